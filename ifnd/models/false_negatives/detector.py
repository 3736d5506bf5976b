"""What every false-negative detector shares: the batch it sees and the flags it returns.

A detector looks at a step's anchors and candidates and flags, per anchor, the candidates it takes
for false negatives (negatives of the anchor's own class); a treatment (``treatment.py``) then
eliminates or attracts them. Detectors are registered in ``MODELS`` and built from the
algorithm's ``detector=dict(type=...)``.
"""
from dataclasses import dataclass, field, replace
from typing import Optional

import torch
from torch import Tensor, nn

from ifnd.clustering.acceptance import Acceptance, build_acceptance


@dataclass
class NegativeBatch:
    """One step's anchors and candidates, as a detector sees them.

    ``anchors`` [A, D] and ``candidates`` [C, D] are L2-normalised embeddings (SimCLR: the
    local views ``cat([z1, z2])`` and the views of all ranks; MoCo: the queries and the queue).
    ``negatives`` [A, C] marks each anchor's negatives (not itself, not its positive).
    ``anchor_index`` / ``candidate_index``: sample indices (-1: unknown, MoCo's initial queue
    rows); ``anchor_classes`` / ``candidate_classes``: ground-truth classes when the data has
    them (-1 unknown), else None. ``views``: anchors are ``views`` blocks of the same images.
    ``support`` [M, S, D]: the anchor images' support views (FNC), else None.
    """

    anchors: torch.Tensor
    candidates: torch.Tensor
    negatives: torch.Tensor
    anchor_index: torch.Tensor | None
    candidate_index: torch.Tensor | None
    anchor_classes: torch.Tensor | None = None
    candidate_classes: torch.Tensor | None = None
    views: int = 1
    support: torch.Tensor | None = None
    own_image: torch.Tensor | None = None  # each local image's column among the candidate images
    # The loss's layout (``treatment.contrast``): each anchor's positive column among the
    # candidates [A], or a positive of its own outside them [A, D] (MoCo's key); the columns that
    # are no candidate of it [A, C]; the queue rows an enqueue overwrites before the backward.
    positive_index: torch.Tensor | None = None
    positives: torch.Tensor | None = None
    excluded: torch.Tensor | None = None
    overwritten: torch.Tensor | None = None
    # Negatives each anchor has, known from the shapes alone (a weighting needs one at least).
    negatives_per_anchor: int | None = None
    # What a detector derives from the batch once and reads again (its flags, its logs): e.g. the
    # pseudo labels of the anchors and candidates, looked up once a step.
    derived: dict = field(default_factory=dict)


# What a clustering round can hand the parts (PseudoLabelHook computes those its model's parts
# declare, and what its acceptance ranks by): the accepted labels, IFND's κ, PCL's per-cluster
# concentrations φ, the centroids.
ROUND_OUTPUTS = frozenset({'labels', 'kappa', 'concentrations', 'centroids'})


@dataclass(frozen=True)
class DetectorNeeds:
    """What a detector needs from its algorithm and the data, declared once by the detector and
    asked by the algorithms (SimCLR, MoCo) and the hooks."""

    label_bank: bool = False  # reads the algorithm's PseudoLabelBank (filled by PseudoLabelHook)
    sample_index: bool = False  # keeps per-sample state: data_samples['index']
    classes: bool = False  # reads the ground-truth classes (an oracle)
    support_views: int = 0  # extra views per image, embedded without gradient (FNC)
    batch_only: bool = False  # flags only among the batch's views (not MoCo's queue)
    round_outputs: frozenset = frozenset()  # of ROUND_OUTPUTS: what it reads of each round


