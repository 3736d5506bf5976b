"""False-negative methods under one recipe and several seeds: top-1 with error bars.

Trains SimCLR (instance discrimination), IFND (pseudo labels, elimination), SupCon (attraction
with ground truth), the elimination oracle (Eq. 3 with ground truth), debiased contrastive
learning (Chuang et al., 2020), hard negative sampling (Robinson et al., 2021) and false negative
cancellation (FNC, Huynh et al., 2022; elimination and attraction) with ``tools/train.py``, one
subprocess per method and seed, the same budget through ``--cfg-options``; ``--methods`` picks
any subset. After each pre-training run a linear probe (the linear protocol, frozen backbone,
through ``tools/train.py``) is trained on the same images. The tables give, per method, mean +- sd
over seeds of the final weighted-kNN and linear top-1; the per-seed paired difference to SimCLR
with its mean and a 95 % t-interval; and the share of the SimCLR -> SupCon gap each method
closes, with Fieller's 95 % interval for a ratio of paired means. IFND's MTPR / MTNR (Sec. 4.4)
and acceptance rate per clustering round come from its ``pseudo_labels/rounds.json``; the
precision and recall of the negatives IFND and FNC flag, per epoch in the batches trained on,
from the runs' logged ``train/fn_precision`` / ``train/fn_recall``. A picture shows kNN top-1 over epochs
(mean line, sd band), IFND's rounds and the flagging methods' precision and recall.

``--eval-split val`` holds a class-balanced part of the training split out of training and
evaluates on it: hyper-parameters are chosen that way, never on the test split. ``test`` (the
default) trains on the training split and evaluates on the test split.

Presets:

* ``cpu``: three seeds of every method on a 2-core CPU in about 2 hours with ``--jobs 2`` (10 %
  of Fashion-MNIST, a half-width ResNet-18, 30 epochs; the hyper-parameters, the methods' own
  included, chosen on the val split as README's "Does it work?" section says).
* ``gpu``: the configs' own settings (full data, 200 epochs, batch 256, clustering every 5
  epochs, kNN every 10) on one GPU.

Any explicit option overrides its preset value. Finished runs are kept (``run.json`` in each run's
work dir) and not trained again unless their command changed or ``--rerun`` is given, so an
interrupted benchmark continues where it stopped. Example::

    python benchmarks/false_negatives.py --preset cpu --out fn_cpu.json --plot fn_cpu.png
    python benchmarks/false_negatives.py --preset cpu --eval-split val --seeds 0 \\
        --temperature 0.2 --num-clusters 30,100 --work-dir work_dirs/fn_select/t02_k30-100
    python benchmarks/false_negatives.py --preset cpu --eval-split val --seeds 0 \\
        --methods hard_negative --method-options hard_negative:model.beta=4.0 \\
        --work-dir work_dirs/fn_select/hard_b4
    python benchmarks/false_negatives.py --preset gpu --work-dir work_dirs/fn_gpu --amp
"""
from __future__ import annotations

import argparse
import concurrent.futures
import glob
import json
import math
import os
import os.path as osp
import platform
import shlex
import subprocess
import sys
import time
from typing import Sequence

import numpy as np

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))

# Configs sharing one recipe per data set: instance baseline, IFND, the two oracles and the other
# false-negative methods.
DATASETS = {
    'fmnist': {
        'simclr': 'configs/simclr/simclr_r18_200e_fmnist.py',
        'ifnd': 'configs/ifnd/ifnd_r18_200e_fmnist.py',
        'supcon': 'configs/ifnd/supcon_r18_200e_fmnist.py',
        'oracle_elim': 'configs/ifnd/oracle_elim_r18_200e_fmnist.py',
        'debiased': 'configs/debiased/debiased_r18_200e_fmnist.py',
        'hard_negative': 'configs/hard_negative/hard_negative_r18_200e_fmnist.py',
        'fnc_elim': 'configs/fnc/fnc_elim_r18_200e_fmnist.py',
        'fnc_attr': 'configs/fnc/fnc_attr_r18_200e_fmnist.py',
        'linear': 'configs/benchmarks/linear/linear_r18_100e_fmnist.py',
    },
    **{name: {
        'simclr': f'configs/simclr/simclr_r50_1000e_{name}.py',
        'ifnd': f'configs/ifnd/ifnd_r50_1000e_{name}.py',
        'supcon': f'configs/ifnd/supcon_r50_1000e_{name}.py',
        'oracle_elim': f'configs/ifnd/oracle_elim_r50_1000e_{name}.py',
        'debiased': f'configs/debiased/debiased_r50_1000e_{name}.py',
        'hard_negative': f'configs/hard_negative/hard_negative_r50_1000e_{name}.py',
        'fnc_elim': f'configs/fnc/fnc_elim_r50_1000e_{name}.py',
        'fnc_attr': f'configs/fnc/fnc_attr_r50_1000e_{name}.py',
        'linear': f'configs/benchmarks/linear/linear_r50_100e_{name}.py',
    } for name in ('cifar10', 'cifar100')},
}
METHODS = ('simclr', 'ifnd', 'supcon', 'oracle_elim', 'debiased', 'hard_negative', 'fnc_elim',
           'fnc_attr')
TITLES = {'simclr': 'SimCLR', 'ifnd': 'IFND', 'supcon': 'SupCon', 'oracle_elim': 'Oracle-elim',
          'debiased': 'Debiased', 'hard_negative': 'Hard negatives', 'fnc_elim': 'FNC-elim',
          'fnc_attr': 'FNC-attr'}
LABELS = {'simclr': 'instance labels', 'ifnd': 'pseudo labels (k-means)',
          'supcon': 'ground truth, attraction', 'oracle_elim': 'ground truth, elimination',
          'debiased': 'instance labels, negatives debiased by a class prior',
          'hard_negative': 'instance labels, negatives reweighted by hardness',
          'fnc_elim': 'support views flag negatives, elimination',
          'fnc_attr': 'support views flag negatives, attraction'}
# Every method but the two ends of the gap: their share of the SimCLR -> SupCon gap is reported.
CLOSERS = tuple(m for m in METHODS if m not in ('simclr', 'supcon'))
# Methods that flag individual negatives as false: their in-batch detection precision and recall
# (against the ground-truth classes) are logged per epoch by FalseNegativeDetectionHook.
FLAGGERS = ('ifnd', 'fnc_elim', 'fnc_attr')
DETECTION_KEYS = ('train/fn_precision', 'train/fn_recall')

# The methods' own settings on the cpu budget, chosen on the val split (README); the configs keep
# the papers' values for their own recipes.
CPU_METHOD_OPTIONS = {'debiased': {'model.tau_plus': 0.01}, 'hard_negative': {'model.beta': 2.0},
                      'fnc_elim': {'model.top_k': 3}, 'fnc_attr': {'model.top_k': 3}}
