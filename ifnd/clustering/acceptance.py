"""Acceptance: which samples' pseudo labels count, by the calendar or by the evidence.

IFND accepts the ⌈r·N⌉ most confident pseudo labels, r following a schedule over the epochs
(Sec. 3.2): the calendar schemes ``'constant'``, ``'step'`` and ``'linear'``, whose arithmetic is
here (the build-time checks that name the part and key, and the random-order schedule for any
detector, stay with the parts in ``ifnd/models/false_negatives/acceptance.py``).

The evidence schemes accept by what a clustering round shows, whatever the epoch:

- ``'confidence'``: a sample's label at a level when its confidence κ is high enough (the round
  sets the level's bound: ``threshold`` of the way from chance, 1/k, to 1), so the accepted share
  grows as the embedding sharpens (:func:`accept_confident`);
- ``'stability'``: a sample's label when its cluster is the one its cluster of the previous round
  became, clusters matched across rounds by their members' overlap (:func:`accept_stable`), a
  label-free estimate of precision.
"""
import math

import torch
from torch import Tensor

__all__ = ['ACCEPTANCE_SCHEMES', 'CALENDAR_SCHEMES', 'EVIDENCE_SCHEMES', 'acceptance_rate',
           'idle_schedule', 'unique_labels', 'smallest_accepted', 'accept_confident', 'match_clusters',
           'accept_stable']

CALENDAR_SCHEMES = ('constant', 'step', 'linear')
EVIDENCE_SCHEMES = ('confidence', 'stability')
ACCEPTANCE_SCHEMES = CALENDAR_SCHEMES + EVIDENCE_SCHEMES


def acceptance_rate(epoch: int, max_epochs: int, scheme: str = 'linear', final_rate: float = 1.0,
                    step_epoch: int = 0) -> float:
    """Fraction of the samples to accept at ``epoch``.

    ``'constant'``: ``final_rate``; ``'step'``: 0 before ``step_epoch``, then ``final_rate``;
    ``'linear'``: ``final_rate * epoch / max_epochs`` clamped to ``[0, final_rate]``.
    """
    # The settings the arithmetic cannot take; the parts check types and name their key at build.
    if not isinstance(scheme, str) or scheme not in CALENDAR_SCHEMES:
        raise ValueError(f'an acceptance rate is the calendar schemes\' {CALENDAR_SCHEMES}, got '
                         f'{scheme!r}')
    if not 0.0 <= final_rate <= 1.0:
        raise ValueError(f'acceptance final_rate must be in [0, 1], got {final_rate!r}')
    if step_epoch < 0:
        raise ValueError(f'acceptance step_epoch must be >= 0, got {step_epoch!r}')
    if scheme == 'constant':
        return float(final_rate)
    if scheme == 'step':
        return 0.0 if epoch < step_epoch else float(final_rate)
    if max_epochs <= 0:
        raise ValueError(f'max_epochs must be positive for the linear scheme, got {max_epochs}')
    return float(min(max(final_rate * epoch / max_epochs, 0.0), final_rate))


def idle_schedule(owner: str, max_epochs: int, scheme: str, final_rate: float, step_epoch: int,
                  interval: int) -> str | None:
    """Why a run of ``max_epochs`` ends before the schedule accepts a sample, or None.

    Epoch e trains with the rate of the last update, after ``e - e % interval`` epochs (IFND's
    last clustering round): a step or an interval past the run's end leaves every rate 0. The
    evidence schemes are never idle by the calendar.
    """
    if scheme in EVIDENCE_SCHEMES:
        return None
    for epoch in range(max_epochs):
        if acceptance_rate(epoch - epoch % interval, max_epochs, scheme, final_rate, step_epoch):
            return None
    return (f'{owner} (scheme={scheme!r}, final_rate={final_rate:g}, step_epoch={step_epoch}, '
            f'interval={interval}) accepts no sample before the run ends (train_cfg.max_epochs='
            f'{max_epochs})')


def unique_labels(num: int, device: torch.device) -> Tensor:
    """Labels ``-(i + 1)``: no two samples share one, none equals a cluster id."""
    return -(torch.arange(num, device=device) + 1)


def smallest_accepted(labels: Tensor, confidence: Tensor) -> float:
    """The smallest confidence among the accepted labels (``>= 0``), ``+inf`` when none is."""
    kept = labels >= 0
    return float(confidence[kept].double().min()) if bool(kept.any()) else math.inf


def _check_assignments(assignments: Tensor, other: Tensor, name: str) -> None:
    if assignments.ndim != 1 or other.shape != assignments.shape:
        raise ValueError(f'assignments and {name} must both be [N], got {tuple(assignments.shape)} '
                         f'and {tuple(other.shape)}')


def accept_confident(assignments: Tensor, confidence: Tensor,
                     threshold: float) -> tuple[Tensor, float]:
    """Keep the cluster ids of the samples whose confidence is at least ``threshold``.

    The others get ``-(i + 1)``; NaN confidences are never accepted. Returns ``(labels [N] int64,
    the smallest accepted confidence)`` (``+inf`` when nothing is accepted), as ``accept_labels``.
    """
    _check_assignments(assignments, confidence, 'confidence')
    scores = confidence.detach().to(assignments.device).double()
    accepted = scores >= threshold  # NaN compares False
    labels = torch.where(accepted, assignments.long(),
                         unique_labels(len(assignments), assignments.device))
    return labels, smallest_accepted(labels, scores)


def match_clusters(assignments: Tensor, previous: Tensor) -> Tensor:
    """For each cluster of ``assignments``, the cluster of ``previous`` sharing the most members.

    Ties go to the lower previous id; a cluster with no member maps to -1. Returns ``[k]`` int64
    with k = ``assignments.max() + 1``.
    """
    _check_assignments(assignments, previous, 'previous')
    assignments, previous = assignments.long().cpu(), previous.long().cpu()
    if assignments.numel() == 0:
        return torch.empty(0, dtype=torch.long)
    k, k_prev = int(assignments.max()) + 1, int(previous.max()) + 1
    overlap = torch.bincount(assignments * k_prev + previous, minlength=k * k_prev).view(k, k_prev)
    best = overlap.argmax(dim=1)  # the first maximum: the lower id on ties
    return torch.where(overlap.sum(dim=1) > 0, best, -1)


def accept_stable(assignments: Tensor, previous: Tensor | None) -> tuple[Tensor, float]:
    """Keep the cluster ids of the samples whose previous cluster is the one their cluster matches.

    ``previous``: the last round's assignments at this level (None in the first round: nothing is
    accepted). Returns ``(labels [N] int64, the accepted share)``.
    """
    num = len(assignments)
    unique = unique_labels(num, assignments.device)
    if previous is None:
        return unique, 0.0
    match = match_clusters(assignments, previous).to(assignments.device)
    stable = match[assignments.long()] == previous.to(assignments.device).long()
    labels = torch.where(stable, assignments.long(), unique)
    return labels, float(stable.float().mean()) if num else 0.0