class FalseNegativeDetector(nn.Module):
    """Base of the detectors: flags ``[L, A, C]`` (L levels) or None before anything is flagged.

    ``acceptance``: a calendar scheme of ``ifnd/clustering/acceptance.py``
    (``dict(type='LinearAcceptance')``), ranking the samples in a random order drawn from its
    ``seed``; a flag then counts only between two accepted samples. With the ground-truth detector
    this is the schedule-matched oracle, which tells how much of IFND's shortfall its schedule
    alone explains. ``setup`` and ``set_epoch`` are called by
    :class:`ifnd.hooks.NegativeDetectorHook` before training and before each epoch.
    """

    needs = DetectorNeeds()  # a subclass declares its own; an acceptance adds sample_index
    levels = 1  # label granularities of the flags' first dimension

    def __init__(self, acceptance: dict | None = None) -> None:
        super().__init__()
        self.acceptance: Acceptance | None = None
        if acceptance is not None:
            self.acceptance = build_acceptance(acceptance, f'{type(self).__name__} acceptance',
                                               by_round=False)
            self.needs = replace(self.needs, sample_index=True)  # the order is per sample
        self.epoch = 0
        self.max_epochs = 0
        self.num_samples = 0
        # The accepted samples ([N] bool, on the device) and whether any is, set each epoch from
        # a permutation drawn from the acceptance's seed: the same on every process and after a
        # resume, so it is not saved.
        self._order: torch.Tensor | None = None
        self._accepted: torch.Tensor | None = None
        self._any_accepted = False

    def attach(self, bank) -> None:
        """Receive the algorithm's label bank; called where ``needs.label_bank``."""
        raise TypeError(f'{type(self).__name__} declares needs.label_bank but reads no label bank')

    def setup(self, num_samples: int, max_epochs: int, device: torch.device) -> None:
        """Size per-sample state for ``num_samples`` training samples."""
        self.num_samples, self.max_epochs = num_samples, max_epochs
        if self.acceptance is not None:
            seed = self.acceptance.seed if self.acceptance.seed is not None else 0
            order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed))
            scores = torch.empty(num_samples, dtype=torch.float64)
            scores[order] = -torch.arange(num_samples, dtype=torch.float64)  # first drawn, first
            self._order = scores
            self._accepted = torch.zeros(num_samples, dtype=torch.bool, device=device)

    def check_levels(self, num_clusters: list[int], clusterer: str) -> None:
        """Refuse settings of this detector that the clustering levels ``num_clusters`` (of
        ``clusterer``, the hook filling its labels) would leave idle."""

    def idle_warnings(self, max_epochs: int) -> list[str]:
        """The settings that keep this detector from flagging anything in a run of ``max_epochs``."""
        warning = None if self.acceptance is None else self.acceptance.idle_reason(max_epochs, 1)
        return [warning] if warning else []

    def set_epoch(self, epoch: int) -> None:
        """The epoch about to start (epochs done)."""
        self.epoch = epoch
        if self.acceptance is not None:
            self.acceptance.set_epoch(epoch, self.max_epochs)
            if self._order is not None:  # ranked on the host once an epoch: no device sync a step
                labels, _ = self.acceptance.accept(0, torch.zeros(len(self._order), dtype=torch.long),
                                                   self._order, 1)
                accepted = labels >= 0
                self._any_accepted = bool(accepted.any())
                self._accepted.copy_(accepted)

    def check_ready(self) -> None:
        """Refuse a step before the hook set the detector up, naming the fix."""
        if self.acceptance is not None and self._order is None or \
                self.needs.sample_index and self.num_samples == 0:
            raise RuntimeError(f'{type(self).__name__} was not set up: add '
                               "dict(type='NegativeDetectorHook') to default_hooks (it is in "
                               'configs/_base_/default_runtime.py) or call detector.setup()')

    def forward(self, batch: NegativeBatch) -> torch.Tensor | None:
        """Flags ``[L, A, C]`` of the batch, or None where nothing can be flagged yet."""
        self.check_ready()
        if self.acceptance is not None and not self._any_accepted:
            return None
        flags = self.flags(batch)
        if flags is None or self.acceptance is None:
            return flags
        accepted_anchor = self.accepted(batch.anchor_index)
        accepted_candidate = self.accepted(batch.candidate_index)
        return flags & (accepted_anchor.unsqueeze(1) & accepted_candidate.unsqueeze(0))

    def accepted(self, index: torch.Tensor) -> torch.Tensor:
        """Whether each sample of ``index`` is accepted this epoch; unknown samples (-1) are not."""
        accepted = self._accepted.to(index.device)
        return (index >= 0) & accepted[index.clamp(min=0)]

    def flags(self, batch: NegativeBatch) -> torch.Tensor | None:
        """The detector's own flags, before acceptance."""
        raise NotImplementedError

    def log_vars(self, batch: NegativeBatch) -> dict:
        """Scalars to log with the loss (not optimised)."""
        if self.acceptance is None:
            return {}
        return {'accepted': self.accepted(batch.anchor_index).float().mean()}


def false_negative_detection_counts(flagged: Optional[Tensor],
                                    negatives: Tensor,
                                    anchor_classes: Tensor,
                                    candidate_classes: Tensor,
                                    levels: int = 1) -> Tensor:
    """Counts ``[L, 3]`` (float64): flagged negatives, flagged of the anchor's class, same-class negatives.

    ``flagged`` [L, A, C] marks the candidates a loss treats as false negatives (``None``: none
    at any of ``levels``), ``negatives`` [A, C] the anchor's negatives; pairs with an unknown
    class (< 0) on either side are left out. Computed on the device, with no host sync.
    """
    known = (anchor_classes >= 0).unsqueeze(1) & (candidate_classes >= 0).unsqueeze(0)
    negatives = negatives & known
    same = negatives & (anchor_classes.unsqueeze(1) == candidate_classes.unsqueeze(0))
    num_same = same.sum().to(torch.float64).expand(levels)
    if flagged is None:
        zeros = num_same.new_zeros(levels)
        return torch.stack([zeros, zeros, num_same], dim=1)
    if flagged.ndim != 3 or flagged.shape[0] != levels:
        raise ValueError(f'flagged must be [{levels}, A, C], got {tuple(flagged.shape)}')
    flagged = flagged & negatives
    return torch.stack([flagged.sum(dim=(1, 2)).to(torch.float64),
                        (flagged & same).sum(dim=(1, 2)).to(torch.float64), num_same], dim=1)
