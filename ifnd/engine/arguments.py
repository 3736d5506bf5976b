"""Command-line arguments the tools share: the device, encoder and extraction flags, and their checks."""
import argparse
import glob
import os
import os.path as osp

import torch


def resolve_device(name: str) -> torch.device:
    """The device to run on: CUDA when available for 'auto'."""
    if name == 'auto':
        return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    device = torch.device(name)
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise SystemExit('--device cuda was asked for but CUDA is not available')
    return device


def _count(text: str) -> int:
    """A whole number of at least 1, as a flag's value."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r} is not a whole number') from None
    if value < 1:
        raise argparse.ArgumentTypeError(f'must be at least 1, got {value}')
    return value


def add_encoder_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model-name``, ``--cifar-stem`` and ``--num-heads``: settle what a checkpoint's weights
    leave open, or override what it carries."""
    parser.add_argument('--model-name',
                        help='timm backbone name; needed only when the weights leave it open '
                        '(default: the checkpoint\'s config, else the ResNet its weights describe)')
    parser.add_argument('--cifar-stem', action=argparse.BooleanOptionalAction, default=None,
                        help='override the checkpoint: 3x3 stride-1 stem without max-pooling')
    parser.add_argument('--num-heads', type=_count, default=None,
                        help='attention heads of a Vision Transformer read from its weights alone '
                        '(no shape shows them); needed only when its file does not state them')


def encoder_options(args: argparse.Namespace) -> dict:
    """The keyword arguments of ``load_encoder`` that :func:`add_encoder_arguments`'s flags give."""
    options = dict(model_name=args.model_name, num_heads=args.num_heads)
    if args.cifar_stem is not None:
        options['cifar_stem'] = args.cifar_stem
    return options


def add_extraction_arguments(parser: argparse.ArgumentParser, batch_size: int,
                             num_workers: int) -> None:
    """``--batch-size``, ``--num-workers`` and ``--device`` of feature extraction."""
    parser.add_argument('--batch-size', type=int, default=batch_size,
                        help='feature extraction batch (default: %(default)s)')
    parser.add_argument('--num-workers', type=int, default=num_workers,
                        help='data loading workers (default: %(default)s)')
    parser.add_argument('--device', default='auto',
                        help="'auto' (CUDA when available), 'cpu' or 'cuda'")


TORCHRUN_VARIABLES = ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')


def _file_in_the_way(path: str) -> str | None:
    """The first existing component of ``path``'s folders that is a file, not a folder, if any."""
    folder = osp.dirname(osp.abspath(path))
    while folder and not osp.exists(folder):
        folder = osp.dirname(folder)
    return folder if folder and not osp.isdir(folder) else None


def _same_file(a: str, b: str) -> bool:
    """Whether two paths name one file: the same real path (symlinks, ``./x``) or inode (hard links)."""
    if osp.realpath(a) == osp.realpath(b):
        return True
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:  # one does not exist yet: not the same file
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def check_arguments(inputs: dict | None = None, outputs: dict | None = None,
                    folders: dict | None = None, batch_size: int | None = None,
                    num_workers: int | None = None, launcher: str | None = None) -> None:
    """Refuse bad command-line values before any work, with one line naming the flag and the fix.

    ``inputs``: flag -> file (or list of files; ``None`` skipped) that must exist and not be a
    folder; ``outputs``: flag -> file to write (``None`` skipped), which must not be a folder nor
    lie under a file, nor be an input or another output (same real path or same inode: it would
    replace it); ``folders``: flag -> output folder, which must not be a file nor lie under one;
    ``batch_size`` >= 1, ``num_workers`` >= 0; ``launcher`` 'pytorch' needs torchrun's variables.
    """
    _check_inputs(inputs or {})
    _check_outputs(inputs or {}, outputs or {})
    _check_folders(folders or {})
    if batch_size is not None and batch_size < 1:
        _fail(f'--batch-size must be at least 1, got {batch_size}')
    if num_workers is not None and num_workers < 0:
        _fail(f'--num-workers must be 0 (load in the main process) or more, got {num_workers}')
    if launcher == 'pytorch':
        missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
        if missing:
            _fail(f'--launcher pytorch needs the variables torchrun sets ({", ".join(missing)} '
                  'missing): start with torchrun --nproc_per_node=NUM_GPUS ..., or leave --launcher '
                  'out to run one process')


def _fail(message: str) -> None:
    raise SystemExit(f'error: {message}')


def _check_inputs(inputs: dict) -> None:
    """Each input file exists and is not a folder."""
    for flag, paths in inputs.items():
        for path in paths if isinstance(paths, (list, tuple)) else [paths]:
            if path is None:
                continue
            if osp.isdir(path):
                found = sorted(glob.glob(osp.join(path, '*.pth')))
                example = found[-1] if found else osp.join(path, 'epoch_N.pth')
                _fail(f'{flag} {path} is a folder; pass the file inside it, e.g. {example}')
            if not osp.isfile(path):
                _fail(f'{flag} not found: {path}; check the path')


def _check_outputs(inputs: dict, outputs: dict) -> None:
    """Each output file can be written and replaces no input nor an earlier output."""
    for flag, path in outputs.items():
        if path is None:
            continue
        if osp.isdir(path) or str(path).endswith(('/', os.sep)):
            _fail(f'{flag} {path} is a folder; give a file name, e.g. {osp.join(path, "NAME")}')
        blocker = _file_in_the_way(path)
        if blocker:
            _fail(f'{flag} {path} cannot be written: {blocker} is a file, not a folder; choose '
                  'another path')
    # Writing an output that is an input (or an earlier output) would replace that file.
    written: list[tuple[str, str]] = []
    read = [(flag, path) for flag, paths in inputs.items()
            for path in (paths if isinstance(paths, (list, tuple)) else [paths]) if path is not None]
    for flag, path in ((f, p) for f, p in outputs.items() if p is not None):
        for other_flag, other in read + written:
            if _same_file(path, other):
                _fail(f'{flag} {path} is the same file as {other_flag} {other}: writing it would '
                      f'replace it; give {flag} another path')
        written.append((flag, path))


def _check_folders(folders: dict) -> None:
    """Each output folder is not a file and lies under no file."""
    for flag, path in folders.items():
        if path is None:
            continue
        if osp.exists(path) and not osp.isdir(path):
            _fail(f'{flag} {path} is a file, not a folder; choose another folder')
        blocker = _file_in_the_way(osp.join(path, 'x'))
        if blocker:
            _fail(f'{flag} {path} cannot be created: {blocker} is a file, not a folder; choose '
                  'another folder')