# None means: keep the config's value. The cpu values were chosen on the val split (README).
PRESETS = {
    'cpu': dict(epochs=30, subset=0.1, batch_size=128, backbone='resnet18', cifar_stem=False,
                channels='32,64,128,256', neck_hidden=256, cluster_interval=3, knn_interval=5,
                val_fraction=1.0, lr=0.25, warmup_epochs=2, num_workers=2, temperature=0.2,
                num_clusters=None, final_rate=None, nredo=2, linear_epochs=10,
                seeds=[0, 1, 2], method_options=CPU_METHOD_OPTIONS),
    'gpu': dict(epochs=None, subset=None, batch_size=None, backbone=None, cifar_stem=None,
                channels=None, neck_hidden=None, cluster_interval=None, knn_interval=None,
                val_fraction=None, lr=None, warmup_epochs=None, num_workers=None,
                temperature=None, num_clusters=None, final_rate=None, nredo=None,
                linear_epochs=None, seeds=[0, 1, 2], method_options={}),
}

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the shared helpers beside this script
from common import HelpFormatter  # noqa: E402


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.replace(' ', '').split(',') if v]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(
        description='Train false-negative methods (SimCLR, IFND, SupCon, the elimination '
        'oracle, debiased, hard negatives, FNC) with one recipe and several seeds '
        '(tools/train.py in subprocesses, each followed by a linear probe), then print kNN and '
        'linear top-1 (mean +- sd), the paired differences to SimCLR, the share of the SimCLR -> '
        'SupCon gap closed (95%% intervals), IFND\'s MTPR/MTNR per round and the precision and '
        'recall of the negatives IFND and FNC flag.',
        formatter_class=HelpFormatter)
    parser.add_argument('--preset', choices=sorted(PRESETS), default='cpu',
                        help="budget: 'cpu' (about 2 hours on 2 cores with --jobs 2) or 'gpu' "
                        "(the configs' own settings); the options below override it")
    parser.add_argument('--dataset', choices=sorted(DATASETS), default='fmnist',
                        help='which configs to train')
    parser.add_argument('--methods', nargs='+', choices=METHODS, default=list(METHODS),
                        help='methods to train (SimCLR and SupCon are needed for the gaps)')
    parser.add_argument('--seeds', nargs='+', type=int, default=None,
                        help='run seeds; every method runs once per seed (preset: 0 1 2)')
    parser.add_argument('--eval-split', choices=('test', 'val'), default='test',
                        help="'val': hold --val-fraction of the training split out of training "
                        "and evaluate on it (choosing hyper-parameters); 'test': the test split")
    for method in METHODS:
        parser.add_argument(f'--{method.replace("_", "-")}-config', default=None,
                            help=f'config of {TITLES[method]} (default: from --dataset)')
    parser.add_argument('--linear-config', default=None,
                        help='linear-probe config (default: from --dataset)')
    cpu = ', '.join([f'{key}={value}' for key, value in PRESETS['cpu'].items()
                     if value is not None and key not in ('seeds', 'method_options')]
                    + _method_option_texts(PRESETS['cpu']['method_options']))
    budget = parser.add_argument_group(
        'budget', f'Unset options take the preset value: cpu: {cpu}; gpu keeps the configs.')
    budget.add_argument('--epochs', type=int, default=None, help='training epochs')
    budget.add_argument('--subset', type=float, default=None,
                        help='class-balanced fraction of the training split trained on (1 = all)')
    budget.add_argument('--batch-size', type=int, default=None, help='images per batch')
    budget.add_argument('--backbone', default=None, help='timm model name, e.g. resnet18')
    budget.add_argument('--cifar-stem', action=argparse.BooleanOptionalAction, default=None,
                        help='3x3 stride-1 ResNet stem without max-pool')
    budget.add_argument('--channels', default=None,
                        help='ResNet stage widths, e.g. 32,64,128,256 (half width)')
    budget.add_argument('--neck-hidden', type=int, default=None,
                        help='hidden width of the projection head')
    budget.add_argument('--cluster-interval', type=int, default=None,
                        help='IFND re-clustering interval in epochs')
    budget.add_argument('--knn-interval', type=int, default=None,
                        help='kNN evaluation interval in epochs (it always runs after the last '
                        'epoch; by default only then when --epochs is set)')
    budget.add_argument('--val-fraction', type=float, default=None,
                        help='class-balanced fraction of the evaluation split used as queries '
                        '(with --eval-split val: of the training split, held out of training)')
    budget.add_argument('--lr', default=None,
                        help="SGD learning rate, or 'scaled' for 0.5 x batch / 1024 (the recipe)")
    budget.add_argument('--warmup-epochs', type=int, default=None,
                        help='linear warm-up epochs before the cosine decay (used when --epochs '
                        "changes the schedule; default 5%% of the epochs)")
    budget.add_argument('--num-workers', type=int, default=None, help='data-loader workers')
    budget.add_argument('--temperature', type=float, default=None,
                        help='loss temperature of every method (IFND\'s kappa follows it)')
    budget.add_argument('--num-clusters', type=_ints, default=None,
                        help='IFND\'s k per level, e.g. 10,30,100')
    budget.add_argument('--final-rate', type=float, default=None,
                        help='IFND\'s acceptance rate at the last epoch (linear schedule)')
    budget.add_argument('--nredo', type=int, default=None, help='k-means restarts of IFND')
    budget.add_argument('--linear-epochs', type=int, default=None,
                        help='linear-probe epochs (its lr steps scale with them); 0 skips it')
    budget.add_argument('--method-options', nargs='+', default=None, metavar='METHOD:KEY=VALUE',
                        help="one method's config overrides, e.g. debiased:model.tau_plus=0.05 "
                        'hard_negative:model.beta=1 (they replace the preset\'s for that key)')
    parser.add_argument('--cfg-options', nargs='+', default=[],
                        help='extra key=value overrides passed to every pre-training run')
    parser.add_argument('--amp', action='store_true', help='train with mixed precision')
    parser.add_argument('--threads', type=int, default=None,
                        help='OMP/MKL threads of each training process (default: torch\'s own, '
                        'or cores / --jobs)')
    parser.add_argument('--jobs', type=int, default=1,
                        help='training runs at a time (on a CPU, each gets cores / jobs threads)')
    parser.add_argument('--level', default='finest',
                        help="clustering level for the MTPR/MTNR column: 'finest' (largest k, as "
                        "the paper's k=100) or its index")
    parser.add_argument('--work-dir', default=None,
                        help='parent of one work dir per method and seed (default: '
                        'work_dirs/false_negatives/<dataset>_<preset>_<eval split>)')
    parser.add_argument('--python', default=sys.executable, help='interpreter for tools/train.py')
    parser.add_argument('--dry-run', action='store_true', help='print the commands, run nothing')
    parser.add_argument('--skip-train', action='store_true',
                        help='only read the results already in the work dirs')
    parser.add_argument('--rerun', action='store_true',
                        help='train again also runs whose results are already there')
    parser.add_argument('--verbose', action='store_true',
                        help='show the training output (otherwise it goes to train.log)')
    parser.add_argument('--out', default=None, help='also write the results as JSON here')
    parser.add_argument('--plot', default=None,
                        help='also draw kNN top-1 over epochs and IFND\'s rounds into this PNG')
    args = parser.parse_args(argv)

    preset = PRESETS[args.preset]
    given = args.method_options or []
    args.method_options = None
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.method_options = {m: dict(o) for m, o in args.method_options.items()}
    for item in given:
        method, sep, assignment = item.partition(':')
        key, eq, value = assignment.partition('=')
        if not (sep and eq and key) or method not in METHODS:
            parser.error(f'--method-options takes METHOD:KEY=VALUE with METHOD one of '
                         f'{", ".join(METHODS)}, got {item!r}')
        if method not in args.methods:
            # It would be silently ignored: no run of that method is made.
            parser.error(f'--method-options {item}: {method} is not in --methods '
                         f'({" ".join(args.methods)}); add it to --methods or drop the option')
        args.method_options.setdefault(method, {})[key] = value
    if args.epochs is not None and args.epochs < 1:
        parser.error('--epochs must be >= 1')
    for name in ('subset', 'val_fraction', 'final_rate'):
        value = getattr(args, name)
        if value is not None and not 0.0 < value <= 1.0:
            parser.error(f'--{name.replace("_", "-")} must be in (0, 1]')
    for name in ('batch_size', 'cluster_interval', 'knn_interval', 'nredo', 'jobs',
                 'neck_hidden'):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f'--{name.replace("_", "-")} must be >= 1')
    if args.linear_epochs is not None and args.linear_epochs < 0:
        parser.error('--linear-epochs must be >= 0')
    if args.temperature is not None and args.temperature <= 0:
        parser.error('--temperature must be > 0')
    if args.num_clusters is not None and (not args.num_clusters or min(args.num_clusters) < 2):
        parser.error('--num-clusters needs k >= 2 per level, e.g. 10,30,100')
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f'--seeds repeats a seed: {args.seeds}')
    if args.eval_split == 'val' and (args.val_fraction is None or args.val_fraction >= 1.0):
        parser.error('--eval-split val needs --val-fraction below 1 (the held-out share of the '
                     'training split), e.g. 0.1')
    if args.channels is not None and not isinstance(args.channels, tuple):
        try:
            args.channels = tuple(_ints(args.channels))
        except ValueError:
            parser.error(f'--channels must be integers like 32,64,128,256, got {args.channels!r}')
    if args.lr is not None and args.lr != 'scaled':
        try:
            args.lr = float(args.lr)
        except ValueError:
            parser.error(f"--lr must be a number or 'scaled', got {args.lr!r}")
    if args.level != 'finest':
        try:
            args.level = int(args.level)
        except ValueError:
            parser.error(f"--level must be 'finest' or an integer, got {args.level!r}")
    for method in (*args.methods, 'linear'):
        key = f'{method}_config'
        if getattr(args, key) is None:
            setattr(args, key, DATASETS[args.dataset][method])
        setattr(args, key, resolve_config(getattr(args, key)))
    # Training runs in the repository root: make the work dir independent of the caller's cwd.
    if args.work_dir is None:
        args.work_dir = osp.join(REPO, 'work_dirs', 'false_negatives',
                                 f'{args.dataset}_{args.preset}_{args.eval_split}')
    args.work_dir = osp.abspath(args.work_dir)
    if args.threads is None and args.jobs > 1 and not args.dry_run:
        import torch
        if not torch.cuda.is_available():
            args.threads = max(1, (os.cpu_count() or 1) // args.jobs)
    return args


def resolve_config(path: str) -> str:
    """A config path as tools/train.py (run in the repository root) will find it."""
    if osp.isfile(path) and not osp.isfile(osp.join(REPO, path)):
        path = osp.abspath(path)  # relative to the caller's cwd, not to the repository
    full = path if osp.isabs(path) else osp.join(REPO, path)
    if not osp.isfile(full):
        raise SystemExit(f'config not found: {path}')
    return path


def _load_config(path: str):
    from mmengine.config import Config
    return Config.fromfile(path if osp.isabs(path) else osp.join(REPO, path))


def _hook_index(cfg, hook_type: str) -> int | None:
    for i, hook in enumerate(cfg.get('custom_hooks', [])):
        if hook.get('type') == hook_type:
            return i
    return None


def cfg_options(method: str, cfg, args: argparse.Namespace, seed: int | None = None,
                split: dict | None = None) -> list[str]:
    """The ``--cfg-options`` overrides that put ``method``'s config on the chosen budget."""
    opts: dict[str, object] = {}
    if seed is not None:
        opts['randomness.seed'] = seed
    if args.epochs is not None:
        opts['train_cfg.max_epochs'] = args.epochs
        scheds = cfg.get('param_scheduler') or []
        if args.epochs != cfg.train_cfg.max_epochs:
            # The configs warm up linearly for 5% of the epochs, then decay by cosine; the epoch
            # bounds are absolute, so they must follow a changed length.
            types = [s.get('type') for s in scheds]
            if types == ['LinearLR', 'CosineAnnealingLR']:
                warm = args.warmup_epochs if args.warmup_epochs is not None \
                    else round(0.05 * args.epochs)
                warm = max(1, min(warm, args.epochs))
                end = max(args.epochs, warm + 1)
                opts.update({'param_scheduler.0.end': warm, 'param_scheduler.1.begin': warm,
                             'param_scheduler.1.end': end, 'param_scheduler.1.T_max': end - warm})
            else:
                print(f'warning: {method}: param_scheduler {types} is left as configured for '
                      f'{cfg.train_cfg.max_epochs} epochs', file=sys.stderr)
    opts.update(train_subset_options('train_dataloader.dataset', cfg.train_dataloader.dataset,
                                     args, split))
    batch = args.batch_size or cfg.train_dataloader.batch_size
    if args.batch_size is not None:
        opts['train_dataloader.batch_size'] = args.batch_size
    if args.lr == 'scaled':
        opts['optim_wrapper.optimizer.lr'] = 0.5 * batch / 1024
    elif args.lr is not None:
        opts['optim_wrapper.optimizer.lr'] = args.lr
    opts.update(backbone_options(args))
    if args.neck_hidden is not None:
        opts['model.neck.hidden_dim'] = args.neck_hidden
    if args.temperature is not None:
        opts['model.temperature'] = args.temperature
    if args.num_workers is not None:
        opts.update(worker_options('train_dataloader', cfg, args.num_workers))
    knn = _hook_index(cfg, 'KNNEvalHook')
    if knn is None:
        raise SystemExit(f'{method}: the config has no KNNEvalHook in custom_hooks; top-1 '
                         'cannot be measured')
    if args.knn_interval is not None:
        opts[f'custom_hooks.{knn}.interval'] = args.knn_interval
    elif args.epochs is not None:
        # Only the final top-1 is reported: evaluate once, after the last epoch.
        opts[f'custom_hooks.{knn}.interval'] = args.epochs
    opts.update(query_options(f'custom_hooks.{knn}.val_dataset', cfg.custom_hooks[knn].val_dataset,
                              args, split))
    if args.num_workers is not None:
        opts[f'custom_hooks.{knn}.num_workers'] = args.num_workers
    labels = _hook_index(cfg, 'PseudoLabelHook')
    if labels is not None:
        if seed is not None:
            opts[f'custom_hooks.{labels}.seed'] = seed
        if args.cluster_interval is not None:
            opts[f'custom_hooks.{labels}.interval'] = args.cluster_interval
        if args.nredo is not None:
            opts[f'custom_hooks.{labels}.kmeans.nredo'] = args.nredo
        if args.num_clusters is not None:
            opts[f'custom_hooks.{labels}.num_clusters'] = list(args.num_clusters)
        if args.final_rate is not None:
            opts[f'custom_hooks.{labels}.final_rate'] = args.final_rate
        if args.num_workers is not None:
            opts[f'custom_hooks.{labels}.num_workers'] = args.num_workers
    elif method == 'ifnd':
        raise SystemExit('ifnd: the config has no PseudoLabelHook in custom_hooks')
    opts.update(args.method_options.get(method, {}))
    return _as_cli(opts) + list(args.cfg_options)


def _as_train_reads(options: list[str]) -> dict:
    """``--cfg-options`` items read back as tools/train.py reads them (values typed alike)."""
    from ifnd.engine.cli import CfgOptionsAction
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=CfgOptionsAction)
    return parser.parse_args(['--cfg-options', *options]).cfg_options if options else {}


