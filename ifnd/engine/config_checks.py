"""Config values checked before a run: ``--cfg-options`` parsing and keys, value types, top-level
keys, and settings the run would not use or that would leave a part idle."""
import argparse
import ast
import collections.abc
import difflib
import inspect
import logging
import math
import os.path as osp
import types
import typing

from mmengine.config import Config, DictAction
from mmengine.hooks import CheckpointHook
from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor
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
    """Refuse config values of the wrong type (``max_epochs='ten'``), naming the key and the type,
    and NaN anywhere in the config.

    Checked against the type hints of the class each ``type`` names, and of the dict-valued
    options a class declares in ``config_dict_options`` (e.g. PseudoLabelHook's ``kmeans``).
    """
    from ifnd.registry import parameter_types  # imports timm: only when a config is checked

    def fix(key: str) -> str:
        return (f'fix it in {osp.basename(cfg.filename or "the config")} or with --cfg-options '
                f'{key}=... (quote lists and values with spaces)')

    def check(key: str, value: typing.Any, annotation: typing.Any) -> None:
        if not _fits(value, annotation):
            raise ValueError(f'config key {key!r} must be {_type_name(annotation)}, got {value!r} '
                             f'({type(value).__name__}); {fix(key)}')

    def walk(node: typing.Any, path: str) -> None:
        if isinstance(node, float) and math.isnan(node):
            # Every comparison with NaN is false: a probability of NaN applies nothing (or, as
            # `rand >= p`, everything), a NaN rate or lr trains NaN, whatever part reads it.
            raise ValueError(f'config key {path!r} is NaN, which is no setting: every comparison '
                             'with it is false, so the part reading it would silently skip (or '
                             f'always do) what it governs; {fix(path)}')
        if isinstance(node, (list, tuple)):
            for i, item in enumerate(node):
                walk(item, _join(path, i))
            return
        if not isinstance(node, dict):
            return
        cls = node.get('type')
        cls = _registered_class(cls) if isinstance(cls, str) else cls
        types_of = parameter_types(cls) if cls is not None else {}
        nested = getattr(cls, 'config_dict_options', {}) if cls is not None else {}
        for name, value in node.items():
            key = _join(path, name)
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
                      'support_views', 'glofnd', 'nnclr', 'vit_tiny_p4', 'vis_backends')


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
    from ifnd.fileio.former_names import FORMER_HOOK_KEYS  # read as the current names on load
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
    from ifnd.fileio.former_names import former_option_clash
    clash = former_option_clash(options)
    if clash:
        raise SystemExit(clash)
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
                declared = _paramwise_keys() if parts[:depth + 1] == ['optim_wrapper', 'paramwise_cfg'] \
                    else _dict_options(node).get(part)
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
                               else depth == 0 and part in runner_args) \
                        or parts[:depth] == ['optim_wrapper'] and part in OPTIM_WRAPPER_BUILD_KEYS:
                    break
            else:
                break  # a value is being replaced by a dict or list: mmengine merges that itself
            where = '.'.join(parts[:depth]) or 'the config'
            close = difflib.get_close_matches(part, names, n=3, cutoff=0.6)
            hint = (f'did you mean {" or ".join(repr(".".join(parts[:depth] + [c])) for c in close)}?'
                    if close else f'{where} has: {", ".join(map(str, names[:12]))}')
            raise SystemExit(f"--cfg-options key '{key}' is not in {osp.basename(cfg.filename or '')}"
                             f' ({where} has no {part!r}); {hint}')


# The paramwise_cfg keys mmengine's DefaultOptimWrapperConstructor reads (it ignores any other
# silently), and the keys of a custom_keys entry; a constructor of this project declares the keys
# it adds in `paramwise_keys` (LayerDecayOptimWrapperConstructor: layer_decay_rate).
MMENGINE_PARAMWISE_KEYS = ('custom_keys', 'bias_lr_mult', 'bias_decay_mult', 'norm_decay_mult',
                           'dwconv_decay_mult', 'flat_decay_mult', 'dcn_offset_lr_mult',
                           'bypass_duplicate')
CUSTOM_KEY_OPTIONS = ('lr_mult', 'decay_mult')
# The optim_wrapper keys mmengine's build_optim_wrapper reads itself, not the wrapper's class.
OPTIM_WRAPPER_BUILD_KEYS = ('constructor', 'paramwise_cfg')
DEFAULT_CONSTRUCTOR = 'DefaultOptimWrapperConstructor'


