"""Contrastive losses with pseudo-label aware false-negative handling.

One masked InfoNCE covers the three objectives of IFND (Chen et al., ICLR 2022):

* ``'inst'`` -- instance discrimination, Eq. ``eq:contrastive``: the positive of anchor ``i`` is
  its other view ``i'``, every other candidate is a negative.
* ``'elim'`` -- false-negative elimination, Eq. ``eq:elimination``: candidates that share the
  anchor's pseudo label (other than ``i'``) leave the denominator.
* ``'attr'`` -- false-negative attraction, Eq. ``eq:attraction`` (SupCon's form): candidates that
  share the anchor's pseudo label join the positives; the denominator keeps every candidate.

Pseudo labels come as ``[L, M]`` (``L`` clustering granularities); the loss is the average over
levels. Samples whose pseudo label was not accepted must carry labels that match no other sample
(e.g. ``-(index + 1)``), which makes them pure instance-discrimination samples.

``proto_nce_loss`` is the prototype term of PCL's ProtoNCE, used by the PCL baselines.

Other ways of handling false negatives, compared with IFND:

* ``debiased_nce`` -- the debiased contrastive loss (Chuang et al., NeurIPS 2020), and with
  β > 0 hard negative sampling (Robinson et al., ICLR 2021); on SimCLR's views
  (``debiased_loss_from_candidates``) and on MoCo's queue (``queue_debiased_loss``).
* ``fnc_false_negatives`` -- FNC's detection (Huynh et al., WACV 2022) from support views, whose
  boolean mask goes to ``contrastive_loss_from_mask`` (the masked InfoNCE above, 'elim' or
  'attr', with a mask instead of labels).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

# ifnd.models.false_negatives imports this module; its settings checks import nothing of ifnd.
from ifnd.models.false_negatives.settings import check_number, check_optional, check_temperature

__all__ = [
    'LOSS_MODES',
    'masked_info_nce',
    'label_masks',
    'contrastive_loss_from_candidates',
    'contrastive_loss',
    'queue_contrastive_loss',
    'contrastive_loss_from_mask',
    'check_debiasing',
    'debiased_nce',
    'debiased_loss_from_candidates',
    'debiased_contrastive_loss',
    'queue_debiased_loss',
    'FNC_STRATEGIES',
    'FNC_AGGREGATIONS',
    'check_fnc_options',
    'fnc_false_negatives',
    'fnc_loss',
    'false_negative_detection_counts',
    'proto_nce_loss',
]

LOSS_MODES = ('inst', 'elim', 'attr')


def _check_mode(mode: str) -> None:
    if mode not in LOSS_MODES:
        raise ValueError(f'unknown contrastive loss mode {mode!r}; valid modes are {LOSS_MODES}')


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
                excluded: Tensor, mode: str) -> tuple[Tensor, Tensor]:
    """Positive and denominator masks ``[A, C]`` of one label level for the given loss mode."""
    _check_mode(mode)
    positive = positive.bool() & ~excluded.bool()
    allowed = ~excluded.bool()
    if mode == 'inst':
        return positive, allowed
    same = anchor_labels.reshape(-1, 1) == candidate_labels.reshape(1, -1)
    if mode == 'elim':
        # Eq. eq:elimination: the own positive stays even though it shares the label.
        return positive, allowed & ~(same & ~positive)
    # 'attr', Eq. eq:attraction: P(i) = {i'} ∪ {n in N(i): y_n = y_i}; S(i) is unchanged.
    return (positive | same) & allowed, allowed


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


def _check_candidates(anchors: Tensor, candidates: Tensor, positive_index: Tensor,
                      self_index: Tensor, temperature: float) -> None:
    """Refuse anchor / candidate sets whose shapes or temperature do not fit together."""
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


def _candidate_logits(anchors: Tensor, candidates: Tensor, positive_index: Tensor,
                      self_index: Tensor, temperature: float) -> tuple[Tensor, Tensor, Tensor]:
    """Logits ``[A, C]`` / τ, the anchors' own columns ``[A, C]`` and positive indices on device."""
    logits = anchors @ candidates.t() / temperature
    columns = torch.arange(candidates.shape[0], device=logits.device)
    excluded = columns.unsqueeze(0) == self_index.to(logits.device).unsqueeze(1)
    return logits, excluded, positive_index.to(logits.device)


