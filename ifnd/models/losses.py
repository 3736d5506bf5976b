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
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    'LOSS_MODES',
    'masked_info_nce',
    'label_masks',
    'contrastive_loss_from_candidates',
    'contrastive_loss',
    'queue_contrastive_loss',
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
    if anchors.ndim != 2 or candidates.ndim != 2:
        raise ValueError(f'anchors and candidates must be 2-D, got {tuple(anchors.shape)} and '
                         f'{tuple(candidates.shape)}')
    if anchors.shape[1] != candidates.shape[1]:
        raise ValueError(f'anchors have dimension {anchors.shape[1]} but candidates have '
                         f'{candidates.shape[1]}')
    num_anchors, num_candidates = anchors.shape[0], candidates.shape[0]
    for name, index in (('positive_index', positive_index), ('self_index', self_index)):
        if index.shape != (num_anchors, ):
            raise ValueError(f'{name} must have shape [{num_anchors}], got {tuple(index.shape)}')
    if temperature <= 0:
        raise ValueError(f'temperature must be positive, got {temperature}')
    if (anchor_labels is None) != (candidate_labels is None):
        raise ValueError('anchor_labels and candidate_labels must be given together')
    anchor_labels = _as_levels(anchor_labels, num_anchors, 'anchor_labels')
    candidate_labels = _as_levels(candidate_labels, num_candidates, 'candidate_labels')
    if anchor_labels is not None and anchor_labels.shape[0] != candidate_labels.shape[0]:
        raise ValueError(f'anchor_labels have {anchor_labels.shape[0]} levels but '
                         f'candidate_labels have {candidate_labels.shape[0]}')

    logits = anchors @ candidates.t() / temperature
    columns = torch.arange(num_candidates, device=logits.device)
    excluded = columns.unsqueeze(0) == self_index.to(logits.device).unsqueeze(1)
    positive_index = positive_index.to(logits.device)
    if anchor_labels is None:
        # With instance labels no candidate shares the anchor's label: all modes equal 'inst'.
        return _label_masked_nce(logits, positive_index, excluded, None, None, 'inst')
    anchor_labels = anchor_labels.to(logits.device)
    candidate_labels = candidate_labels.to(logits.device)
    return _label_masked_nce(logits, positive_index, excluded, anchor_labels, candidate_labels,
                             mode, instance_if_unaccepted)


def _label_masked_nce(logits: Tensor, positive_index: Tensor, excluded: Optional[Tensor],
                      anchor_labels: Optional[Tensor], candidate_labels: Optional[Tensor],
                      mode: str, instance_if_unaccepted: bool = False) -> Tensor:
    """Per-anchor loss ``[A]`` of ``mode`` averaged over label levels, all levels in one pass.

    Equals ``masked_info_nce`` with the masks of ``label_masks`` (the general mask form) but
    builds the ``[L, A, C]`` same-label mask with one broadcast compare and reduces every level
    at once: the positive is the single column ``positive_index``, the excluded columns are
    filled with -inf once. With ``instance_if_unaccepted`` the loss is exactly 'inst' when no
    candidate label is accepted: then every level equals the instance loss bit for bit, so level
    0 alone is selected on the device (the mean over levels could differ in the last bit), and no
    separate instance loss is computed.
    """
    base = logits if excluded is None else logits.masked_fill(excluded, float('-inf'))
    pos_column = positive_index.unsqueeze(1)
    if anchor_labels is None or mode == 'inst':
        return torch.logsumexp(base, dim=1) - logits.gather(1, pos_column).squeeze(1)
    levels = anchor_labels.shape[0]
    same = anchor_labels.unsqueeze(2) == candidate_labels.unsqueeze(1)  # [L, A, C]
    level_pos = pos_column.unsqueeze(0).expand(levels, -1, -1)
    if mode == 'elim':
        # Eq. eq:elimination: label-mates leave the denominator, the own positive stays.
        same.scatter_(2, level_pos, False)
        per_level = torch.logsumexp(base.unsqueeze(0).masked_fill(same, float('-inf')), dim=2)
        subtract = logits.gather(1, pos_column).squeeze(1)
    else:
        # 'attr', Eq. eq:attraction: label-mates join the positives; S(i) is unchanged.
        same.scatter_(2, level_pos, True)
        if excluded is not None:
            same.masked_fill_(excluded.unsqueeze(0), False)
        num_pos = same.sum(dim=2).to(logits.dtype)
        pos_sum = torch.where(same, logits.unsqueeze(0), 0.0).sum(dim=2)
        per_level = torch.logsumexp(base, dim=1).unsqueeze(0) - pos_sum / num_pos
        subtract = None
    loss = per_level.mean(dim=0)
    if instance_if_unaccepted:
        # Selected on the device (no host sync); the unselected branch gets exact zero gradients.
        loss = torch.where((candidate_labels >= 0).any(), loss, per_level[0])
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
    if z1.ndim != 2 or z1.shape != z2.shape:
        raise ValueError(f'z1 and z2 must both be [M, D] with equal shapes, got {tuple(z1.shape)} '
                         f'and {tuple(z2.shape)}')
    num = z1.shape[0]
    views = torch.cat([z1, z2], dim=0)
    index = torch.arange(num, device=z1.device)
    positive_index = torch.cat([index + num, index])
    self_index = torch.arange(2 * num, device=z1.device)
    view_labels = _as_levels(labels, num, 'labels')
    if view_labels is not None:
        view_labels = torch.cat([view_labels, view_labels], dim=1)
    return contrastive_loss_from_candidates(views, views, positive_index, self_index, view_labels,
                                            view_labels, temperature, mode).mean()


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
    if q.ndim != 2 or q.shape != k.shape:
        raise ValueError(f'q and k must both be [M, D] with equal shapes, got {tuple(q.shape)} '
                         f'and {tuple(k.shape)}')
    if queue.ndim != 2 or queue.shape[1] != q.shape[1]:
        raise ValueError(f'queue must be [K, {q.shape[1]}], got {tuple(queue.shape)}')
    if temperature <= 0:
        raise ValueError(f'temperature must be positive, got {temperature}')
    if (labels is None) != (queue_labels is None):
        raise ValueError('labels and queue_labels must be given together')
    num, size = q.shape[0], queue.shape[0]
    labels = _as_levels(labels, num, 'labels')
    queue_labels = _as_levels(queue_labels, size, 'queue_labels')
    if labels is not None and labels.shape[0] != queue_labels.shape[0]:
        raise ValueError(f'labels have {labels.shape[0]} levels but queue_labels have '
                         f'{queue_labels.shape[0]}')

    l_pos = (q * k).sum(dim=1, keepdim=True)
    if overwritten is None or not q.requires_grad or len(overwritten) > size:
        l_neg = q @ queue.t()  # a wrap-around enqueue (batch > queue) would hit a row twice
    else:
        l_neg = _QueueLogits.apply(q, queue, overwritten)
    logits = torch.cat([l_pos, l_neg], dim=1) / temperature
    if labels is None:
        return F.cross_entropy(logits, logits.new_zeros(num, dtype=torch.long))

    # Column 0 (the own key) is always the positive; its label column is never read (the
    # positive column is set explicitly per level), so any value serves.
    labels, queue_labels = labels.to(q.device), queue_labels.to(q.device)
    column_labels = torch.cat([queue_labels[:, :1], queue_labels], dim=1)
    return _label_masked_nce(logits, logits.new_zeros(num, dtype=torch.long), None, labels,
                             column_labels, mode).mean()


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
