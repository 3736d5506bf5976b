"""SimCLR vs IFND vs SupCon under one recipe: top-1 gaps and IFND's false-negative detection.

Trains the three methods with ``tools/train.py`` (one subprocess each, the same budget through
``--cfg-options``), then prints the paper's kind of table: the final weighted-kNN top-1 of each,
the gaps IFND - SimCLR and SupCon - SimCLR, and MTPR / MTNR (Sec. 4.4) of the pseudo labels of
IFND's last clustering round. SimCLR's labels are instance labels (MTPR 0, MTNR 100 by
definition) and SupCon's the ground truth (MTPR 100, MTNR 100 by definition).

Presets:

* ``cpu``: a budget for a 2-core CPU (a few epochs on a small class-balanced subset, ResNet-18
  with the standard stride-4 stem, clustering every epoch, kNN at the end on a subset of the
  test split): minutes, not a reproduction.
* ``gpu``: the configs' own settings (full data, 200 epochs, batch 256, clustering every 5
  epochs, kNN every 10) on one GPU.

Any explicit option overrides its preset value. Example::

    python benchmarks/false_negatives.py --preset cpu --out fn_cpu.json
    python benchmarks/false_negatives.py --preset gpu --work-dir work_dirs/fn_gpu --amp
"""
from __future__ import annotations

import argparse
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

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))

# Config triples (instance baseline, IFND, oracle) sharing one recipe per data set.
DATASETS = {
    'fmnist': {
        'simclr': 'configs/simclr/simclr_r18_200e_fmnist.py',
        'ifnd': 'configs/ifnd/ifnd_r18_200e_fmnist.py',
        'supcon': 'configs/ifnd/supcon_r18_200e_fmnist.py',
    },
    'cifar10': {
        'simclr': 'configs/simclr/simclr_r50_1000e_cifar10.py',
        'ifnd': 'configs/ifnd/ifnd_r50_1000e_cifar10.py',
        'supcon': 'configs/ifnd/supcon_r50_1000e_cifar10.py',
    },
    'cifar100': {
        'simclr': 'configs/simclr/simclr_r50_1000e_cifar100.py',
        'ifnd': 'configs/ifnd/ifnd_r50_1000e_cifar100.py',
        'supcon': 'configs/ifnd/supcon_r50_1000e_cifar100.py',
    },
}
METHODS = ('simclr', 'ifnd', 'supcon')
TITLES = {'simclr': 'SimCLR', 'ifnd': 'IFND', 'supcon': 'SupCon'}

