"""Helpers shared by the command-line tools: device choice, JSON results, Runner configs, errors."""
import argparse
import contextlib
import difflib
import glob
import inspect
import json
import os
import os.path as osp
from collections.abc import Iterator

import torch
from mmengine.config import Config
from mmengine.registry import Registry
from mmengine.runner import Runner

from ifnd.engine.checkpoint import AtomicLocalBackend


def resolve_device(name: str) -> torch.device:
    """The device to run on: CUDA when available for 'auto'."""
    if name == 'auto':
        return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    device = torch.device(name)
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise SystemExit('--device cuda was asked for but CUDA is not available')
    return device


def write_json(result: dict | list, path: str, indent: int | None = 2) -> None:
    """Write results as JSON atomically (the folder is created), and say where."""
    AtomicLocalBackend().put_text(json.dumps(result, indent=indent), path)
    print(f'Results written to {path}')


def amp_options(dtype: str | None = None) -> dict:
    """AmpOptimWrapper's dtype and loss scale: bfloat16 unscaled where the GPU has it, else float16."""
    if dtype is None:
        dtype = 'bfloat16' if torch.cuda.is_bf16_supported() else 'float16'
    if dtype == 'bfloat16':
        # bf16 has float32's exponent range: no GradScaler, so no inf check syncing every step.
        return dict(dtype='bfloat16', loss_scale=dict(enabled=False))
    return dict(dtype=dtype, loss_scale='dynamic')


def runner_config(config: str, work_dir: str | None = None, resume: str | None = None,
                  amp: bool = False, cfg_options: dict | None = None,
                  launcher: str = 'none') -> Config:
    """A Runner config from a file with the usual command-line choices applied.

    ``resume`` is a checkpoint path, or ``'auto'`` for the latest checkpoint in the work dir;
    ``work_dir`` defaults to ``work_dirs/<config name>``.
    """
    if not osp.isfile(config):
        raise SystemExit(f'Config file not found: {config}. Configs live under configs/, '
                         'e.g. configs/ifnd/ifnd_r18_200e_fmnist.py')
    check_arguments(launcher=launcher, folders={'--work-dir': work_dir})
    cfg = Config.fromfile(config)
    cfg.launcher = launcher
    if cfg_options:
        check_cfg_options(cfg, cfg_options)
        cfg.merge_from_dict(cfg_options)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('work_dirs', osp.splitext(osp.basename(config))[0])
    if amp:
        if not torch.cuda.is_available():
            raise SystemExit('--amp needs a GPU (mmengine\'s AmpOptimWrapper trains in mixed '
                             'precision on GPUs only); leave it out on a CPU')
        if cfg.optim_wrapper.get('type', 'OptimWrapper') != 'OptimWrapper':
            raise SystemExit(f'--amp needs optim_wrapper.type OptimWrapper, '
                             f'the config has {cfg.optim_wrapper.type}')
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        for key, value in amp_options(cfg.optim_wrapper.get('dtype')).items():
            cfg.optim_wrapper.setdefault(key, value)
    if resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif resume is not None:
        if not osp.isfile(resume):
            raise SystemExit(f'Checkpoint to resume from not found: {resume}')
        cfg.resume = True
        cfg.load_from = resume
    return cfg


def add_encoder_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model-name`` and ``--cifar-stem``: override the backbone a checkpoint carries or implies."""
    parser.add_argument('--model-name',
                        help='timm backbone name; needed only when the weights leave it open '
                        '(default: the checkpoint\'s config, else the ResNet its weights describe)')
    parser.add_argument('--cifar-stem', action=argparse.BooleanOptionalAction, default=None,
                        help='override the checkpoint: 3x3 stride-1 stem without max-pooling')


def add_extraction_arguments(parser: argparse.ArgumentParser, batch_size: int,
                             num_workers: int) -> None:
    """``--batch-size``, ``--num-workers`` and ``--device`` of feature extraction."""
    parser.add_argument('--batch-size', type=int, default=batch_size,
                        help='feature extraction batch (default: %(default)s)')
    parser.add_argument('--num-workers', type=int, default=num_workers,
                        help='data loading workers (default: %(default)s)')
    parser.add_argument('--device', default='auto',
                        help="'auto' (CUDA when available), 'cpu' or 'cuda'")


def _registered_class(type_name: str):
    """The class a config ``type`` names in any of ifnd's registries (or their mmengine parents)."""
    from ifnd import registry
    for reg in vars(registry).values():
        if isinstance(reg, Registry):
            found = reg.get(type_name)
            if found is not None:
                return found
    return None


def _takes_keyword(node: dict, name: str) -> bool:
    """Whether a config dict with a ``type`` may gain the keyword ``name`` (its class accepts it)."""
    cls = node.get('type')
    cls = _registered_class(cls) if isinstance(cls, str) else cls
    if cls is None:
        return True  # a type we cannot inspect: leave the check to its constructor
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


