"""A work dir's run: the files a training run leaves there, and the checkpoint ``--resume`` takes."""
import glob
import os
import re
import shutil

# A work dir holds a run when it has a checkpoint or last_checkpoint: a new run there would
# overwrite them and the pseudo labels one folder down. mmengine's timestamped log folders do not
# count, nor do the first round's pseudo labels of a run stopped before its first checkpoint (it
# is started again without --resume).
CHECKPOINT_NAME = re.compile(r'^(epoch|iter)_(\d+)\.pth$')
RUN_CHECKPOINTS = ('last_checkpoint', 'epoch_*.pth', 'iter_*.pth')
RUN_LABELS = (os.path.join('pseudo_labels', 'epoch_*.npz'), os.path.join('pseudo_labels', 'rounds.json'))


def run_files(work_dir: str, labels: bool = True) -> list[str]:
    """The files a training run left in ``work_dir``: ``last_checkpoint``, checkpoints, pseudo labels."""
    found = []
    for pattern in RUN_CHECKPOINTS + (RUN_LABELS if labels else ()):
        found += sorted(glob.glob(os.path.join(glob.escape(work_dir), pattern)))
    return found


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


def remove_run(work_dir: str) -> list[str]:
    """Delete an earlier run's files in ``work_dir`` (:func:`run_files`; logs stay); the paths deleted."""
    found = run_files(work_dir)
    for path in found:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    return found


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
    with open(pointer, 'rb') as f:
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
        return named, None
    if newest:
        return newest, (f'last_checkpoint names {named}, which does not exist: resuming from the '
                        f'newest checkpoint in {work_dir}, {newest}')
    raise FileNotFoundError(f'last_checkpoint in {work_dir} names {named}, which does not exist, and '
                            f'{work_dir} holds no epoch_*.pth or iter_*.pth; pass the checkpoint: '
                            '--resume PATH/epoch_N.pth')
