"""A work dir's run: the files a training run writes there, the lock a running one holds, and the
checkpoint ``--resume`` takes."""
import contextlib
import datetime
import errno
import fcntl
import json
import os
import re
import socket
import stat
import sys
from collections.abc import Iterator

from ifnd.fileio import (check_open_file, check_own_path, check_plain_file, checkpoint_config, config_to_data,
                         open_plain, read_checkpoint)
from ifnd.fileio.former_names import translate_former_config

# The exact names a training run writes: checkpoints and last_checkpoint in the work dir, every
# round's pseudo labels and their summary one folder down. A work dir holds a run when it has a
# checkpoint or last_checkpoint; mmengine's timestamped log folders do not count, nor do the first
# round's pseudo labels of a run stopped before its first checkpoint (it is started again).
CHECKPOINT_NAME = re.compile(r'^(epoch|iter)_(\d+)\.pth$')
LAST_CHECKPOINT = 'last_checkpoint'
LABELS_FOLDER = 'pseudo_labels'
LABELS_NAME = re.compile(r'^(epoch_\d+\.npz|rounds\.json)$')
LOCK_NAME = '.run.lock'


def _sort_key(name: str) -> tuple:
    """Checkpoints by kind and number (epoch_2 before epoch_10), other names after them."""
    match = CHECKPOINT_NAME.match(name)
    return (0, match.group(1), int(match.group(2))) if match else (1, name, 0)


def _regular_file(path: str) -> bool:
    """A plain file, not a link, folder or device: the only kind a run writes."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def check_work_dir(work_dir: str) -> None:
    """Refuse a work dir that is not a folder of its own name: a link would carry every file the run
    writes elsewhere, and a file (or FIFO, socket) cannot hold them."""
    path = os.path.abspath(work_dir)  # without a trailing '/', which would follow a link
    fix = (f'pass the folder it names: --work-dir {os.path.realpath(path)}'
           if os.path.islink(path) and os.path.isdir(path) else 'delete it or choose another --work-dir')
    check_own_path(path, 'work dir', folder=True, fix=fix)


def run_folders(work_dir: str) -> list[str]:
    """The folders a run writes in: the work dir and its own ``pseudo_labels`` (never through a link)."""
    own = _labels_folder(work_dir)
    return [work_dir] + ([own] if own else [])


def _labels_folder(work_dir: str) -> str | None:
    """The work dir's own pseudo-label folder; None where it is missing, a link or not a folder."""
    folder = os.path.join(work_dir, LABELS_FOLDER)
    try:
        return folder if stat.S_ISDIR(os.lstat(folder).st_mode) else None
    except OSError:
        return None


def _run_like_entries(work_dir: str, labels: bool) -> list[tuple[str, bool]]:
    """Entries named as a run's files, each with whether it is one (a plain file in the work dir's own
    folders); links, folders and files under a linked ``pseudo_labels`` are named but not the run's."""
    found = []
    names = os.listdir(work_dir) if os.path.isdir(work_dir) else []
    for name in sorted(names, key=_sort_key):
        if name == LAST_CHECKPOINT or CHECKPOINT_NAME.match(name):
            path = os.path.join(work_dir, name)
            found.append((path, _regular_file(path)))
    if labels:
        folder = os.path.join(work_dir, LABELS_FOLDER)
        own = _labels_folder(work_dir)
        if own is None and os.path.lexists(folder):
            found.append((folder, False))  # a link is never followed, a file is not a run's
        for name in sorted(os.listdir(own)) if own else []:
            if LABELS_NAME.match(name):
                path = os.path.join(own, name)
                found.append((path, _regular_file(path)))
    return found


def run_files(work_dir: str, labels: bool = True) -> list[str]:
    """The files a training run wrote in ``work_dir``: ``last_checkpoint``, ``epoch_N.pth``,
    ``iter_N.pth`` and, with ``labels``, ``pseudo_labels/epoch_N.npz`` and ``rounds.json``."""
    return [path for path, own in _run_like_entries(work_dir, labels) if own]


def check_new_run(work_dir: str) -> None:
    """Refuse to start a new run (no ``--resume``) in a work dir that holds one: it would be overwritten."""
    found = run_files(work_dir, labels=False)
    if found:
        names = ', '.join(os.path.relpath(f, work_dir) for f in found[:3])
        more = f' and {len(found) - 3} more' if len(found) > 3 else ''
        raise FileExistsError(
            f'{work_dir} holds a run ({names}{more}) that a new run would overwrite; continue it '
            'with --resume, choose another --work-dir, or start over with --overwrite (deletes its '
            'checkpoints and pseudo labels)')


