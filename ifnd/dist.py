"""Collectives that degrade to identities in a single process."""
import torch
import torch.distributed as torch_dist
from mmengine.dist import (all_gather, all_reduce, get_dist_info, get_rank, get_world_size,
                           is_distributed)


class _GatherWithGrad(torch.autograd.Function):
    """All-gather along dim 0 whose backward hands each rank the summed gradient of its rows."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(get_world_size())]
        torch_dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        # Every rank's loss may depend on this rank's rows: sum the gradients of all ranks.
        grad = grad.contiguous()
        torch_dist.all_reduce(grad)
        return grad.chunk(get_world_size(), dim=0)[get_rank()]


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` from all ranks along dim 0, letting gradients flow back to each rank."""
    if not is_distributed() or get_world_size() == 1:
        return x
    return _GatherWithGrad.apply(x)


def gather_no_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` (same shape on every rank) from all ranks along dim 0, detached."""
    if not is_distributed() or get_world_size() == 1:
        return x.detach()
    return torch.cat(all_gather(x.detach().contiguous()), dim=0)


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` in place over all ranks and return it (``x`` unchanged in one process)."""
    if is_distributed() and get_world_size() > 1:
        all_reduce(x)
    return x


def shard_index(num: int) -> torch.Tensor:
    """Indices of the samples this rank handles out of ``num``: ``rank::world_size``."""
    rank, world_size = get_dist_info()
    return torch.arange(rank, num, world_size)


def gather_shards(x: torch.Tensor, num: int) -> torch.Tensor:
    """Every rank's rows for the samples ``shard_index(num)``, all-gathered in sample order."""
    world_size = get_dist_info()[1]
    if world_size == 1:
        return x
    # Shards differ in length by at most one: pad to equal size, gather, then interleave back.
    per_rank = -(-num // world_size)
    padded = x.new_zeros((per_rank, *x.shape[1:]))
    padded[:len(x)] = x
    return torch.stack(all_gather(padded), dim=1).reshape(-1, *x.shape[1:])[:num]
