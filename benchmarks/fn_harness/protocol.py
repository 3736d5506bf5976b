"""What the benchmark compares and under which budget: data sets, methods, presets, options."""
from __future__ import annotations

import argparse
import math
import os
import os.path as osp
import sys
from typing import Sequence

from ..common import HelpFormatter

from ifnd.settings import check_temperature

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

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
        'ifnd_hard': 'configs/ifnd/ifnd_hard_r18_200e_fmnist.py',
        'glofnd': 'configs/glofnd/glofnd_r18_200e_fmnist.py',
        'glofnd_hard': 'configs/glofnd/glofnd_hard_r18_200e_fmnist.py',
        'oracle_elim_linear': 'configs/ifnd/oracle_elim_linear_r18_200e_fmnist.py',
        'ifnd_confident': 'configs/ifnd/ifnd_confident_r18_200e_fmnist.py',
        'ifnd_confident_hard': 'configs/ifnd/ifnd_confident_hard_r18_200e_fmnist.py',
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
    'digits': {
        'simclr': 'configs/simclr/simclr_r18_8e_digits.py',
        'ifnd': 'configs/ifnd/ifnd_r18_8e_digits.py',
        'supcon': 'configs/ifnd/supcon_r18_8e_digits.py',
        'oracle_elim': 'configs/ifnd/oracle_elim_r18_8e_digits.py',
        'debiased': 'configs/debiased/debiased_r18_8e_digits.py',
        'hard_negative': 'configs/hard_negative/hard_negative_r18_8e_digits.py',
        'fnc_elim': 'configs/fnc/fnc_elim_r18_8e_digits.py',
        'fnc_attr': 'configs/fnc/fnc_attr_r18_8e_digits.py',
        'ifnd_hard': 'configs/ifnd/ifnd_hard_r18_8e_digits.py',
        'glofnd': 'configs/glofnd/glofnd_r18_8e_digits.py',
        'glofnd_hard': 'configs/glofnd/glofnd_hard_r18_8e_digits.py',
        'oracle_elim_linear': 'configs/ifnd/oracle_elim_linear_r18_8e_digits.py',
        'ifnd_confident': 'configs/ifnd/ifnd_confident_r18_8e_digits.py',
        'ifnd_confident_hard': 'configs/ifnd/ifnd_confident_hard_r18_8e_digits.py',
        'linear': 'configs/benchmarks/linear/linear_r18_100e_digits.py',
    },
}
METHODS = ('simclr', 'ifnd', 'supcon', 'oracle_elim', 'debiased', 'hard_negative', 'fnc_elim',
           'fnc_attr', 'ifnd_hard', 'glofnd', 'glofnd_hard', 'oracle_elim_linear', 'ifnd_confident',
           'ifnd_confident_hard')
TITLES = {'simclr': 'SimCLR', 'ifnd': 'IFND', 'supcon': 'SupCon', 'oracle_elim': 'Oracle-elim',
          'debiased': 'Debiased', 'hard_negative': 'Hard negatives', 'fnc_elim': 'FNC-elim',
          'fnc_attr': 'FNC-attr', 'ifnd_hard': 'IFND + hard negatives', 'glofnd': 'GloFND',
          'glofnd_hard': 'GloFND + hard negatives', 'oracle_elim_linear': 'Oracle-elim, linear',
          'ifnd_confident': 'IFND, confident labels',
          'ifnd_confident_hard': 'IFND, confident labels + hard negatives'}