def _paramwise_keys(constructor: type | None = None) -> tuple[str, ...]:
    """The paramwise_cfg keys ``constructor`` reads (None: any constructor of the registry)."""
    from ifnd.registry import OPTIM_WRAPPER_CONSTRUCTORS
    classes = [constructor] if constructor is not None else \
        list(OPTIM_WRAPPER_CONSTRUCTORS.module_dict.values())
    return MMENGINE_PARAMWISE_KEYS + tuple(key for cls in classes
                                           for key in getattr(cls, 'paramwise_keys', ()))


def check_idle_settings(cfg: Config) -> None:
    """Refuse settings the run would silently not use or that make their part do nothing, and warn
    (one line each) about those that leave part of the run idle; each names its config key."""
    tree = cfg.to_dict()
    _check_label_bank_hook(tree)
    warnings = _check_optim_wrapper(tree.get('optim_wrapper'))
    for warning in warnings + _unread_settings(tree, '') + _past_the_end(tree):
        print_log(warning, logger='current', level=logging.WARNING)


def _check_optim_wrapper(wrapper: typing.Any) -> list[str]:
    """Refuse paramwise_cfg keys its constructor ignores and gradient clipping that zeroes the
    gradients; a warning for an lr of 0."""
    if not isinstance(wrapper, dict):
        return []
    name = wrapper.get('constructor', DEFAULT_CONSTRUCTOR)
    constructor = _registered_class(name) if isinstance(name, str) else None
    paramwise = wrapper.get('paramwise_cfg')
    if isinstance(paramwise, dict) and isinstance(constructor, type) \
            and issubclass(constructor, DefaultOptimWrapperConstructor):
        from ifnd.registry import OPTIM_WRAPPER_CONSTRUCTORS
        reads = _paramwise_keys(constructor)
        used = f'optim_wrapper.constructor is {name}' if 'constructor' in wrapper else \
            f"optim_wrapper has no constructor (mmengine's {DEFAULT_CONSTRUCTOR})"
        for key in paramwise:
            if key in reads:
                continue
            readers = [other for other, cls in OPTIM_WRAPPER_CONSTRUCTORS.module_dict.items()
                       if key in getattr(cls, 'paramwise_keys', ())]
            close = difflib.get_close_matches(str(key), reads, n=1, cutoff=0.6)
            fix = (f"set optim_wrapper.constructor='{readers[0]}' or remove the key" if readers else
                   f'did you mean {close[0]!r}?' if close else f'it reads {", ".join(reads)}')
            raise ValueError(f"config key 'optim_wrapper.paramwise_cfg.{key}' is "
                             f'{"read only by " + " and ".join(readers) if readers else "not read"}'
                             f', and {used}, which ignores it: {fix}')
        for group, options in (paramwise.get('custom_keys') or {}).items():
            unread = sorted(set(options) - set(CUSTOM_KEY_OPTIONS)) if isinstance(options, dict) else []
            if unread:
                raise ValueError(f"config key 'optim_wrapper.paramwise_cfg.custom_keys.{group}."
                                 f"{unread[0]}' is not read ({name} reads "
                                 f'{" and ".join(CUSTOM_KEY_OPTIONS)} of a custom_keys entry): fix '
                                 'its name or remove it')
    clip = wrapper.get('clip_grad')
    if isinstance(clip, dict):
        key = 'clip_value' if clip.get('type') == 'value' else 'max_norm'
        bound = clip.get(key)
        if isinstance(bound, (int, float)) and not isinstance(bound, bool) and bound <= 0:
            raise ValueError(f"config key 'optim_wrapper.clip_grad.{key}' is {bound}: it clips every "
                             f'gradient to {"0" if bound == 0 else "its reverse"}, so nothing would '
                             'be learned; give the largest gradient '
                             f'{"value" if key == "clip_value" else "norm"} to allow (e.g. 1.0), or '
                             'remove clip_grad')
    lr = (wrapper.get('optimizer') or {}).get('lr')
    if lr == 0 and not isinstance(lr, bool):
        return ["config key 'optim_wrapper.optimizer.lr' is 0: the optimiser changes no weight, so "
                'the run would end with the weights it starts from; give a learning rate']
    return []