def check_cfg_options(cfg: Config, options: dict) -> None:
    """Refuse ``--cfg-options`` keys that name nothing in the config, suggesting close names.

    A key may be new only where something takes it: a keyword of the class a ``type`` names, or
    a Runner argument at the top level; otherwise it is a typo that mmengine would silently add.
    """
    runner_args = set(inspect.signature(Runner).parameters)
    tree = cfg.to_dict()
    for key in options:
        parts = key.split('.')
        node = tree
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            if isinstance(node, (list, tuple)):
                if part.isdigit() and int(part) < len(node):
                    node = node[int(part)]
                    continue
                names = [str(i) for i in range(len(node))]
            elif isinstance(node, dict):
                if part in node:
                    node = node[part]
                    continue
                if last and (_takes_keyword(node, part) if 'type' in node
                             else depth == 0 and part in runner_args):
                    break
                names = list(node.keys())
            else:
                break  # a value is being replaced by a dict or list: mmengine merges that itself
            where = '.'.join(parts[:depth]) or 'the config'
            close = difflib.get_close_matches(part, names, n=3, cutoff=0.6)
            hint = (f'did you mean {" or ".join(repr(".".join(parts[:depth] + [c])) for c in close)}?'
                    if close else f'{where} has: {", ".join(map(str, names[:12]))}')
            raise SystemExit(f"--cfg-options key '{key}' is not in {osp.basename(cfg.filename or '')}"
                             f' ({where} has no {part!r}); {hint}')


# What torchrun sets for every process; without them --launcher pytorch cannot start.
TORCHRUN_VARIABLES = ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')


def _file_in_the_way(path: str) -> str | None:
    """The first existing component of ``path``'s folders that is a file, not a folder, if any."""
    folder = osp.dirname(osp.abspath(path))
    while folder and not osp.exists(folder):
        folder = osp.dirname(folder)
    return folder if folder and not osp.isdir(folder) else None


def check_arguments(inputs: dict | None = None, outputs: dict | None = None,
                    folders: dict | None = None, batch_size: int | None = None,
                    num_workers: int | None = None, launcher: str | None = None) -> None:
    """Refuse bad command-line values before any work, with one line naming the flag and the fix.

    ``inputs``: flag -> file (or list of files) that must exist and not be a folder;
    ``outputs``: flag -> file to write (``None`` skipped), which must not be a folder nor lie under
    a file; ``folders``: flag -> output folder, which must not be a file nor lie under one;
    ``batch_size`` >= 1, ``num_workers`` >= 0; ``launcher`` 'pytorch' needs torchrun's variables.
    """
    def fail(message: str):
        raise SystemExit(f'error: {message}')

    for flag, paths in (inputs or {}).items():
        for path in paths if isinstance(paths, (list, tuple)) else [paths]:
            if osp.isdir(path):
                found = sorted(glob.glob(osp.join(path, '*.pth')))
                example = found[-1] if found else osp.join(path, 'epoch_N.pth')
                fail(f'{flag} {path} is a folder; pass the file inside it, e.g. {example}')
            if not osp.isfile(path):
                fail(f'{flag} not found: {path}; check the path')
    for flag, path in (outputs or {}).items():
        if path is None:
            continue
        if osp.isdir(path) or str(path).endswith(('/', os.sep)):
            fail(f'{flag} {path} is a folder; give a file name, e.g. {osp.join(path, "NAME")}')
        blocker = _file_in_the_way(path)
        if blocker:
            fail(f'{flag} {path} cannot be written: {blocker} is a file, not a folder; choose '
                 'another path')
    for flag, path in (folders or {}).items():
        if path is None:
            continue
        if osp.exists(path) and not osp.isdir(path):
            fail(f'{flag} {path} is a file, not a folder; choose another folder')
        blocker = _file_in_the_way(osp.join(path, 'x'))
        if blocker:
            fail(f'{flag} {path} cannot be created: {blocker} is a file, not a folder; choose '
                 'another folder')
    if batch_size is not None and batch_size < 1:
        fail(f'--batch-size must be at least 1, got {batch_size}')
    if num_workers is not None and num_workers < 0:
        fail(f'--num-workers must be 0 (load in the main process) or more, got {num_workers}')
    if launcher == 'pytorch':
        missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
        if missing:
            fail(f'--launcher pytorch needs the variables torchrun sets ({", ".join(missing)} '
                 'missing): start with torchrun --nproc_per_node=NUM_GPUS ..., or leave --launcher '
                 'out to run one process')


# Exceptions that report bad input (paths, configs, registry names, checkpoints, data, a diverged
# run): the tools print their message alone; IFND_DEBUG=1 shows the traceback.
INPUT_ERRORS = (OSError, ValueError, KeyError, TypeError, ImportError, FloatingPointError)


@contextlib.contextmanager
def input_errors_as_messages() -> Iterator[None]:
    """Turn bad-input exceptions into a one-line ``error: ...`` and exit status 1."""
    try:
        yield
    except INPUT_ERRORS as err:
        if os.environ.get('IFND_DEBUG'):
            raise
        message = str(err.args[0] if isinstance(err, KeyError) and err.args else err)
        if 'Original Traceback' in message:  # re-raised from a loader worker: keep the worker's line
            message = message.strip().splitlines()[-1].split(': ', 1)[-1]
        if isinstance(err, TypeError) and 'unexpected keyword argument' in message:
            message += '; check its spelling in the config or --cfg-options'
        raise SystemExit(f'error: {" ".join(message.split())}') from None
