"""Optimiser wrappers: mixed precision where a CUDA device is present, float32 elsewhere."""
import contextlib
from collections.abc import Iterator

import torch
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from timm.optim import Lars
from torch import nn

from ifnd.registry import OPTIM_WRAPPERS, OPTIMIZERS

# LARS for large-batch SimCLR/IFND: timm's maintained implementation. Parameters with
# weight_decay 0 (BN and biases through paramwise_cfg) skip the trust-ratio adaptation, as in SimCLR.
# Registered here, where the optimisers are (OPTIMIZERS imports this package on demand).
OPTIMIZERS.register_module(name='LARS', module=Lars)

# AmpOptimWrapper's keywords that a plain OptimWrapper does not take.
_AMP_ONLY = ('dtype', 'loss_scale', 'use_fsdp')


def amp_options(dtype: str | None = None) -> dict:
    """AmpOptimWrapper's dtype and loss scale: bfloat16 unscaled where the GPU has it, else float16."""
    if dtype is None:
        dtype = 'bfloat16' if torch.cuda.is_bf16_supported() else 'float16'
    if dtype == 'bfloat16':
        # bf16 has float32's exponent range: no GradScaler, so no inf check syncing every step.
        return dict(dtype='bfloat16', loss_scale=dict(enabled=False))
    return dict(dtype=dtype, loss_scale='dynamic')


class CPUBfloat16OptimWrapper(OptimWrapper):
    """An ``OptimWrapper`` whose forward runs in ``torch.autocast('cpu', torch.bfloat16)``.

    The GPU recipes' bfloat16 step on a CPU (mmengine's ``AmpOptimWrapper`` refuses to start
    without a GPU); bfloat16 has float32's exponent range, so there is no loss scaler.
    """

    @contextlib.contextmanager
    def optim_context(self, model: nn.Module) -> Iterator[None]:
        """The parent's context (gradient accumulation) with bfloat16 autocast on the CPU."""
        with super().optim_context(model), torch.autocast('cpu', dtype=torch.bfloat16):
            yield


@OPTIM_WRAPPERS.register_module()
def AutoAmpOptimWrapper(bf16_on_cpu: bool = False, **kwargs) -> OptimWrapper:  # noqa: N802
    """An ``AmpOptimWrapper`` when CUDA is available (bfloat16 autocast without a loss scaler
    where the GPU supports it, else float16 with dynamic scaling; ``dtype`` and ``loss_scale``
    given here win), else a float32 ``OptimWrapper`` with the AMP keywords dropped.

    The GPU recipes use it, so one config trains in mixed precision on a GPU and unchanged on a
    CPU; ``optim_wrapper.type=OptimWrapper`` turns mixed precision off. ``bf16_on_cpu=True``
    runs the GPU's bfloat16 autocast on a CPU too (:class:`CPUBfloat16OptimWrapper`), to check
    the recipe's precision without a GPU.
    """
    if torch.cuda.is_available():
        options = amp_options(kwargs.pop('dtype', None))
        return AmpOptimWrapper(**{**options, **kwargs})
    plain = {k: v for k, v in kwargs.items() if k not in _AMP_ONLY}
    if bf16_on_cpu:
        if kwargs.get('dtype') not in (None, 'bfloat16', torch.bfloat16):
            raise ValueError(f"bf16_on_cpu=True autocasts to bfloat16 (the CPU's autocast type), "
                             f"got dtype={kwargs['dtype']!r}: remove dtype or set it to 'bfloat16'")
        return CPUBfloat16OptimWrapper(**plain)
    return OptimWrapper(**plain)
