"""Every path a training run writes, checked before anything is written: the work dir, the config
dump, the log folder mmengine names by the second the run starts (its log, ``vis_data`` and
TensorBoard event files), the folders hooks write in (pseudo labels, an ``out_dir``) and
``last_checkpoint``.

mmengine opens these by name, following links and waiting on FIFOs; each is checked first by
:mod:`ifnd.fileio.plain_files`. The log folder's name can be foreseen, so anyone could make it
first: it is used only as a folder of this user's holding only plain files of one name (a run
started again within the same second appends to its log, as mmengine does).
"""
import os.path as osp
from collections.abc import Iterator

from mmengine.config import Config

from ifnd.engine.work_dir import LAST_CHECKPOINT, check_work_dir
from ifnd.fileio import AtomicLocalBackend, check_own_path, check_own_tree, open_plain
from ifnd.registry import HOOKS

# Where mmengine's visualizer backends write (LocalVisBackend, TensorboardVisBackend), in the log
# folder or a configured save_dir; LocalVisBackend's images one folder down.
VIS_FOLDER = 'vis_data'
IMAGE_FOLDER = 'vis_image'
# The config dump's first line: a file of the dump's name without it is a user's, never replaced.
DUMP_MARK = '# ifnd config dump:'
DUMP_FIRST_LINE = f'{DUMP_MARK} the resolved config of the run in this folder, written at each start\n'


def config_dump_path(cfg: Config, work_dir: str, timestamp: str) -> str:
    """Where a run dumps its config: ``WORK_DIR/<config name>.py`` (mmengine's name for a Python
    config), or ``WORK_DIR/<timestamp>.py`` for a config without a file."""
    name = osp.splitext(osp.basename(cfg.filename))[0] if cfg.filename else timestamp
    return osp.join(work_dir, f'{name}.py')


def _hooks(cfg: Config) -> Iterator[tuple[type | None, object]]:
    """Each configured hook's class (None where unknown) and ``out_dir``."""
    for hook in [*(cfg.get('default_hooks') or {}).values(), *(cfg.get('custom_hooks') or [])]:
        if isinstance(hook, dict):
            kind = hook.get('type')
            yield (HOOKS.get(kind) if isinstance(kind, str) else kind), hook.get('out_dir')
        elif hook is not None:
            yield type(hook), getattr(hook, 'out_dir', None)


def _check_save_dirs(cfg: Config) -> None:
    """A configured visualizer's ``save_dir`` (its backends write in ``save_dir/vis_data``) and a
    backend's own ``save_dir``, where one is set instead of the log folder."""
    visualizer = cfg.get('visualizer')
    if not isinstance(visualizer, dict):
        return
    if visualizer.get('save_dir'):
        check_own_path(visualizer['save_dir'], 'visualizer save_dir folder', folder=True)
        check_own_tree(osp.join(visualizer['save_dir'], VIS_FOLDER), 'log', (IMAGE_FOLDER,))
    for backend in visualizer.get('vis_backends') or []:
        if isinstance(backend, dict) and backend.get('save_dir'):
            check_own_tree(backend['save_dir'], 'log', (IMAGE_FOLDER,))


def _check_out_dir(out_dir: str, work_dir: str, timestamp: str) -> None:
    """A hook's ``out_dir``: mmengine writes in ``out_dir/<work dir's name>`` (checkpoints, and the
    log folder's files under the same names)."""
    fix = 'delete it or set another out_dir'
    check_own_path(out_dir, 'out_dir folder', folder=True, fix=fix)
    copies = osp.join(out_dir, osp.basename(work_dir.rstrip(osp.sep)))
    check_own_path(copies, 'out_dir folder', folder=True, fix=fix)
    check_own_path(osp.join(copies, f'{timestamp}.log'), 'log file')
    check_own_tree(osp.join(copies, VIS_FOLDER), 'log', (IMAGE_FOLDER,))


def check_run_paths(cfg: Config, work_dir: str, timestamp: str) -> None:
    """Refuse a link (symbolic or hard), FIFO, socket, device, or a folder of the wrong kind at any path
    the run of ``cfg`` started at ``timestamp`` writes: :class:`~ifnd.fileio.NotAPlainFile` naming it."""
    check_work_dir(work_dir)
    check_own_tree(osp.join(work_dir, timestamp), 'log', (VIS_FOLDER, f'{VIS_FOLDER}/{IMAGE_FOLDER}'))
    _check_save_dirs(cfg)
    check_own_path(config_dump_path(cfg, work_dir, timestamp), 'config dump')
    check_own_path(osp.join(work_dir, LAST_CHECKPOINT), 'last_checkpoint file')
    for hook, out_dir in _hooks(cfg):
        for name in getattr(hook, 'work_dir_folders', ()):  # e.g. PseudoLabelHook's pseudo_labels
            check_own_path(osp.join(work_dir, name), f'{name} folder', folder=True)
        if isinstance(out_dir, str) and '://' not in out_dir:  # a local folder, not a storage URI
            _check_out_dir(out_dir, work_dir, timestamp)


def write_config_dump(cfg: Config, work_dir: str, timestamp: str) -> str | None:
    """Write the run's config to its dump (:func:`config_dump_path`) atomically, marked by its first
    line; a file of that name without the mark is a user's and is kept: the warning to log then."""
    path = config_dump_path(cfg, work_dir, timestamp)
    if check_own_path(path, 'config dump'):
        with open_plain(path, 'rb', 'config dump', own=True) as f:
            if f.read(len(DUMP_MARK)) != DUMP_MARK.encode():
                return (f'kept {path}: a file of that name that no run dumped (its first line is not '
                        f'"{DUMP_MARK} ..."), so this run\'s config is not written there (each '
                        'checkpoint holds it)')
    AtomicLocalBackend().put_text(DUMP_FIRST_LINE + cfg.pretty_text, path)
    return None