def remove_run(work_dir: str) -> tuple[list[str], list[str]]:
    """Delete an earlier run's files in ``work_dir`` (:func:`run_files`: plain files under the names a
    run writes; logs stay); the paths deleted, and those left that only look like them (why, each)."""
    removed, left = [], []
    for path, own in _run_like_entries(work_dir, labels=True):
        if own:
            os.unlink(path)
            removed.append(path)
        else:
            kind = ('a link' if os.path.islink(path) else 'a folder' if os.path.isdir(path)
                    else 'not a plain file')
            left.append(f'{path} ({kind})')
    return removed, left


def check_written_in_place(work_dir: str) -> None:
    """Refuse a work dir whose ``last_checkpoint`` is not its own plain file: mmengine writes it in
    place after every checkpoint (a FIFO there would stop the run, a link carry the write elsewhere)."""
    path = os.path.join(work_dir, LAST_CHECKPOINT)
    if os.path.lexists(path):
        check_plain_file(path, 'last_checkpoint file', own=True, writing=True)


def inputs_in_run(work_dir: str, config: dict, skip: tuple[str, ...] = ('work_dir',)) -> list[str]:
    """The files of the run in ``work_dir`` (:func:`run_files`) that ``config`` reads, each as
    ``'FILE (KEY)'``: a path it names (``model.pretrained``, ``load_from``, a data root, a list file)
    is the file, or a folder holding it. ``--overwrite`` must not delete them."""
    runs = {os.path.realpath(path): path for path in run_files(work_dir)}
    found = []

    def visit(value, key: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if key or k not in skip:
                    visit(v, f'{key}.{k}' if key else str(k))
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                visit(v, f'{key}.{i}')
        elif isinstance(value, str) and value and '\n' not in value and os.path.lexists(value):
            named = os.path.realpath(value)
            found.extend(f'{path} ({key})' for real, path in runs.items()
                         if real == named or real.startswith(named.rstrip(os.sep) + os.sep))

    visit(config, '')
    return found


def holds_run(work_dir: str) -> bool:
    """Whether ``work_dir`` holds a run to continue: a checkpoint or ``last_checkpoint``."""
    return bool(run_files(work_dir, labels=False))


# Settings a continued run may have set for itself (tools/train.py's resume choice); not the run's own.
_RESUME_KEYS = ('resume', 'load_from')


def _flat(value, key: str = '') -> dict:
    if isinstance(value, dict):
        return {k2: v2 for k, v in value.items() for k2, v2 in _flat(v, f'{key}.{k}' if key else str(k)).items()}
    if isinstance(value, (list, tuple)):
        return {k2: v2 for i, v in enumerate(value) for k2, v2 in _flat(v, f'{key}.{i}').items()} or {key: ()}
    return {key: value}


def differences_from_run(config: dict, work_dir: str) -> list[str] | None:
    """The settings (dotted keys) in which ``config`` (as data) differs from the config of the run in
    ``work_dir`` (its checkpoint's): ``[]`` for the same run, None where no checkpoint says."""
    path, _ = resume_checkpoint(work_dir)
    try:
        saved = checkpoint_config(read_checkpoint(path), path) if path else None
    except (OSError, ValueError):
        return None
    if saved is None:
        return None
    try:  # a run saved before a rename says the same in its former names
        saved = translate_former_config(config_to_data(saved), path)
    except ValueError:
        return None
    ours, theirs = (_flat({k: v for k, v in c.items() if k not in _RESUME_KEYS})
                    for c in (config_to_data(config), config_to_data(saved)))
    return sorted(k for k in ours.keys() | theirs.keys() if ours.get(k, '<unset>') != theirs.get(k, '<unset>'))


def requeue_count() -> int:
    """How often the scheduler has requeued this job (SLURM's ``SLURM_RESTART_COUNT``; 0 elsewhere)."""
    value = os.environ.get('SLURM_RESTART_COUNT', '')
    return int(value) if value.isdigit() else 0


def _holder(lock_path: str) -> str:
    """Who holds a work dir, as its lock file says."""
    try:
        with open_plain(lock_path, 'r', 'lock file', own=True, encoding='utf-8') as f:
            info = json.loads(f.read(4096))
        return (f'pid {int(info["pid"])} on {str(info["host"])[:64]}, started '
                f'{str(info["started"])[:32]}: {str(info["command"])[:300]}')
    except (OSError, ValueError, KeyError, TypeError):
        return 'its lock file does not say which'


@contextlib.contextmanager
def hold_work_dir(work_dir: str) -> Iterator[None]:
    """Hold ``work_dir`` for this run while the block runs; refuse it while another run holds it.

    An advisory lock (``flock``) on ``work_dir/.run.lock``, which also names its holder: the system
    releases it when the holding process ends, however it ends, so a killed run never leaves its
    work dir held. (``filelock`` truncates the file on every attempt, which would erase the name.)
    """
    check_work_dir(work_dir)
    os.makedirs(work_dir, exist_ok=True)
    path = os.path.join(work_dir, LOCK_NAME)
    try:  # the work dir's own file: never through a link, never a FIFO (no waiting for a writer)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as err:
        kind = 'a link' if os.path.islink(path) else 'not a file' if os.path.lexists(path) else None
        if kind is None:
            raise
        raise FileExistsError(f'{path} is {kind}, not the lock file a run holds; delete it (no run '
                              'writes it so) and start again') from err
    try:
        check_open_file(fd, path, 'lock file', own=True, writing=True)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.EAGAIN, errno.EACCES):
                raise FileExistsError(
                    f'{work_dir} is in use by another run ({_holder(path)}); wait for it to end or '
                    'stop it, or choose another --work-dir') from None
            # Some cluster file systems are mounted without locks: training there must still work.
            print(f'warning: cannot lock {path} ({err.strerror}): this file system has no locks, so '
                  f'a second run started in {work_dir} meanwhile would not be refused', file=sys.stderr,
                  flush=True)
        info = dict(pid=os.getpid(), host=socket.gethostname(),
                    started=datetime.datetime.now().isoformat(timespec='seconds'),
                    command=' '.join([os.path.basename(sys.executable)] + sys.argv))
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def newest_checkpoint(work_dir: str) -> str | None:
    """The checkpoint of the latest epoch in ``work_dir`` (``epoch_N.pth``), else of the latest iteration."""
    found = {}
    for name in os.listdir(work_dir) if os.path.isdir(work_dir) else []:
        match = CHECKPOINT_NAME.match(name)
        if match and os.path.isfile(os.path.join(work_dir, name)):
            found.setdefault(match.group(1), []).append((int(match.group(2)), name))
    for kind in ('epoch', 'iter'):  # by number, not time: copying a work dir changes the times
        if kind in found:
            return os.path.join(work_dir, max(found[kind])[1])
    return None


