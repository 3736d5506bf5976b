"""Contrastive losses with pseudo-label aware false-negative handling: the equations the models run.

One masked InfoNCE (:func:`masked_nce`) covers the three objectives of IFND (Chen et al., ICLR
2022), by the treatment of the flagged false negatives:

* ``None`` -- instance discrimination, Eq. ``eq:contrastive``: the positive of anchor ``i`` is
  its other view ``i'``, every other candidate is a negative.
* ``'elim'`` -- false-negative elimination, Eq. ``eq:elimination``: flagged candidates (those that
  share the anchor's pseudo label, other than ``i'``) leave the denominator.
* ``'attr'`` -- false-negative attraction, Eq. ``eq:attraction`` (SupCon's form): flagged
  candidates join the positives; the denominator keeps every candidate.

Pseudo labels come as ``[L, M]`` (``L`` clustering granularities); the loss is the average over
levels. Samples whose pseudo label was not accepted must carry labels that match no other sample
(e.g. ``-(index + 1)``), which makes them pure instance-discrimination samples.
:func:`contrastive_loss` is the batch form of one process (SimCLR's 2M views); the models build
their logits with :func:`candidate_logits` (SimCLR, over the gathered views) or
:func:`queue_logits` (MoCo) and join detectors and treatments in
:mod:`ifnd.models.false_negatives.treatment`.

``proto_nce_loss`` is the prototype term of PCL's ProtoNCE, used by the PCL baselines.

Other ways of handling false negatives, compared with IFND:

* ``debiased_nce`` -- the debiased contrastive loss (Chuang et al., NeurIPS 2020), and with
  β > 0 hard negative sampling (Robinson et al., ICLR 2021); on MoCo's queue
  ``queue_debiased_loss``.

The detectors' own arithmetic lives with them (FNC's selection from support views in
``false_negatives/support_views.py``, the detection counts in ``false_negatives/detector.py``).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ifnd.settings import check_number, check_temperature

__all__ = [
    'TREATMENTS',
    'check_treatment',
    'masked_nce',
    'check_candidates',
    'candidate_logits',
    'batch_views',
    'contrastive_loss',
    'queue_logits',
    'check_debiasing',
    'debiased_nce',
    'queue_debiased_loss',
    'proto_nce_loss',
]

TREATMENTS = ('elim', 'attr')  # of the flagged false negatives; None: not treated (instance loss)


def check_treatment(treatment: Optional[str], owner: str = 'the model') -> None:
    """Refuse a treatment other than ``None``, ``'elim'`` and ``'attr'``, naming the fix."""
    if treatment is not None and (not isinstance(treatment, str) or treatment not in TREATMENTS):
        raise ValueError(f'{owner}: treatment must be None or one of {TREATMENTS} (elimination or '
                         f'attraction of the flagged false negatives), got {treatment!r}')


def _as_levels(labels: Optional[Tensor], length: int, name: str) -> Optional[Tensor]:
    """Return ``labels`` as ``[L, length]`` (``[length]`` becomes one level)."""
    if labels is None:
        return None
    if not isinstance(labels, Tensor):
        labels = torch.as_tensor(labels)
    if labels.ndim == 1:
        labels = labels.unsqueeze(0)
    if labels.ndim != 2 or labels.shape[1] != length:
        raise ValueError(f'{name} must have shape [{length}] or [L, {length}], '
                         f'got {tuple(labels.shape)}')
    if labels.shape[0] < 1:
        raise ValueError(f'{name} has no label level')
    return labels


def check_candidates(anchors: Tensor, candidates: Tensor, positive_index: Tensor,
                     self_index: Tensor, temperature: float) -> None:
    """Refuse anchor / candidate sets whose shapes or temperature do not fit together.

    Args:
        anchors: L2-normalised anchor embeddings ``[A, D]`` (a process's local views).
        candidates: L2-normalised candidate embeddings ``[C, D]`` (the views of all processes).
        positive_index: each anchor's positive candidate row ``[A]``.
        self_index: each anchor's own candidate row ``[A]`` (negative: not among them).
        temperature: the loss temperature τ.
    """
    if anchors.ndim != 2 or candidates.ndim != 2:
        raise ValueError(f'anchors and candidates must be 2-D, got {tuple(anchors.shape)} and '
                         f'{tuple(candidates.shape)}')
    if anchors.shape[1] != candidates.shape[1]:
        raise ValueError(f'anchors have dimension {anchors.shape[1]} but candidates have '
                         f'{candidates.shape[1]}')
    for name, index in (('positive_index', positive_index), ('self_index', self_index)):
        if index.shape != (anchors.shape[0], ):
            raise ValueError(f'{name} must have shape [{anchors.shape[0]}], got '
                             f'{tuple(index.shape)}')
    check_temperature('the loss', temperature)


def candidate_logits(anchors: Tensor, candidates: Tensor, positive_index: Tensor,
                     self_index: Tensor, temperature: float) -> tuple[Tensor, Tensor, Tensor]:
    """Logits ``[A, C]`` / τ, the anchors' own columns ``[A, C]`` and positive indices on device.

    The arguments are those of :func:`check_candidates`, which callers run first.
    """
    logits = anchors @ candidates.t() / temperature
    columns = torch.arange(candidates.shape[0], device=logits.device)
    excluded = columns.unsqueeze(0) == self_index.to(logits.device).unsqueeze(1)
    return logits, excluded, positive_index.to(logits.device)


def masked_nce(logits: Tensor, positive_index: Tensor, excluded: Optional[Tensor],
               flagged: Optional[Tensor], treatment: Optional[str],
               all_levels_if: Optional[Tensor] = None) -> Tensor:
    """Per-anchor InfoNCE ``[A]`` with flagged false negatives treated by ``treatment``, level mean.

    Args:
        logits: similarities / τ ``[A, C]``.
        positive_index: each anchor's positive column ``[A]``.
        excluded: columns that are no candidate of the anchor (itself) ``[A, C]``, filled with
            -inf once; None: none.
        flagged: the false negatives per level ``[L, A, C]``, edited in place (callers pass a
            fresh mask); None: none.
        treatment: ``None`` (instance loss), ``'elim'`` (flagged leave the denominator) or
            ``'attr'`` (flagged join the positives).
        all_levels_if: a 0-d bool tensor; where it is False, level 0 alone is returned (chosen on
            the device, no host sync).
    """
    base = logits if excluded is None else logits.masked_fill(excluded, float('-inf'))
    pos_column = positive_index.unsqueeze(1)
    if flagged is None or treatment is None:
        return torch.logsumexp(base, dim=1) - logits.gather(1, pos_column).squeeze(1)
    levels = flagged.shape[0]
    level_pos = pos_column.unsqueeze(0).expand(levels, -1, -1)
    if treatment == 'elim':
        # Eq. eq:elimination: flagged candidates leave the denominator, the own positive stays.
        flagged.scatter_(2, level_pos, False)
        per_level = torch.logsumexp(base.unsqueeze(0).masked_fill(flagged, float('-inf')), dim=2)
        subtract = logits.gather(1, pos_column).squeeze(1)
    else:
        # 'attr', Eq. eq:attraction: flagged candidates join the positives; S(i) is unchanged.
        flagged.scatter_(2, level_pos, True)
        if excluded is not None:
            flagged.masked_fill_(excluded.unsqueeze(0), False)
        num_pos = flagged.sum(dim=2).to(logits.dtype)
        pos_sum = torch.where(flagged, logits.unsqueeze(0), 0.0).sum(dim=2)
        per_level = torch.logsumexp(base, dim=1).unsqueeze(0) - pos_sum / num_pos
        subtract = None
    loss = per_level.mean(dim=0)
    if all_levels_if is not None:
        # Selected on the device (no host sync); the unselected branch gets exact zero gradients.
        loss = torch.where(all_levels_if, loss, per_level[0])
    return loss if subtract is None else loss - subtract


def batch_views(z1: Tensor, z2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The 2M views ``cat([z1, z2])`` of one process with their positive and own rows."""
    if z1.ndim != 2 or z1.shape != z2.shape:
        raise ValueError(f'z1 and z2 must both be [M, D] with equal shapes, got {tuple(z1.shape)} '
                         f'and {tuple(z2.shape)}')
    num = z1.shape[0]
    index = torch.arange(num, device=z1.device)
    return (torch.cat([z1, z2], dim=0), torch.cat([index + num, index]),
            torch.arange(2 * num, device=z1.device))


def contrastive_loss(z1: Tensor,
                     z2: Tensor,
                     labels: Optional[Tensor] = None,
                     temperature: float = 0.1,
                     treatment: Optional[str] = None) -> Tensor:
    """SimCLR-style batch contrastive loss over the 2M views, label-sharing views treated.

    ``z1``, ``z2`` [M, D]: L2-normalised embeddings of two views of the same M images.
    ``labels``: ``None`` (instance labels), [M] or [L, M] pseudo labels per image.
    Returns the mean over the 2M anchors, averaged over the label levels.
    """
    views, positive_index, self_index = batch_views(z1, z2)
    view_labels = _as_levels(labels, z1.shape[0], 'labels')
    check_treatment(treatment, 'contrastive_loss')
    check_candidates(views, views, positive_index, self_index, temperature)
    logits, excluded, positive_index = candidate_logits(views, views, positive_index, self_index,
                                                        temperature)
    if view_labels is None or treatment is None:
        # With instance labels no candidate shares the anchor's label: every treatment is None.
        return masked_nce(logits, positive_index, excluded, None, None).mean()
    view_labels = torch.cat([view_labels, view_labels], dim=1).to(logits.device)
    same = view_labels.unsqueeze(2) == view_labels.unsqueeze(1)  # [L, 2M, 2M]
    return masked_nce(logits, positive_index, excluded, same, treatment).mean()


def queue_logits(q: Tensor, k: Tensor, queue: Tensor, temperature: float,
                 overwritten: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """MoCo's logits / τ: each query with its own key ``[M]`` and with the queue ``[M, K]``.

    Args:
        q: queries ``[M, D]``.
        k: their keys ``[M, D]`` (positive pairs row by row).
        queue: the negatives ``[K, D]``.
        temperature: the loss temperature τ.
        overwritten: queue rows the caller overwrites in place (its enqueue) before the
            backward; the queue is then used without a copy (see ``_QueueLogits``).
    """
    if q.ndim != 2 or q.shape != k.shape:
        raise ValueError(f'q and k must both be [M, D] with equal shapes, got {tuple(q.shape)} '
                         f'and {tuple(k.shape)}')
    if queue.ndim != 2 or queue.shape[1] != q.shape[1]:
        raise ValueError(f'queue must be [K, {q.shape[1]}], got {tuple(queue.shape)}')
    if temperature <= 0:
        raise ValueError(f'temperature must be positive, got {temperature}')
    l_pos = (q * k).sum(dim=1)
    if overwritten is None or not q.requires_grad or len(overwritten) > queue.shape[0]:
        l_neg = q @ queue.t()  # a wrap-around enqueue (batch > queue) would hit a row twice
    else:
        l_neg = _QueueLogits.apply(q, queue, overwritten)
    return l_pos / temperature, l_neg / temperature


class _QueueLogits(torch.autograd.Function):
    """``q @ queue.T`` whose backward survives one in-place write of the rows ``slots``.

    MoCo enqueues its keys into the queue in place right after the loss and before the backward.
    Saving the queue for the backward the usual way would make that write an autograd error, and
    copying the whole queue [K, D] every step to avoid it costs more than the step's own key rows.
    Instead the rows about to be overwritten ([B, D]) are kept, and the backward uses
    ``grad @ queue_now + grad[:, slots] @ (old_rows - queue_now[slots])``, which is
    ``grad @ queue_at_forward`` whether the write happened or not. Any other in-place change of the
    queue between forward and backward (seen through its version counter) is refused, as autograd
    would. No gradient flows into the queue (it is a buffer).
    """

    @staticmethod
    def forward(ctx, q: Tensor, queue: Tensor, slots: Tensor) -> Tensor:
        ctx.queue, ctx.version = queue, queue._version  # not saved: its write is allowed
        ctx.save_for_backward(slots, queue[slots])
        return q @ queue.t()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        slots, old_rows = ctx.saved_tensors
        queue = ctx.queue
        writes = queue._version - ctx.version
        if writes not in (0, 1):
            raise RuntimeError(f'the MoCo queue was modified {writes} times in place between the '
                               'loss and its backward; only the one enqueue of the step is allowed')
        grad_q = grad @ queue
        if writes:
            grad_q = grad_q + grad[:, slots] @ (old_rows - queue[slots])
        return grad_q, None, None


def check_debiasing(tau_plus: float, beta: float, owner: str = 'the loss') -> None:
    """Refuse a class prior τ⁺ outside [0, 1) or a negative hardness β, naming the fix."""
    check_number(owner, 'tau_plus', tau_plus, low=0, high=1, high_open=True,
                 hint='the class prior τ⁺, about 1 / number of classes (0 gives the uncorrected '
                 'loss)')
    check_number(owner, 'beta', beta, low=0, hint='the hardness β: 0 gives the debiased loss, '
                 'larger values weight harder negatives more')


def debiased_nce(pos_logits: Tensor,
                 neg_logits: Tensor,
                 temperature: float,
                 tau_plus: float = 0.1,
                 beta: float = 0.0,
                 negatives: Optional[Tensor] = None) -> Tensor:
    """Per-anchor debiased (β = 0) or hard-negative (β > 0) contrastive loss ``[A]`` from logits.

    Chuang et al. (NeurIPS 2020) with the reweighting of Robinson et al. (ICLR 2021). The logits
    are similarities / τ: ``pos_logits`` [A], ``neg_logits`` [A, C] of which ``negatives`` [A, C]
    marks the N negatives of each row (all C when ``None``). With pos = exp(pos_logit),
    neg_i = exp(neg_logit_i), imp_i = neg_i^β and R = N Σ imp_i·neg_i / Σ imp_i (R = Σ neg_i at
    β = 0): Ng = max((R − τ⁺·N·pos) / (1 − τ⁺), N·e^(−1/τ)) and loss = −log(pos / (pos + Ng)).
    Computed in log space (no exp of large logits); gradients flow through the weights imp_i, as
    in the authors' code.
    """
    check_debiasing(tau_plus, beta)
    check_temperature('the loss', temperature)
    if neg_logits.ndim != 2 or pos_logits.shape != neg_logits.shape[:1]:
        raise ValueError(f'pos_logits must be [A] and neg_logits [A, C], got '
                         f'{tuple(pos_logits.shape)} and {tuple(neg_logits.shape)}')
    if negatives is None:
        masked = neg_logits
        log_num = torch.full_like(pos_logits, math.log(neg_logits.shape[1]))
    else:
        masked = neg_logits.masked_fill(~negatives, float('-inf'))
        log_num = negatives.sum(dim=1).to(neg_logits.dtype).log()
    if beta == 0:
        log_neg = torch.logsumexp(masked, dim=1)
    else:
        log_neg = (log_num + torch.logsumexp((beta + 1) * masked, dim=1)
                   - torch.logsumexp(beta * masked, dim=1))
    if tau_plus > 0:
        # log(R − τ⁺·N·pos) where R is the larger; elsewhere the clamp below gives Ng. The inner
        # where keeps log1p's argument above -1, so the unused branch has a finite gradient.
        gap = math.log(tau_plus) + log_num + pos_logits - log_neg
        below = gap < 0
        corrected = log_neg + torch.log1p(-torch.exp(torch.where(below, gap, -1.0)))
        log_neg = torch.where(below, corrected, float('-inf')) - math.log1p(-tau_plus)
    log_ng = torch.maximum(log_neg, log_num - 1.0 / temperature)
    return torch.logaddexp(pos_logits, log_ng) - pos_logits


def queue_debiased_loss(q: Tensor,
                        k: Tensor,
                        queue: Tensor,
                        temperature: float = 0.2,
                        tau_plus: float = 0.01,
                        beta: float = 0.0,
                        overwritten: Optional[Tensor] = None) -> Tensor:
    """Debiased / hard-negative loss on MoCo's queue (N = K negatives), mean over the M queries.

    ``overwritten``: queue rows the caller's enqueue overwrites before the backward (see
    :func:`queue_logits`).
    """
    pos, neg = queue_logits(q, k, queue, temperature, overwritten)
    return debiased_nce(pos, neg, temperature, tau_plus, beta).mean()


def proto_nce_loss(z: Tensor, centroids: Sequence[Tensor], assignments: Tensor,
                   concentration: Sequence[Tensor]) -> Tensor:
    """Prototype term of PCL's ProtoNCE, averaged over clustering levels.

    For level ``l``: ``cross_entropy((z · c_jᵀ) / φ_j, assignment)`` over all prototypes, averaged
    over samples whose assignment is >= 0 (others are not accepted and ignored; a level without
    accepted samples contributes 0). ``z`` [M, D], ``centroids[l]`` [K_l, D],
    ``assignments`` [L, M] (or [M]), ``concentration[l]`` [K_l].
    """
    if z.ndim != 2:
        raise ValueError(f'z must be [M, D], got {tuple(z.shape)}')
    assignments = _as_levels(assignments, z.shape[0], 'assignments')
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
        # Per-sample CE with rejected targets clamped to a valid id, then masked out: no
        # data-dependent branching (and no device sync) when nothing is accepted.
        per_sample = F.cross_entropy(logits, target.clamp(min=0), reduction='none')
        per_sample = torch.where(valid, per_sample, torch.zeros_like(per_sample))
        total = total + per_sample.sum() / valid.sum().clamp(min=1).to(z.dtype)
    return total / levels
