"""The command line of ``python -m benchmarks.false_negatives``: options, presets applied, checks."""
from __future__ import annotations

import argparse
import math
import os
import os.path as osp
import sys
from typing import Sequence

from ifnd.settings import check_temperature

from ..common import HelpFormatter
from .merge import next_seed
from .protocol import DATASETS, DEFAULTS, METHODS, PRESETS, REPO, method_option_texts


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.replace(' ', '').split(',') if v]


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--preset', choices=sorted(PRESETS), default='cpu',
                        help="budget: 'cpu' (Fashion-MNIST, about 3 hours on 2 cores with --jobs "
                        "2), 'digits' (scikit-learn's digits, about 40 s a run on one thread), "
                        "'gpu' (the configs' own settings), 'gpu-slot' (one seed of 4 methods "
                        'on all of Fashion-MNIST in 8 minutes of one GPU, the next seed each '
                        "time), 'vit' (the ViT protocol: Fashion-MNIST with a 4-block ViT on 2 "
                        "cores, about an hour with --jobs 2) or 'vit-gpu-slot' (one seed of SimCLR "
                        'and MoCo v3 with and without IFND, ViT-Tiny, 8 minutes of one GPU); the '
                        'options below override it')
    parser.add_argument('--rehearse', action='store_true',
                        help='train the preset\'s runs at toy size on the CPU (2 epochs, float32; '
                        'digits with an eighth-width ResNet, or 1%% of Fashion-MNIST with a '
                        'one-block ViT) to check the command before its GPU run; the options '
                        'below still override')
    parser.add_argument('--dataset', choices=sorted(DATASETS), default=None,
                        help="which configs to train (default: the preset's, fmnist or digits)")
    parser.add_argument('--methods', nargs='+', choices=tuple(METHODS), default=None,
                        help='methods to train (SimCLR and SupCon are needed for the gaps; '
                        'default: every method with a config for --dataset)')
    parser.add_argument('--seeds', nargs='+', type=int, default=None,
                        help='run seeds; every method runs once per seed (preset: 0 1 2; '
                        'digits: 0 1 2 3 4; gpu-slot: the first seed no --previous result has)')
    parser.add_argument('--eval-split', choices=('test', 'val'), default='test',
                        help="'val': hold --val-fraction of the training split out of training "
                        "and evaluate on it (choosing hyper-parameters); 'test': the test split")
    for method in METHODS.values():
        parser.add_argument(f'--{method.name.replace("_", "-")}-config', default=None,
                            help=f'config of {method.title} (default: from --dataset)')
    parser.add_argument('--linear-config', default=None,
                        help='linear-probe config (default: from --dataset)')


def _add_data_budget(budget: argparse._ArgumentGroup) -> None:
    budget.add_argument('--epochs', type=int, default=None, help='training epochs')
    budget.add_argument('--subset', type=float, default=None,
                        help='class-balanced fraction of the training split trained on (1 = all)')
    budget.add_argument('--batch-size', type=int, default=None, help='images per batch')
    budget.add_argument('--backbone', default=None, help='timm model name, e.g. resnet18')
    budget.add_argument('--cifar-stem', action=argparse.BooleanOptionalAction, default=None,
                        help='3x3 stride-1 ResNet stem without max-pool')
    budget.add_argument('--channels', default=None,
                        help='ResNet stage widths, e.g. 32,64,128,256 (half width)')
    budget.add_argument('--channels-last', action=argparse.BooleanOptionalAction, default=None,
                        help='NHWC weights and inputs (faster bfloat16 convolutions on a GPU)')
    budget.add_argument('--embed-dim', type=int, default=None, help='ViT width (token dimension)')
    budget.add_argument('--depth', type=int, default=None, help='ViT blocks')
    budget.add_argument('--num-heads', type=int, default=None, help='ViT attention heads')
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
    budget.add_argument('--augment-on', choices=('cpu', 'device'), default=None,
                        help="where the training views are made, of pre-training and probe: "
                        "'device' in batches in the data preprocessor (with --num-workers 0), "
                        "'cpu' by the loader")


def _add_method_budget(budget: argparse._ArgumentGroup) -> None:
    budget.add_argument('--temperature', type=float, default=None,
                        help='loss temperature of every method (IFND\'s kappa follows it)')
    budget.add_argument('--num-clusters', type=_ints, default=None,
                        help='IFND\'s k per level, e.g. 10,30,100')
    budget.add_argument('--final-rate', type=float, default=None,
                        help='IFND\'s acceptance rate at the last epoch (the calendar schemes; '
                        'methods accepting by evidence have none)')
    budget.add_argument('--nredo', type=int, default=None, help='k-means restarts of IFND')
    budget.add_argument('--linear-epochs', type=int, default=None,
                        help='linear-probe epochs (its lr steps scale with them); 0 skips it')
    budget.add_argument('--method-options', nargs='+', default=None, metavar='METHOD:KEY=VALUE',
                        help="one method's config overrides, e.g. debiased:model.tau_plus=0.05 "
                        'hard_negative:model.beta=1 (they replace the preset\'s for that key)')


