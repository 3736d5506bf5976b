"""The training commands: ``--cfg-options`` per method and seed, the linear probe, the val split."""
from __future__ import annotations

import argparse
import os
import os.path as osp
import sys

import numpy as np

from ifnd.clustering import CalendarAcceptance
from ifnd.registry import ACCEPTANCES

from .option_checks import check_run_options
from .protocol import METHODS, REPO


def load_config(path: str):
    """The mmengine Config of ``path`` (relative to the repository root unless absolute)."""
    from mmengine.config import Config
    return Config.fromfile(path if osp.isabs(path) else osp.join(REPO, path))


def hook_index(cfg, hook_type: str) -> int | None:
    """Index of the first ``hook_type`` in the config's custom_hooks, or None."""
    for i, hook in enumerate(cfg.get('custom_hooks', [])):
        if hook.get('type') == hook_type:
            return i
    return None


def as_cli(opts: dict) -> list[str]:
    """``key=value`` texts that tools/train.py's ``--cfg-options`` reads back to the same values."""
    # DictAction reads numbers, lists, tuples, True/False and None back; other strings as they are.
    def text(value):
        if isinstance(value, (list, tuple)):
            inner = ','.join(text(v) for v in value)
            return f'[{inner}]' if isinstance(value, list) else f'({inner})'
        return str(value)
    return [f'{key}={text(value)}' for key, value in opts.items()]


def _schedule_options(method: str, cfg, args: argparse.Namespace) -> dict:
    """Epochs, and the warm-up and cosine bounds that follow a changed length."""
    opts: dict[str, object] = {}
    if args.epochs is None:
        return opts
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
    return opts


def _knn_options(method: str, cfg, args: argparse.Namespace, split: dict | None) -> dict:
    """When and on which images the KNNEvalHook measures top-1."""
    knn = hook_index(cfg, 'KNNEvalHook')
    if knn is None:
        raise SystemExit(f'{method}: the config has no KNNEvalHook in custom_hooks; top-1 '
                         'cannot be measured')
    opts: dict[str, object] = {}
    if args.knn_interval is not None:
        opts[f'custom_hooks.{knn}.interval'] = args.knn_interval
    elif args.epochs is not None:
        # Only the final top-1 is reported: evaluate once, after the last epoch.
        opts[f'custom_hooks.{knn}.interval'] = args.epochs
    opts.update(query_options(f'custom_hooks.{knn}.val_dataset', cfg.custom_hooks[knn].val_dataset,
                              args, split))
    if args.num_workers is not None:
        opts[f'custom_hooks.{knn}.num_workers'] = args.num_workers
    return opts


def _has_final_rate(hook: dict) -> bool:
    """Whether the hook's acceptance scheme accepts a rate (the calendar's) rather than by evidence."""
    kind = (hook.get('acceptance') or {}).get('type', 'LinearAcceptance')
    return issubclass(ACCEPTANCES.get(kind) or type(None), CalendarAcceptance)


def _pseudo_label_options(method: str, cfg, args: argparse.Namespace, seed: int | None) -> dict:
    """IFND's clustering settings (its PseudoLabelHook), seeded by the run seed."""
    labels = hook_index(cfg, 'PseudoLabelHook')
    opts: dict[str, object] = {}
    if labels is None:
        if METHODS[method].clusters:
            raise SystemExit(f'{method}: the config has no PseudoLabelHook in custom_hooks')
        return opts
    if seed is not None:
        opts[f'custom_hooks.{labels}.seed'] = seed
    if args.cluster_interval is not None:
        opts[f'custom_hooks.{labels}.interval'] = args.cluster_interval
    if args.nredo is not None:
        opts[f'custom_hooks.{labels}.kmeans.nredo'] = args.nredo
    if args.num_clusters is not None:
        opts[f'custom_hooks.{labels}.num_clusters'] = list(args.num_clusters)
    if args.final_rate is not None and _has_final_rate(cfg.custom_hooks[labels]):
        opts[f'custom_hooks.{labels}.acceptance.final_rate'] = args.final_rate
    if args.num_workers is not None:
        opts[f'custom_hooks.{labels}.num_workers'] = args.num_workers
    return opts


def _acceptance_options(cfg, args: argparse.Namespace, seed: int | None) -> dict:
    """A detector's acceptance schedule on IFND's clustering interval, its order seeded by the run."""
    detector = cfg.model.get('detector') or {}
    if not detector.get('acceptance'):
        return {}
    opts: dict[str, object] = {}
    if seed is not None:
        opts['model.detector.acceptance.seed'] = seed
    if args.cluster_interval is not None:
        opts['model.detector.acceptance.interval'] = args.cluster_interval
    return opts