# None means: keep the config's value.
PRESETS = {
    'cpu': dict(epochs=5, subset=0.05, batch_size=128, backbone='resnet18', cifar_stem=False,
                cluster_interval=1, knn_interval=None, val_fraction=0.2, lr='scaled',
                warmup_epochs=1, num_workers=2),
    'gpu': dict(epochs=None, subset=None, batch_size=None, backbone=None, cifar_stem=None,
                cluster_interval=None, knn_interval=None, val_fraction=None, lr=None,
                warmup_epochs=None, num_workers=None),
}

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the shared helpers beside this script
from common import HelpFormatter  # noqa: E402


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(
        description='Train SimCLR, IFND and SupCon with one recipe (tools/train.py in '
        'subprocesses), then print kNN top-1, the gaps to SimCLR, and MTPR/MTNR of IFND\'s '
        'last pseudo labels as a Markdown table.',
        formatter_class=HelpFormatter)
    parser.add_argument('--preset', choices=sorted(PRESETS), default='cpu',
                        help="budget: 'cpu' (minutes on 2 cores) or 'gpu' (the configs' own "
                        'settings); the options below override it')
    parser.add_argument('--dataset', choices=sorted(DATASETS), default='fmnist',
                        help='which config triple to train')
    parser.add_argument('--methods', nargs='+', choices=METHODS, default=list(METHODS),
                        help='methods to train (SimCLR is needed for the gaps)')
    for method in METHODS:
        parser.add_argument(f'--{method}-config', default=None,
                            help=f'config of {TITLES[method]} (default: from --dataset)')
    cpu = ', '.join(f'{key}={value}' for key, value in PRESETS['cpu'].items() if value is not None)
    budget = parser.add_argument_group(
        'budget', f'Unset options take the preset value: cpu: {cpu}; gpu keeps the configs.')
    budget.add_argument('--epochs', type=int, default=None, help='training epochs')
    budget.add_argument('--subset', type=float, default=None,
                        help='class-balanced fraction of the training set (1 = all)')
    budget.add_argument('--batch-size', type=int, default=None, help='images per batch')
    budget.add_argument('--backbone', default=None, help='timm model name, e.g. resnet18')
    budget.add_argument('--cifar-stem', action=argparse.BooleanOptionalAction, default=None,
                        help='3x3 stride-1 ResNet stem without max-pool')
    budget.add_argument('--cluster-interval', type=int, default=None,
                        help='IFND re-clustering interval in epochs')
    budget.add_argument('--knn-interval', type=int, default=None,
                        help='kNN evaluation interval in epochs (it always runs after the last '
                        'epoch; by default only then when --epochs is set)')
    budget.add_argument('--val-fraction', type=float, default=None,
                        help='class-balanced fraction of the test split used as kNN queries')
    budget.add_argument('--lr', default=None,
                        help="SGD learning rate, or 'scaled' for 0.5 x batch / 1024 (the recipe)")
    budget.add_argument('--warmup-epochs', type=int, default=None,
                        help='linear warm-up epochs before the cosine decay (used when --epochs '
                        "changes the schedule; default 5%% of the epochs)")
    budget.add_argument('--num-workers', type=int, default=None, help='data-loader workers')
    budget.add_argument('--nredo', type=int, default=None, help='k-means restarts of IFND')
    parser.add_argument('--cfg-options', nargs='+', default=[],
                        help='extra key=value overrides passed to every training run')
    parser.add_argument('--amp', action='store_true', help='train with mixed precision')
    parser.add_argument('--threads', type=int, default=None,
                        help='OMP/MKL threads of each training process (default: torch\'s own)')
    parser.add_argument('--level', default='finest',
                        help="clustering level for MTPR/MTNR: 'finest' (largest k, as the "
                        "paper's k=100) or its index")
    parser.add_argument('--work-dir', default=None,
                        help='parent of one work dir per method (default: '
                        'work_dirs/false_negatives/<dataset>_<preset>)')
    parser.add_argument('--python', default=sys.executable, help='interpreter for tools/train.py')
    parser.add_argument('--dry-run', action='store_true', help='print the commands, run nothing')
    parser.add_argument('--skip-train', action='store_true',
                        help='only read the results already in the work dirs')
    parser.add_argument('--verbose', action='store_true',
                        help='show the training output (otherwise it goes to train.log)')
    parser.add_argument('--out', default=None, help='also write the results as JSON here')
    args = parser.parse_args(argv)

    preset = PRESETS[args.preset]
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.epochs is not None and args.epochs < 1:
        parser.error('--epochs must be >= 1')
    for name in ('subset', 'val_fraction'):
        value = getattr(args, name)
        if value is not None and not 0.0 < value <= 1.0:
            parser.error(f'--{name.replace("_", "-")} must be in (0, 1]')
    for name in ('batch_size', 'cluster_interval', 'knn_interval', 'nredo'):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f'--{name.replace("_", "-")} must be >= 1')
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
    for method in METHODS:
        key = f'{method}_config'
        if getattr(args, key) is None:
            setattr(args, key, DATASETS[args.dataset][method])
        setattr(args, key, resolve_config(getattr(args, key)))
    # Training runs in the repository root: make the work dir independent of the caller's cwd.
    if args.work_dir is None:
        args.work_dir = osp.join(REPO, 'work_dirs', 'false_negatives',
                                 f'{args.dataset}_{args.preset}')
    args.work_dir = osp.abspath(args.work_dir)
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


def cfg_options(method: str, cfg, args: argparse.Namespace) -> list[str]:
    """The ``--cfg-options`` overrides that put ``method``'s config on the chosen budget."""
    opts: dict[str, object] = {}
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
    if args.subset is not None and args.subset < 1.0:
        opts['train_dataloader.dataset.subset_fraction'] = args.subset
    batch = args.batch_size or cfg.train_dataloader.batch_size
    if args.batch_size is not None:
        opts['train_dataloader.batch_size'] = args.batch_size
    if args.lr == 'scaled':
        opts['optim_wrapper.optimizer.lr'] = 0.5 * batch / 1024
    elif args.lr is not None:
        opts['optim_wrapper.optimizer.lr'] = args.lr
    if args.backbone is not None:
        opts['model.backbone.model_name'] = args.backbone
    if args.cifar_stem is not None:
        opts['model.backbone.cifar_stem'] = args.cifar_stem
    if args.num_workers is not None:
        opts['train_dataloader.num_workers'] = args.num_workers
        if args.num_workers == 0:
            opts['train_dataloader.persistent_workers'] = False
    knn = _hook_index(cfg, 'KNNEvalHook')
    if knn is None:
        raise SystemExit(f'{method}: the config has no KNNEvalHook in custom_hooks; top-1 '
                         'cannot be measured')
    if args.knn_interval is not None:
        opts[f'custom_hooks.{knn}.interval'] = args.knn_interval
    elif args.epochs is not None:
        # Only the final top-1 is reported: evaluate once, after the last epoch.
        opts[f'custom_hooks.{knn}.interval'] = args.epochs
    if args.val_fraction is not None and args.val_fraction < 1.0:
        opts[f'custom_hooks.{knn}.val_dataset.subset_fraction'] = args.val_fraction
    if args.num_workers is not None:
        opts[f'custom_hooks.{knn}.num_workers'] = args.num_workers
    labels = _hook_index(cfg, 'PseudoLabelHook')
    if labels is not None:
        if args.cluster_interval is not None:
            opts[f'custom_hooks.{labels}.interval'] = args.cluster_interval
        if args.nredo is not None:
            opts[f'custom_hooks.{labels}.kmeans.nredo'] = args.nredo
        if args.num_workers is not None:
            opts[f'custom_hooks.{labels}.num_workers'] = args.num_workers
    elif method == 'ifnd':
        raise SystemExit('ifnd: the config has no PseudoLabelHook in custom_hooks')
    # DictAction reads numbers and True/False back; other strings are taken as they are.
    return [f'{key}={value}' for key, value in opts.items()] + list(args.cfg_options)


