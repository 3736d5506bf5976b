"""The layout of a result file (``--out``), checked before an earlier one is merged (--previous).

Only what the summary, tables and picture read is checked, each value's type and range, so a
hand-edited or foreign file is refused naming the path inside it (``runs[3].top1``) before any
training, not with a traceback hours later.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

from .protocol import DETECTION_KEYS, METHODS


class Leaf(NamedTuple):
    """A value: its test and what it must be, as a message says it."""

    test: Callable[[object], bool]
    what: str


class Nullable(NamedTuple):
    """``schema`` or null."""

    schema: object


class MapOf(NamedTuple):
    """An object with any keys, each value of ``schema``."""

    schema: object


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


PERCENT = Leaf(lambda v: _finite(v) and 0 <= v <= 100, 'a number in [0, 100] (a percentage)')
MEASURED = Nullable(PERCENT)  # null where nothing was measured (a NaN, written as null)
EPOCH = Leaf(_count, 'an int >= 0')
SECONDS = Nullable(Leaf(lambda v: _finite(v) and v >= 0, 'a number of seconds >= 0'))
METHOD = Leaf(lambda v: isinstance(v, str) and v in METHODS, f'one of {", ".join(METHODS)}')
SEED = Leaf(lambda v: _count(v) and v < 2 ** 32, 'an int in [0, 2**32)')
TEXT = Leaf(lambda v: isinstance(v, str), 'a string')
K = Leaf(lambda v: _count(v) and v >= 2, 'an int >= 2 (clusters)')
HISTORY = [(EPOCH, PERCENT)]  # [[epoch, value], ...]
ROUND = {'epoch': EPOCH, 'rate': Leaf(lambda v: _finite(v) and 0 <= v <= 1, 'a number in [0, 1]'),
         'levels': [{'k': K, 'mtpr?': MEASURED, 'mtnr?': MEASURED}]}
RUN = {
    'method': METHOD, 'seed': SEED, 'top1': PERCENT, 'top1_epoch?': EPOCH, 'top1_history': HISTORY,
    'linear_top1?': MEASURED, 'seconds?': SECONDS, 'linear_seconds?': SECONDS,
    'mtpr?': MEASURED, 'mtnr?': MEASURED, 'k?': K, 'rounds?': [ROUND],
    'detection?': {'false_negatives_eliminated': MEASURED, 'true_negatives_eliminated': MEASURED},
    'flagged?': Nullable({**{key: [(EPOCH, MEASURED)] for key in DETECTION_KEYS},
                          **{f'{key}_mean?': MEASURED for key in DETECTION_KEYS}}),
}
RESULT = {
    'device?': Nullable(TEXT), 'wall_seconds?': SECONDS,
    'settings': {'methods': [METHOD], 'seeds': [SEED], 'method_options?': Nullable(MapOf(Nullable(
        MapOf(Leaf(lambda v: True, 'any value')))))},
    'runs': [RUN], 'merged_from?': [MapOf(Leaf(lambda v: True, 'any value'))],
}


class LayoutError(ValueError):
    """A value out of its layout: where it is, the value and what it must be."""

    def __init__(self, where: str, value: object, what: str, missing: bool = False) -> None:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + '...'
        super().__init__(f'{where} is missing ({what})' if missing else
                         f'{where} is {shown}, not {what}')


def _kind(schema: object) -> str:
    """What a value of ``schema`` is, in a message."""
    if isinstance(schema, Leaf):
        return schema.what
    if isinstance(schema, Nullable):
        return f'{_kind(schema.schema)} or null'
    if type(schema) is tuple:  # noqa: E721  (the named tuples above are schemas of their own)
        return f'a list of {len(schema)} ({", ".join(_kind(s) for s in schema)})'
    return 'a list' if isinstance(schema, list) else 'an object'


def check(value: object, schema: object, where: str) -> None:
    """Raise :class:`LayoutError` at the first value of ``value`` out of ``schema``.

    A schema is a :class:`Leaf`, :class:`Nullable` or :class:`MapOf`; a dict (an object with these
    keys, ``'key?'`` optional, others allowed); ``[item]`` (a list of items); or a tuple (a list of
    exactly these).
    """
    if isinstance(schema, Nullable):
        if isinstance(schema.schema, Leaf) and value is not None and not schema.schema.test(value):
            raise LayoutError(where, value, _kind(schema))
        if value is not None:
            check(value, schema.schema, where)
        return
    if isinstance(schema, Leaf):
        if not schema.test(value):
            raise LayoutError(where, value, schema.what)
        return
    exact = type(schema) is tuple  # noqa: E721  (a list of exactly these; MapOf is a tuple too)
    container = dict if isinstance(schema, (dict, MapOf)) else list
    if not isinstance(value, container) or exact and len(value) != len(schema):
        raise LayoutError(where, value, _kind(schema))
    if isinstance(schema, MapOf):
        for key, item in value.items():
            check(item, schema.schema, f'{where}.{key}')
    elif isinstance(schema, dict):
        for key, item_schema in schema.items():
            name = key.rstrip('?')
            if name in value:
                check(value[name], item_schema, f'{where}.{name}' if where else name)
            elif not key.endswith('?'):
                raise LayoutError(f'{where}.{name}' if where else name, None, _kind(item_schema),
                                  missing=True)
    else:
        for index, item in enumerate(value):
            check(item, schema[index] if exact else schema[0], f'{where}[{index}]')


def check_result(result: dict) -> None:
    """Refuse a result whose values the report would misread (:class:`LayoutError`)."""
    check(result, RESULT, '')
    for index, run in enumerate(result['runs']):
        for key in ('rounds', 'detection'):  # the clustering methods' table reads them
            if METHODS[run['method']].clusters and key not in run:
                raise LayoutError(f'runs[{index}].{key}', None, f"{_kind(RUN[key + '?'])}, which "
                                  f"{run['method']} runs have", missing=True)