def cfg_options(method: str, cfg, args: argparse.Namespace, seed: int | None = None,
                split: dict | None = None) -> list[str]:
    """The ``--cfg-options`` overrides that put ``method``'s config on the chosen budget."""
    opts: dict[str, object] = {}
    if seed is not None:
        opts['randomness.seed'] = seed
    opts.update(_schedule_options(method, cfg, args))
    opts.update(train_subset_options('train_dataloader.dataset', cfg.train_dataloader.dataset,
                                     args, split))
    opts.update(augment_options(args))
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
    opts.update(_knn_options(method, cfg, args, split))
    opts.update(_pseudo_label_options(method, cfg, args, seed))
    opts.update(_acceptance_options(cfg, args, seed))
    opts.update(args.method_options.get(method, {}))
    return as_cli(opts) + list(args.cfg_options)


# The ViT sizes a budget may set (ViTBackbone's arguments).
VIT_SIZES = ('embed_dim', 'depth', 'num_heads')


def backbone_options(args: argparse.Namespace) -> dict:
    """Backbone overrides shared by pre-training and the linear probe (its weights must fit)."""
    opts: dict[str, object] = {}
    if args.backbone is not None:
        opts['model.backbone.model_name'] = args.backbone
    if args.cifar_stem is not None:
        opts['model.backbone.cifar_stem'] = args.cifar_stem
    if args.channels is not None:
        opts['model.backbone.channels'] = tuple(args.channels)
    if args.channels_last is not None:
        opts['model.backbone.channels_last'] = args.channels_last
    for name in VIT_SIZES:
        if getattr(args, name, None) is not None:
            opts[f'model.backbone.{name}'] = getattr(args, name)
    return opts


def augment_options(args: argparse.Namespace) -> dict:
    """Where the training views are made, shared by pre-training and the linear probe."""
    if args.augment_on is None:
        return {}
    # Views on the device stay eager, as the encoder: a short run does not win back the compile time.
    return {'train_dataloader.dataset.augment_on': args.augment_on, 'model.data_preprocessor.compile': False}


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
    for name in ('model_name', 'cifar_stem', 'channels', *VIT_SIZES):
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
    opts.update(augment_options(args))
    opts.update(query_options('val_dataloader.dataset', cfg.val_dataloader.dataset, args, split))
    if args.num_workers is not None:
        for loader in ('train_dataloader', 'val_dataloader'):
            opts.update(worker_options(loader, cfg, args.num_workers, persistent=False))
    return as_cli(opts)


def worker_options(loader: str, cfg, num_workers: int, persistent: bool | None = None) -> dict:
    """Loader workers; persistent ones (where the config has the key) only when there are any."""
    opts: dict[str, object] = {f'{loader}.num_workers': num_workers}
    if 'persistent_workers' in cfg[loader]:
        keep = cfg[loader].persistent_workers if persistent is None else persistent
        opts[f'{loader}.persistent_workers'] = bool(keep) and num_workers > 0
    return opts


def training_data(cfg):
    """The config's whole training split, without views or subset (its labels; its files read)."""
    from mmengine.registry import init_default_scope

    import ifnd  # noqa: F401  (registers the data sets)
    from ifnd.registry import DATASETS
    init_default_scope('ifnd')
    data = {k: v for k, v in dict(cfg.train_dataloader.dataset).items()
            if k not in ('pipeline', 'subset_fraction', 'subset_file', 'subset_seed', 'augment_on')}
    return DATASETS.build(data)


def write_split(args: argparse.Namespace, cfg) -> dict:
    """Index files of a held-out validation part of the training split and of the rest trained on.

    The validation part is ``--val-fraction`` of every class; the training images are
    ``--subset`` of every class of the full split, drawn from what is left (both class-balanced,
    fixed seeds, so every method and seed sees the same images).
    """
    from ifnd.datasets import balanced_subset_indices
    labels = np.asarray(training_data(cfg).labels)
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


def make_plans(args: argparse.Namespace) -> list[dict]:
    """One plan per method and seed: work dir, pre-training and linear-probe commands."""
    configs = {m: load_config(getattr(args, f'{m}_config')) for m in args.methods}
    split = None
    if args.eval_split == 'val' and not args.dry_run:
        split = write_split(args, configs[args.methods[0]])
    elif args.eval_split == 'val':
        split = {name: osp.join(args.work_dir, 'split', f'{name}.txt') for name in ('train', 'val')}
    linear_cfg = load_config(args.linear_config) if args.linear_epochs != 0 else None
    plans = []
    for seed in args.seeds:
        for method in args.methods:
            cfg = configs[method]
            work_dir = osp.join(args.work_dir, method, f'seed_{seed}')
            options = cfg_options(method, cfg, args, seed, split)
            if seed == args.seeds[0]:  # a bad option fails now, not hours later inside a run
                check_run_options(method, cfg, options, args)
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
