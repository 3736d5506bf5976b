"""The loss references the tests compare ``ifnd.models.losses`` against, and the former spellings.

* :func:`masked_info_nce` with :func:`label_masks` -- the general form of the masked InfoNCE, with
  full boolean positive and denominator masks per level: the reference for the fused
  :func:`ifnd.models.losses.masked_nce`.
* The former entry points -- a candidate set with pseudo labels or a flag mask, MoCo's queue with
  labels, the debiased loss on SimCLR's views, FNC on one process -- spelled over the live
  equations (:func:`~ifnd.models.losses.candidate_logits`, :func:`~ifnd.models.losses.masked_nce`,
  :func:`~ifnd.models.losses.queue_logits`, :func:`~ifnd.models.losses.debiased_nce`,
  and FNC's selection, :func:`~ifnd.models.false_negatives.support_views.fnc_false_negatives`),
  so tests reach the live code through them.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ifnd.models.false_negatives.support_views import check_fnc_options, fnc_false_negatives
from ifnd.models.losses import (batch_views, candidate_logits, check_candidates, check_treatment,
                                debiased_nce, masked_nce, queue_logits)


def masked_info_nce(logits: Tensor, positive_mask: Tensor, denominator_mask: Tensor) -> Tensor:
    """Per-anchor InfoNCE averaged over each anchor's positives, with a masked denominator.

    ``loss_i = -1/|P_i| * sum_{p in P_i} (logits[i, p] - logsumexp_{s in S_i} logits[i, s])`` with
    ``P_i = positive_mask[i]`` and ``S_i = denominator_mask[i]``; ``logits`` are already divided by
    the temperature. Callers guarantee ``P_i`` is a non-empty subset of ``S_i``; a row without any
    positive yields 0 (and no gradient) instead of NaN.
    """
    if logits.ndim != 2:
        raise ValueError(f'logits must be [A, C], got shape {tuple(logits.shape)}')
    if positive_mask.shape != logits.shape or denominator_mask.shape != logits.shape:
        raise ValueError(
            f'masks must match logits {tuple(logits.shape)}, got positive_mask '
            f'{tuple(positive_mask.shape)} and denominator_mask {tuple(denominator_mask.shape)}')
    positive_mask = positive_mask.bool()
    num_pos = positive_mask.sum(dim=1)
    has_pos = num_pos > 0
    # A row with no positive could also have an empty denominator, whose logsumexp is -inf and
    # whose backward is NaN; giving such rows the full row keeps everything finite, and their
    # loss is zeroed below.
    denominator_mask = denominator_mask.bool() | ~has_pos.unsqueeze(1)
    log_norm = torch.logsumexp(logits.masked_fill(~denominator_mask, float('-inf')), dim=1)
    # torch.where (not multiplication) so that no masked entry can leak inf * 0 into the sum.
    pos_sum = torch.where(positive_mask, logits, torch.zeros_like(logits)).sum(dim=1)
    loss = log_norm - pos_sum / num_pos.clamp(min=1).to(logits.dtype)
    return torch.where(has_pos, loss, torch.zeros_like(loss))


def label_masks(anchor_labels: Tensor, candidate_labels: Tensor, positive: Tensor,
                excluded: Tensor, treatment: Optional[str]) -> tuple[Tensor, Tensor]:
    """Positive and denominator masks ``[A, C]`` of one label level for the given treatment."""
    check_treatment(treatment)
    positive = positive.bool() & ~excluded.bool()
    allowed = ~excluded.bool()
    if treatment is None:
        return positive, allowed
    same = anchor_labels.reshape(-1, 1) == candidate_labels.reshape(1, -1)
    if treatment == 'elim':
        # Eq. eq:elimination: the own positive stays even though it shares the label.
        return positive, allowed & ~(same & ~positive)
    # 'attr', Eq. eq:attraction: P(i) = {i'} ∪ {n in N(i): y_n = y_i}; S(i) is unchanged.
    return (positive | same) & allowed, allowed


def as_levels(labels: Optional[Tensor], length: int, name: str) -> Optional[Tensor]:
    """Return ``labels`` as ``[L, length]`` (``[length]`` becomes one level)."""
    if labels is None:
        return None
    labels = torch.as_tensor(labels)
    if labels.ndim == 1:
        labels = labels.unsqueeze(0)
    if labels.ndim != 2 or labels.shape[1] != length or labels.shape[0] < 1:
        raise ValueError(f'{name} must have shape [{length}] or [L, {length}], '
                         f'got {tuple(labels.shape)}')
    return labels


def contrastive_loss_from_candidates(anchors: Tensor,
                                     candidates: Tensor,
                                     positive_index: Tensor,
                                     self_index: Tensor,
                                     anchor_labels: Optional[Tensor] = None,
                                     candidate_labels: Optional[Tensor] = None,
                                     temperature: float = 0.1,
                                     treatment: Optional[str] = None,
                                     instance_if_unaccepted: bool = False) -> Tensor:
    """Per-anchor loss ``[A]`` of ``treatment`` against a candidate set, averaged over label levels.

    ``anchor_labels`` [L, A] / ``candidate_labels`` [L, C] (or [A] / [C]); ``None``: instance
    labels. ``instance_if_unaccepted``: when no candidate label is accepted (all negative), level
    0 alone, exactly the instance loss, chosen on the device.
    """
    check_treatment(treatment)
    check_candidates(anchors, candidates, positive_index, self_index, temperature)
    if (anchor_labels is None) != (candidate_labels is None):
        raise ValueError('anchor_labels and candidate_labels must be given together')
    anchor_labels = as_levels(anchor_labels, anchors.shape[0], 'anchor_labels')
    candidate_labels = as_levels(candidate_labels, candidates.shape[0], 'candidate_labels')
    logits, excluded, positive_index = candidate_logits(anchors, candidates, positive_index,
                                                        self_index, temperature)
    if anchor_labels is None or treatment is None:
        return masked_nce(logits, positive_index, excluded, None, None)
    same = anchor_labels.unsqueeze(2) == candidate_labels.unsqueeze(1)  # [L, A, C]
    any_accepted = (candidate_labels >= 0).any() if instance_if_unaccepted else None
    return masked_nce(logits, positive_index, excluded, same, treatment, any_accepted)


def contrastive_loss_from_mask(anchors: Tensor, candidates: Tensor, positive_index: Tensor,
                               self_index: Tensor, false_negatives: Tensor,
                               temperature: float = 0.1, treatment: Optional[str] = 'elim') -> Tensor:
    """Per-anchor loss ``[A]`` of ``treatment`` with the false negatives ``[A, C]`` as a boolean mask."""
    check_treatment(treatment)
    check_candidates(anchors, candidates, positive_index, self_index, temperature)
    logits, excluded, positive_index = candidate_logits(anchors, candidates, positive_index,
                                                        self_index, temperature)
    flagged = false_negatives.to(dtype=torch.bool, copy=True).unsqueeze(0)
    return masked_nce(logits, positive_index, excluded, flagged, treatment)


def queue_contrastive_loss(q: Tensor,
                           k: Tensor,
                           queue: Tensor,
                           labels: Optional[Tensor] = None,
                           queue_labels: Optional[Tensor] = None,
                           temperature: float = 0.2,
                           treatment: Optional[str] = None,
                           overwritten: Optional[Tensor] = None) -> Tensor:
    """MoCo's loss of each query against its own key and the queue, label-sharing keys treated.

    ``labels`` [M] / [L, M] of the batch, ``queue_labels`` [K] / [L, K] of the queue entries;
    the mean over the M queries, averaged over the label levels.
    """
    check_treatment(treatment)
    if (labels is None) != (queue_labels is None):
        raise ValueError('labels and queue_labels must be given together')
    labels = as_levels(labels, q.shape[0], 'labels')
    queue_labels = as_levels(queue_labels, queue.shape[0], 'queue_labels')
    l_pos, l_neg = queue_logits(q, k, queue, temperature, overwritten)
    logits = torch.cat([l_pos.unsqueeze(1), l_neg], dim=1)
    positive = logits.new_zeros(q.shape[0], dtype=torch.long)
    if labels is None:
        return F.cross_entropy(logits, positive)
    if treatment is None:
        return masked_nce(logits, positive, None, None, None).mean()
    # Column 0, the own key, is the positive: its label is never read.
    column_labels = torch.cat([queue_labels[:, :1], queue_labels], dim=1)
    same = labels.unsqueeze(2) == column_labels.unsqueeze(1)  # [L, M, 1 + K]
    return masked_nce(logits, positive, None, same, treatment).mean()


def debiased_loss_from_candidates(anchors: Tensor, candidates: Tensor, positive_index: Tensor,
                                  self_index: Tensor, temperature: float = 0.5,
                                  tau_plus: float = 0.1, beta: float = 0.0) -> Tensor:
    """Per-anchor debiased loss ``[A]``: every candidate but the anchor and its positive is a
    negative."""
    check_candidates(anchors, candidates, positive_index, self_index, temperature)
    logits, excluded, positive_index = candidate_logits(anchors, candidates, positive_index,
                                                        self_index, temperature)
    pos_column = positive_index.unsqueeze(1)
    negatives = (~excluded).scatter_(1, pos_column, False)
    return debiased_nce(logits.gather(1, pos_column).squeeze(1), logits, temperature, tau_plus,
                        beta, negatives)


def debiased_contrastive_loss(z1: Tensor, z2: Tensor, temperature: float = 0.5,
                              tau_plus: float = 0.1, beta: float = 0.0) -> Tensor:
    """Debiased (β = 0) or hard-negative (β > 0) loss of SimCLR's 2M views, mean over anchors."""
    views, positive_index, self_index = batch_views(z1, z2)
    return debiased_loss_from_candidates(views, views, positive_index, self_index, temperature,
                                         tau_plus, beta).mean()


