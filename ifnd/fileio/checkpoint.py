"""The safe checkpoint reader: ``torch.load(weights_only=True)`` with mmengine's plain-data state
allowed, errors that name the file (and what it is, when it is no checkpoint) and the fix, and the
checks that a state dict fits a model and holds usable weights."""
import ast
import os
import re
import zipfile

import torch

from ifnd.settings import format_bytes

from .plain_files import check_plain_file

# torch.save writes a zip archive; torch < 1.6 wrote a pickle of protocol 2 (0x80 0x02).
ZIP_MAGIC = b'PK\x03\x04'
PICKLE_START = 0x80
HEAD_BYTES = 4096
# Text files up to this size are parsed to tell Python source from other text.
MAX_SOURCE_BYTES = 1 << 20
PASS_A_CHECKPOINT = 'pass the checkpoint file (.pth) that training or torch.save wrote'
CORRUPT_FIX = 'use an earlier checkpoint of the run (--resume PATH/epoch_N.pth) or copy the file again'


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


def read_checkpoint(filename: str, map_location='cpu') -> dict:
    """A checkpoint file read with ``weights_only=True``, with errors that name the file and the fix."""
    try:
        check_plain_file(filename, 'checkpoint file')  # a FIFO or device would never end a read
    except FileNotFoundError:
        raise FileNotFoundError(f'checkpoint not found: {filename}') from None
    try:
        with torch.serialization.safe_globals(mmengine_checkpoint_globals()):
            checkpoint = torch.load(filename, map_location=map_location, weights_only=True)
    except (MemoryError, OSError):  # the machine's or the file system's problem, said as is
        raise
    except Exception as err:  # noqa: BLE001 (torch raises many kinds on a file it cannot read)
        # torch's own text may advise weights_only=False, which would run the file's code: never shown.
        raise ValueError(_unreadable(filename, err)) from None
    if not isinstance(checkpoint, dict):
        raise ValueError(f'{filename} holds a {type(checkpoint).__name__}, not a state dict or checkpoint')
    _check_dense(checkpoint, filename)
    return checkpoint


# How deep a checkpoint's dicts and lists are searched for tensors (optimiser state: 4 levels).
MAX_NESTING = 16


def _check_dense(value, filename: str, where: str = '', depth: int = 0) -> None:
    """Refuse a tensor whose shape claims more elements than the file holds for it.

    ``torch.save`` keeps a view as its storage and strides: an expanded tensor (stride 0) of
    shape ``[1, 2**30, 1]`` takes 4 bytes in the file, and a reader that builds a model of its
    shape would allocate gigabytes. A model's weights never overlap like this.
    """
    if isinstance(value, torch.Tensor):
        claimed = value.numel() * value.element_size()
        if value.layout == torch.strided and claimed > value.untyped_storage().nbytes():
            raise ValueError(f'{filename}: {where or "the tensor"} has shape {tuple(value.shape)} '
                             f'({format_bytes(claimed)}) but the file holds '
                             f'{format_bytes(value.untyped_storage().nbytes())} of it (an expanded view, '
                             'which no model\'s weights are): the file was altered; '
                             f'{PASS_A_CHECKPOINT}')
    elif depth < MAX_NESTING and isinstance(value, dict):
        for key, item in value.items():
            _check_dense(item, filename, f'{where}.{key}' if where else str(key), depth + 1)
    elif depth < MAX_NESTING and isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_dense(item, filename, f'{where}[{i}]', depth + 1)


def _unreadable(filename: str, err: Exception) -> str:
    """One line saying what a file torch could not load is, and the fix."""
    kind = _not_a_checkpoint(filename)
    if kind is not None:
        return f'{filename} {kind}'
    text = str(err)
    if 'Weights only load failed' in text:
        found = re.search(r'GLOBAL (\S+)', text)
        if found:  # e.g. solo-learn's or VISSL's hyper-parameters as Namespace/OmegaConf objects
            return (f'{filename} holds Python objects ({found.group(1)}) besides its weights, which '
                    'a safe load does not create (creating them can run code from the file): save '
                    'the weights alone with the program that wrote it (torch.save({"state_dict": '
                    'model.state_dict()}, "OUT.pth")) and pass OUT.pth')
        detail = re.search(r'WeightsUnpickler error:\s*(.+)', text)
        reason = detail.group(1).strip() if detail else 'not a pickle torch.save writes'
    elif isinstance(err, EOFError):
        reason = 'the file ends early'
    else:
        lines = text.strip().splitlines()
        reason = lines[0].split('. ')[0] if lines else type(err).__name__
    if 'weights_only' in reason:
        reason = type(err).__name__
    return f'checkpoint {filename} is truncated or corrupt ({reason}); {CORRUPT_FIX}'


