"""The masked InfoNCE of IFND's three objectives (Eqs. 1, 3, 4) and its logits: SimCLR's candidate
views, MoCo's queue."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ifnd.settings import check_temperature


# Of the flagged false negatives; None: not treated (instance loss). 'zero' is HCSC's code: a dropped
# negative's logit multiplied by 0, so it still adds e^0 to the denominator.
TREATMENTS = ('elim', 'attr', 'zero')


def check_treatment(treatment: Optional[str], owner: str = 'the model') -> None:
    """Refuse a treatment other than ``None``, ``'elim'`` and ``'attr'``, naming the fix."""
    if treatment is not None and (not isinstance(treatment, str) or treatment not in TREATMENTS):
        raise ValueError(f'{owner}: treatment must be None or one of {TREATMENTS} (elimination, '
                         f'attraction or zeroed logits of the flagged false negatives), got {treatment!r}')


def label_levels(labels: Optional[Tensor], length: int, name: str) -> Optional[Tensor]:
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
        treatment: ``None`` (instance loss), ``'elim'`` (flagged leave the denominator),
            ``'attr'`` (flagged join the positives) or ``'zero'`` (flagged logits set to 0, HCSC's
            code: each still adds e^0 to the denominator, with no gradient).
        all_levels_if: a 0-d bool tensor; where it is False, level 0 alone is returned (chosen on
            the device, no host sync).
    """
    base = logits if excluded is None else logits.masked_fill(excluded, float('-inf'))
    pos_column = positive_index.unsqueeze(1)
    if flagged is None or treatment is None:
        return torch.logsumexp(base, dim=1) - logits.gather(1, pos_column).squeeze(1)
    levels = flagged.shape[0]
    level_pos = pos_column.unsqueeze(0).expand(levels, -1, -1)
    if treatment in ('elim', 'zero'):
        # Eq. eq:elimination: flagged candidates leave the denominator, the own positive stays;
        # 'zero' keeps them there with logit 0 (never an excluded column).
        flagged.scatter_(2, level_pos, False)
        if treatment == 'zero' and excluded is not None:
            flagged.masked_fill_(excluded.unsqueeze(0), False)
        dropped = float('-inf') if treatment == 'elim' else 0.0
        per_level = torch.logsumexp(base.unsqueeze(0).masked_fill(flagged, dropped), dim=2)
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
    view_labels = label_levels(labels, z1.shape[0], 'labels')
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