LABELS = {'simclr': 'instance labels', 'ifnd': 'pseudo labels (k-means)',
          'supcon': 'ground truth, attraction', 'oracle_elim': 'ground truth, elimination',
          'debiased': 'instance labels, negatives debiased by a class prior',
          'hard_negative': 'instance labels, negatives reweighted by hardness',
          'fnc_elim': 'support views flag negatives, elimination',
          'fnc_attr': 'support views flag negatives, attraction',
          'ifnd_hard': 'pseudo labels, elimination; the rest reweighted by hardness',
          'glofnd': 'learned per-image thresholds flag negatives, elimination',
          'glofnd_hard': 'learned thresholds, elimination; the rest reweighted by hardness',
          'oracle_elim_linear': "ground truth accepted on IFND's linear schedule, elimination",
          'ifnd_confident': 'pseudo labels accepted by confidence, flagged where two levels agree',
          'ifnd_confident_hard': 'confident pseudo labels, elimination; the rest reweighted by hardness'}
# Every method but the two ends of the gap: their share of the SimCLR -> SupCon gap is reported.
CLOSERS = tuple(m for m in METHODS if m not in ('simclr', 'supcon'))
# Methods that flag individual negatives as false: their in-batch detection precision and recall
# (against the ground-truth classes) are logged per epoch by FalseNegativeDetectionHook.
FLAGGERS = ('ifnd', 'fnc_elim', 'fnc_attr', 'ifnd_hard', 'glofnd', 'glofnd_hard',
            'oracle_elim_linear', 'ifnd_confident', 'ifnd_confident_hard')
DETECTION_KEYS = ('train/fn_precision', 'train/fn_recall')
# Methods whose detector is IFND's clustering (PseudoLabelHook): their rounds' MTPR/MTNR are read.
CLUSTERERS = ('ifnd', 'ifnd_hard', 'ifnd_confident', 'ifnd_confident_hard')
# Paired contrasts between methods (a − b on the seeds both ran, 95% t-interval): acceptance by
# evidence against IFND's calendar and the schedule-matched oracle, the schedule's cost, and the
# combinations against their parts.
CONTRASTS = (('ifnd_confident', 'ifnd'), ('ifnd_confident', 'oracle_elim_linear'),
             ('ifnd_confident_hard', 'ifnd_hard'), ('ifnd_confident_hard', 'hard_negative'),
             ('oracle_elim', 'oracle_elim_linear'), ('oracle_elim_linear', 'ifnd'),
             ('ifnd_hard', 'hard_negative'), ('glofnd', 'ifnd'))

# The methods' own settings on the cpu budget, chosen on the val split (README); the configs keep
# the papers' values for their own recipes.
# The combinations take their parts' settings: hard negatives' beta, and GloFND's alpha; GloFND
# starts a third of the way in with lambda's step 0.1 (its configs' quarter of 200 epochs and the
# authors' 0.05 would leave 30 epochs little time to learn).
CPU_METHOD_OPTIONS = {'debiased': {'model.tau_plus': 0.01}, 'hard_negative': {'model.beta': 2.0},
                      'fnc_elim': {'model.top_k': 3}, 'fnc_attr': {'model.top_k': 3},
                      'ifnd_hard': {'model.weighting.beta': 2.0},
                      'ifnd_confident_hard': {'model.weighting.beta': 2.0},
                      'glofnd': {'model.detector.start_epoch': 10, 'model.detector.lr': 0.1,
                                 'model.detector.alpha': 0.05},
                      'glofnd_hard': {'model.detector.start_epoch': 10, 'model.detector.lr': 0.1,
                                      'model.weighting.beta': 2.0, 'model.detector.alpha': 0.05}}
# The methods' own settings on the digits budget, chosen on its own val split
# (docs/false_negatives.md, "Digits protocol"); the combinations take their parts' values, and
# GloFND starts about a third of the way in, as on the cpu budget.
DIGITS_METHOD_OPTIONS = {'debiased': {'model.tau_plus': 0.1}, 'hard_negative': {'model.beta': 1.0},
                         'fnc_elim': {'model.top_k': 3}, 'fnc_attr': {'model.top_k': 3},
                         'ifnd_hard': {'model.weighting.beta': 1.0},
                         'ifnd_confident_hard': {'model.weighting.beta': 1.0},
                         'glofnd': {'model.detector.alpha': 0.1, 'model.detector.start_epoch': 3,
                                    'model.detector.lr': 0.1},
                         'glofnd_hard': {'model.detector.alpha': 0.1,
                                         'model.detector.start_epoch': 3,
                                         'model.detector.lr': 0.1, 'model.weighting.beta': 1.0}}
