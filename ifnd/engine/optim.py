"""Optimiser wrappers: mixed precision where a CUDA device is present, float32 elsewhere."""
import torch
from mmengine.optim import AmpOptimWrapper, OptimWrapper

from ifnd.registry import OPTIM_WRAPPERS

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


@OPTIM_WRAPPERS.register_module()
def AutoAmpOptimWrapper(**kwargs) -> OptimWrapper:  # noqa: N802 (a config type name)
    """An ``AmpOptimWrapper`` when CUDA is available (bfloat16 autocast without a loss scaler
    where the GPU supports it, else float16 with dynamic scaling; ``dtype`` and ``loss_scale``
    given here win), else a float32 ``OptimWrapper`` with the AMP keywords dropped.

    The GPU recipes use it, so one config trains in mixed precision on a GPU and unchanged on a
    CPU; ``optim_wrapper.type=OptimWrapper`` turns mixed precision off.
    """
    if torch.cuda.is_available():
        options = amp_options(kwargs.pop('dtype', None))
        return AmpOptimWrapper(**{**options, **kwargs})
    return OptimWrapper(**{k: v for k, v in kwargs.items() if k not in _AMP_ONLY})
