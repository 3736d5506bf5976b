"""Checkpoint safety: atomic writes, and resume under ``torch.load(weights_only=True)``."""
import os
import tempfile
from pathlib import Path

import torch
from mmengine.fileio import LocalBackend, register_backend
from mmengine.runner import Runner

from ifnd.registry import RUNNERS


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
        fd, tmp = tempfile.mkstemp(dir=folder, prefix='.tmp_', suffix=os.path.basename(filepath))
        try:
            with os.fdopen(fd, 'wb') as f:
                f.write(obj)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, filepath)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
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

    def load_checkpoint(self, filename: str, map_location='cpu', strict: bool = False,
                        revise_keys: list = [(r'^module.', '')]):  # noqa: B006 (mmengine's API)
        """Load a checkpoint into the model under the allow-list."""
        with torch.serialization.safe_globals(mmengine_checkpoint_globals()):
            return super().load_checkpoint(filename, map_location, strict, revise_keys)
