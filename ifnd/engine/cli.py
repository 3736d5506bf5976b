"""What the command-line tools share: device choice, Runner configs, argument checks, errors."""
import argparse
import ast
import collections.abc
import contextlib
import datetime
import difflib
import glob
import inspect
import os
import os.path as osp
import subprocess
import types
import typing
from collections.abc import Iterator

import torch
from mmengine.config import Config, DictAction
from mmengine.registry import Registry
from mmengine.runner import Runner

from ifnd.engine.optim import amp_options


def resolve_device(name: str) -> torch.device:
    """The device to run on: CUDA when available for 'auto'."""
    if name == 'auto':
        return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    device = torch.device(name)
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise SystemExit('--device cuda was asked for but CUDA is not available')
    return device


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
    cfg = load_config(config)
    cfg.launcher = launcher
    if cfg_options:
        check_cfg_options(cfg, cfg_options)
        cfg.merge_from_dict(cfg_options)
    check_top_level_keys(cfg)
    check_cfg_types(cfg)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('work_dirs', osp.splitext(osp.basename(config))[0])
    if amp:
        if not torch.cuda.is_available():
            raise SystemExit('--amp needs a GPU (mmengine\'s AmpOptimWrapper trains in mixed '
                             'precision on GPUs only); leave it out on a CPU')
        wrapper_type = cfg.optim_wrapper.get('type', 'OptimWrapper')
        if wrapper_type not in ('OptimWrapper', 'AutoAmpOptimWrapper'):
            raise SystemExit(f'--amp needs optim_wrapper.type OptimWrapper (or AutoAmpOptimWrapper), '
                             f'the config has {wrapper_type}')
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


def _syntax_error_in(path: str, seen: set[str] | None = None) -> SyntaxError | None:
    """The first syntax error in a Python config or the ``_base_`` files it names, with its file."""
    seen = set() if seen is None else seen
    path = osp.abspath(path)
    if path in seen or not osp.isfile(path) or not path.endswith('.py'):
        return None
    seen.add(path)
    with open(path, encoding='utf-8') as f:
        text = f.read()
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as err:
        return err
    for base in _base_files(path, tree):
        found = _syntax_error_in(base, seen)
        if found is not None:
            return found
    return None


def _base_files(path: str, tree: ast.Module) -> list[str]:
    """The ``_base_`` files a parsed Python config names, as absolute paths (literal lists only)."""
    files = []
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and getattr(node.targets[0], 'id', None) == '_base_'):
            try:
                bases = ast.literal_eval(node.value)
            except ValueError:
                return files
            for base in [bases] if isinstance(bases, str) else bases:
                if isinstance(base, str):
                    files.append(osp.abspath(osp.join(osp.dirname(path), base)))
    return files


def _base_cycle(path: str, chain: tuple[str, ...] = ()) -> list[str] | None:
    """A cycle of ``_base_`` files reached from a Python config (first file repeated at the end)."""
    path = osp.abspath(path)
    if path in chain:
        return list(chain[chain.index(path):]) + [path]
    if not osp.isfile(path) or not path.endswith('.py'):
        return None
    try:
        with open(path, encoding='utf-8') as f:
            tree = ast.parse(f.read(), filename=path)
    except (SyntaxError, ValueError, OSError):
        return None
    for base in _base_files(path, tree):
        found = _base_cycle(base, chain + (path,))
        if found is not None:
            return found
    return None


def load_config(path: str) -> Config:
    """``Config.fromfile`` with one-line errors: syntax errors by file and line, Python as YAML,
    ``_base_`` files that include each other."""
    cycle = _base_cycle(path)
    if cycle is not None:  # mmengine would recurse until RecursionError
        start = osp.dirname(cycle[0])
        names = ' -> '.join(osp.relpath(f, start) for f in cycle)
        raise ValueError(f'config {path}: its _base_ files include each other ({names}); remove one '
                         'of these _base_ entries')
    try:
        return Config.fromfile(path)
    except SyntaxError as err:
        found = _syntax_error_in(path) or err
        where = found.filename if found.filename not in (None, '<unknown>') else path
        raise ValueError(f'config {where} line {found.lineno}: {found.msg}; fix the file') from None
    except Exception as err:
        if osp.splitext(path)[1].lower() in ('.yaml', '.yml', '.json'):
            with open(path, encoding='utf-8', errors='replace') as f:
                text = f.read()
            try:
                compile(text, path, 'exec')
                python = True
            except SyntaxError:
                python = False
            if python:
                raise ValueError(f'config {path} is Python, not {osp.splitext(path)[1][1:]}: '
                                 f'rename it to {osp.splitext(path)[0]}.py') from None
        reason = ' '.join(str(err).split()) or type(err).__name__
        raise ValueError(f'cannot read config {path} ({type(err).__name__}: {reason}); check the '
                         'file') from None


