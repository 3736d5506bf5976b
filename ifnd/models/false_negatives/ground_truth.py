"""The oracle's detector: candidates of the anchor's ground-truth class.

With elimination it is the elimination oracle, with attraction SupCon; with an acceptance
scheme (``acceptance=dict(type='LinearAcceptance')``) it flags only between accepted samples, the
schedule-matched oracle that IFND's detection can be measured against. On MoCo's queue the
classes of the queued keys are looked up by their sample index in the training set's labels,
which ``setup`` receives.
"""
import torch

from ifnd.registry import MODELS

from .detector import DetectorNeeds, FalseNegativeDetector, NegativeBatch


@MODELS.register_module()
class GroundTruth(FalseNegativeDetector):
    """Flags the candidates whose class equals the anchor's (a supervised oracle)."""

    needs = DetectorNeeds(classes=True)

    def __init__(self, acceptance: dict | None = None) -> None:
        super().__init__(acceptance)
        self._checked = False
        self._classes: torch.Tensor | None = None  # the training set's labels, by sample index

    def set_classes(self, classes: torch.Tensor) -> None:
        """The training set's labels, for candidates known by sample index only (MoCo's queue)."""
        self._classes = classes

    def candidate_classes(self, batch: NegativeBatch) -> torch.Tensor:
        """The candidates' classes: looked up by sample index in the training set's labels where
        the hook gave them (also for queued keys of an older checkpoint, which carry no class), else
        the batch's own (-1: unknown)."""
        if batch.candidate_classes is not None and (self._classes is None or batch.candidate_index is None):
            return batch.candidate_classes
        if self._classes is None:
            raise RuntimeError('the GroundTruth detector on a queue needs the training set\'s '
                               "labels: NegativeDetectorHook (in default_hooks) passes them, or "
                               'call detector.set_classes(labels)')
        index = batch.candidate_index
        classes = self._classes.to(index.device)[index.clamp(min=0)]
        return torch.where(index >= 0, classes, -1)

    def flags(self, batch: NegativeBatch) -> torch.Tensor:
        """Same-class candidates ``[1, A, C]``."""
        anchor = batch.anchor_classes
        if not self._checked:  # one host sync on the first batch, none afterwards
            if anchor is None or bool((anchor < 0).any()):
                raise ValueError('the GroundTruth detector (SupCon, OracleElim) needs a data set '
                                 'with labels: every training image needs its class')
            self._checked = True
        candidate = self.candidate_classes(batch)
        return (anchor.unsqueeze(1) == candidate.unsqueeze(0)).unsqueeze(0)
