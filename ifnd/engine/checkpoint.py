"""Checkpoint safety: atomic writes, resume under ``torch.load(weights_only=True)``, clear errors."""
import glob
import os
import pickle
import re
import tempfile
from pathlib import Path

import torch
from mmengine.fileio import LocalBackend, register_backend
from mmengine.model import is_model_wrapper
from mmengine.runner import Runner, find_latest_checkpoint
from mmengine.runner.checkpoint import _load_checkpoint, _load_checkpoint_to_model

from ifnd.registry import RUNNERS


# Temp files of unfinished atomic writes; a process killed mid-write leaves one behind.
TEMP_PREFIX = '.tmp_'


@register_backend('atomic_local')
class AtomicLocalBackend(LocalBackend):
    """Local storage whose writes are atomic: a temp file in the same folder, then a rename.

    A run killed while saving leaves the previous checkpoint (and ``last_checkpoint``) intact.
    Select it with ``backend_args=dict(backend='atomic_local')`` on the CheckpointHook.
    """

    def put(self, obj: bytes, filepath: str | Path) -> None:
        """Write bytes to ``filepath`` atomically."""
        folder = os.path.dirname(os.path.abspath(filepath))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=TEMP_PREFIX, suffix=os.path.basename(filepath))
        try:
            with os.fdopen(fd, 'wb') as f:
                f.write(obj)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, filepath)
        except BaseException as err:
            if os.path.exists(tmp):
                os.unlink(tmp)
            if isinstance(err, OSError):
                kept = ('its previous version is intact' if os.path.exists(filepath)
                        else 'earlier files are intact')
                raise OSError(err.errno, f'could not write {filepath} ({err.strerror or err}); {kept}. '
                              f'Free space in {folder} (or choose another --work-dir) and run again '
                              '(--resume continues from the last checkpoint)') from err
            raise

    def put_text(self, obj: str, filepath: str | Path, encoding: str = 'utf-8') -> None:
        """Write text to ``filepath`` atomically."""
        self.put(obj.encode(encoding), filepath)


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


@RUNNERS.register_module()
class SafeLoadRunner(Runner):
    """mmengine's Runner whose checkpoint loads (resume included) allow mmengine's own state.

    torch >= 2.6 loads with ``weights_only=True`` and refuses mmengine's resume state; rather
    than loading untrusted files with ``weights_only=False``, the few plain-data classes it needs
    are allowed, only while loading.
    """

    def load_or_resume(self) -> None:
        """Load or resume as mmengine does, but refuse ``--resume`` when there is nothing to resume."""
        if self._resume and self._load_from is None and not self._has_loaded:
            if find_latest_checkpoint(self.work_dir) is None:
                raise FileNotFoundError(
                    f'--resume found no checkpoint in {self.work_dir} (no last_checkpoint file); '
                    'start the run without --resume, or pass the file: --resume PATH/epoch_N.pth')
        if self._resume and not self._has_loaded:
            self._remove_unfinished_writes()
        super().load_or_resume()

    def build_train_loop(self, loop):
        """mmengine's training loop, refusing a data loader that yields no batch at all."""
        loop = super().build_train_loop(loop)
        dataloader = getattr(loop, 'dataloader', None)
        if dataloader is not None and hasattr(dataloader, '__len__') and len(dataloader) == 0:
            raise ValueError(empty_loader_message(dataloader))
        return loop

    def _remove_unfinished_writes(self) -> None:
        # Checkpoints in the work dir, pseudo labels and summaries one folder down.
        for path in glob.glob(os.path.join(self.work_dir, TEMP_PREFIX + '*')) + \
                glob.glob(os.path.join(self.work_dir, '*', TEMP_PREFIX + '*')):
            os.unlink(path)
            self.logger.info(f'Removed {path}, left by a run stopped while writing it')

    def load_checkpoint(self, filename: str, map_location='cpu', strict: bool = False,
                        revise_keys: list = [(r'^module.', '')]):  # noqa: B006 (mmengine's API)
        """Load a checkpoint into the model under the allow-list, refusing files that do not fit it."""
        checkpoint = read_checkpoint(filename, map_location)
        self.call_hook('after_load_checkpoint', checkpoint=checkpoint)
        model = self.model.module if is_model_wrapper(self.model) else self.model
        check_state_fits(model, checkpoint.get('state_dict', checkpoint), filename)
        _load_checkpoint_to_model(model, checkpoint, strict, revise_keys=revise_keys)
        self._has_loaded = True
        self.logger.info(f'Load checkpoint from {filename}')
        return checkpoint


def empty_loader_message(dataloader) -> str:
    """Why a training data loader has no batch (too few samples for one batch), and the fix."""
    from mmengine.dist import get_world_size
    num = len(dataloader.dataset)
    world = get_world_size()
    per_process = len(dataloader.sampler) if hasattr(dataloader.sampler, '__len__') else num
    batch_size = dataloader.batch_size or getattr(dataloader.batch_sampler, 'batch_size', None)
    drop_last = getattr(dataloader.batch_sampler, 'drop_last', dataloader.drop_last)
    where = f'{num} samples' + (f' ({per_process} per process over {world})' if world > 1 else '')
    if num == 0 or not drop_last:
        return (f'the training set has {where}: no batch to train on and the checkpoints would '
                'be untrained; check train_dataloader.dataset (data_root, subset_fraction)')
    return (f'the training set has {where}, fewer than one batch of {batch_size} with '
            'drop_last=True: no iteration would run and the checkpoints would be untrained; set '
            f'train_dataloader.batch_size to at most {per_process} or '
            'train_dataloader.drop_last=False (or use more data)')


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
    # The pseudo-label bank is sized by the data set and takes the stored shapes when loading.
    resizable = {k for k in target if '.label_bank.' in f'.{k}'}
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
