"""Checkpoint safety: atomic writes, resume under ``torch.load(weights_only=True)``, clear errors.

A checkpoint's training config is data, never code: new checkpoints store it as plain Python
data (``meta['cfg']`` a dict), and :func:`checkpoint_config` reads older or foreign files' config
text by parsing it, evaluating literal values only, without executing anything.
"""
import ast
import glob
import logging
import os
import pickle
import re
import tempfile
from pathlib import Path

import torch
from mmengine.config import Config
from mmengine.fileio import LocalBackend, register_backend
from mmengine.logging import print_log
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

    def call_hook(self, fn_name: str, **kwargs) -> None:
        """Call the hooks; a checkpoint about to be saved gets its config as plain data, not text."""
        if fn_name == 'before_save_checkpoint':
            meta = kwargs['checkpoint'].get('meta')
            if isinstance(meta, dict) and 'cfg' in meta:
                meta['cfg'] = config_to_data(self.cfg)
        super().call_hook(fn_name, **kwargs)

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
        meta = checkpoint.get('meta')
        if isinstance(meta, dict) and 'config' in meta:
            # mmengine's resume runs Config.fromstring on this text (for a GPU-count check): never.
            del meta['config']
            self.logger.info(f"Ignored meta['config'] of {filename}: config text is not executed")
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


# ----------------------------------------------------------------------------- configs as data

PLAIN_SCALARS = (str, int, float, bool, type(None))
# Scopes whose registered names a config read from a checkpoint may use.
OWN_SCOPES = ('ifnd', 'mmengine')
# Keys a config read from a checkpoint never passes on: files to read, mmengine's own fields.
DROPPED_KEYS = ('_base_', 'filename', 'text', 'pretty_text', 'env_variables')
MAX_DEPTH = 64


def config_to_data(cfg) -> dict:
    """A config as plain Python data (dict, list, tuple, str, int, float, bool, None) for a checkpoint.

    Values of other kinds (a class or function in a lazy-import config) become their qualified
    name, a string, so the checkpoint never holds anything a reader would execute.
    """
    def plain(value, depth: int = 0):
        if depth > MAX_DEPTH:
            raise ValueError(f'config nested deeper than {MAX_DEPTH} levels')
        if hasattr(value, 'to_dict') and not isinstance(value, type):
            value = value.to_dict()
        if isinstance(value, dict):
            return {str(k) if not isinstance(k, (str, int)) else k: plain(v, depth + 1)
                    for k, v in value.items()}
        if isinstance(value, (list, set, frozenset)):
            return [plain(v, depth + 1) for v in value]
        if isinstance(value, tuple):
            return tuple(plain(v, depth + 1) for v in value)
        if isinstance(value, PLAIN_SCALARS):
            return value
        name = getattr(value, '__qualname__', None)
        module = getattr(value, '__module__', None)
        return f'{module}.{name}' if name and module else repr(value)
    return plain(cfg)


class _NotData(ValueError):
    """Config content that is not plain data."""


def _check_data(value, where: str, depth: int = 0):
    """``value`` if it is plain data (a copy with lists for lists), else ``_NotData``."""
    if depth > MAX_DEPTH:
        raise _NotData(f'{where} is nested deeper than {MAX_DEPTH} levels')
    if isinstance(value, bool) or isinstance(value, PLAIN_SCALARS):
        return value
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise _NotData(f'{where} has a key of type {type(k).__name__}')
            out[k] = _check_data(v, f'{where}.{k}', depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        items = [_check_data(v, f'{where}[{i}]', depth + 1) for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise _NotData(f'{where} holds a {type(value).__name__}, not plain data')


def _literal(node: ast.AST, depth: int = 0):
    """The value of a literal expression: constants, lists, tuples, dicts, ``dict(k=...)``."""
    if depth > MAX_DEPTH:
        raise _NotData(f'line {getattr(node, "lineno", "?")}: nested deeper than {MAX_DEPTH} levels')
    if isinstance(node, ast.Constant) and isinstance(node.value, PLAIN_SCALARS):
        return node.value
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd))
            and isinstance(node.operand, ast.Constant)
            and isinstance(node.operand.value, (int, float)) and not isinstance(node.operand.value, bool)):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    if isinstance(node, (ast.List, ast.Tuple)) and not any(isinstance(e, ast.Starred) for e in node.elts):
        items = [_literal(e, depth + 1) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
        keys = [_literal(k, depth + 1) for k in node.keys]
        if all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in keys):
            return {k: _literal(v, depth + 1) for k, v in zip(keys, node.values)}
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == 'dict'
            and not node.args and all(kw.arg is not None for kw in node.keywords)):
        return {kw.arg: _literal(kw.value, depth + 1) for kw in node.keywords}
    code = ast.unparse(node)
    raise _NotData(f'line {getattr(node, "lineno", "?")} holds code, not a literal value '
                   f'({code[:60]}{"..." if len(code) > 60 else ""})')