def contrastive_loss_from_candidates(anchors: Tensor,
                                     candidates: Tensor,
                                     positive_index: Tensor,
                                     self_index: Tensor,
                                     anchor_labels: Optional[Tensor] = None,
                                     candidate_labels: Optional[Tensor] = None,
                                     temperature: float = 0.1,
                                     mode: str = 'inst',
                                     instance_if_unaccepted: bool = False) -> Tensor:
    """Per-anchor contrastive loss ``[A]`` against a candidate set, averaged over label levels.

    ``anchors`` [A, D] and ``candidates`` [C, D] are L2-normalised embeddings.
    ``positive_index[a]`` is the candidate row of anchor ``a``'s other view; ``self_index[a]`` is
    the candidate row of the anchor itself (excluded everywhere), or negative when the anchor is
    not among the candidates. ``anchor_labels`` [L, A] / ``candidate_labels`` [L, C] (or [A] /
    [C]) are pseudo labels; ``None`` means instance labels, where every mode reduces to ``'inst'``.
    A distributed caller passes its local views as anchors and the gathered views of all ranks as
    candidates. ``instance_if_unaccepted``: when no candidate label is accepted (all negative),
    return exactly the 'inst' loss, chosen on the device without a host sync. This relies on the
    module's rule that an unaccepted label matches no other sample (only the anchor's own views):
    then every level equals 'inst' bit for bit and level 0 is returned.
    """
    _check_mode(mode)
    _check_candidates(anchors, candidates, positive_index, self_index, temperature)
    num_anchors, num_candidates = anchors.shape[0], candidates.shape[0]
    if (anchor_labels is None) != (candidate_labels is None):
        raise ValueError('anchor_labels and candidate_labels must be given together')
    anchor_labels = _as_levels(anchor_labels, num_anchors, 'anchor_labels')
    candidate_labels = _as_levels(candidate_labels, num_candidates, 'candidate_labels')
    if anchor_labels is not None and anchor_labels.shape[0] != candidate_labels.shape[0]:
        raise ValueError(f'anchor_labels have {anchor_labels.shape[0]} levels but '
                         f'candidate_labels have {candidate_labels.shape[0]}')

    logits, excluded, positive_index = _candidate_logits(anchors, candidates, positive_index,
                                                         self_index, temperature)
    if anchor_labels is None or mode == 'inst':
        # With instance labels no candidate shares the anchor's label: all modes equal 'inst'.
        return _masked_nce(logits, positive_index, excluded, None, 'inst')
    anchor_labels = anchor_labels.to(logits.device)
    candidate_labels = candidate_labels.to(logits.device)
    return _label_masked_nce(logits, positive_index, excluded, anchor_labels, candidate_labels,
                             mode, instance_if_unaccepted)


def contrastive_loss_from_mask(anchors: Tensor,
                               candidates: Tensor,
                               positive_index: Tensor,
                               self_index: Tensor,
                               false_negatives: Tensor,
                               temperature: float = 0.1,
                               mode: str = 'elim') -> Tensor:
    """Per-anchor loss ``[A]`` of ``mode`` with the false negatives given as a boolean mask.

    The label-free form of :func:`contrastive_loss_from_candidates`: ``false_negatives`` [A, C]
    marks the candidates treated as false negatives of each anchor (e.g. FNC's detections);
    ``'elim'`` drops them from the denominator, ``'attr'`` makes them positives. The anchor's
    own view and its positive are never treated as false negatives.
    """
    _check_mode(mode)
    _check_candidates(anchors, candidates, positive_index, self_index, temperature)
    if false_negatives.shape != (anchors.shape[0], candidates.shape[0]):
        raise ValueError(f'false_negatives must be [{anchors.shape[0]}, {candidates.shape[0]}] '
                         f'(anchors x candidates), got {tuple(false_negatives.shape)}')
    logits, excluded, positive_index = _candidate_logits(anchors, candidates, positive_index,
                                                         self_index, temperature)
    # A copy: the masked core edits its mask in place.
    flagged = false_negatives.to(device=logits.device, dtype=torch.bool, copy=True).unsqueeze(0)
    return _masked_nce(logits, positive_index, excluded, flagged, mode)