def fnc_loss(z1: Tensor, z2: Tensor, support: Tensor, temperature: float = 0.5,
             treatment: str = 'elim', top_k: Optional[int] = None,
             threshold: Optional[float] = None, aggregation: str = 'mean') -> Tensor:
    """FNC on SimCLR's 2M views of one process, mean over anchors; ``support`` is [M, S, D]."""
    check_fnc_options(treatment, top_k, threshold, aggregation)
    views, positive_index, self_index = batch_views(z1, z2)
    num = z1.shape[0]
    flags = fnc_false_negatives(support, views.detach().view(2, num, -1),
                                torch.arange(num, device=z1.device), top_k, threshold, aggregation)
    return contrastive_loss_from_mask(views, views, positive_index, self_index, flags.repeat(2, 2),
                                      temperature, treatment).mean()


def mocov3_reference(q1: Tensor, q2: Tensor, k1: Tensor, k2: Tensor, temperature: float = 0.2,
                     flags: Optional[list] = None, treatment: Optional[str] = None) -> Tensor:
    """MoCo v3's symmetric loss ``ctr(q1, k2) + ctr(q2, k1)`` from the paper, element by element.

    ``ctr(q, k) = 2τ · mean_i −log(exp(q_i·k_i/τ) / Σ_j exp(q_i·k_j/τ))`` over the M queries and
    the M keys of the other view (one process). ``flags[l][d][i][j]``: at level l, in direction d
    (0: q1 against k2, 1: q2 against k1), key j flagged for query i (j ≠ i): ``'elim'`` drops it
    from the denominator, ``'attr'`` makes it a positive (SupCon's mean over the positives, the
    denominator unchanged); the loss is the mean over the levels. Written with scalar operations,
    independently of :mod:`ifnd.models.losses`.
    """
    num = q1.shape[0]
    levels = flags if flags is not None else [None]
    total = q1.new_zeros(())
    for direction, (q, k) in enumerate(((q1, k2), (q2, k1))):
        for level in levels:
            level_sum = q1.new_zeros(())
            for i in range(num):
                exps = [torch.exp(q[i] @ k[j] / temperature) for j in range(num)]
                flagged = [j != i and level is not None and bool(level[direction][i][j])
                           for j in range(num)]
                if treatment == 'elim':
                    denominator = sum(e for e, f in zip(exps, flagged) if not f)
                else:
                    denominator = sum(exps)
                positives = [i] + ([j for j in range(num) if flagged[j]]
                                   if treatment == 'attr' else [])
                level_sum = level_sum + sum(-torch.log(exps[p] / denominator)
                                            for p in positives) / len(positives)
            total = total + 2 * temperature * level_sum / num / len(levels)
    return total
