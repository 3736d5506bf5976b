"""Split BatchNorm: shuffle-BN of several GPUs emulated in one forward pass on one device.

MoCo encodes its keys with BatchNorm statistics of sub-batches (one per GPU, after a shuffle) so
that a query cannot find its key through the batch statistics. In one process the key batch used
to be encoded in ``G`` sequential forwards of ``N / G`` samples; :class:`SplitBatchNorm` gives the
same result in one forward: the sample ``i`` of the input belongs to group ``i % G`` (a free view
``[N, C, ...] -> [N / G, G * C, ...]``), every group is normalised with its own statistics, and the
running statistics are updated as the ``G`` sequential updates would have done.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ['SplitBatchNorm', 'convert_split_batchnorm', 'split_batchnorm']


class SplitBatchNorm(nn.BatchNorm1d):
    """BatchNorm (1-d, 2-d or 3-d input) with per-group batch statistics in training mode.

    ``num_splits`` (set by :func:`split_batchnorm`, 1 otherwise, where it is a plain BatchNorm):
    sample ``i`` is normalised with the statistics of the samples ``j`` with ``j % G == i % G``.
    The running statistics follow the ``G`` groups in order ``0 .. G-1`` as ``G`` sequential
    BatchNorm updates, and ``num_batches_tracked`` grows by ``G``. Parameters, buffers and
    state-dict keys are those of ``nn.BatchNorm{1,2,3}d``.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # An instance attribute from the start, not a class default: a compiled encoder guards on
        # where it is found, so the first split_batchnorm() would otherwise recompile the eval
        # (feature extraction) graph.
        self.num_splits = 1

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f'expected at least 2-D input, got {input.dim()}-D')

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalised input; per group of samples when training with ``num_splits`` > 1."""
        groups = self.num_splits
        if groups == 1 or not self.training:
            return super().forward(input)
        num, channels = input.shape[0], input.shape[1]
        if num % groups:
            raise ValueError(f'a batch of {num} cannot be split into {groups} equal groups')
        # reshape, not view: a channels-last input needs a copy here, a contiguous one does not.
        grouped = input.reshape(num // groups, groups * channels, *input.shape[2:])
        weight = None if self.weight is None else self.weight.repeat(groups)
        bias = None if self.bias is None else self.bias.repeat(groups)
        if not self.track_running_stats:
            out = F.batch_norm(grouped, None, None, weight, bias, True, 0.0, self.eps)
            return out.view_as(input)
        # With momentum 1 F.batch_norm writes each group's statistics (mean, unbiased variance)
        # into these temporaries exactly, at no extra pass over the activations.
        group_mean = self.running_mean.new_zeros(groups * channels)
        group_var = self.running_var.new_zeros(groups * channels)
        out = F.batch_norm(grouped, group_mean, group_var, weight, bias, True, 1.0, self.eps)
        self._update_running_stats(group_mean.view(groups, channels),
                                   group_var.view(groups, channels))
        return out.view_as(input)

    @torch.no_grad()
    def _update_running_stats(self, group_mean: torch.Tensor, group_var: torch.Tensor) -> None:
        groups = group_mean.shape[0]
        if self.momentum is None:
            # Cumulative average: the factor changes with every update, so apply them in order.
            for g in range(groups):
                self.num_batches_tracked.add_(1)
                factor = 1.0 / self.num_batches_tracked.to(group_mean.dtype)
                self.running_mean.lerp_(group_mean[g], factor)
                self.running_var.lerp_(group_var[g], factor)
            return
        # G sequential EMA updates r <- (1 - m) r + m s_g in closed form (no device sync):
        # r_G = (1 - m)^G r_0 + sum_g m (1 - m)^(G - 1 - g) s_g.
        m = self.momentum
        decay = (1.0 - m) ** torch.arange(groups - 1, -1, -1, dtype=group_mean.dtype,
                                          device=group_mean.device)
        weights = (m * decay).unsqueeze(1)
        keep = (1.0 - m) ** groups
        self.running_mean.mul_(keep).add_((weights * group_mean).sum(0))
        self.running_var.mul_(keep).add_((weights * group_var).sum(0))
        self.num_batches_tracked.add_(groups)


def convert_split_batchnorm(module: nn.Module) -> nn.Module:
    """``module`` with each plain ``nn.BatchNorm{1,2,3}d`` replaced by a :class:`SplitBatchNorm`."""
    if type(module) in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d):
        converted = SplitBatchNorm(module.num_features, module.eps, module.momentum,
                                   module.affine, module.track_running_stats,
                                   device=_device_of(module), dtype=_dtype_of(module))
        converted.load_state_dict(module.state_dict())
        if module.affine:
            converted.weight.requires_grad_(module.weight.requires_grad)
            converted.bias.requires_grad_(module.bias.requires_grad)
        converted.train(module.training)
        return converted
    for name, child in module.named_children():
        new = convert_split_batchnorm(child)
        if new is not child:
            setattr(module, name, new)
    return module


def _device_of(module: nn.Module) -> torch.device | None:
    tensor = next(iter(module.state_dict().values()), None)
    return None if tensor is None else tensor.device


def _dtype_of(module: nn.Module) -> torch.dtype | None:
    for tensor in list(module.parameters()) + [getattr(module, 'running_mean', None)]:
        if tensor is not None:
            return tensor.dtype
    return None


@contextlib.contextmanager
def split_batchnorm(module: nn.Module, num_splits: int) -> Iterator[None]:
    """Within the block, every :class:`SplitBatchNorm` of ``module`` uses ``num_splits`` groups."""
    layers = [m for m in module.modules() if isinstance(m, SplitBatchNorm)]
    for layer in layers:
        layer.num_splits = num_splits
    try:
        yield
    finally:
        for layer in layers:
            layer.num_splits = 1