def _model_error(cfg) -> Exception | None:
    """Why the config's model cannot be built (its constructor's checks), or None; nothing is allocated."""
    import copy

    import torch
    from mmengine.registry import init_default_scope

    import ifnd  # noqa: F401  (registers the models)
    from ifnd.engine.cli import INPUT_ERRORS
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


def _unknown_keyword(cfg, key: str, method: str) -> str:
    """Why ``key`` is refused by a class that passes ``**kwargs`` on (the key check lets it through)."""
    import difflib

    from ifnd.engine.cli import _parameter_types, _registered_class
    *parents, name = key.split('.')
    node = cfg.to_dict()
    for part in parents:
        node = node[int(part)] if isinstance(node, (list, tuple)) else node[part]
    cls = _registered_class(node['type']) if isinstance(node.get('type'), str) else node.get('type')
    names = list(_parameter_types(cls)) if cls is not None else []
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    hint = (f'did you mean {" or ".join(method + ":" + ".".join([*parents, c]) for c in close)}?'
            if close else f'it takes: {", ".join(names)}')
    return f'{getattr(cls, "__name__", node.get("type"))} takes no {name!r}; {hint}'


def check_method_options(method: str, cfg, options: list[str], args: argparse.Namespace) -> None:
    """Refuse ``method``'s ``--method-options`` its training run would reject, before any training.

    ``options`` are the run's ``--cfg-options``: each of the method's keys must name something its
    config takes (``check_cfg_options``), its value must have the type the class declares
    (``check_cfg_types``), and the model must build with it (the constructor's range checks).
    """
    import copy

    from ifnd.engine.cli import check_cfg_options, check_cfg_types
    own = args.method_options.get(method, {})
    if not own:
        return
    read = _as_train_reads(options)
    budget = copy.deepcopy(cfg)
    budget.merge_from_dict({k: v for k, v in read.items() if k not in own})

    def fail(key: str, reason: str):
        raise SystemExit(f'error: --method-options {method}:{key}={own[key]}: {reason}')

    for key in own:
        try:
            check_cfg_options(budget, {key: read[key]})
        except SystemExit as err:
            # Its message starts "--cfg-options key '<key>' is not in ...": say it of this option.
            fail(key, 'the key ' + str(err.code).split(f"'{key}' ", 1)[-1])
    merged = copy.deepcopy(budget)
    merged.merge_from_dict({key: read[key] for key in own})
    try:
        check_cfg_types(merged)
    except ValueError as err:
        named = [key for key in own if f"'{key}'" in str(err)]
        reason = str(err).split('; fix it in')[0]
        if named:
            fail(named[0], f'{reason}; give a value of that type')
        raise SystemExit(f'error: {method}: {reason}') from None
    error = _model_error(merged)
    if error is None:
        return
    base_error = _model_error(budget)
    if base_error is not None:
        raise SystemExit(f'error: {method}: the model of {osp.basename(cfg.filename)} does not build '
                         f'with the benchmark\'s settings: {" ".join(str(base_error).split())}')
    for key in own:  # the option whose value the constructor refuses
        alone = copy.deepcopy(budget)
        alone.merge_from_dict({key: read[key]})
        refused = _model_error(alone)
        if isinstance(refused, TypeError) and 'unexpected keyword argument' in str(refused):
            fail(key, _unknown_keyword(alone, key, method))
        if refused is not None:
            fail(key, f'{" ".join(str(refused).split())}; change the value')
    keys = ' '.join(f'{method}:{key}={value}' for key, value in own.items())
    raise SystemExit(f'error: --method-options {keys}: together they are refused: '
                     f'{" ".join(str(error).split())}; change one of them')