def train_command(method: str, config: str, work_dir: str, options: list[str],
                  args: argparse.Namespace) -> list[str]:
    """The tools/train.py command line of one method."""
    cmd = [args.python, 'tools/train.py', config, '--work-dir', work_dir]
    if args.amp:
        cmd.append('--amp')
    if options:
        cmd += ['--cfg-options', *options]
    return cmd


def final_knn_top1(work_dir: str, since: float | None) -> tuple[float, int, list]:
    """Final ``knn/top1`` of the newest run in ``work_dir`` (from its vis_data/scalars.json).

    Each run writes ``<work_dir>/<timestamp>/vis_data/scalars.json``, one JSON object per line;
    the kNN hook's lines hold ``knn/top1`` and ``step`` (epochs done). Runs older than ``since``
    (a time stamp) are ignored, so stale results of an earlier run are never reported.
    """
    files = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    if since is not None:
        files = [f for f in files if osp.getmtime(f) >= since]
    for path in reversed(files):  # newest time stamp first
        history = []
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                record = json.loads(line)
                if 'knn/top1' in record:
                    history.append((int(record.get('step', -1)), float(record['knn/top1'])))
        if history:
            step, top1 = max(history, key=lambda h: h[0])
            return top1, step, sorted(history)
    raise RuntimeError(f'no knn/top1 scalar found under {work_dir}/*/vis_data/scalars.json'
                       + (' written by this run' if since is not None else ''))


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


def run_method(method: str, cmd: list[str], work_dir: str, args: argparse.Namespace) -> float:
    """Run one training command; returns its wall-clock seconds."""
    os.makedirs(work_dir, exist_ok=True)
    env = dict(os.environ)
    if args.threads is not None:
        env['OMP_NUM_THREADS'] = env['MKL_NUM_THREADS'] = str(args.threads)
    log_path = osp.join(work_dir, 'train.log')
    tic = time.time()
    if args.verbose:
        proc = subprocess.run(cmd, cwd=REPO, env=env)
    else:
        with open(log_path, 'w') as log:
            proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    seconds = time.time() - tic
    if proc.returncode != 0:
        if not args.verbose:
            with open(log_path) as f:
                tail = f.read()[-4000:]
            print(tail, file=sys.stderr)
        raise SystemExit(f'{method}: training failed with exit code {proc.returncode} '
                         f'(log: {log_path})')
    print(f'{TITLES[method]}: finished in {seconds:.0f} s', flush=True)
    return seconds


def collect(method: str, work_dir: str, since: float | None, args) -> dict:
    """Top-1 and label statistics of one finished run."""
    top1, step, history = final_knn_top1(work_dir, since)
    entry = {'top1': top1, 'top1_epoch': step, 'top1_history': history}
    if method == 'simclr':
        entry.update(mtpr=0.0, mtnr=100.0, labels='instance labels (by definition)')
    elif method == 'supcon':
        entry.update(mtpr=100.0, mtnr=100.0, labels='ground truth (by definition)')
    else:
        last, used = last_round(work_dir, since)
        level = pick_level(last, args.level)
        entry.update(mtpr=level.get('mtpr', math.nan), mtnr=level.get('mtnr', math.nan),
                     labels=f"pseudo labels, k={level['k']}, round after epoch {last['epoch']} "
                     f"(acceptance rate {last['rate']:.2f})",
                     last_round=last, last_round_used_in_training=used)
    return entry


