"""Checkpoint safety: atomic writes, resume under ``torch.load(weights_only=True)``, clear errors.

A checkpoint's training config is data, never code: new checkpoints store it as plain Python
data (``meta['cfg']`` a dict), and :func:`checkpoint_config` reads older or foreign files' config
text by parsing it, evaluating literal values only, without executing anything.
"""
import ast
import glob
import logging
import math
import os
import pickle
import re
import shutil
import tempfile
from pathlib import Path

import torch
from mmengine.config import Config
from mmengine.fileio import LocalBackend, register_backend
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapper
from mmengine.runner import Runner
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
                # The message alone, without '[Errno N]' before it: the tools print it as their line.
                failed = OSError(f'could not write {filepath} ({err.strerror or err}); {kept}. '
                                 f'Free space in {folder} (or choose another --work-dir) and run again '
                                 '(--resume continues from the last checkpoint)')
                failed.errno = err.errno
                raise failed from err
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

    ``--resume`` without a path continues from the work dir's own files (:func:`resume_checkpoint`),
    and the optimizer settings named in ``resume_optimizer_keys`` (tools/train.py: those given
    with ``--cfg-options optim_wrapper.optimizer.KEY=...``) are taken from this run's config
    instead of the checkpoint.
    """

    resume_optimizer_keys: tuple[str, ...] = ()

    def load_or_resume(self) -> None:
        """Load or resume as mmengine does, but refuse ``--resume`` when there is nothing to resume."""
        if self._resume and self._load_from is None and not self._has_loaded:
            path, note = resume_checkpoint(self.work_dir)
            if path is None:
                raise FileNotFoundError(
                    f'--resume found no checkpoint in {self.work_dir} (no last_checkpoint file, no '
                    'epoch_*.pth or iter_*.pth); start the run without --resume, or pass the file: '
                    '--resume PATH/epoch_N.pth')
            if note:
                self.logger.warning(note)
            self._load_from = path
        resuming = self._resume and not self._has_loaded
        if resuming:
            self._remove_unfinished_writes()
        wanted = self._optimizer_settings() if resuming and self.resume_optimizer_keys else None
        super().load_or_resume()
        if wanted:
            self._apply_optimizer_settings(wanted)
        elif resuming and self.resume_optimizer_keys:
            self.logger.warning(f'{", ".join(self.resume_optimizer_keys)} from the command line not '
                                f'applied to a {type(self.optim_wrapper).__name__} (one built '
                                "OptimWrapper only): the checkpoint's values hold")

    def _optimizer_settings(self) -> list[dict] | None:
        """This run's configured values of ``resume_optimizer_keys``, per param group, before resuming."""
        if not isinstance(self.optim_wrapper, OptimWrapper):
            return None  # not built (val/test) or several optimizers: nothing to carry over
        # A scheduler moves the current value; the configured one is kept as initial_<key>.
        return [{k: g.get(f'initial_{k}', g[k]) for k in self.resume_optimizer_keys if k in g}
                for g in self.optim_wrapper.optimizer.param_groups]

    def _apply_optimizer_settings(self, wanted: list[dict]) -> None:
        """Put this run's optimizer values in place of the resumed ones, at the schedule's position.

        The checkpoint restores every param group's values and the schedulers' ``base_values``;
        a numeric value is scaled by new/old configured value, which follows multiplicative
        schedules exactly (warm-up, steps, cosine to zero), and the schedulers' base values become
        the new ones, so the rest of the schedule is the new value's.
        """
        groups = self.optim_wrapper.optimizer.param_groups
        schedulers = self.param_schedulers or []
        if isinstance(schedulers, dict):
            schedulers = [s for group in schedulers.values() for s in group]
        changed = []
        for key in self.resume_optimizer_keys:
            before = None
            for group, values in zip(groups, wanted):
                if key not in values or key not in group:
                    continue
                new, old = values[key], group.get(f'initial_{key}', group[key])
                before = old if before is None else before
                numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool)
                              for v in (new, old, group[key]))
                group[key] = group[key] * new / old if numbers and old else new
                if f'initial_{key}' in group:
                    group[f'initial_{key}'] = new
            for scheduler in schedulers:
                if getattr(scheduler, 'param_name', None) == key:
                    scheduler.base_values = [g.get(f'initial_{key}', g[key]) for g in groups]
                    scheduler._last_value = [g[key] for g in groups]
            if before is not None and wanted[0].get(key) != before:
                now = groups[0][key]
                new = wanted[0][key]
                same = now == new or all(isinstance(v, (int, float)) for v in (now, new)) \
                    and math.isclose(now, new)
                changed.append(f"{key}={new} from the command line instead of the checkpoint's "
                               f'{before}' + ('' if same else f' ({now:.6g} at this point of the '
                                                                'schedule)'))
        if changed:
            self.logger.info('Resumed with ' + '; '.join(changed))

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
    when there is none; a ``last_checkpoint`` that names no file raises ``ValueError``.
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