def _method_option_texts(method_options: dict) -> list[str]:
    return [f'{method}:{key}={value}' for method, options in method_options.items()
            for key, value in options.items()]


def _as_cli(opts: dict) -> list[str]:
    # DictAction reads numbers, lists, tuples, True/False and None back; other strings as they are.
    def text(value):
        if isinstance(value, (list, tuple)):
            inner = ','.join(text(v) for v in value)
            return f'[{inner}]' if isinstance(value, list) else f'({inner})'
        return str(value)
    return [f'{key}={text(value)}' for key, value in opts.items()]


def backbone_options(args: argparse.Namespace) -> dict:
    """Backbone overrides shared by pre-training and the linear probe (its weights must fit)."""
    opts: dict[str, object] = {}
    if args.backbone is not None:
        opts['model.backbone.model_name'] = args.backbone
    if args.cifar_stem is not None:
        opts['model.backbone.cifar_stem'] = args.cifar_stem
    if args.channels is not None:
        opts['model.backbone.channels'] = tuple(args.channels)
    return opts


def train_subset_options(key: str, dataset_cfg, args: argparse.Namespace,
                         split: dict | None) -> dict:
    """Which training images a run sees: a held-out-free subset file, or a class-balanced share."""
    if split is not None:
        opts = {f'{key}.subset_file': split['train']}
        if dataset_cfg.get('subset_fraction') is not None:
            opts[f'{key}.subset_fraction'] = None
        return opts
    if args.subset is not None and args.subset < 1.0:
        return {f'{key}.subset_fraction': args.subset}
    return {}


def query_options(key: str, dataset_cfg, args: argparse.Namespace, split: dict | None) -> dict:
    """Which images are evaluated: the held-out part of the training split, or the test split."""
    if split is not None:
        opts = {f'{key}.split': 'train', f'{key}.subset_file': split['val']}
        if dataset_cfg.get('subset_fraction') is not None:
            opts[f'{key}.subset_fraction'] = None
        return opts
    if args.val_fraction is not None and args.val_fraction < 1.0:
        return {f'{key}.subset_fraction': args.val_fraction}
    return {}


def linear_options(cfg, pretrain_cfg, checkpoint: str, args: argparse.Namespace, seed: int,
                   split: dict | None) -> list[str]:
    """The ``--cfg-options`` of the linear probe of one pre-trained checkpoint."""
    opts: dict[str, object] = {'model.pretrained': checkpoint, 'randomness.seed': seed}
    backbone = backbone_options(args)
    for name in ('model_name', 'cifar_stem', 'channels'):
        # The probe's backbone must be the pre-trained one: take what the budget leaves alone
        # from the pre-training config.
        value = pretrain_cfg.model.backbone.get(name)
        if f'model.backbone.{name}' not in backbone and value is not None:
            backbone[f'model.backbone.{name}'] = tuple(value) if name == 'channels' else value
    opts.update(backbone)
    if args.linear_epochs:
        full = cfg.train_cfg.max_epochs
        opts['train_cfg.max_epochs'] = args.linear_epochs
        opts['train_cfg.val_interval'] = args.linear_epochs
        scheds = cfg.get('param_scheduler') or []
        if [s.get('type') for s in scheds] == ['MultiStepLR']:
            # The lr steps sit at the same fractions of the shorter schedule.
            opts['param_scheduler.0.milestones'] = sorted(
                {max(1, round(m * args.linear_epochs / full)) for m in scheds[0].milestones})
    opts.update(train_subset_options('train_dataloader.dataset', cfg.train_dataloader.dataset,
                                     args, split))
    opts.update(query_options('val_dataloader.dataset', cfg.val_dataloader.dataset, args, split))
    if args.num_workers is not None:
        for loader in ('train_dataloader', 'val_dataloader'):
            opts.update(worker_options(loader, cfg, args.num_workers, persistent=False))
    return _as_cli(opts)


