"""IFND's detector: candidates sharing the anchor's accepted pseudo label, at every level.

The labels come from the algorithm's :class:`PseudoLabelBank`, filled by ``PseudoLabelHook``
(clustering, κ, acceptance by the calendar or the evidence); an unaccepted sample carries a label
of its own, so it flags nothing and is flagged by nothing. ``agreement`` > 1 flags a pair only
where its labels agree at that many levels.
"""
from typing import Annotated

import torch

from ifnd.settings import Bound
from ifnd.registry import MODELS

from .detector import NegativeBatch
from .label_bank import LabelBankDetector
from ifnd.settings import check_number


# The levels a pair's labels may be asked to agree at: the build and a checkpoint's config take one range.
AGREEMENT = Bound(1, 64)


@MODELS.register_module()
class PseudoLabels(LabelBankDetector):
    """Flags the candidates whose pseudo label equals the anchor's, per clustering level."""

    def __init__(self, agreement: Annotated[int, AGREEMENT] = 1) -> None:
        """``agreement``: flag a pair at a level only where its labels agree at this many levels or
        more (1: every level on its own, the paper's; a precision knob)."""
        super().__init__()
        self.agreement = check_number('PseudoLabels', 'agreement', agreement, int, low=AGREEMENT.low,
                                      high=AGREEMENT.high,
                                      hint='the levels whose labels must agree for a flag')
    def check_levels(self, num_clusters: list[int], clusterer: str) -> None:
        """Refuse an agreement at more levels than are clustered: no pair could ever agree."""
        if self.agreement > len(num_clusters):
            raise ValueError(f'PseudoLabels agreement={self.agreement} asks labels to agree at more levels '
                             f'than {clusterer} clusters at ({len(num_clusters)}: num_clusters='
                             f'{list(num_clusters)}), so nothing would be flagged: set agreement to at '
                             f'most {len(num_clusters)}, or add levels')

    def check_ready(self) -> None:
        """The bank's own lookup names the missing hook."""

    def set_epoch(self, epoch: int) -> None:
        """Acceptance is the PseudoLabelHook's, per round."""
        self.epoch = epoch

    def labels(self, index: torch.Tensor) -> torch.Tensor:
        """Labels ``[L, n]``; unknown samples (-1) get labels no other sample or column has."""
        bank = self.bank
        known = index >= 0
        labels = bank.lookup(torch.where(known, index, 0))
        column = torch.arange(len(index), device=index.device)
        return torch.where(known, labels, -(bank.num_samples + 1 + column))

    def batch_labels(self, batch: NegativeBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The anchors' and the candidates' labels ``[L, A]``, ``[L, C]``, looked up once a batch
        (every unknown sample, on either side, with a label of its own)."""
        found = batch.derived.get('pseudo_labels')
        if found is None:
            anchors = len(batch.anchor_index)
            both = self.labels(torch.cat([batch.anchor_index, batch.candidate_index]))
            found = batch.derived['pseudo_labels'] = (both[:, :anchors], both[:, anchors:])
        return found

    def flags(self, batch: NegativeBatch) -> torch.Tensor | None:
        """Same-label candidates ``[L, A, C]``; None while no label is accepted (no masks built)."""
        if not self.bank.any_accepted:
            return None
        anchor, candidate = self.batch_labels(batch)
        same = anchor.unsqueeze(2) == candidate.unsqueeze(1)
        if self.agreement == 1:
            return same
        return same & (same.sum(dim=0, keepdim=True) >= self.agreement)

    def log_vars(self, batch: NegativeBatch) -> dict:
        """The share of the batch's anchors that carry an accepted pseudo label."""
        return {'accepted': (self.batch_labels(batch)[0] >= 0).float().mean().detach()}