def _not_a_checkpoint(filename: str) -> str | None:
    """What a file is that is not a checkpoint, from its first bytes; ``None`` for torch's formats."""
    with open(filename, 'rb') as f:
        head = f.read(HEAD_BYTES)
    if not head:
        return f'is empty (0 bytes), not a checkpoint; {CORRUPT_FIX}'
    if head.startswith(ZIP_MAGIC):
        try:
            with zipfile.ZipFile(filename) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError, ValueError):
            return None  # a zip archive cut short or damaged: torch's reason is shown
        if not any(name == 'data.pkl' or name.endswith('/data.pkl') for name in names):
            return (f'is a zip archive of other files ({", ".join(names[:3]) or "none"}), not a '
                    f'checkpoint; {PASS_A_CHECKPOINT}')
        return None
    if head[:2] == bytes((PICKLE_START, 2)):
        return None
    if head[0] == PICKLE_START:
        return (f'is a Python pickle (protocol {head[1]}) that torch.save did not write, not a '
                f'checkpoint; {PASS_A_CHECKPOINT}')
    try:
        text = head.decode('utf-8')
    except UnicodeDecodeError as err:
        if err.start < len(head) - 3:  # more than a character cut at the end of the read
            return (f'is not a checkpoint (neither a zip archive nor a pickle: it starts with bytes '
                    f'{head[:8].hex(" ")}); {PASS_A_CHECKPOINT}')
        text = head[:err.start].decode('utf-8')
    start = text.lstrip().lower()
    if start.startswith(('<!doctype html', '<html', '<head', '<body', '<?xml')) or '<html' in start[:1024]:
        return (f'looks like an {"XML" if start.startswith("<?xml") else "HTML"} page (a login, error '
                'or download page saved in place of the file), not a checkpoint: download it again '
                'from a link that serves the file itself')
    if _python_source(filename):
        return f'is Python source (a config or script), not a checkpoint; {PASS_A_CHECKPOINT}'
    first = next((line.strip() for line in text.splitlines() if line.strip()), '')
    return f'is a text file, not a checkpoint (it starts with {first[:40]!r}); {PASS_A_CHECKPOINT}'


def _python_source(filename: str) -> bool:
    """Whether a text file parses as Python with an import, definition or assignment in it."""
    if os.path.getsize(filename) > MAX_SOURCE_BYTES:
        return False
    try:
        with open(filename, encoding='utf-8') as f:
            tree = ast.parse(f.read())
    except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError, MemoryError):
        return False
    # A bare expression or 'key: value' (YAML parses as an annotation) is no sign of code.
    return any(isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign))
               for node in tree.body)


def check_weights(state: dict, reference: dict, source: str) -> None:
    """Raise ``ValueError`` for weights that would load but give meaningless features.

    Refused: a non-floating tensor (integer, bool, complex, quantised) where ``reference`` (a
    model's state dict, on any device, ``meta`` included) holds a floating-point one, and
    non-finite values in any floating-point tensor. Keys ``reference`` lacks are not looked at;
    integer buffers of the model (BatchNorm's ``num_batches_tracked``, label banks, queue
    indices) may hold integers.
    """
    non_finite = []
    for key, value in state.items():
        expected = reference.get(key)
        if not isinstance(value, torch.Tensor) or not isinstance(expected, torch.Tensor):
            continue
        if expected.is_floating_point() and not value.is_floating_point():
            raise ValueError(
                f'{source}: {key} holds {str(value.dtype).replace("torch.", "")} values where the '
                f'model has {str(expected.dtype).replace("torch.", "")} weights, so it would load '
                'as numbers that mean nothing: the file was altered or written for another '
                f'model; {PASS_A_CHECKPOINT} from the model itself')
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            non_finite.append(key)
    if non_finite:
        key = non_finite[0]
        value = state[key]
        nan, inf = int(torch.isnan(value).sum()), int(torch.isinf(value).sum())
        more = f' ({len(non_finite) - 1} more tensors too)' if len(non_finite) > 1 else ''
        raise ValueError(
            f'{source}: {key} has {nan + inf} non-finite values ({nan} NaN, {inf} infinite) of '
            f'{value.numel()}{more}, so the features computed with it mean nothing: the run '
            'diverged before this checkpoint or the file was damaged; use an earlier checkpoint of '
            'the run, or train again with a lower learning rate or optim_wrapper.clip_grad')


def _without_module_prefix(state: dict) -> dict:
    return {k[len('module.'):] if k.startswith('module.') else k: v for k, v in state.items()}


def state_differences(model: torch.nn.Module, state: dict) -> str:
    """What keeps ``state`` from loading into ``model`` (missing, unexpected, mis-shaped keys), or ''.

    ``model`` may live on the ``meta`` device: only keys and shapes are compared.
    """
    state = _without_module_prefix(state)
    target = model.state_dict()
    # Per-sample state (the pseudo-label bank, GloFND's thresholds) is sized by the data set and
    # takes the stored shapes when loading.
    resizable = {f'{name}.{key}' if name else key for name, module in model.named_modules()
                 if getattr(module, 'sized_by_data', False)
                 for key, _ in module.named_buffers(recurse=False)}
    # Buffers newer than some checkpoints, which their module fills in when they are missing.
    filled = {f'{name}.{key}' if name else key for name, module in model.named_modules()
              for key in getattr(module, 'filled_when_missing', ())}
    missing = sorted(set(target) - set(state) - filled)
    unexpected = sorted(set(state) - set(target))
    mismatched = sorted(f'{k} {tuple(state[k].shape)} vs {tuple(target[k].shape)}'
                        for k in set(state) & set(target) - resizable
                        if hasattr(state[k], 'shape') and state[k].shape != target[k].shape)

    def first(items: list[str]) -> str:
        return ', '.join(items[:3]) + (f' and {len(items) - 3} more' if len(items) > 3 else '')
    return '; '.join(f'{len(v)} {name} ({first(v)})' for name, v in
                     (('missing keys', missing), ('unexpected keys', unexpected),
                      ('shape mismatches', mismatched)) if v)


def check_state_fits(model: torch.nn.Module, state: dict, filename: str) -> None:
    """Raise ``ValueError`` naming the differences when a state dict was written for another model,
    or when its weights are unusable (:func:`check_weights`)."""
    differences = state_differences(model, state)
    if differences:
        raise ValueError(f'checkpoint {filename} does not fit the model {type(model).__name__}: '
                         f'{differences}. It was written for another architecture or config: '
                         'train or resume with the config it was written with, or load only its '
                         'backbone (model.pretrained=..., tools/extract_backbone.py)')
    check_weights(_without_module_prefix(state), model.state_dict(), filename)