def worker_options(loader: str, cfg, num_workers: int, persistent: bool | None = None) -> dict:
    """Loader workers; persistent ones (where the config has the key) only when there are any."""
    opts: dict[str, object] = {f'{loader}.num_workers': num_workers}
    if 'persistent_workers' in cfg[loader]:
        keep = cfg[loader].persistent_workers if persistent is None else persistent
        opts[f'{loader}.persistent_workers'] = bool(keep) and num_workers > 0
    return opts


def write_split(args: argparse.Namespace, cfg) -> dict:
    """Index files of a held-out validation part of the training split and of the rest trained on.

    The validation part is ``--val-fraction`` of every class; the training images are
    ``--subset`` of every class of the full split, drawn from what is left (both class-balanced,
    fixed seeds, so every method and seed sees the same images).
    """
    from mmengine.registry import init_default_scope

    import ifnd  # noqa: F401  (registers the data sets)
    from ifnd.datasets import balanced_subset_indices
    from ifnd.registry import DATASETS
    init_default_scope('ifnd')
    data = {k: v for k, v in dict(cfg.train_dataloader.dataset).items()
            if k not in ('pipeline', 'subset_fraction', 'subset_file', 'subset_seed', 'augment_on')}
    labels = np.asarray(DATASETS.build(data).labels)
    val = balanced_subset_indices(labels, args.val_fraction, seed=1)
    rest = np.setdiff1d(np.arange(len(labels)), val)
    train = []
    for c in np.unique(labels):
        pool = rest[labels[rest] == c]
        want = max(1, round((args.subset or 1.0) * (labels == c).sum()))
        if want > len(pool):
            raise SystemExit(f'--subset {args.subset} with --val-fraction {args.val_fraction} '
                             f'asks for more images of class {c} than the split holds')
        train.append(np.random.default_rng(2).choice(pool, want, replace=False))
    folder = osp.join(args.work_dir, 'split')
    os.makedirs(folder, exist_ok=True)
    paths = {}
    for name, indices in (('train', np.sort(np.concatenate(train))), ('val', val)):
        paths[name] = osp.join(folder, f'{name}.txt')
        np.savetxt(paths[name], indices, fmt='%d')
    print(f'Held-out split: {len(val)} validation images of the training split, '
          f'{sum(map(len, train))} trained on (index files in {folder})')
    return paths


def train_command(config: str, work_dir: str, options: list[str],
                  args: argparse.Namespace) -> list[str]:
    """A tools/train.py command line."""
    cmd = [args.python, 'tools/train.py', config, '--work-dir', work_dir]
    if args.amp:
        cmd.append('--amp')
    if options:
        cmd += ['--cfg-options', *options]
    return cmd


def read_scalars(work_dir: str, key: str, since: float | None) -> list[tuple[int, float]]:
    """``(step, value)`` of a scalar in the newest run's vis_data/scalars.json under ``work_dir``.

    Each run writes ``<work_dir>/<timestamp>/vis_data/scalars.json``, one JSON object per line.
    Runs older than ``since`` (a time stamp) are ignored, so stale results are never reported.
    """
    files = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    if since is not None:
        files = [f for f in files if osp.getmtime(f) >= since]
    for path in reversed(files):  # newest time stamp first
        history = []
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    record = json.loads(line)
                    if key in record:
                        history.append((int(record.get('step', -1)), float(record[key])))
        if history:
            return sorted(history)
    raise RuntimeError(f'no {key} scalar found under {work_dir}/*/vis_data/scalars.json'
                       + (' written by this run' if since is not None else ''))


def final_knn_top1(work_dir: str, since: float | None) -> tuple[float, int, list]:
    """Final ``knn/top1`` of the newest run in ``work_dir``, its epoch and the whole history."""
    history = read_scalars(work_dir, 'knn/top1', since)
    step, top1 = history[-1]
    return top1, step, history


def last_round(work_dir: str, since: float | None) -> tuple[dict, dict | None]:
    """Last clustering round of ``pseudo_labels/rounds.json``, and the last one used in training.

    The round after the final epoch is the last one written; its labels are not trained on any
    more, so the round before it is returned too (None when there is none).
    """
    path = osp.join(work_dir, 'pseudo_labels', 'rounds.json')
    if not osp.isfile(path):
        raise RuntimeError(f'{path} not found: did the IFND run cluster?')
    if since is not None and osp.getmtime(path) < since:
        raise RuntimeError(f'{path} predates this run')
    with open(path) as f:
        rounds = json.load(f)
    if not rounds:
        raise RuntimeError(f'{path} holds no round')
    rounds = sorted(rounds, key=lambda r: r['epoch'])
    return rounds[-1], (rounds[-2] if len(rounds) > 1 else None)


def pick_level(round_stats: dict, level: int | str) -> dict:
    """The statistics of one clustering level: the finest (largest k) or the given index."""
    levels = round_stats['levels']
    if level == 'finest':
        return max(levels, key=lambda lv: lv['k'])
    if not -len(levels) <= level < len(levels):
        raise SystemExit(f'--level {level} is out of range: the round has {len(levels)} levels')
    return levels[level]


def training_device() -> str:
    """The device tools/train.py will train on (CUDA when available)."""
    import torch
    if torch.cuda.is_available():
        return f'CUDA: {torch.cuda.get_device_name(0)}'
    return f'CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores'


def save_json(value, path: str) -> None:
    """Write strict JSON atomically (temp file, fsync, rename), as checkpoints are written."""
    from ifnd.engine import AtomicLocalBackend
    from ifnd.engine.cli import json_safe
    AtomicLocalBackend().put_text(json.dumps(json_safe(value), indent=1, allow_nan=False), path)


def _run(cmd: list[str], log_path: str, args: argparse.Namespace, what: str) -> float:
    """Run one command (output to ``log_path`` unless --verbose); returns its wall-clock seconds."""
    env = dict(os.environ)
    if args.threads is not None:
        env['OMP_NUM_THREADS'] = env['MKL_NUM_THREADS'] = str(args.threads)
    tic = time.time()
    if args.verbose:
        proc = subprocess.run(cmd, cwd=REPO, env=env)
    else:
        with open(log_path, 'w') as log:
            proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        if not args.verbose:
            with open(log_path) as f:
                print(f.read()[-4000:], file=sys.stderr)
        raise SystemExit(f'{what}: training failed with exit code {proc.returncode} '
                         f'(log: {log_path})')
    return time.time() - tic