# None means: keep the config's value. The cpu values were chosen on the val split (README); the
# digits budget (all of digits' 1,347 training images, an eighth-width ResNet-18, 8 epochs) was set
# by the time of one run, pre-training and linear probe together, on one thread: about 40 s.
PRESETS = {
    'cpu': dict(dataset='fmnist', epochs=30, subset=0.1, batch_size=128, backbone='resnet18',
                cifar_stem=False, channels='32,64,128,256', neck_hidden=256, cluster_interval=3,
                knn_interval=5, val_fraction=1.0, lr=0.25, warmup_epochs=2, num_workers=2,
                temperature=0.2, num_clusters=None, final_rate=None, nredo=2, linear_epochs=10,
                seeds=[0, 1, 2], method_options=CPU_METHOD_OPTIONS),
    'digits': dict(dataset='digits', epochs=8, subset=1.0, batch_size=64, backbone='resnet18',
                   cifar_stem=True, channels='8,16,32,64', neck_hidden=256, cluster_interval=1,
                   knn_interval=2, val_fraction=1.0, lr=0.25, warmup_epochs=1, num_workers=0,
                   temperature=0.2, num_clusters=None, final_rate=None, nredo=None,
                   linear_epochs=10, seeds=[0, 1, 2, 3, 4], method_options=DIGITS_METHOD_OPTIONS),
    'gpu': dict(dataset='fmnist', epochs=None, subset=None, batch_size=None, backbone=None,
                cifar_stem=None, channels=None, neck_hidden=None, cluster_interval=None,
                knn_interval=None, val_fraction=None, lr=None, warmup_epochs=None,
                num_workers=None, temperature=None, num_clusters=None, final_rate=None,
                nredo=None, linear_epochs=None, seeds=[0, 1, 2], method_options={}),
    # One seed of the gap's two ends, IFND and the schedule-matched oracle on all 60,000 images
    # in one 8-minute GPU run; seeds=None: the first seed no --previous result has. The configs'
    # GPU network (full-width ResNet-18, CIFAR stem, 28 px) in bfloat16, channels_last, views made
    # on the GPU, not compiled (a minute of compilation a process would not pay back in 8
    # epochs); the cpu protocol's tau 0.2 and lr per image (0.25 at 128 -> 0.5 at 256).
    # Time on one H100, estimated, not measured: at 20k views/s forward and backward in bfloat16,
    # shared by the four runs, an epoch is 60,000 x 2 views, 6 s a method, so 8 epochs of four
    # take 192 s; start-up 30 s; kNN after epochs 4 and 8 (70,000 images forward, ~2 s a run)
    # 16 s; IFND's 9 clustering rounds (~3 s) 27 s; the probes 55 s (15 s start-up, ~1 s a
    # method-epoch); the report 5 s: ~325 s, 5.4 of 8 minutes (6.5 at 15k views/s). Four runs at
    # once, not one after another: the GPU work is the same, but their start-ups (about a minute
    # more in a row) and CPU phases overlap. --time-limit stops them at 8 minutes, keeping what
    # finished.
    'gpu-slot': dict(dataset='fmnist', methods=['simclr', 'ifnd', 'supcon', 'oracle_elim_linear'],
                     epochs=8, subset=1.0, batch_size=256, backbone='resnet18', cifar_stem=True,
                     channels='64,128,256,512', neck_hidden=512, cluster_interval=1,
                     knn_interval=4, val_fraction=1.0, lr=0.5, warmup_epochs=1, num_workers=0,
                     temperature=0.2, num_clusters=None, final_rate=None, nredo=2,
                     linear_epochs=10, seeds=None, method_options={}, amp=True,
                     augment_on='device', channels_last=True, jobs=4, time_limit=480.0),
}
# --rehearse: a preset's runs at toy size on the CPU (digits, 2 epochs, an eighth-width network,
# float32) to check a command end to end before its GPU slot: the second epoch trains on the
# first round's labels. Start-up is most of its 1-2 minutes on 2 cores.
REHEARSAL = dict(dataset='digits', epochs=2, batch_size=64, channels='8,16,32,64',
                 neck_hidden=64, knn_interval=1, cluster_interval=1, nredo=1, linear_epochs=3,
                 amp=False)