def resume_checkpoint(work_dir: str) -> tuple[str | None, str | None]:
    """The checkpoint ``--resume`` continues from in ``work_dir``, and a note when it is not simply
    the one ``last_checkpoint`` names.

    mmengine's ``last_checkpoint`` holds an absolute path: a work dir copied or moved elsewhere
    would resume from the original's file. The work dir's own file of that name is taken instead;
    a named file that is missing gives the newest checkpoint in the work dir. ``(None, None)``
    when there is none. A ``last_checkpoint`` that is empty, garbled or a folder raises
    ``ValueError``; one naming a file that is missing, with no checkpoint in the work dir to fall
    back to, raises ``FileNotFoundError``.
    """
    pointer = os.path.join(work_dir, 'last_checkpoint')
    newest = newest_checkpoint(work_dir)
    fix = (f'delete it (--resume then continues from the newest checkpoint, {newest}) or pass the '
           f'checkpoint: --resume {newest}' if newest else
           'delete it, or pass the checkpoint: --resume PATH/epoch_N.pth')
    if not os.path.lexists(pointer):
        return newest, (f'{work_dir} has no last_checkpoint file: resuming from its newest '
                        f'checkpoint, {newest}' if newest else None)
    if os.path.isdir(pointer):
        raise ValueError(f'{pointer} is a folder, not the last_checkpoint file naming the checkpoint '
                         f'to resume; {fix}')
    with open_plain(pointer, 'rb', 'last_checkpoint file', own=True) as f:
        raw = f.read(4097)
    try:
        text = raw.decode('utf-8').strip()
    except UnicodeDecodeError:
        text = None
    if not text or len(raw) > 4096 or any(c in text for c in '\n\r\x00'):
        what = 'empty' if text == '' else 'not the path of a checkpoint'
        raise ValueError(f'{pointer} is {what} (last_checkpoint should name the checkpoint to '
                         f'resume); {fix}')
    named = text if os.path.isabs(text) else os.path.join(work_dir, text)
    own = os.path.join(work_dir, os.path.basename(named))
    if os.path.isfile(own):
        moved = os.path.realpath(own) != os.path.realpath(named)
        return own, (f'last_checkpoint names {named}, outside {work_dir} (the work dir was copied '
                     f'or moved): resuming from its own {own}' if moved else None)
    if os.path.isfile(named):  # CheckpointHook(out_dir=...) saves outside the work dir
        inside = os.path.dirname(os.path.realpath(named)) == os.path.realpath(work_dir)
        return named, (None if inside else f'last_checkpoint in {work_dir} names {named}, outside '
                       'the work dir: resuming from it (pass --resume PATH to choose another)')
    if newest:
        return newest, (f'last_checkpoint names {named}, which does not exist: resuming from the '
                        f'newest checkpoint in {work_dir}, {newest}')
    raise FileNotFoundError(f'last_checkpoint in {work_dir} names {named}, which does not exist, and '
                            f'{work_dir} holds no epoch_*.pth or iter_*.pth; pass the checkpoint: '
                            '--resume PATH/epoch_N.pth')