def run_plan(plan: dict, args: argparse.Namespace) -> dict | None:
    """Pre-train one method with one seed, then its probe; read a finished run (None: unfinished).

    A run is finished when its ``run.json`` names the same commands; it then is read, not
    trained again (unless --rerun).
    """
    work_dir, what = plan['work_dir'], f"{TITLES[plan['method']]} seed {plan['seed']}"
    record_path = osp.join(work_dir, 'run.json')
    commands = {'pretrain': shlex.join(plan['cmd']),
                'linear': shlex.join(plan['linear_cmd']) if plan['linear_cmd'] else None}
    if not args.rerun and osp.isfile(record_path):
        with open(record_path) as f:
            record = json.load(f)
        if record.get('commands') == commands:
            print(f'{what}: finished before, read from {work_dir}', flush=True)
            return record
    if args.skip_train:
        print(f'{what}: not finished in {work_dir}; left out (--skip-train)', flush=True)
        return None
    os.makedirs(work_dir, exist_ok=True)
    # Not finished before (or --rerun): start over, replacing what an earlier attempt left there.
    # --overwrite is left out of the recorded commands: it does not change the results.
    seconds = _run([*plan['cmd'], '--overwrite'], osp.join(work_dir, 'train.log'), args, what)
    linear_seconds = None
    if plan['linear_cmd']:
        linear_seconds = _run([*plan['linear_cmd'], '--overwrite'], osp.join(work_dir, 'linear.log'),
                              args, f'{what} linear probe')
    record = {'commands': commands, 'seconds': seconds, 'linear_seconds': linear_seconds,
              'finished': time.strftime('%Y-%m-%d %H:%M:%S')}
    save_json(record, record_path)
    print(f'{what}: finished in {seconds:.0f} s'
          + (f' + linear probe {linear_seconds:.0f} s' if linear_seconds else ''), flush=True)
    return record


def collect(plan: dict, record: dict, args: argparse.Namespace) -> dict:
    """Top-1 (kNN and linear) and label statistics of one finished run."""
    method, work_dir = plan['method'], plan['work_dir']
    top1, step, history = final_knn_top1(work_dir, None)
    entry = {'method': method, 'seed': plan['seed'], 'top1': top1, 'top1_epoch': step,
             'top1_history': history, 'seconds': record.get('seconds'),
             'linear_seconds': record.get('linear_seconds'), 'command': record['commands']}
    if plan['linear_cmd']:
        entry['linear_top1'] = read_scalars(osp.join(work_dir, 'linear'), 'top1',
                                            None)[-1][1]
    if method == 'ifnd':
        with open(osp.join(work_dir, 'pseudo_labels', 'rounds.json')) as f:
            entry['rounds'] = sorted(json.load(f), key=lambda r: r['epoch'])
        entry['detection'] = detection_over_training(entry['rounds'], step)
        level = pick_level(entry['rounds'][-1], args.level)
        entry.update(mtpr=level.get('mtpr', math.nan), mtnr=level.get('mtnr', math.nan),
                     k=level['k'])
    elif method in ('supcon', 'oracle_elim', 'simclr'):
        truth = method != 'simclr'
        entry.update(mtpr=100.0 if truth else 0.0, mtnr=100.0)
    if method in FLAGGERS:
        entry['flagged'] = flagged_negatives(work_dir)
    return entry


def flagged_negatives(work_dir: str) -> dict | None:
    """Per-epoch precision and recall (%) of flagged negatives and their means; None if unlogged."""
    try:
        result = {key: read_scalars(work_dir, key, None) for key in DETECTION_KEYS}
    except RuntimeError:
        return None
    result.update({f'{key}_mean': float(np.nanmean([v for _, v in values]))
                   for key, values in result.items()})
    return result


