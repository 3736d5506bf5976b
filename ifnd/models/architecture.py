"""What a checkpoint's config may decide: the model's architecture, and nothing else.

A checkpoint is data a user hands us. Its config (``meta['cfg']`` of a training checkpoint,
``meta['model']`` of a backbone-only file) is read as data by
:func:`ifnd.fileio.checkpoint_config`; of it, only the keys listed here, with values of
the listed kinds, reach a builder. The keys of a part with a ``type`` are the parameters of the
registered class's constructor (and of its bases, through ``**kwargs``), each of the kind its
annotation gives; the tables below declare only what an annotation cannot say: nested parts,
narrower kinds (widths and lengths at least 1) and the few keys a constructor takes through
``**kwargs``. Everything else — compile options (the compiler's command line
is one), ``pretrained`` and any path, URL or download flag, ``init_cfg``, data sets, pipelines,
hooks, work dirs — is dropped with one log line naming it, so a reader never compiles, downloads
or writes because a checkpoint says so. The architecture is built on the ``meta`` device and
compared with the checkpoint's weights before any reader builds it for real, so a config never
allocates more memory than its weights already take.
"""
import collections.abc
import copy
import logging
import math
import re
import types
import typing
from typing import Any, Callable

from mmengine.logging import print_log

from ifnd.fileio import checkpoint_config, config_data
from ifnd.models.false_negatives.treatment import WEIGHTING_OPTIONS
from ifnd.registry import ACCEPTANCES, MODELS, parameter_types
from ifnd.settings import MAX_MODEL_BYTES, MAX_SIZE, Bound, format_bytes
from ifnd.fileio.former_names import translate_former_names

NAME = re.compile(r'[A-Za-z0-9_]{1,64}')


class _Refused(ValueError):
    """An allow-listed key whose value is not of its kind."""


def _size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIZE:
        raise _Refused(f'is not a whole number from 1 to {MAX_SIZE}')
    return value


def _bounded(bound: Bound) -> Callable:
    def bounded(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) \
                or not bound.low <= value <= min(bound.high, MAX_SIZE):
            raise _Refused(f'is not a whole number from {bound.low} to {min(bound.high, MAX_SIZE)}')
        return value
    return bounded


# A projection head's layers: each is a module object, made even on the meta device (2**20 of them
# took minutes and gigabytes before a size check could refuse them); heads in use have 2 or 3.
MAX_LAYERS = 64


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SIZE:
        raise _Refused(f'is not a whole number from 0 to {MAX_SIZE}')
    return value


def _sizes(value: Any) -> tuple:
    if not isinstance(value, (list, tuple)) or not 1 <= len(value) <= 16:
        raise _Refused('is not a list of 1 to 16 whole numbers')
    return tuple(_size(v) for v in value)