def _label_masked_nce(logits: Tensor, positive_index: Tensor, excluded: Optional[Tensor],
                      anchor_labels: Tensor, candidate_labels: Tensor, mode: str,
                      instance_if_unaccepted: bool = False) -> Tensor:
    """Per-anchor loss ``[A]`` of ``mode`` averaged over label levels, all levels in one pass.

    Equals ``masked_info_nce`` with the masks of ``label_masks`` (the general mask form) but
    builds the ``[L, A, C]`` same-label mask with one broadcast compare and reduces every level
    at once. With ``instance_if_unaccepted`` the loss is exactly 'inst' when no candidate label
    is accepted: then every level equals the instance loss bit for bit, so level 0 alone is
    selected on the device (the mean over levels could differ in the last bit), and no separate
    instance loss is computed.
    """
    if mode == 'inst':
        return _masked_nce(logits, positive_index, excluded, None, 'inst')
    same = anchor_labels.unsqueeze(2) == candidate_labels.unsqueeze(1)  # [L, A, C]
    any_accepted = (candidate_labels >= 0).any() if instance_if_unaccepted else None
    return _masked_nce(logits, positive_index, excluded, same, mode, any_accepted)


def _masked_nce(logits: Tensor, positive_index: Tensor, excluded: Optional[Tensor],
                flagged: Optional[Tensor], mode: str,
                all_levels_if: Optional[Tensor] = None) -> Tensor:
    """Per-anchor loss ``[A]`` with ``flagged`` [L, A, C] false negatives, averaged over levels.

    The positive is the single column ``positive_index``, the excluded columns are filled with
    -inf once. ``flagged`` is edited in place (callers pass a fresh mask). ``all_levels_if``: a
    0-d bool tensor; where it is False, level 0 alone is returned (chosen on the device).
    """
    base = logits if excluded is None else logits.masked_fill(excluded, float('-inf'))
    pos_column = positive_index.unsqueeze(1)
    if flagged is None or mode == 'inst':
        return torch.logsumexp(base, dim=1) - logits.gather(1, pos_column).squeeze(1)
    levels = flagged.shape[0]
    level_pos = pos_column.unsqueeze(0).expand(levels, -1, -1)
    if mode == 'elim':
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


def contrastive_loss(z1: Tensor,
                     z2: Tensor,
                     labels: Optional[Tensor] = None,
                     temperature: float = 0.1,
                     mode: str = 'inst') -> Tensor:
    """SimCLR-style batch contrastive loss over the 2M views, with pseudo-label modes.

    ``z1``, ``z2`` [M, D]: L2-normalised embeddings of two views of the same M images.
    ``labels``: ``None`` (instance labels), [M] or [L, M] pseudo labels per image.
    Returns the mean over the 2M anchors, averaged over the label levels.
    """
    views, positive_index, self_index = _batch_views(z1, z2)
    view_labels = _as_levels(labels, z1.shape[0], 'labels')
    if view_labels is not None:
        view_labels = torch.cat([view_labels, view_labels], dim=1)
    return contrastive_loss_from_candidates(views, views, positive_index, self_index, view_labels,
                                            view_labels, temperature, mode).mean()