# Defaults of the options a preset may leave unset.
DEFAULTS = dict(amp=False, jobs=1)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.replace(' ', '').split(',') if v]


def method_option_texts(method_options: dict) -> list[str]:
    """``METHOD:KEY=VALUE`` texts of per-method config overrides."""
    return [f'{method}:{key}={value}' for method, options in method_options.items()
            for key, value in options.items()]


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--preset', choices=sorted(PRESETS), default='cpu',
                        help="budget: 'cpu' (Fashion-MNIST, about 3 hours on 2 cores with --jobs "
                        "2), 'digits' (scikit-learn's digits, about 40 s a run on one thread), "
                        "'gpu' (the configs' own settings) or 'gpu-slot' (one seed of 4 methods "
                        'on all of Fashion-MNIST in 8 minutes of one GPU, the next seed each '
                        'time); the options below override it')
    parser.add_argument('--rehearse', action='store_true',
                        help='train the preset\'s runs at toy size on the CPU (digits, 2 epochs, '
                        'an eighth-width network, float32) to check the command before its GPU '
                        'run; the options below still override')
    parser.add_argument('--dataset', choices=sorted(DATASETS), default=None,
                        help="which configs to train (default: the preset's, fmnist or digits)")
    parser.add_argument('--methods', nargs='+', choices=METHODS, default=None,
                        help='methods to train (SimCLR and SupCon are needed for the gaps; '
                        'default: every method with a config for --dataset)')
    parser.add_argument('--seeds', nargs='+', type=int, default=None,
                        help='run seeds; every method runs once per seed (preset: 0 1 2; '
                        'digits: 0 1 2 3 4; gpu-slot: the first seed no --previous result has)')
    parser.add_argument('--eval-split', choices=('test', 'val'), default='test',
                        help="'val': hold --val-fraction of the training split out of training "
                        "and evaluate on it (choosing hyper-parameters); 'test': the test split")
    for method in METHODS:
        parser.add_argument(f'--{method.replace("_", "-")}-config', default=None,
                            help=f'config of {TITLES[method]} (default: from --dataset)')
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
                        help='IFND\'s acceptance rate at the last epoch (linear schedule)')
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
        'budget', f"Unset options take the preset value: cpu: {preset('cpu')}; digits: "
        f"{preset('digits')}; gpu-slot: {preset('gpu-slot')}; gpu keeps the configs.")
    _add_data_budget(budget)
    _add_method_budget(budget)
    _add_tool_options(parser)
    return parser


def _apply_preset(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fill unset options from the preset; merge ``--method-options`` over the preset's."""
    given = args.method_options or []
    args.method_options = None
    for values in (REHEARSAL if args.rehearse else {}, PRESETS[args.preset], DEFAULTS):
        for key, value in values.items():
            if getattr(args, key, None) is None:
                setattr(args, key, value)
    if args.methods is None:
        args.methods = [m for m in METHODS
                        if m in DATASETS[args.dataset] or getattr(args, f'{m}_config')]
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
                 'neck_hidden'):
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
    known = DATASETS[args.dataset]
    for method in (*args.methods, 'linear'):
        key = f'{method}_config'
        if getattr(args, key) is None:
            if method not in known:
                raise SystemExit(f'{method} has no config for --dataset {args.dataset}: pass '
                                 f'--{method.replace("_", "-")}-config or leave it out of --methods')
            setattr(args, key, known[method])
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
        from .merge import next_seed
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