def _real(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _Refused('is not a finite number')
    return value


def _reals(value: Any) -> tuple:
    if not isinstance(value, (list, tuple)) or not 1 <= len(value) <= 16:
        raise _Refused('is not a list of 1 to 16 numbers')
    return tuple(_real(v) for v in value)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Refused('is not True or False')
    return value


def _name(value: Any) -> str:
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise _Refused('is not a plain name (letters, digits, _)')
    return value


def _optional(check: Callable) -> Callable:
    def optional(value: Any):
        return None if value is None else check(value)
    return optional


def _timm_name(value: Any) -> str:
    """A name of timm's own registry: never ``hf-hub:`` or ``local-dir:``, which fetch or read files."""
    import timm
    if not isinstance(value, str) or not NAME.fullmatch(value) or value not in timm.list_models():
        raise _Refused("is not one of timm's model names (timm.list_models())")
    return value


def _registered(*bases: str, registry=MODELS) -> Callable:
    """A check that a ``type`` names a class registered in ``registry`` deriving from one of
    ``bases``; the check keeps the registry (``check.registry``) for the class's other keys."""
    def registered(value: Any) -> str:
        # The registry's own table, never registry.get: for an unknown name mmengine imports it.
        registry.import_from_location()
        cls = registry._module_dict.get(value) if isinstance(value, str) else None
        if not isinstance(cls, type) or not any(base.__name__ in bases for base in cls.__mro__):
            raise _Refused(f'is not a registered {" or ".join(bases)}')
        return value
    registered.registry = registry
    return registered


BACKBONE_KEYS = dict(type=_registered('TimmBackbone'), model_name=_timm_name, cifar_stem=_flag,
                     channels_last=_flag, channels=_sizes, stem_width=_size, stem_type=_name,
                     in_chans=_size)
# A ViTBackbone's other keys (img_size, patch_size, depth, global_pool, frozen_patch_embed, ...)
# are its constructor's parameters.
NECK_KEYS = dict(type=_registered('MLPNeck'), in_dim=_size, hidden_dim=_size, out_dim=_size,
                 num_layers=_bounded(Bound(1, MAX_LAYERS)), with_bn=_flag, with_last_bn=_flag)
PREPROCESSOR_KEYS = dict(type=_registered('ContrastiveDataPreprocessor'), mean=_reals, std=_reals)
_KINDS: dict[Any, Callable] = {bool: _flag, int: _count, float: _real, str: _name}
# The false-negative parts hold no weights but may hold per-sample state (GloFND's thresholds),
# which a checkpoint's weights carry: kept so those weights load. An acceptance's other keys are
# its class's constructor parameters.
ACCEPTANCE_KEYS = dict(type=_registered('Acceptance', registry=ACCEPTANCES))
# A detector's other keys (alpha, lr, betas, ...) are its class's constructor parameters.
DETECTOR_KEYS = dict(type=_registered('FalseNegativeDetector'), num_support_views=_size,
                     top_k=_optional(_size), acceptance=ACCEPTANCE_KEYS)
WEIGHTING_KEYS = {key: _KINDS[kind] for key, kind in WEIGHTING_OPTIONS.items()}
# The algorithm (or Encoder, or linear classifier): its parts, and the settings declared for every
# model type (keys passed on through **kwargs, narrower kinds); the rest its constructor's.
MODEL_KEYS = dict(
    detector=DETECTOR_KEYS, treatment=_optional(_name), weighting=WEIGHTING_KEYS,
    type=_registered('ContrastiveAlgorithm', 'Encoder', 'ImageClassifier'),
    backbone=BACKBONE_KEYS, neck=NECK_KEYS, predictor=NECK_KEYS, data_preprocessor=PREPROCESSOR_KEYS,
    temperature=_real, queue_len=_size, momentum=_real,
    bn_splits=_size, tau_plus=_real, beta=_real, proto_weight=_real,
    num_support_views=_size, top_k=_optional(_size), threshold=_optional(_real), aggregation=_name,
    num_classes=_size, frozen=_flag, head_norm=_flag)

# Parameters never taken from a checkpoint, whatever their annotation: what reads, fetches,
# compiles or initialises from elsewhere.
NEVER_TAKEN = re.compile(r'path|file|dir|url|download|compile|pretrained|checkpoint|init_cfg|hub',
                         re.IGNORECASE)
# Parameters that say how a machine runs the model, not what the model is: the reader's own
# settings decide them (a decoder one machine lacks would make the config unusable on it).
RUNTIME_KEYS = frozenset({'non_blocking', 'decoder'})


def _one_of(names: tuple) -> Callable:
    def one_of(value: Any) -> Any:
        if isinstance(value, bool) or value not in names:
            raise _Refused(f'is not one of {", ".join(map(repr, names))}')
        return value
    return one_of


def _annotation_check(annotation: Any) -> Callable | None:
    """The check of a value of the kind ``annotation`` names, ``None`` for kinds never taken."""
    if annotation in _KINDS:
        return _KINDS[annotation]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        bounds = [m for m in annotation.__metadata__ if isinstance(m, Bound)]
        return _bounded(bounds[0]) if bounds and args[0] is int else _annotation_check(args[0])
    if origin is typing.Literal and all(isinstance(a, (str, int, float, bool)) for a in args):
        return _one_of(args)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        inner = _annotation_check(rest[0]) if len(rest) == 1 else None
        return inner and (_optional(inner) if len(rest) < len(args) else inner)
    if origin in (tuple, list, collections.abc.Sequence) and args:
        kinds = {a for a in args if a is not Ellipsis}
        if kinds == {int}:
            return _sizes
        if kinds <= {int, float}:
            return _reals
    return None  # dicts, modules, callables: only the declared tables take these


def derived_keys(cls: type) -> dict[str, Callable]:
    """The keys a checkpoint's config may give ``cls``, with their checks, from its constructor."""
    derived = {}
    for name, annotation in parameter_types(cls).items():
        check = (None if NEVER_TAKEN.search(name) or name in RUNTIME_KEYS
                 else _annotation_check(annotation))
        if check is not None:
            derived[name] = check
    return derived


def _allowed(config: dict, declared: dict) -> dict:
    """``declared`` plus the keys the constructor of the class ``config['type']`` names takes.

    Declared entries win: they narrow a kind (a width is at least 1) or nest a part.
    """
    check = declared.get('type')
    if check is None or isinstance(check, dict) or 'type' not in config:
        return declared
    try:
        check(config['type'])
    except _Refused:
        return declared  # _keep refuses the config for its type
    cls = check.registry._module_dict[config['type']]
    return {**derived_keys(cls), **declared}


def _keep(config: Any, allowed: dict, where: str, dropped: list[str]) -> dict:
    """The allow-listed part of ``config``; dropped keys are appended to ``dropped``."""
    if not isinstance(config, dict):
        raise _Refused(f'{where} is not a dict')
    kept = {}
    allowed = _allowed(config, allowed)
    for key, value in config.items():
        check = allowed.get(key)
        if check is None:
            dropped.append(f'{where}.{key}')
        elif isinstance(check, dict) and value is None:
            kept[key] = None  # the builders' own default (e.g. data_preprocessor=None)
        elif isinstance(check, dict):
            kept[key] = _keep(value, check, f'{where}.{key}', dropped)
        else:
            try:
                kept[key] = check(value)
            except _Refused as err:
                raise _Refused(f'{where}.{key}={value!r:.80} {err}') from None
    return kept


def _meta_model(model: dict):
    """``model`` built on the ``meta`` device (no memory), refused if it does not build or would
    need more than ``MAX_MODEL_BYTES``."""
    import torch
    try:
        with torch.device('meta'):
            module = MODELS.build(copy.deepcopy(model))
    except Exception as err:  # noqa: BLE001 (any failure to build makes the config unusable)
        raise _Refused(f'it does not build ({type(err).__name__}: {err})') from None
    needed = _memory(module)
    if needed > MAX_MODEL_BYTES:
        raise _Refused(f'it would need {format_bytes(needed)} for its weights and buffers, more '
                       f'than the {format_bytes(MAX_MODEL_BYTES)} a model may take')
    return module


def _memory(module) -> int:
    """Bytes that building ``module`` for real allocates for its weights and buffers."""
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def _weights_differences(module, checkpoint: dict, source: str) -> str:
    """How a (meta) model's keys and shapes differ from a checkpoint's weights, '' if they do not.

    An ``Encoder`` (a backbone-only file's model) is compared with the backbone's weights alone.
    """
    from ifnd.fileio.checkpoint import state_differences
    from ifnd.fileio.checkpoint_layouts import backbone_state
    if type(module) is MODELS._module_dict.get('Encoder'):  # a backbone-only file's model
        try:
            return state_differences(module.backbone.model, backbone_state(checkpoint, source))
        except ValueError:
            return 'its weights are in no layout the readers know'
    state = checkpoint.get('state_dict')
    return state_differences(module, state if isinstance(state, dict) else {})


def architecture_config(model: Any, source: str = 'checkpoint', ignored: tuple = (),
                        checkpoint: dict | None = None) -> dict | None:
    """The architecture part of a model config from a checkpoint, or ``None`` when it is unusable.

    Keys outside the allow-list are dropped, and with ``ignored`` (the config's other top-level
    keys) named in one log line; a listed key whose value is not of its kind makes the whole
    config unusable (one log line says why). With ``checkpoint``, the architecture, built on the
    ``meta`` device, must have exactly the keys and shapes of the weights it holds: a config that
    claims more (or other) than its weights is never built for real.
    """
    dropped = list(ignored)
    try:
        try:
            model = translate_former_names(model, source)
        except ValueError as err:
            raise _Refused(str(err)) from None
        kept = _keep(copy.deepcopy(model), MODEL_KEYS, 'model', dropped)
        if 'type' not in kept:
            raise _Refused('model names no type')
        module = _meta_model(kept)
        differences = '' if checkpoint is None else _weights_differences(module, checkpoint, source)
        if differences:
            raise _Refused(f'it does not describe the weights the file holds (weights vs config: '
                           f'{differences}); built, it would need {format_bytes(_memory(module))}')
    except _Refused as err:
        print_log(f'{source}: its model config is not used: {err}. The architecture is read from '
                  'the weights (or pass --config / --model-name)', logger='current',
                  level=logging.WARNING)
        return None
    if dropped:
        print_log(f"{source}: a checkpoint's config decides the architecture only; ignored "
                  f'{", ".join(dropped)}', logger='current', level=logging.INFO)
    return kept


def checkpoint_architecture(checkpoint: dict, source: str = 'checkpoint') -> dict | None:
    """The model architecture a checkpoint's config describes (allow-listed), or ``None``.

    Training checkpoints carry their whole config in ``meta['cfg']``, backbone-only files their
    model in ``meta['model']``; only the model's architecture is taken from either, and only when
    it has the keys and shapes of the checkpoint's own weights. Configs of mmengine-based peers
    (mmselfsup, mmpretrain) name types this project lacks and give ``None``.
    """
    meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else None
    if not isinstance(meta, dict):
        return None
    ignored: tuple = ()
    if meta.get('cfg') is not None:
        cfg = checkpoint_config(checkpoint, source)
        if cfg is None:
            return None
        ignored = tuple(sorted(k for k in cfg if k != 'model'))
        model = cfg.get('model')
        model = model.to_dict() if hasattr(model, 'to_dict') else model
    elif meta.get('model') is not None:
        model = config_data(meta['model'], source, "meta['model']")
        if isinstance(model, dict):
            model = dict(model, type=model.get('type', 'Encoder'))
    else:
        return None
    return architecture_config(model, source, ignored, checkpoint) if isinstance(model, dict) else None
