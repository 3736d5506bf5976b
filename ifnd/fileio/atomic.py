"""Atomic file writes: a temp file in the same folder, flushed to disk, then renamed over the target.

A process killed mid-write leaves the previous file intact (and a ``TEMP_PREFIX`` file that
resuming removes).
"""
import errno
import os
import tempfile
from pathlib import Path

from mmengine.fileio import LocalBackend, register_backend

from ifnd.fileio.plain_files import check_own_path, check_replaceable

# Temp files of unfinished atomic writes; a process killed mid-write leaves one behind.
TEMP_PREFIX = '.tmp_'


def _advice(err: OSError, folder: str) -> str:
    """What to do about a write that failed with ``err`` in ``folder``."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return f'Free space in {folder} (or choose another --work-dir)'
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f'make {folder} writable (or choose another --work-dir)'
    return f'check {folder} (or choose another --work-dir)'


@register_backend('atomic_local')
class AtomicLocalBackend(LocalBackend):
    """Local storage whose writes are atomic: a temp file in the same folder, then a rename.

    A run killed while saving leaves the previous checkpoint (and ``last_checkpoint``) intact.
    Select it with ``backend_args=dict(backend='atomic_local')`` on the CheckpointHook.
    """

    def put(self, obj: bytes, filepath: str | Path) -> None:
        """Write bytes to ``filepath`` atomically."""
        filepath = str(filepath)
        check_replaceable(filepath)
        folder = os.path.dirname(os.path.abspath(filepath))
        try:
            os.makedirs(folder, exist_ok=True)
        except FileExistsError:  # something else than a folder has its name
            check_own_path(folder, 'folder', folder=True)
            raise
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
                check_replaceable(filepath)  # a folder put there meanwhile is named as such
                kept = ('its previous version is intact' if os.path.exists(filepath)
                        else 'earlier files are intact')
                # The message alone, without '[Errno N]' before it: the tools print it as their line.
                failed = OSError(f'could not write {filepath} ({err.strerror or err}); {kept}. '
                                 f'{_advice(err, folder)} and run again (--resume continues from '
                                 'the last checkpoint)')
                failed.errno = err.errno
                raise failed from err
            raise

    def put_text(self, obj: str, filepath: str | Path, encoding: str = 'utf-8') -> None:
        """Write text to ``filepath`` atomically."""
        self.put(obj.encode(encoding), filepath)