def _check_label_bank_hook(tree: dict) -> None:
    """A model that reads pseudo labels (a label-bank detector, PCL's prototypes) with no hook that
    fills them would train as if it had neither."""
    model = tree.get('model')
    cls = _registered_class(model.get('type')) if isinstance(model, dict) and \
        isinstance(model.get('type'), str) else None
    if not hasattr(cls, 'configured_detector'):
        return
    detector = cls.configured_detector(model)
    detector_cls = _registered_class(detector) if isinstance(detector, str) else None
    if getattr(getattr(detector_cls, 'needs', None), 'label_bank', False):
        reader = f"model {model['type']}'s detector {detector}"
    elif getattr(cls, 'uses_prototypes', False):
        reader = f"model {model['type']}'s prototypes"
    else:
        return
    default_hooks = tree.get('default_hooks')
    hooks = list(tree.get('custom_hooks') or []) + list(
        default_hooks.values() if isinstance(default_hooks, dict) else [])
    if any('label_bank' in getattr(_registered_class(hook.get('type')), 'provides', ())
           for hook in hooks if isinstance(hook, dict) and isinstance(hook.get('type'), str)):
        return
    raise ValueError(f"config key 'custom_hooks' has no PseudoLabelHook, and {reader} reads the "
                     'pseudo labels it fills: every sample would keep a label of its own, so the '
                     "run would train as if without them; add dict(type='PseudoLabelHook', "
                     'num_clusters=[...]) to custom_hooks (configs/_base_/pseudo_labels.py has the '
                     "paper's settings)")


def _unread_settings(node: typing.Any, path: str) -> list[str]:
    """Settings given in the config that their part reads only under another setting it does not
    have (a part's ``read_when``)."""
    from ifnd.registry import parameter_defaults
    if isinstance(node, (list, tuple)):
        return [w for i, item in enumerate(node) for w in _unread_settings(item, _join(path, i))]
    if not isinstance(node, dict):
        return []
    cls = _registered_class(node['type']) if isinstance(node.get('type'), str) else None
    found = []
    for key, rule in getattr(cls, 'read_when', {}).items():
        if key not in node:
            continue
        value = node[rule.setting] if rule.setting in node else \
            parameter_defaults(cls).get(rule.setting)
        if not rule.test(value):
            found.append(f'config key {_join(path, key)!r} is read only when {rule.setting} '
                         f'{rule.condition}, and {_join(path, rule.setting)} is {value!r}: '
                         f'{cls.__name__} ignores it; set {rule.setting} or remove {key}')
    return found + [w for key, value in node.items() for w in _unread_settings(value, _join(path, key))]


def _past_the_end(tree: dict) -> list[str]:
    """Epochs of a schedule, checkpoints and validation that come after the run's last epoch."""
    max_epochs = (tree.get('train_cfg') or {}).get('max_epochs')
    if not isinstance(max_epochs, int) or isinstance(max_epochs, bool):
        return []
    end = f"the run's end (train_cfg.max_epochs={max_epochs})"
    fix = 'lower it or raise train_cfg.max_epochs'
    found = []
    schedulers = tree.get('param_scheduler')
    for i, scheduler in enumerate([schedulers] if isinstance(schedulers, dict) else schedulers or []):
        if not isinstance(scheduler, dict) or not scheduler.get('by_epoch', True):
            continue  # by iteration: the epoch's length is known only with the data
        key, kind = f'param_scheduler.{i}', scheduler.get('type')
        begin = scheduler.get('begin', 0)
        if isinstance(begin, int) and begin >= max_epochs:
            found.append(f"config key '{key}.begin' is {begin}, not before {end}: {kind} never "
                         f'acts; {fix}')
            continue
        late = [m for m in scheduler.get('milestones') or [] if isinstance(m, int) and m >= max_epochs]
        if late:
            found.append(f"config key '{key}.milestones' has {late}, past {end}: {kind} never "
                         f'applies {"it" if len(late) == 1 else "them"}; {fix}')
    for name, hook in (tree.get('default_hooks') or {}).items():
        cls = _registered_class(hook.get('type')) if isinstance(hook, dict) and \
            isinstance(hook.get('type'), str) else None
        if not (isinstance(cls, type) and issubclass(cls, CheckpointHook)) \
                or not hook.get('by_epoch', True) or hook.get('save_last', True):
            continue
        interval = hook.get('interval', -1)
        if isinstance(interval, int) and interval > max_epochs:
            found.append(f"config key 'default_hooks.{name}.interval' is {interval}, past {end}, "
                         'and save_last is False: no checkpoint would be written; lower it, or set '
                         f'default_hooks.{name}.save_last=True')
    val_begin = (tree.get('train_cfg') or {}).get('val_begin', 1)
    if tree.get('val_dataloader') and isinstance(val_begin, int) and val_begin > max_epochs:
        found.append(f"config key 'train_cfg.val_begin' is {val_begin}, past {end}: the run "
                     f'would never validate; {fix}')
    return found


def _join(path: str, key: typing.Any) -> str:
    """The dotted config key of ``key`` under ``path``."""
    return f'{path}.{key}' if path else str(key)