def markdown_tables(result: dict) -> str:
    """The comparison table, plus IFND's per-level statistics of its last round."""
    s = result['settings']
    runs = result['methods']
    stem = {None: '', True: ' (CIFAR stem)', False: ' (standard stem)'}[s['cifar_stem']]
    budget = (f"{s['epochs'] or 'config'} epochs, subset {s['subset'] or 1}, batch "
              f"{s['batch_size'] or 'config'}, backbone {s['backbone'] or 'config'}{stem}")
    lines = [f"SimCLR vs IFND vs SupCon on {s['dataset']} ({s['preset']} preset: {budget}), "
             f"trained on {result['device']}; top-1 = weighted kNN on the frozen backbone", '',
             '| Method | Labels | kNN top-1 (%) | Gap to SimCLR | MTPR (%) | MTNR (%) '
             '| Train (s) |', '|---|---|---:|---:|---:|---:|---:|']
    base = runs.get('simclr', {}).get('top1')
    for method in METHODS:
        if method not in runs:
            continue
        r = runs[method]
        gap = '—' if method == 'simclr' or base is None else f"{r['top1'] - base:+.2f}"
        seconds = r.get('seconds')
        lines.append(f"| {TITLES[method]} | {r['labels']} | {r['top1']:.2f} | {gap} | "
                     f"{r['mtpr']:.2f} | {r['mtnr']:.2f} | "
                     f"{'—' if seconds is None else f'{seconds:.0f}'} |")
    ifnd = runs.get('ifnd')
    if ifnd:
        last = ifnd['last_round']
        lines += ['', f"IFND pseudo labels of the last round (after epoch {last['epoch']}, "
                  f"acceptance rate {last['rate']:.2f}):", '',
                  '| k | accepted | clusters used | NMI | MTPR (%) | MTNR (%) |',
                  '|---:|---:|---:|---:|---:|---:|']
        for lv in last['levels']:
            lines.append(f"| {lv['k']} | {lv['accept_rate']:.2f} | {lv['clusters_used']} | "
                         f"{lv.get('nmi', math.nan):.3f} | {lv.get('mtpr', math.nan):.2f} | "
                         f"{lv.get('mtnr', math.nan):.2f} |")
        used = ifnd.get('last_round_used_in_training')
        if used is not None and used['epoch'] != last['epoch']:
            level = pick_level(used, s['level'])
            mtpr, mtnr = level.get('mtpr', math.nan), level.get('mtnr', math.nan)
            lines += ['', f"The last labels trained on came from the round after epoch "
                      f"{used['epoch']} (acceptance rate {used['rate']:.2f}): MTPR {mtpr:.2f}%, "
                      f"MTNR {mtnr:.2f}% at k={level['k']}."]
    return '\n'.join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    """Train (unless --skip-train), read the results, print the tables; returns the results."""
    args = parse_args(argv)
    device = training_device()
    if args.threads is not None:
        device += f', {args.threads} thread(s) per run'
    if args.preset == 'gpu' and device.startswith('CPU') and not args.dry_run:
        print('warning: the gpu preset on a CPU takes days; use --preset cpu', file=sys.stderr)
    print(f'Training device: {device}')
    plans = []
    for method in args.methods:
        config = getattr(args, f'{method}_config')
        cfg = _load_config(config)
        work_dir = osp.join(args.work_dir, method)
        cmd = train_command(method, config, work_dir, cfg_options(method, cfg, args), args)
        plans.append((method, cmd, work_dir))
    for method, cmd, _ in plans:
        env = f'OMP_NUM_THREADS={args.threads} ' if args.threads is not None else ''
        print(f'$ {env}{shlex.join(cmd)}', flush=True)
    if args.dry_run:
        return {}
    runs = {}
    for method, cmd, work_dir in plans:
        since, seconds = None, None
        if not args.skip_train:
            since = time.time() - 1.0  # file times have coarse resolution on some systems
            seconds = run_method(method, cmd, work_dir, args)
        runs[method] = collect(method, work_dir, since, args)
        runs[method].update(seconds=seconds, command=shlex.join(cmd))
    result = {
        'benchmark': 'false_negatives',
        'device': device,
        'settings': {key: value for key, value in vars(args).items()
                     if key not in ('out', 'python', 'dry_run', 'skip_train', 'verbose')},
        'methods': runs,
    }
    if 'simclr' in runs:
        base = runs['simclr']['top1']
        result['gaps'] = {f'{TITLES[m]} - SimCLR': runs[m]['top1'] - base
                          for m in ('ifnd', 'supcon') if m in runs}
    print()
    print(markdown_tables(result), flush=True)
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=1)
        print(f'\nWrote {args.out}')
    return result


if __name__ == '__main__':
    main(sys.argv[1:])