def config_text_to_data(text: str) -> dict:
    """The settings of mmengine config text (``pretty_text``), read without executing it.

    Every statement must assign a literal value (constants, lists, tuples, dicts, ``dict(...)``
    with keyword arguments) to a name; anything else raises ``ValueError`` naming the line.
    """
    try:
        tree = ast.parse(text, mode='exec')
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise _NotData(f'the config text does not parse ({type(err).__name__}: '
                       f'{getattr(err, "msg", err)})') from None
    data = {}
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            code = ast.unparse(stmt).splitlines()[0] if stmt else ''
            raise _NotData(f'line {stmt.lineno} is not an assignment of a literal value '
                           f'({code[:60]}{"..." if len(code) > 60 else ""})')
        try:
            data[stmt.targets[0].id] = _literal(stmt.value)
        except RecursionError:
            raise _NotData(f'line {stmt.lineno} is nested too deeply') from None
    return data


def _registered(name: str) -> bool:
    """Whether ``name`` is registered in ifnd's or mmengine's registries (no import fallback).

    mmengine's ``Registry.get`` imports any dotted module path it is given (``os.system``) when
    the name is not registered: names from a checkpoint are looked up here first, never there.
    """
    from mmengine.registry import Registry

    from ifnd import registry
    scope, _, key = name.rpartition('.')
    if scope not in ('', *OWN_SCOPES) or not key.isidentifier():
        return False
    for reg in vars(registry).values():
        while isinstance(reg, Registry):
            reg.import_from_location()
            if key in reg._module_dict:
                return True
            reg = reg.parent
    return False


def _foreign_names(data, where: str = 'cfg', depth: int = 0) -> list[str]:
    """``type`` / scope values in a config that this project does not register."""
    found = []
    if isinstance(data, dict):
        for key, value in data.items():
            if key == 'type' and not (isinstance(value, str) and _registered(value)):
                found.append(f'{where}.type={value!r}')
            elif key in ('_scope_', 'default_scope') and value not in (None, *OWN_SCOPES):
                found.append(f'{where}.{key}={value!r}')
            else:
                found += _foreign_names(value, f'{where}.{key}', depth + 1)
    elif isinstance(data, (list, tuple)):
        for i, value in enumerate(data):
            found += _foreign_names(value, f'{where}[{i}]', depth + 1)
    return found


def config_data(value, source: str = 'checkpoint', field: str = "meta['cfg']") -> dict | None:
    """A config stored in a checkpoint (plain data or config text) as checked plain data, or ``None``.

    Text is parsed, never executed; names of ``type`` must be registered in this project (an
    unregistered name would make mmengine import and call whatever it names). Anything else
    gives ``None`` and a log line saying why.
    """
    try:
        if isinstance(value, str):
            data = config_text_to_data(value)
        elif isinstance(value, dict):
            data = _check_data(value, field)
        else:
            raise _NotData(f'it is a {type(value).__name__}')
        data = {k: v for k, v in data.items() if k not in DROPPED_KEYS}
        foreign = _foreign_names(data, field)
        if foreign:
            raise _NotData('it names types this project does not register: '
                           + ', '.join(foreign[:3]) + (f' and {len(foreign) - 3} more'
                                                       if len(foreign) > 3 else ''))
    except _NotData as err:
        print_log(f'{source}: its config ({field}) is not used: {err}. It is never executed; the '
                  'backbone is read from the weights (or pass --config / --model-name)',
                  logger='current', level=logging.WARNING)
        return None
    return data


def checkpoint_config(checkpoint: dict, source: str = 'checkpoint') -> Config | None:
    """The training config a checkpoint carries (``meta['cfg']``), read as data, or ``None``.

    The one reader of checkpoint configs: plain data (new checkpoints) or config text (older
    ones, mmselfsup/mmpretrain) is checked by :func:`config_data`; nothing is ever executed.
    """
    meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else None
    if not isinstance(meta, dict) or meta.get('cfg') is None:
        return None
    data = config_data(meta['cfg'], source)
    if data is None:
        return None
    if not all(isinstance(k, str) and k.isidentifier() for k in data):
        print_log(f"{source}: its config (meta['cfg']) is not used: its top-level keys are not all "
                  'names', logger='current', level=logging.WARNING)
        return None
    return Config(data)
