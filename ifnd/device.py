"""Running on the training device: ``compile`` settings as the configs give them (``'auto'``: compiled
on CUDA only, a bool, or a dict of ``torch.compile`` options) and host-to-device copies that never
wait for the device."""
from typing import Literal, Union

import torch

CompileSetting = Union[bool, Literal['auto'], dict]


def check_compile(setting: CompileSetting, owner: str = 'compile') -> None:
    """Refuse a ``compile`` setting that is neither a bool, ``'auto'`` nor a dict, naming the choices."""
    if setting != 'auto' and not isinstance(setting, (bool, dict)):
        raise ValueError(f"{owner} must be a bool, 'auto' or a dict of torch.compile options "
                         f"(e.g. dict(backend='eager')), got {setting!r}")


def compile_options(setting: CompileSetting, device: torch.device | str) -> dict | None:
    """The ``torch.compile`` options of ``setting`` on ``device``, or None to run eagerly.

    ``'auto'`` compiles on CUDA only: on a CPU inductor's compile time is rarely won back. Shapes
    are static unless the dict says otherwise: training batches have one size (drop_last) and
    feature extraction pads its last batch, so each mode compiles once, to fixed-size kernels
    (under automatic dynamic shapes, a training step after an extraction at another batch size
    would compile a dynamic-batch graph).
    """
    check_compile(setting)
    if setting == 'auto':
        setting = torch.device(device).type == 'cuda'
    if setting is False:
        return None
    return {'dynamic': False, **({} if setting is True else setting)}


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A CPU tensor on ``device`` without a host wait: copied from pinned memory with ``non_blocking``.

    A plain ``.to(cuda)`` of pageable memory waits for the device to finish its queued work, so the
    host can no longer run ahead of it (each step's host time and device time would add up).
    """
    device = torch.device(device)
    if device.type == 'cuda' and tensor.device.type == 'cpu':
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)