class CfgOptionsAction(DictAction):
    """mmengine's ``--cfg-options`` parser, keeping the spaces inside values (paths, names).

    mmengine's own parser deletes every space; here a value is taken as written, lists and tuples
    as Python literals where they are ones (``"key=['a b', 'c']"``), else as mmengine reads them.
    """

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: typing.Any, option_string: str | None = None) -> None:
        """Parse ``key=value`` items; an item without ``=`` ends with a one-line error."""
        for item in [values] if isinstance(values, str) else values or []:
            if '=' not in item:
                raise SystemExit(f"error: {option_string or '--cfg-options'} {item!r} has no value: "
                                 f'write {item}=VALUE')
        super().__call__(parser, namespace, values, option_string)

    @staticmethod
    def _parse_iterable(val: str) -> typing.Any:
        """A value of ``key=value``: number, bool, None, list/tuple, or the string as written."""
        text = val.strip()
        if text[:1] in '[(' and text[-1:] in '])':
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = None  # e.g. [a,b] with bare words: mmengine's reading
            if isinstance(value, (list, tuple)):
                return list(value) if text[0] == '[' else tuple(value)
            return DictAction._parse_iterable(text)
        if ',' in text:
            return DictAction._parse_iterable(text)
        if len(text) >= 2 and text[0] == text[-1] and text[0] in '\'"':
            return text[1:-1]
        return DictAction._parse_int_float_bool(text)


def _type_name(annotation: typing.Any) -> str:
    """A short readable name of a type annotation."""
    if annotation is type(None):
        return 'None'
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return str(annotation).replace('typing.', '').replace('NoneType', 'None')


