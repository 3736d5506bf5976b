"""Config values checked before a run: ``--cfg-options`` parsing and keys, value types, top-level keys."""
import argparse
import ast
import collections.abc
import difflib
import inspect
import os.path as osp
import types
import typing

from mmengine.config import Config, DictAction
from mmengine.registry import Registry
from mmengine.runner import Runner


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
    if origin is typing.Annotated:  # e.g. a checkpoint's bound on a width
        return _fits(value, args[0])
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


def check_cfg_types(cfg: Config) -> None:
    """Refuse config values of the wrong type (``max_epochs='ten'``), naming the key and the type.

    Checked against the type hints of the class each ``type`` names, and of the dict-valued
    options a class declares in ``config_dict_options`` (e.g. PseudoLabelHook's ``kmeans``).
    """
    from ifnd.registry import parameter_types  # imports timm: only when a config is checked

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
        types_of = parameter_types(cls) if cls is not None else {}
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
# No constructor takes these names (they are values that other keys reuse, not arguments), so
# they are data here, not derived from signatures as the keys under a `type` are.
SHARED_CONFIG_KEYS = ('data_root', 'data', 'mean', 'std', 'view', 'train_pipeline', 'eval_pipeline',
                      'val_dataset', 'knn_hook', 'pseudo_label_hook', 'fn_detection_hook',
                      'support_views', 'glofnd', 'vit_tiny_p4', 'vis_backends')


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
    from ifnd.models.former_names import FORMER_HOOK_KEYS  # read as the current names on load
    return name in FORMER_HOOK_KEYS.get(getattr(cls, '__name__', ''), ()) or any(
        p.name == name or p.kind is p.VAR_KEYWORD for p in params)


def _dict_options(node: dict) -> dict[str, typing.Collection[str]]:
    """The dict-valued keywords of the class a config dict's ``type`` names, with their keys."""
    cls = node.get('type')
    cls = _registered_class(cls) if isinstance(cls, str) else cls
    return dict(getattr(cls, 'config_dict_options', {})) if cls is not None else {}


def _node(tree: typing.Any, path: list[str]) -> typing.Any:
    """The value at a dotted ``--cfg-options`` path of a config tree, or None."""
    node = tree
    for part in path:
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict):
            node = node.get(part)
        else:
            return None
    return node


def check_cfg_options(cfg: Config, options: dict) -> None:
    """Refuse ``--cfg-options`` keys that name nothing in the config, suggesting close names.

    A key may be new only where something takes it: a keyword of the class a ``type`` names, or
    a Runner argument at the top level; otherwise it is a typo that mmengine would silently add.
    """
    runner_args = set(inspect.signature(Runner).parameters)
    tree = cfg.to_dict()
    # A part's new type decides which keys it takes: `acceptance.type=StepAcceptance
    # acceptance.step_epoch=100` is checked against StepAcceptance.
    for key, value in options.items():
        *path, last = key.split('.')
        node = _node(tree, path)
        if last == 'type' and isinstance(node, dict) and 'type' in node:
            node['type'] = value
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

