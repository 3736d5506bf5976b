"""The safe checkpoint reader: ``torch.load(weights_only=True)`` with mmengine's plain-data state
allowed, errors that name the file and the fix, and a check that a state dict fits a model."""
import os
import pickle
import re

import torch
from mmengine.runner.checkpoint import _load_checkpoint


def mmengine_checkpoint_globals() -> list:
    """The plain-data objects that mmengine's resume state holds, for ``weights_only`` loads.

    The message hub's history buffers hold numpy arrays and scalars, and a table of their
    statistics methods pickled as ``getattr(HistoryBuffer, name)``. ``getattr`` is safe to allow
    here because the weights-only unpickler still refuses to call anything not allow-listed.
    """
    import numpy as np
    from mmengine.logging import HistoryBuffer

    dtype_classes = [getattr(np.dtypes, name) for name in dir(np.dtypes) if name.endswith('DType')]
    return [HistoryBuffer, getattr, np.ndarray, np.dtype, *dtype_classes,
            np._core.multiarray._reconstruct, np._core.multiarray.scalar]


def read_checkpoint(filename: str, map_location='cpu') -> dict:
    """A checkpoint file read with ``weights_only=True``, with errors that name the file and the fix."""
    if not os.path.isfile(filename):
        raise FileNotFoundError(f'checkpoint not found: {filename}')
    try:
        with torch.serialization.safe_globals(mmengine_checkpoint_globals()):
            checkpoint = _load_checkpoint(filename, map_location=map_location)
    except (RuntimeError, EOFError, pickle.UnpicklingError) as err:
        if 'Weights only load failed' in str(err):
            # e.g. solo-learn's or VISSL's hyper-parameters as OmegaConf/AttrDict objects.
            found = re.search(r'GLOBAL (\S+)', str(err))
            raise ValueError(
                f'{filename} holds Python objects that safe (weights_only) loading refuses'
                f'{" (" + found.group(1) + ")" if found else ""}. If you trust the file, keep its '
                "weights alone: python -c \"import torch; c = torch.load('IN', weights_only=False); "
                "torch.save({'state_dict': c['state_dict']}, 'OUT')\" and pass OUT") from None
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f'checkpoint {filename} is truncated or corrupt ({reason}); use an earlier '
                         'checkpoint of the run (--resume PATH/epoch_N.pth) or copy the file again') from err
    if not isinstance(checkpoint, dict):
        raise ValueError(f'{filename} holds a {type(checkpoint).__name__}, not a state dict or checkpoint')
    return checkpoint


def check_state_fits(model: torch.nn.Module, state: dict, filename: str) -> None:
    """Raise ``ValueError`` naming the differences when a state dict was written for another model."""
    state = {k[len('module.'):] if k.startswith('module.') else k: v for k, v in state.items()}
    target = model.state_dict()
    # Per-sample state (the pseudo-label bank, GloFND's thresholds) is sized by the data set and
    # takes the stored shapes when loading.
    resizable = {f'{name}.{key}' if name else key for name, module in model.named_modules()
                 if getattr(module, 'sized_by_data', False)
                 for key, _ in module.named_buffers(recurse=False)}
    missing = sorted(set(target) - set(state))
    unexpected = sorted(set(state) - set(target))
    mismatched = sorted(f'{k} {tuple(state[k].shape)} vs {tuple(target[k].shape)}'
                        for k in set(state) & set(target) - resizable
                        if hasattr(state[k], 'shape') and state[k].shape != target[k].shape)
    if missing or unexpected or mismatched:
        def first(items: list[str]) -> str:
            return ', '.join(items[:3]) + (f' and {len(items) - 3} more' if len(items) > 3 else '')
        parts = [f'{len(v)} {name} ({first(v)})' for name, v in
                 (('missing keys', missing), ('unexpected keys', unexpected),
                  ('shape mismatches', mismatched)) if v]
        raise ValueError(f'checkpoint {filename} does not fit the model {type(model).__name__}: '
                         f'{"; ".join(parts)}. It was written for another architecture or config: '
                         'train or resume with the config it was written with, or load only its '
                         'backbone (model.pretrained=..., tools/extract_backbone.py)')
