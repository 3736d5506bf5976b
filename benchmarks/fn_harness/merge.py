"""Runs of earlier results (``--previous FILE.json``) merged with this invocation's.

An earlier result (the JSON ``--out`` writes) gives the runs of the methods and seeds this
invocation does not train; its settings must be this invocation's except in what only says which
runs were made, where and how fast. A method's own settings (its config and ``--method-options``)
are compared only where both train it and some of the earlier runs are kept: a method trained
again on every seed the earlier result has (a changed method, a new recipe) replaces its runs.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os.path as osp

from ifnd.fileio import json_safe
from ifnd.fileio.json_files import read_json

from .layout import LayoutError, check_result
from .plan import as_cli
from .protocol import METHODS

# Settings that say which runs were made, where and how fast, not what a run measures.
FREE_SETTINGS = ('methods', 'seeds', 'work_dir', 'jobs', 'threads')
# Settings of one method, compared for the methods both results train.
PER_METHOD = 'method_options', *(f'{m}_config' for m in METHODS)
# An earlier result's largest size: a run takes a few KB, so this holds tens of thousands.
MAX_RESULT_BYTES = 256 << 20


def _plain(value: object) -> object:
    """``value`` as it reads back from a result's JSON (tuples as lists, non-finite as null)."""
    return json.loads(json.dumps(json_safe(value)))


def read_previous(path: str) -> dict:
    """An earlier result of this benchmark, refused with the reason when it is not one."""
    fix = 'give the JSON file an earlier run wrote with --out'
    try:
        result = read_json(path, MAX_RESULT_BYTES, allow_nan=True)  # a NaN is named where it is
    except OSError as err:
        raise SystemExit(f'--previous {path}: cannot be read ({err.strerror or err}); '
                         f'{fix}') from None
    except ValueError as err:
        raise SystemExit(f'--previous {path}: {err}; {fix}') from None
    if not isinstance(result, dict) or result.get('benchmark') != 'false_negatives':
        raise SystemExit(f'--previous {path}: not a false_negatives result (it needs '
                         f"'benchmark': 'false_negatives', 'settings' and 'runs'); {fix}")
    try:
        check_result(result)
    except LayoutError as err:
        raise SystemExit(f'--previous {path}: {err}; correct that value, or {fix}') from None
    return result


def next_seed(paths: list[str]) -> int:
    """The smallest seed no run of the earlier results has: the seed one more run adds."""
    taken = {run['seed'] for path in paths for run in read_previous(path)['runs']}
    return next(seed for seed in itertools.count() if seed not in taken)


def _method_settings(settings: dict, method: str) -> dict:
    """One method's config and own options, the options as the training command writes them."""
    options = (settings.get('method_options') or {}).get(method) or {}
    return {'config': settings.get(f'{method}_config'), 'options': sorted(as_cli(options))}


def settings_differences(previous: dict, current: dict, kept: set[str] | None = None) -> list[str]:
    """``key: earlier value != this value`` for each setting the two results may not differ in;
    ``kept``: the methods whose earlier runs are kept (None: all), the others' own settings free."""
    differences = []
    for key in sorted(set(previous) | set(current)):
        if key in FREE_SETTINGS or key in PER_METHOD:
            continue
        # A key one result lacks (a harness option added since) reads as unset.
        before, now = _plain(previous.get(key)), _plain(current.get(key))
        if before != now:
            differences.append(f'{key}: {before!r} there, {now!r} here')
    shared = [m for m in METHODS if m in (previous.get('methods') or [])
              and m in (current.get('methods') or []) and (kept is None or m in kept)]
    for method in shared:
        before, now = _method_settings(previous, method), _method_settings(current, method)
        if before['config'] != now['config']:
            differences.append(f"{method}_config: {before['config']!r} there, "
                               f"{now['config']!r} here")
        if before['options'] != now['options']:
            differences.append(f"method_options of {method}: {before['options']} there, "
                               f"{now['options']} here")
    return differences


def check_previous(paths: list[str], settings: dict, args: argparse.Namespace) -> list[dict]:
    """The earlier results to merge, each with the runs it gives; refused before any training."""
    trained = {(m, s) for m in args.methods for s in args.seeds}
    previous, given = [], {}
    for path in paths:
        result = read_previous(path)
        kept = {r['method'] for r in result['runs'] if (r['method'], r['seed']) not in trained}
        differences = settings_differences(result['settings'], settings, kept)
        if differences:
            raise SystemExit(f'--previous {path}: its settings differ from this invocation\'s in '
                             f'{"; ".join(differences)}. Only methods, seeds, work_dir, jobs, '
                             'threads and the settings of methods not trained here may differ: '
                             'run with the same settings, or leave the file out')
        runs = [r for r in result['runs'] if (r['method'], r['seed']) not in trained]
        for run in runs:
            key = (run['method'], run['seed'])
            if key in given:
                raise SystemExit(f'--previous: {run["method"]} seed {run["seed"]} is in both '
                                 f'{given[key]} and {path}; give only one of them')
            given[key] = path
        previous.append({'path': path, 'result': result, 'runs': runs})
    return previous


def merge(result: dict, previous: list[dict]) -> dict:
    """``result`` with the earlier results' runs; settings, summary inputs and devices updated."""
    if not previous:
        return result
    settings = dict(result['settings'])
    options = dict(settings.get('method_options') or {})
    runs, devices, sources = list(result['runs']), [result['device']], []
    for source in previous:
        earlier = source['result']['settings']
        taken_only = {r['method'] for r in source['runs']} - set(result['settings']['methods'])
        for method in sorted(taken_only):
            # Its runs are the earlier result's: so are its config and its own settings.
            settings[f'{method}_config'] = earlier.get(f'{method}_config')
            own = (earlier.get('method_options') or {}).get(method)
            if own:
                options[method] = own
            else:
                options.pop(method, None)
        runs += source['runs']
        device = source['result'].get('device')
        if device and device not in devices:
            devices.append(device)
        sources.append({'file': osp.abspath(source['path']), 'device': device,
                        'wall_seconds': source['result'].get('wall_seconds'),
                        'runs': [[r['method'], r['seed']] for r in source['runs']],
                        **({'merged_from': source['result']['merged_from']}
                           if source['result'].get('merged_from') else {})})
    settings['method_options'] = options
    settings['methods'] = [m for m in METHODS if any(r['method'] == m for r in runs)
                           or m in result['settings']['methods']]
    settings['seeds'] = sorted({*result['settings']['seeds'], *(r['seed'] for r in runs)})
    device = devices[0] + ''.join(f'; earlier runs on {d}' for d in devices[1:])
    return dict(result, device=device, settings=settings, runs=runs, merged_from=sources)