def detection_over_training(rounds: list[dict], epochs: int) -> dict:
    """Shares of false and true negatives IFND eliminated, averaged over epochs and levels.

    The loss averages its levels, and epoch e trains on the labels of the last round before it,
    so these are the shares of the oracle's eliminations made (MTPR) and of true negatives
    eliminated wrongly (100 - MTNR) in the loss terms of the whole run.
    """
    ordered = sorted(rounds, key=lambda r: r['epoch'])
    mtpr, wrong = [], []
    for epoch in range(1, epochs + 1):
        used = [r for r in ordered if r['epoch'] < epoch][-1]
        mtpr.append(np.mean([lv.get('mtpr', math.nan) for lv in used['levels']]))
        wrong.append(np.mean([100.0 - lv.get('mtnr', math.nan) for lv in used['levels']]))
    return {'false_negatives_eliminated': float(np.mean(mtpr)),
            'true_negatives_eliminated': float(np.mean(wrong))}


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (nan for a single value)."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else math.nan


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean of paired differences and its two-sided Student-t interval."""
    from scipy import stats
    values = np.asarray(values, dtype=np.float64)
    mean = float(values.mean())
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.5 + level / 2, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def fieller_interval(num: Sequence[float], den: Sequence[float],
                     level: float = 0.95) -> tuple[float, float, float]:
    """Ratio of paired means mean(num) / mean(den) and Fieller's interval for it.

    The interval is every rho with |mean(num - rho den)| <= t * se(num - rho den); it is
    (-inf, inf) when the denominator's mean is not clearly away from zero.
    """
    from scipy import stats
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    n = len(num)
    ratio = float(num.mean() / den.mean()) if den.mean() != 0 else math.nan
    if n < 2:
        return ratio, math.nan, math.nan
    t2 = stats.t.ppf(0.5 + level / 2, n - 1) ** 2
    cov = np.cov(num, den, ddof=1) / n
    a = den.mean() ** 2 - t2 * cov[1, 1]
    b = -2 * (num.mean() * den.mean() - t2 * cov[0, 1])
    c = num.mean() ** 2 - t2 * cov[0, 0]
    disc = b * b - 4 * a * c
    if a <= 0 or disc < 0:
        return ratio, -math.inf, math.inf
    root = math.sqrt(disc)
    return ratio, (-b - root) / (2 * a), (-b + root) / (2 * a)


def summarise(runs: list[dict], seeds: Sequence[int]) -> dict:
    """Per-method mean +- sd, paired differences to SimCLR and the share of the gap closed.

    A method missing some seeds (read with --skip-train before they finished) is summarised over
    the seeds it has, and compared with SimCLR and SupCon on the seeds they share.
    """
    by = {(r['method'], r['seed']): r for r in runs}
    methods = [m for m in METHODS if any(r['method'] == m for r in runs)]
    summary: dict = {'methods': {}, 'paired': {}, 'gap_closed': {}}

    def values(method: str, metric: str) -> dict:
        return {s: by[method, s][metric] for s in seeds
                if (method, s) in by and metric in by[method, s]}

    for metric in ('top1', 'linear_top1'):
        for m in methods:
            got = values(m, metric)
            if got:
                mean, sd = mean_sd(list(got.values()))
                summary['methods'].setdefault(m, {})[metric] = {
                    'mean': mean, 'sd': sd, 'values': list(got.values()), 'seeds': list(got)}
        base, top = values('simclr', metric), values('supcon', metric)
        for m in methods:
            if m == 'simclr' or not base:
                continue
            got = values(m, metric)
            shared = [s for s in got if s in base]
            diffs = [got[s] - base[s] for s in shared]
            if diffs:
                mean, lo, hi = t_interval(diffs)
                summary['paired'].setdefault(m, {})[metric] = {
                    'mean': mean, 'low': lo, 'high': hi, 'values': diffs, 'seeds': shared}
            shared = [s for s in shared if s in top]
            if m in CLOSERS and shared:
                share, lo, hi = fieller_interval([got[s] - base[s] for s in shared],
                                                 [top[s] - base[s] for s in shared])
                summary['gap_closed'].setdefault(m, {})[metric] = {
                    'share': share, 'low': lo, 'high': hi, 'seeds': shared}
    return summary


def _pm(stat: dict | None) -> str:
    if not stat:
        return '—'
    return f"{stat['mean']:.2f}" + ('' if math.isnan(stat['sd']) else f" ± {stat['sd']:.2f}")


def _ci(stat: dict | None, key: str = 'mean', scale: float = 1.0, fmt: str = '{:+.2f}') -> str:
    if not stat:
        return '—'
    value = fmt.format(stat[key] * scale)
    if math.isnan(stat['low']):
        return value
    ends = ['−∞' if v == -math.inf else '∞' if v == math.inf else fmt.format(v * scale)
            for v in (stat['low'], stat['high'])]
    return f'{value} [{ends[0]}, {ends[1]}]'


def markdown_tables(result: dict) -> str:
    """The comparison table with error bars, per-seed numbers, flagged negatives, IFND's rounds."""
    s, summary, runs = result['settings'], result['summary'], result['runs']
    seeds = s['seeds']
    stem = {None: '', True: ' (CIFAR stem)', False: ' (standard stem)'}[s['cifar_stem']]
    width = '' if not s.get('channels') else f", widths {','.join(map(str, s['channels']))}"
    budget = (f"{s['epochs'] or 'config'} epochs, subset {s['subset'] or 1}, batch "
              f"{s['batch_size'] or 'config'}, backbone {s['backbone'] or 'config'}{stem}{width}")
    split = ('held-out validation part of the training split' if s['eval_split'] == 'val'
             else 'test split')
    own = _method_option_texts(s.get('method_options') or {})
    if own:
        budget += f"; the methods' own settings {', '.join(own)}"
    lines = [f"False-negative methods on {s['dataset']} ({s['preset']} preset: {budget}), "
             f"{len(seeds)} seeds ({', '.join(map(str, seeds))}), trained on {result['device']}; "
             f'evaluated on the {split}. Top-1: mean ± sd over seeds; Δ: mean of the per-seed '
             'paired differences to SimCLR [95% t-interval]; gap closed: (method − SimCLR) / '
             "(SupCon − SimCLR) [Fieller's 95% interval]", '',
             '| Method | Labels | kNN top-1 (%) | linear top-1 (%) | Δ kNN vs SimCLR '
             '| Δ linear vs SimCLR | gap closed, kNN | gap closed, linear | Train (s) |',
             '|---|---|---:|---:|---:|---:|---:|---:|---:|']
    for m in METHODS:
        stats = summary['methods'].get(m)
        if not stats:
            continue
        paired = summary['paired'].get(m, {})
        gap = summary['gap_closed'].get(m, {})
        secs = [r['seconds'] for r in runs if r['method'] == m and r.get('seconds')]
        have = len(stats['top1']['values']) if 'top1' in stats else len(seeds)
        title = TITLES[m] + (f' ({have} of {len(seeds)} seeds)' if have < len(seeds) else '')
        lines.append(
            f"| {title} | {LABELS[m]} | {_pm(stats.get('top1'))} | "
            f"{_pm(stats.get('linear_top1'))} | {_ci(paired.get('top1'))} | "
            f"{_ci(paired.get('linear_top1'))} | "
            f"{_ci(gap.get('top1'), 'share', 100, '{:.0f}%')} | "
            f"{_ci(gap.get('linear_top1'), 'share', 100, '{:.0f}%')} | "
            f"{np.mean(secs):.0f} |" if secs else '— |')
    present = [m for m in METHODS if m in summary['methods']]
    lines += ['', 'Per seed (kNN / linear top-1, %):', '',
              '| Seed | ' + ' | '.join(TITLES[m] for m in present) + ' |',
              '|---:|' + '---:|' * len(present)]
    by = {(r['method'], r['seed']): r for r in runs}
    for seed in seeds:
        cells = []
        for m in present:
            r = by.get((m, seed))
            if r is None:  # not finished (--skip-train)
                cells.append('—')
                continue
            lin = r.get('linear_top1')
            cells.append(f"{r['top1']:.2f}" + ('' if lin is None else f' / {lin:.2f}'))
        lines.append(f'| {seed} | ' + ' | '.join(cells) + ' |')
    flagged = [(m, [r['flagged'] for r in runs if r['method'] == m and r.get('flagged')])
               for m in FLAGGERS]
    flagged = [(m, fl) for m, fl in flagged if fl]
    if flagged:
        lines += ['', 'Negatives flagged as false in the batches trained on, against the '
                  'ground-truth classes (%): precision (flagged that share the anchor\'s class) '
                  'and recall (same-class negatives flagged), the mean over epochs and the last '
                  'epoch, mean ± sd over seeds. SupCon and the oracle flag with precision and '
                  'recall 100, SimCLR flags nothing.', '',
                  '| Method | precision | recall | precision, last epoch | recall, last epoch |',
                  '|---|---:|---:|---:|---:|']
        for m, fl in flagged:
            cells = [_pm(dict(zip(('mean', 'sd'), mean_sd([f[f'{key}_mean'] for f in fl]))))
                     for key in DETECTION_KEYS]
            cells += [_pm(dict(zip(('mean', 'sd'), mean_sd([f[key][-1][1] for f in fl]))))
                      for key in DETECTION_KEYS]
            runs_of = sum(r['method'] == m for r in runs)
            # Runs trained before the detection scalars were logged are left out, and said so.
            title = TITLES[m] + (f' ({len(fl)} of {runs_of} seeds)' if len(fl) < runs_of else '')
            lines.append(f'| {title} | ' + ' | '.join(cells) + ' |')
    ifnd = [r for r in runs if r['method'] == 'ifnd']
    if ifnd:
        ks = [lv['k'] for lv in ifnd[0]['rounds'][0]['levels']]
        lines += ['', 'IFND pseudo labels per clustering round (mean over seeds): acceptance '
                  'rate, then MTPR / MTNR (%) of the labels used, per k. A round after epoch e '
                  'gives the labels of epochs e+1 onwards.', '',
                  '| after epoch | rate | ' + ' | '.join(f'k={k}' for k in ks) + ' |',
                  '|---:|---:|' + '---:|' * len(ks)]
        for i, first in enumerate(ifnd[0]['rounds']):
            rounds = [r['rounds'][i] for r in ifnd if i < len(r['rounds'])]
            cells = []
            for j in range(len(ks)):
                mtpr = np.mean([rd['levels'][j].get('mtpr', math.nan) for rd in rounds])
                mtnr = np.mean([rd['levels'][j].get('mtnr', math.nan) for rd in rounds])
                cells.append(f'{mtpr:.1f} / {mtnr:.2f}')
            lines.append(f"| {first['epoch']} | {first['rate']:.2f} | " + ' | '.join(cells) + ' |')
        fn = mean_sd([r['detection']['false_negatives_eliminated'] for r in ifnd])
        tn = mean_sd([r['detection']['true_negatives_eliminated'] for r in ifnd])
        lines += ['', f'Over the whole run (every epoch with the labels it trained on, averaged '
                  f'over the levels as the loss is), IFND eliminated {fn[0]:.1f}% of the false '
                  f'negatives (the oracle: 100%) and {tn[0]:.2f}% of the true negatives '
                  '(the oracle: 0%).']
    return '\n'.join(lines)


