"""The debiased contrastive loss (Chuang et al., NeurIPS 2020) and hard negative sampling
(Robinson et al., ICLR 2021), on a batch's negatives or MoCo's queue."""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from ifnd.settings import check_number, check_temperature

from .nce import queue_logits


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
