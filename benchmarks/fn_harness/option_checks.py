"""A run's ``--cfg-options`` refused before any training when the run would refuse them."""
from __future__ import annotations

import argparse
import copy
import os.path as osp


def as_train_reads(options: list[str]) -> dict:
    """``--cfg-options`` items read back as tools/train.py reads them (values typed alike)."""
    from ifnd.engine.config_checks import CfgOptionsAction
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=CfgOptionsAction)
    return parser.parse_args(['--cfg-options', *options]).cfg_options if options else {}


def model_error(cfg) -> Exception | None:
    """Why the config's model cannot be built (its constructor's checks), or None; nothing is allocated."""
    import torch
    from mmengine.registry import init_default_scope

    import ifnd  # noqa: F401  (registers the models)
    from ifnd.engine.input_errors import INPUT_ERRORS
    from ifnd.registry import MODELS
    init_default_scope('ifnd')
    model = copy.deepcopy(cfg.model)
    if cfg.get('data_preprocessor') is not None:
        model.setdefault('data_preprocessor', cfg.data_preprocessor)  # as the Runner builds it
    try:
        with torch.device('meta'):  # shapes only: the full-size models build in a fraction of a second
            MODELS.build(model)
    except (*INPUT_ERRORS, AssertionError) as err:
        return err
    return None


def unknown_keyword(cfg, key: str, method: str) -> str:
    """Why ``key`` is refused by a class that passes ``**kwargs`` on (the key check lets it through)."""
    import difflib

    from ifnd.engine.config_checks import _registered_class
    from ifnd.registry import parameter_types
    *parents, name = key.split('.')
    node = cfg.to_dict()
    for part in parents:
        node = node[int(part)] if isinstance(node, (list, tuple)) else node[part]
    cls = _registered_class(node['type']) if isinstance(node.get('type'), str) else node.get('type')
    names = list(parameter_types(cls)) if cls is not None else []
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    hint = (f'did you mean {" or ".join(method + ":" + ".".join([*parents, c]) for c in close)}?'
            if close else f'it takes: {", ".join(names)}')
    return f'{getattr(cls, "__name__", node.get("type"))} takes no {name!r}; {hint}'


def _fail(method: str, own: dict, key: str, reason: str):
    raise SystemExit(f'error: --method-options {method}:{key}={own[key]}: {reason}')


def _check_keys_and_types(method: str, budget, own: dict, read: dict):
    """Each key names something the config takes, with a value of the declared type; the merge."""
    from ifnd.engine.config_checks import check_cfg_options, check_cfg_types
    for key in own:
        try:
            check_cfg_options(budget, {key: read[key]})
        except SystemExit as err:
            # Its message starts "--cfg-options key '<key>' is not in ...": say it of this option.
            _fail(method, own, key, 'the key ' + str(err.code).split(f"'{key}' ", 1)[-1])
    merged = copy.deepcopy(budget)
    merged.merge_from_dict({key: read[key] for key in own})
    try:
        check_cfg_types(merged)
    except ValueError as err:
        named = [key for key in own if f"'{key}'" in str(err)]
        reason = str(err).split('; fix it in')[0]
        if named:
            _fail(method, own, named[0], f'{reason}; give a value of that type')
        raise SystemExit(f'error: {method}: {reason}') from None
    return merged


def _blame(method: str, budget, own: dict, read: dict, error: Exception) -> None:
    """Name the option the model's constructor refuses (or all of them, refused together)."""
    for key in own:  # the option whose value the constructor refuses
        alone = copy.deepcopy(budget)
        alone.merge_from_dict({key: read[key]})
        refused = model_error(alone)
        if isinstance(refused, TypeError) and 'unexpected keyword argument' in str(refused):
            _fail(method, own, key, unknown_keyword(alone, key, method))
        if refused is not None:
            _fail(method, own, key, f'{" ".join(str(refused).split())}; change the value')
    keys = ' '.join(f'{method}:{key}={value}' for key, value in own.items())
    raise SystemExit(f'error: --method-options {keys}: together they are refused: '
                     f'{" ".join(str(error).split())}; change one of them')


def _check_budget(method: str, cfg, budget_options: dict):
    """The benchmark's own options (budget, seeds, workers) on ``method``'s config, merged; its
    model must build with them."""
    from ifnd.engine.config_checks import check_cfg_options
    try:
        check_cfg_options(cfg, budget_options)
    except SystemExit as err:
        raise SystemExit(f'error: {method}: {err.code} (a key of --cfg-options, or one the '
                         f'benchmark sets: then give {method} a config with it)') from None
    budget = copy.deepcopy(cfg)
    budget.merge_from_dict(budget_options)
    error = model_error(budget)
    if error is not None:
        raise SystemExit(f'error: {method}: the model of {osp.basename(cfg.filename)} does not build '
                         f'with the benchmark\'s settings: {" ".join(str(error).split())}')
    return budget


def check_run_options(method: str, cfg, options: list[str], args: argparse.Namespace) -> None:
    """Refuse a run's ``--cfg-options`` its training run would reject, before any training.

    ``options`` are the run's ``--cfg-options``: each key, the benchmark's own and the method's,
    must name something its config takes (``check_cfg_options``); the method's values must have
    the type the class declares (``check_cfg_types``), and the model must build with them (the
    constructor's range checks).
    """
    own = args.method_options.get(method, {})
    read = as_train_reads(options)
    budget = _check_budget(method, cfg, {k: v for k, v in read.items() if k not in own})
    if not own:
        return
    merged = _check_keys_and_types(method, budget, own, read)
    error = model_error(merged)
    if error is not None:
        _blame(method, budget, own, read, error)
