"""The prototype term of ProtoNCE: PCL's, and HCSC's with its selected negative prototypes."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .nce import label_levels


def proto_nce_loss(z: Tensor, centroids: Sequence[Tensor], assignments: Tensor,
                   concentration: Sequence[Tensor], kept: Sequence[Tensor | None] | None = None,
                   zeroed: bool = False) -> Tensor:
    """Prototype term of PCL's ProtoNCE, averaged over clustering levels.

    For level ``l``: ``cross_entropy((z · c_jᵀ) / φ_j, assignment)`` over all prototypes, averaged
    over samples whose assignment is >= 0 (others are not accepted and ignored; a level without
    accepted samples contributes 0). ``z`` [M, D], ``centroids[l]`` [K_l, D],
    ``assignments`` [L, M] (or [M]), ``concentration[l]`` [K_l].

    ``kept[l]`` [M, K_l] (HCSC's prototype selection; None: every prototype): the negative
    prototypes each sample keeps; the others leave the denominator, or with ``zeroed`` keep a logit
    of 0 there (HCSC's code multiplies them by 0). A sample's own prototype is always kept.
    """
    if z.ndim != 2:
        raise ValueError(f'z must be [M, D], got {tuple(z.shape)}')
    assignments = label_levels(assignments, z.shape[0], 'assignments')
    levels = assignments.shape[0]
    if len(centroids) != levels or len(concentration) != levels:
        raise ValueError(f'got {levels} assignment levels, {len(centroids)} centroid sets and '
                         f'{len(concentration)} concentration vectors; they must agree')
    total = z.new_zeros(())
    for level in range(levels):
        cents, phi = centroids[level].to(z), concentration[level].to(z)
        if cents.ndim != 2 or cents.shape[1] != z.shape[1] or phi.shape != (cents.shape[0], ):
            raise ValueError(f'level {level}: centroids must be [K, {z.shape[1]}] and '
                             f'concentration [K], got {tuple(cents.shape)} and {tuple(phi.shape)}')
        target = assignments[level].to(z.device)
        valid = target >= 0
        logits = (z @ cents.t()) / phi.unsqueeze(0)
        if kept is not None and kept[level] is not None:
            own = F.one_hot(target.clamp(min=0), cents.shape[0]).bool()
            logits = logits.masked_fill(~(kept[level].to(z.device) | own), 0.0 if zeroed else float('-inf'))
        # Per-sample CE with rejected targets clamped to a valid id, then masked out: no
        # data-dependent branching (and no device sync) when nothing is accepted.
        per_sample = F.cross_entropy(logits, target.clamp(min=0), reduction='none')
        per_sample = torch.where(valid, per_sample, torch.zeros_like(per_sample))
        total = total + per_sample.sum() / valid.sum().clamp(min=1).to(z.dtype)
    return total / levels
