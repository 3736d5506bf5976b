"""A config as data, never code: written to checkpoints as plain Python data, read back from
plain data or from config text by parsing it and evaluating literal values only.

New checkpoints store their training config as a dict (``meta['cfg']``, :func:`config_to_data`);
:func:`checkpoint_config` reads it, or older and foreign files' config text, without executing
anything, and accepts only ``type`` names this project registers.
"""
import ast
import logging

from mmengine.config import Config
from mmengine.logging import print_log

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