def _fits(value: typing.Any, annotation: typing.Any) -> bool:
    """Whether a config value fits a type annotation; types not judged here always fit."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation in (typing.Any, inspect.Parameter.empty) or isinstance(annotation, (str, typing.TypeVar)):
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    container = origin or annotation
    if container in (list, tuple, collections.abc.Sequence, typing.List, typing.Tuple):
        if not isinstance(value, (list, tuple)):
            return False
        if container in (tuple, typing.Tuple) and args and not (len(args) == 2 and args[1] is Ellipsis):
            return len(value) == len(args) and all(_fits(v, a) for v, a in zip(value, args))
        return all(_fits(v, args[0]) for v in value) if args else True
    if container in (dict, collections.abc.Mapping, typing.Dict):
        return isinstance(value, dict)
    return True  # classes and other types: configs give them as dicts that are built later


def _parameter_types(cls: typing.Any) -> dict[str, typing.Any]:
    """The annotated keywords a registered class (or function) takes, following ``**kwargs`` that
    a class passes on to its base classes."""
    found: dict[str, typing.Any] = {}
    targets = [c.__init__ for c in cls.__mro__ if '__init__' in vars(c) and c is not object] \
        if isinstance(cls, type) else [cls]
    for target in targets:
        try:
            params = inspect.signature(target).parameters
        except (TypeError, ValueError):
            break
        try:
            hints = typing.get_type_hints(target)
        except Exception:  # unresolvable forward references: keep the plain annotations
            hints = {}
        for name, param in params.items():
            if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
                found.setdefault(name, hints.get(name, param.annotation))
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            break
    return found


def check_cfg_types(cfg: Config) -> None:
    """Refuse config values of the wrong type (``max_epochs='ten'``), naming the key and the type.

    Checked against the type hints of the class each ``type`` names, and of the dict-valued
    options a class declares in ``config_dict_options`` (e.g. PseudoLabelHook's ``kmeans``).
    """
    def check(key: str, value: typing.Any, annotation: typing.Any) -> None:
        if not _fits(value, annotation):
            raise ValueError(f'config key {key!r} must be {_type_name(annotation)}, got {value!r} '
                             f'({type(value).__name__}); fix it in '
                             f'{osp.basename(cfg.filename or "the config")} or with --cfg-options '
                             f'{key}=... (quote lists and values with spaces)')

    def walk(node: typing.Any, path: str) -> None:
        if isinstance(node, (list, tuple)):
            for i, item in enumerate(node):
                walk(item, f'{path}.{i}' if path else str(i))
            return
        if not isinstance(node, dict):
            return
        cls = node.get('type')
        cls = _registered_class(cls) if isinstance(cls, str) else cls
        types_of = _parameter_types(cls) if cls is not None else {}
        nested = getattr(cls, 'config_dict_options', {}) if cls is not None else {}
        for name, value in node.items():
            key = f'{path}.{name}' if path else str(name)
            if name in types_of:
                check(key, value, types_of[name])
            if name in nested and isinstance(value, dict):
                for option, option_value in value.items():
                    if option in nested[name]:
                        check(f'{key}.{option}', option_value, nested[name][option])
            walk(value, key)

    walk(cfg.to_dict(), '')


# Top-level config keys that mmengine reads besides Runner's arguments (tools/train.py reads
# runner_type; Config.fromfile custom_imports).
RUNNER_CONFIG_KEYS = ('runner_type', 'custom_imports', 'model_wrapper_cfg', 'find_unused_parameters',
                      'compile', 'sync_bn', 'efficient_conv_bn_eval', 'activation_checkpointing')
# The names this project's configs define at the top level for reuse by other keys and configs
# ({{_base_.eval_pipeline}}) or read by its tools (tools/knn_eval.py: knn_hook, eval_pipeline). A
# config's own variables start with '_' (e.g. _lr = 0.1); any other top-level key must be read.
SHARED_CONFIG_KEYS = ('data_root', 'data', 'mean', 'std', 'view', 'train_pipeline', 'eval_pipeline',
                      'val_dataset', 'knn_hook', 'pseudo_label_hook', 'fn_detection_hook',
                      'support_views', 'glofnd', 'vis_backends')


def check_top_level_keys(cfg: Config) -> None:
    """Refuse a top-level config key that nothing reads (``randomnes=7``), suggesting close names.

    Allowed: the Runner's arguments and the keys mmengine reads (``RUNNER_CONFIG_KEYS``), the
    project's shared names (``SHARED_CONFIG_KEYS``), and names starting with ``_``.
    """
    allowed = (set(inspect.signature(Runner).parameters) - {'cfg'}) | set(RUNNER_CONFIG_KEYS) \
        | set(SHARED_CONFIG_KEYS)
    for key in cfg.keys():
        if key in allowed or str(key).startswith('_'):
            continue
        close = difflib.get_close_matches(str(key), sorted(allowed), n=3, cutoff=0.6)
        hint = (f'did you mean {" or ".join(map(repr, close))}?' if close else
                "if it is a variable of the config's own, start its name with '_'")
        raise ValueError(f'config key {key!r} in {osp.basename(cfg.filename or "the config")} is '
                         f'not a Runner setting and nothing reads it; {hint}')


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


def _dict_options(node: dict) -> dict[str, typing.Collection[str]]:
    """The dict-valued keywords of the class a config dict's ``type`` names, with their keys."""
    cls = node.get('type')
    cls = _registered_class(cls) if isinstance(cls, str) else cls
    return dict(getattr(cls, 'config_dict_options', {})) if cls is not None else {}


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
        # The keys a dict-valued option takes, where its class declares them (config_dict_options).
        option_keys: typing.Collection[str] | None = None
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            if isinstance(node, (list, tuple)):
                if part.isdigit() and int(part) < len(node):
                    node = node[int(part)]
                    continue
                names = [str(i) for i in range(len(node))]
            elif isinstance(node, dict):
                declared = _dict_options(node).get(part)
                if part in node:
                    node, option_keys = node[part], declared
                    continue
                names = list(option_keys) if option_keys is not None else list(node.keys())
                if declared is not None and not last:
                    # An option of a dict the config leaves out, e.g. custom_hooks.0.kmeans.backend.
                    if depth == len(parts) - 2 and parts[-1] in declared:
                        break
                    depth, part, names = depth + 1, parts[depth + 1], list(declared)
                elif last and (_takes_keyword(node, part) if 'type' in node
                               else part in option_keys if option_keys is not None
                               else depth == 0 and part in runner_args):
                    break
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
    def fail(message: str):
        raise SystemExit(f'error: {message}')

    for flag, paths in (inputs or {}).items():
        for path in paths if isinstance(paths, (list, tuple)) else [paths]:
            if path is None:
                continue
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
    # Writing an output that is an input (or an earlier output) would replace that file.
    written: list[tuple[str, str]] = []
    read = [(flag, path) for flag, paths in (inputs or {}).items()
            for path in (paths if isinstance(paths, (list, tuple)) else [paths]) if path is not None]
    for flag, path in ((f, p) for f, p in (outputs or {}).items() if p is not None):
        for other_flag, other in read + written:
            if _same_file(path, other):
                fail(f'{flag} {path} is the same file as {other_flag} {other}: writing it would '
                     f'replace it; give {flag} another path')
        written.append((flag, path))
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


def _launcher_variables(launcher: str) -> None:
    """RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR/PORT from the launcher's own variables, as
    mmengine's ``init_dist`` sets them (torchrun sets them itself)."""
    if launcher == 'slurm':
        addr = subprocess.getoutput(f'scontrol show hostname {os.environ["SLURM_NODELIST"]} | head -n1')
        os.environ.setdefault('MASTER_ADDR', addr)
        os.environ.update(RANK=os.environ['SLURM_PROCID'], WORLD_SIZE=os.environ['SLURM_NTASKS'],
                          LOCAL_RANK=os.environ.get('SLURM_LOCALID', '0'))
    elif launcher == 'mpi':
        if 'MASTER_ADDR' not in os.environ:
            raise SystemExit('error: --launcher mpi needs MASTER_ADDR (the address of rank 0); '
                             'export it before mpirun')
        os.environ.update(RANK=os.environ['OMPI_COMM_WORLD_RANK'],
                          WORLD_SIZE=os.environ['OMPI_COMM_WORLD_SIZE'],
                          LOCAL_RANK=os.environ.get('OMPI_COMM_WORLD_LOCAL_RANK', '0'))
    os.environ.setdefault('MASTER_PORT', '29500')


def init_distributed_without_cuda(cfg: Config, cfg_options: dict | None = None) -> None:
    """Start the process group over gloo when a launcher is set and CUDA is not available.

    mmengine's ``init_dist`` pins each process to a GPU (``torch.cuda.set_device``), which fails
    without one; a group that exists already is kept by ``Runner.setup_env``, so it is made here.
    The runtime config's ``nccl`` is the GPU default and gives way to gloo; ``nccl`` asked for on
    the command line is refused. The model is wrapped in DDP without ``device_ids`` (CPU module).
    With CUDA available nothing changes: mmengine starts the group as configured.
    """
    launcher = cfg.get('launcher', 'none')
    if launcher == 'none' or torch.cuda.is_available():
        return
    import torch.distributed as dist
    from mmengine.registry import MODEL_WRAPPERS
    from torch.nn.parallel import DistributedDataParallel

    options = cfg_options or {}
    asked = options.get('env_cfg.dist_cfg.backend',
                        (options.get('env_cfg.dist_cfg') or {}).get('backend',
                        ((options.get('env_cfg') or {}).get('dist_cfg') or {}).get('backend')))
    if asked == 'nccl':
        raise SystemExit('error: env_cfg.dist_cfg.backend=nccl needs CUDA GPUs and none is available '
                         'here; leave the option out (gloo is used on a CPU) or run on a GPU machine')
    cfg.setdefault('env_cfg', {}).setdefault('dist_cfg', {})
    dist_cfg = dict(cfg.env_cfg.dist_cfg)
    if dist_cfg.get('backend', 'nccl') == 'nccl':
        dist_cfg['backend'] = 'gloo'
    cfg.env_cfg.dist_cfg = dist_cfg
    wrapper = cfg.get('model_wrapper_cfg') or dict(
        type='MMDistributedDataParallel', broadcast_buffers=False,
        find_unused_parameters=cfg.get('find_unused_parameters', False))
    wrapper_type = MODEL_WRAPPERS.get(wrapper.get('type', 'MMDistributedDataParallel'))
    if isinstance(wrapper_type, type) and issubclass(wrapper_type, DistributedDataParallel):
        wrapper.setdefault('device_ids', None)  # mmengine's default names a GPU: LOCAL_RANK
    cfg.model_wrapper_cfg = wrapper
    if not dist.is_initialized():
        _launcher_variables(launcher)
        kwargs = {k: v for k, v in dist_cfg.items() if k != 'backend'}
        if 'timeout' in kwargs:
            kwargs['timeout'] = datetime.timedelta(seconds=kwargs['timeout'])
        dist.init_process_group(backend=dist_cfg['backend'], init_method='env://', **kwargs)


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