def _batch_views(z1: Tensor, z2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The 2M views ``cat([z1, z2])`` of one process with their positive and own rows."""
    if z1.ndim != 2 or z1.shape != z2.shape:
        raise ValueError(f'z1 and z2 must both be [M, D] with equal shapes, got {tuple(z1.shape)} '
                         f'and {tuple(z2.shape)}')
    num = z1.shape[0]
    index = torch.arange(num, device=z1.device)
    return (torch.cat([z1, z2], dim=0), torch.cat([index + num, index]),
            torch.arange(2 * num, device=z1.device))


def queue_contrastive_loss(q: Tensor,
                           k: Tensor,
                           queue: Tensor,
                           labels: Optional[Tensor] = None,
                           queue_labels: Optional[Tensor] = None,
                           temperature: float = 0.2,
                           mode: str = 'inst',
                           overwritten: Optional[Tensor] = None) -> Tensor:
    """MoCo-style loss: each query against its own key and the queue, with pseudo-label modes.

    ``q``, ``k`` [M, D] queries and keys (positive pairs row by row), ``queue`` [K, D] negatives.
    ``labels`` [M] / [L, M] are the pseudo labels of the batch, ``queue_labels`` [K] / [L, K]
    those of the queue entries (entries of unknown samples must carry labels that never match).
    ``'elim'`` drops queue entries sharing the query's label from the denominator; ``'attr'`` makes
    them positives. Returns the mean over the M queries, averaged over the label levels; with
    ``'inst'`` it is MoCo's ``cross_entropy(cat([q·k, q·queueᵀ]) / τ, 0)``.
    ``overwritten``: queue rows the caller overwrites in place (its enqueue) before the backward;
    the queue is then used without a copy (see ``_QueueLogits``).
    """
    _check_mode(mode)
    if (labels is None) != (queue_labels is None):
        raise ValueError('labels and queue_labels must be given together')
    num, size = q.shape[0], queue.shape[0]
    labels = _as_levels(labels, num, 'labels')
    queue_labels = _as_levels(queue_labels, size, 'queue_labels')
    if labels is not None and labels.shape[0] != queue_labels.shape[0]:
        raise ValueError(f'labels have {labels.shape[0]} levels but queue_labels have '
                         f'{queue_labels.shape[0]}')

    l_pos, l_neg = _queue_logits(q, k, queue, temperature, overwritten)
    logits = torch.cat([l_pos.unsqueeze(1), l_neg], dim=1)
    if labels is None:
        return F.cross_entropy(logits, logits.new_zeros(num, dtype=torch.long))

    # Column 0 (the own key) is always the positive; its label column is never read (the
    # positive column is set explicitly per level), so any value serves.
    labels, queue_labels = labels.to(q.device), queue_labels.to(q.device)
    column_labels = torch.cat([queue_labels[:, :1], queue_labels], dim=1)
    return _label_masked_nce(logits, logits.new_zeros(num, dtype=torch.long), None, labels,
                             column_labels, mode).mean()


def _queue_logits(q: Tensor, k: Tensor, queue: Tensor, temperature: float,
                  overwritten: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """MoCo's logits / τ: each query with its own key ``[M]`` and with the queue ``[M, K]``."""
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


def debiased_loss_from_candidates(anchors: Tensor,
                                  candidates: Tensor,
                                  positive_index: Tensor,
                                  self_index: Tensor,
                                  temperature: float = 0.5,
                                  tau_plus: float = 0.1,
                                  beta: float = 0.0) -> Tensor:
    """Per-anchor :func:`debiased_nce` ``[A]``: every candidate but the anchor and its positive is
    a negative (N = C − 2 for SimCLR's 2M views, gathered over the ranks)."""
    _check_candidates(anchors, candidates, positive_index, self_index, temperature)
    logits, excluded, positive_index = _candidate_logits(anchors, candidates, positive_index,
                                                         self_index, temperature)
    pos_column = positive_index.unsqueeze(1)
    negatives = (~excluded).scatter_(1, pos_column, False)
    return debiased_nce(logits.gather(1, pos_column).squeeze(1), logits, temperature, tau_plus,
                        beta, negatives)


def debiased_contrastive_loss(z1: Tensor,
                              z2: Tensor,
                              temperature: float = 0.5,
                              tau_plus: float = 0.1,
                              beta: float = 0.0) -> Tensor:
    """Debiased (β = 0) or hard-negative (β > 0) loss of SimCLR's 2M views, mean over anchors."""
    views, positive_index, self_index = _batch_views(z1, z2)
    return debiased_loss_from_candidates(views, views, positive_index, self_index, temperature,
                                         tau_plus, beta).mean()


def queue_debiased_loss(q: Tensor,
                        k: Tensor,
                        queue: Tensor,
                        temperature: float = 0.2,
                        tau_plus: float = 0.01,
                        beta: float = 0.0,
                        overwritten: Optional[Tensor] = None) -> Tensor:
    """Debiased / hard-negative loss on MoCo's queue (N = K negatives), mean over the M queries.

    ``overwritten``: queue rows the caller's enqueue overwrites before the backward (see
    :func:`queue_contrastive_loss`).
    """
    pos, neg = _queue_logits(q, k, queue, temperature, overwritten)
    return debiased_nce(pos, neg, temperature, tau_plus, beta).mean()


FNC_STRATEGIES = ('elim', 'attr')
FNC_AGGREGATIONS = ('mean', 'max')


def check_fnc_options(strategy: str, top_k: Optional[int], threshold: Optional[float],
                      aggregation: str) -> None:
    """Refuse FNC settings that cannot work, naming the fix."""
    if strategy not in FNC_STRATEGIES:
        raise ValueError(f'FNC strategy must be one of {FNC_STRATEGIES} (elimination or '
                         f'attraction), got {strategy!r}')
    _check_fnc_selection(top_k, threshold, aggregation)


def _check_fnc_selection(top_k: Optional[int], threshold: Optional[float],
                         aggregation: str) -> None:
    if aggregation not in FNC_AGGREGATIONS:
        raise ValueError(f'FNC aggregation must be one of {FNC_AGGREGATIONS}, got {aggregation!r}')
    if (top_k is None) == (threshold is None):
        raise ValueError(f'FNC needs exactly one of top_k and threshold, got top_k={top_k} and '
                         f'threshold={threshold}: set the other to None')
    check_optional('FNC', 'top_k', top_k, int, low=1, hint='false negatives per anchor image')
    check_optional('FNC', 'threshold', threshold, low=-1, high=1, high_open=True,
                   hint='a cosine similarity')


@torch.no_grad()
def fnc_false_negatives(support: Tensor,
                        candidate_views: Tensor,
                        own_index: Tensor,
                        top_k: Optional[int] = None,
                        threshold: Optional[float] = None,
                        aggregation: str = 'mean') -> Tensor:
    """FNC's false negatives ``[M, N]`` of M anchor images among N candidate images (boolean).

    ``support`` [M, S, D]: the anchor images' S support-view embeddings; ``candidate_views``
    [V, N, D]: the V views of each candidate image (all L2-normalised); ``own_index[m]``: anchor
    image m's own column (never flagged). The score of (m, n) aggregates cos(support, view) over
    the S × V pairs (``'mean'`` or ``'max'``), so both views of an image are flagged together;
    flagged are each row's ``top_k`` highest scores or the scores above ``threshold``.
    """
    _check_fnc_selection(top_k, threshold, aggregation)
    if support.ndim != 3 or candidate_views.ndim != 3 or support.shape[2] != candidate_views.shape[2]:
        raise ValueError(f'support must be [M, S, D] and candidate_views [V, N, D], got '
                         f'{tuple(support.shape)} and {tuple(candidate_views.shape)}')
    (num, views, dim), size = support.shape, candidate_views.shape[1]
    if own_index.shape != (num, ):
        raise ValueError(f'own_index must have shape [{num}], got {tuple(own_index.shape)}')
    sims = (support.reshape(-1, dim) @ candidate_views.reshape(-1, dim).t()).view(
        num, views, candidate_views.shape[0], size)
    scores = sims.mean(dim=(1, 2)) if aggregation == 'mean' else sims.amax(dim=(1, 2))
    own = torch.arange(size, device=scores.device).unsqueeze(0) == own_index.to(scores.device).unsqueeze(1)
    if threshold is not None:
        return (scores > threshold) & ~own
    if top_k >= size - 1:
        raise ValueError(f'FNC top_k={top_k} would flag all {size - 1} other images of the batch '
                         f'(every negative): use top_k below {size - 1} or a larger batch')
    top = scores.masked_fill(own, float('-inf')).topk(top_k, dim=1).indices
    return torch.zeros_like(own).scatter_(1, top, True)


def fnc_loss(z1: Tensor,
             z2: Tensor,
             support: Tensor,
             temperature: float = 0.5,
             strategy: str = 'elim',
             top_k: Optional[int] = None,
             threshold: Optional[float] = None,
             aggregation: str = 'mean') -> Tensor:
    """FNC on SimCLR's 2M views of one process, mean over anchors; ``support`` is [M, S, D].

    The flags of :func:`fnc_false_negatives` (image-wise, for both views of each anchor and
    candidate image) go to :func:`contrastive_loss_from_mask` with ``strategy`` as its mode.
    """
    check_fnc_options(strategy, top_k, threshold, aggregation)
    views, positive_index, self_index = _batch_views(z1, z2)
    num = z1.shape[0]
    flags = fnc_false_negatives(support, views.detach().view(2, num, -1),
                                torch.arange(num, device=z1.device), top_k, threshold, aggregation)
    return contrastive_loss_from_mask(views, views, positive_index, self_index, flags.repeat(2, 2),
                                      temperature, strategy).mean()


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