def plot(result: dict, path: str) -> None:
    """kNN top-1 per method, IFND's rounds and the flagged negatives' precision and recall."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    runs = result['runs']
    ifnd = [r for r in runs if r['method'] == 'ifnd']
    flaggers = [m for m in FLAGGERS if any(r['method'] == m and r.get('flagged') for r in runs)]
    panels = 1 + 2 * bool(ifnd) + bool(flaggers)
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4.2), squeeze=False)
    ax = axes[0, 0]
    for m in METHODS:
        histories = [dict(r['top1_history']) for r in runs if r['method'] == m]
        if not histories:
            continue
        epochs = sorted(set.intersection(*(set(h) for h in histories)))
        values = np.array([[h[e] for e in epochs] for h in histories])
        mean, sd = values.mean(0), values.std(0, ddof=1) if len(values) > 1 else 0 * values[0]
        line, = ax.plot(epochs, mean, marker='o', ms=3, label=TITLES[m])
        ax.fill_between(epochs, mean - sd, mean + sd, color=line.get_color(), alpha=0.2)
    ax.set(xlabel='epoch', ylabel='kNN top-1 (%)',
           title=f"kNN top-1, mean ± sd over {len(result['settings']['seeds'])} seed(s)")
    ax.grid(alpha=0.3)
    low, high = ax.get_ylim()
    ax.set_ylim(low, high + 0.3 * (high - low))  # room above the curves for the legend
    ax.legend(loc='upper left', ncol=2, fontsize=8)
    if ifnd:
        ks = [lv['k'] for lv in ifnd[0]['rounds'][0]['levels']]
        epochs = [rd['epoch'] for rd in ifnd[0]['rounds']]
        for panel, key, label in ((1, 'mtpr', 'MTPR (%)'), (2, 'mtnr', 'MTNR (%)')):
            ax = axes[0, panel]
            for j, k in enumerate(ks):
                values = np.array([[rd['levels'][j].get(key, math.nan) for rd in r['rounds']]
                                   for r in ifnd])
                ax.plot(epochs, values.mean(0), marker='o', ms=3, label=f'k={k}')
            ax.set(xlabel='clustering round (after epoch)', ylabel=label,
                   title=f'IFND pseudo labels: {label[:4]}')
            ax.grid(alpha=0.3)
            rate = ax.twinx()
            rate.plot(epochs, [rd['rate'] for rd in ifnd[0]['rounds']], 'k--', lw=1,
                      label='acceptance rate')
            rate.set_ylabel('acceptance rate')
            rate.set_ylim(0, 1.05)
            handles = ax.get_legend_handles_labels()
            extra = rate.get_legend_handles_labels()
            ax.legend(handles[0] + extra[0], handles[1] + extra[1], fontsize=8)
    if flaggers:
        ax = axes[0, panels - 1]
        for m in flaggers:
            color = None  # one colour per method: precision solid, recall dashed
            for key, style in zip(DETECTION_KEYS, ('-', '--')):
                histories = [dict(r['flagged'][key]) for r in runs
                             if r['method'] == m and r.get('flagged')]
                epochs = sorted(set.intersection(*(set(h) for h in histories)))
                values = np.array([[h[e] for e in epochs] for h in histories])
                line, = ax.plot(epochs, np.nanmean(values, 0), style, marker='o', ms=3,
                                color=color, label=f"{TITLES[m]} {key.split('_')[-1]}")
                color = line.get_color()
        ax.set(xlabel='epoch', ylabel='%', ylim=(0, 102),
               title='negatives flagged as false: precision, recall')
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    folder = osp.dirname(osp.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f'Wrote {path}')


def make_plans(args: argparse.Namespace) -> list[dict]:
    """One plan per method and seed: work dir, pre-training and linear-probe commands."""
    configs = {m: _load_config(getattr(args, f'{m}_config')) for m in args.methods}
    split = None
    if args.eval_split == 'val' and not args.dry_run:
        split = write_split(args, configs[args.methods[0]])
    elif args.eval_split == 'val':
        split = {name: osp.join(args.work_dir, 'split', f'{name}.txt') for name in ('train', 'val')}
    linear_cfg = _load_config(args.linear_config) if args.linear_epochs != 0 else None
    plans = []
    for seed in args.seeds:
        for method in args.methods:
            cfg = configs[method]
            work_dir = osp.join(args.work_dir, method, f'seed_{seed}')
            options = cfg_options(method, cfg, args, seed, split)
            if seed == args.seeds[0]:  # a bad option fails now, not hours later inside a run
                check_method_options(method, cfg, options, args)
            cmd = train_command(getattr(args, f'{method}_config'), work_dir, options, args)
            linear_cmd = None
            if linear_cfg is not None:
                epochs = args.epochs or cfg.train_cfg.max_epochs
                ckpt = osp.join(work_dir, f'epoch_{epochs}.pth')
                linear_cmd = train_command(
                    args.linear_config, osp.join(work_dir, 'linear'),
                    linear_options(linear_cfg, cfg, ckpt, args, seed, split), args)
            plans.append(dict(method=method, seed=seed, work_dir=work_dir, cmd=cmd,
                              linear_cmd=linear_cmd))
    return plans


def main(argv: Sequence[str] | None = None) -> dict:
    """Train (unless finished or --skip-train), read the results, print the tables."""
    args = parse_args(argv)
    device = training_device()
    if args.threads is not None:
        device += f', {args.threads} thread(s) per run, {args.jobs} run(s) at a time'
    if args.preset == 'gpu' and device.startswith('CPU') and not args.dry_run:
        print('warning: the gpu preset on a CPU takes days; use --preset cpu', file=sys.stderr)
    print(f'Training device: {device}')
    plans = make_plans(args)
    env = f'OMP_NUM_THREADS={args.threads} ' if args.threads is not None else ''
    for plan in plans:
        print(f"$ {env}{shlex.join(plan['cmd'])}", flush=True)
        if plan['linear_cmd']:
            print(f"$ {env}{shlex.join(plan['linear_cmd'])}", flush=True)
    if args.dry_run:
        return {}
    tic = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        records = list(pool.map(lambda plan: run_plan(plan, args), plans))
    runs = [collect(plan, record, args) for plan, record in zip(plans, records) if record]
    if not runs:
        raise SystemExit(f'no finished run in {args.work_dir} (drop --skip-train)')
    result = {
        'benchmark': 'false_negatives',
        'device': device,
        'wall_seconds': time.time() - tic,
        'settings': {key: value for key, value in vars(args).items()
                     if key not in ('out', 'plot', 'python', 'dry_run', 'skip_train', 'verbose',
                                    'rerun')},
        'summary': summarise(runs, args.seeds),
        'runs': runs,
    }
    print()
    print(markdown_tables(result), flush=True)
    if args.out:
        save_json(result, args.out)
        print(f'\nWrote {args.out}')
    if args.plot:
        plot(result, args.plot)
    return result


if __name__ == '__main__':
    main(sys.argv[1:])