def _add_tool_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--cfg-options', nargs='+', default=[],
                        help='extra key=value overrides passed to every pre-training run')
    parser.add_argument('--amp', action=argparse.BooleanOptionalAction, default=None,
                        help='train with mixed precision (default: off; gpu-slot: on)')
    parser.add_argument('--threads', type=int, default=None,
                        help='OMP/MKL threads of each training process (default: torch\'s own, '
                        'or cores / --jobs)')
    parser.add_argument('--jobs', type=int, default=None,
                        help='training runs at a time (on a CPU, each gets cores / jobs threads; '
                        'default: 1; gpu-slot: 4)')
    parser.add_argument('--time-limit', type=float, default=None, metavar='SECONDS',
                        help='wall-clock seconds this invocation may train (gpu-slot: 480): runs '
                        'still training then are stopped, runs that cannot finish in the time left '
                        'are not started, and the finished ones are reported and saved; 0: none')
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
    parser.add_argument('--previous', action='append', default=[], metavar='FILE.json',
                        help="an earlier run's --out JSON (repeatable): its runs of the methods "
                        'and seeds not trained here join the report, JSON and plot; refused '
                        'when its settings differ in more than methods, seeds, work dir, jobs, '
                        'threads and the settings of methods not trained here')
    parser.add_argument('--plot', default=None,
                        help='also draw kNN top-1 over epochs and IFND\'s rounds into this PNG')


def build_parser() -> argparse.ArgumentParser:
    """The command line of benchmarks/false_negatives.py."""
    parser = argparse.ArgumentParser(
        description='Train false-negative methods (SimCLR, IFND, SupCon, the elimination '
        'oracle, debiased, hard negatives, FNC, GloFND and combinations of parts) with one recipe and several seeds '
        '(tools/train.py in subprocesses, each followed by a linear probe), then print kNN and '
        'linear top-1 (mean +- sd), the paired differences to SimCLR, the share of the SimCLR -> '
        'SupCon gap closed (95%% intervals), IFND\'s MTPR/MTNR per round and the precision and '
        'recall of the negatives the detecting methods flag.',
        formatter_class=HelpFormatter)
    _add_run_options(parser)
    def preset(name: str) -> str:
        return ', '.join([f'{key}={" ".join(value) if isinstance(value, list) else value}'
                          for key, value in PRESETS[name].items()
                          if value is not None and key not in ('seeds', 'method_options')]
                         + method_option_texts(PRESETS[name]['method_options']))
    budget = parser.add_argument_group(
        'budget', 'Unset options take the preset value: ' + '; '.join(
            f'{name}: {preset(name)}' for name in PRESETS if name != 'gpu') +
        '; gpu keeps the configs.')
    _add_data_budget(budget)
    _add_method_budget(budget)
    _add_tool_options(parser)
    return parser


def _apply_preset(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fill unset options from the preset; merge ``--method-options`` over the preset's."""
    given = args.method_options or []
    args.method_options = None
    rehearsal = DATASETS[args.dataset or PRESETS[args.preset]['dataset']].rehearsal
    for values in (rehearsal if args.rehearse else {}, PRESETS[args.preset], DEFAULTS):
        for key, value in values.items():
            if getattr(args, key, None) is None:
                setattr(args, key, value)
    if args.methods is None:
        args.methods = [name for name, method in METHODS.items()
                        if method.config(args.dataset) or getattr(args, f'{name}_config')]
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


def _check_ranges(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Refuse numbers out of range and option combinations that cannot work."""
    if args.epochs is not None and args.epochs < 1:
        parser.error('--epochs must be >= 1')
    for name in ('subset', 'val_fraction', 'final_rate'):
        value = getattr(args, name)
        if value is not None and not 0.0 < value <= 1.0:
            parser.error(f'--{name.replace("_", "-")} must be in (0, 1]')
    if args.time_limit is not None and not (math.isfinite(args.time_limit) and args.time_limit >= 0):
        parser.error(f'--time-limit must be a finite number of seconds >= 0 (0: no limit), got {args.time_limit}')
    for name in ('batch_size', 'cluster_interval', 'knn_interval', 'nredo', 'jobs',
                 'neck_hidden', 'embed_dim', 'depth', 'num_heads'):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f'--{name.replace("_", "-")} must be >= 1')
    if args.linear_epochs is not None and args.linear_epochs < 0:
        parser.error('--linear-epochs must be >= 0')
    if args.temperature is not None:
        try:  # the loss's own check and message
            check_temperature('--temperature: the loss', args.temperature)
        except ValueError as err:
            parser.error(str(err))
    if args.num_clusters is not None and (not args.num_clusters or min(args.num_clusters) < 2):
        parser.error('--num-clusters needs k >= 2 per level, e.g. 10,30,100')
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f'--seeds repeats a seed: {args.seeds}')
    if args.eval_split == 'val' and (args.val_fraction is None or args.val_fraction >= 1.0):
        parser.error('--eval-split val needs --val-fraction below 1 (the held-out share of the '
                     'training split), e.g. 0.1')


def _read_texts(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Turn the options given as text (widths, lr, level) into their values."""
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


def _resolve_paths(args: argparse.Namespace) -> None:
    """Configs and work dir as the training runs (in the repository root) see them; threads."""
    for method in (*args.methods, 'linear'):
        key = f'{method}_config'
        if getattr(args, key) is None:
            known = DATASETS[args.dataset].linear if method == 'linear' else \
                METHODS[method].config(args.dataset)
            if known is None:
                raise SystemExit(f'{method} has no config for --dataset {args.dataset}: pass '
                                 f'--{method.replace("_", "-")}-config or leave it out of --methods')
            setattr(args, key, known)
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


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line arguments, with the preset's values for the unset ones."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _apply_preset(args, parser)
    if args.seeds is None:  # the preset's seed is the next one: after those of --previous
        args.seeds = [next_seed(args.previous)]
    _check_ranges(args, parser)
    _read_texts(args, parser)
    _resolve_paths(args)
    return args


def resolve_config(path: str) -> str:
    """A config path as tools/train.py (run in the repository root) will find it."""
    if osp.isfile(path) and not osp.isfile(osp.join(REPO, path)):
        path = osp.abspath(path)  # relative to the caller's cwd, not to the repository
    full = path if osp.isabs(path) else osp.join(REPO, path)
    if not osp.isfile(full):
        raise SystemExit(f'config not found: {path}')
    return path
