"""Time per training step of IFND against its instance-level base, measured side by side.

Pairs: IFND vs SimCLR (batch contrastive), IFNDMoCo vs MoCoV2 (queue of negatives) and, with
``--pairs mocov3``, IFNDMoCoV3 vs MoCoV3 (momentum encoder, the batch's keys). Every
variant gets the same backbone, projection head, batch and input size; one step is the full
``train_step`` of mmengine (preprocessing, forward, loss, backward, optimiser update). The variants
are interleaved (A, B, C, D, A, B, ...) in rounds after a warm-up, so drifting machine load hits
them alike, and the median step time per variant is reported with the ratios IFND/base. An "Encoder" reference row times the backbone alone (forward + backward +
update of the 2 x batch views, as SimCLR encodes them), so step / encoder shows what the
algorithms add around it.

Speed options, each off by default so that runs stay comparable: ``--channels-last`` (NHWC
weights and inputs), ``--amp`` (bfloat16 autocast without a loss scaler where the GPU supports
it, else float16 with dynamic scaling: what the GPU recipes' ``AutoAmpOptimWrapper`` and
``tools/train.py --amp`` choose), ``--compile`` (``torch.compile`` of the backbones), ``--fused``
(the fused update of the recipe's optimiser: SGD, AdamW for the ViT recipe).

The head and the queue follow the recipes: with ``--model resnet50`` the ImageNet recipe's
(``configs/ifnd_r50_200e_in1k.py``: 3-layer MLP 2048 wide to 128 with BN, queue 65536), else a
3-layer head 512 wide (the ResNet-18 recipes') and a queue of 16384. ``--model
vit_small_patch16_224`` reads the MoCo v3 ViT recipe's config
(``configs/mocov3/mocov3_vit-small-p16_300e_in1k.py``): its backbone at ``--image-size`` (ViT-S/16
with 12 heads, frozen patch projection, sin-cos positions, class token), its heads (3-layer
projection 4096 wide to 256, 2-layer prediction), MoCo v3's momentum and temperature, and AdamW;
the IFND recipe on it (``configs/ifnd/ifnd_mocov3_vit-small-p16_300e_in1k.py``) changes only the
model's type. ``--backbone-options`` sets more backbone arguments (a toy ViT: ``depth=1``...).
On a GPU each step is timed by CUDA events around it, without a host sync between steps; on a CPU
by ``perf_counter``. The warm-up is 10 steps per variant with ``--compile`` (compilation happens
there), 3 on a GPU otherwise, 1 on a CPU; the JSON holds each variant's warm-up seconds
(``warmup_s``, compilation included).

The label bank of the IFND variants is filled like a mid-training round: a share of the samples
carries cluster ids (a few clusters per level), the rest unique negative labels, and the MoCo
queue holds keys of real sample indices, so the label lookup and the masking are real work.

Example::

    python -m benchmarks.step_cost --model resnet18 --batch-size 64 --image-size 32 --out step.json
    python -m benchmarks.step_cost --model resnet50 --no-cifar-stem --image-size 224 \
        --batch-size 256 --channels-last --amp --compile --fused
    python -m benchmarks.step_cost --model vit_small_patch16_224 --pairs mocov3 --image-size 224 \
        --batch-size 256 --amp --compile --fused
"""
from __future__ import annotations

import argparse
import functools
import logging
import os
import os.path as osp
import statistics
import sys
import time
from typing import Callable, Sequence

if not __package__:  # started as `python benchmarks/NAME.py`: import the package from the repository
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from mmengine.config import Config, DictAction
from mmengine.logging import MMLogger
from mmengine.optim import OptimWrapper
from mmengine.registry import init_default_scope

from benchmarks.common import (REPO, HelpFormatter, describe_device, report_results, resolve_device,
                               time_call)
from benchmarks.op_count import add_arguments as add_count_arguments

PAIRS = {'simclr': ('SimCLR', 'IFND'), 'moco': ('MoCoV2', 'IFNDMoCo'), 'mocov3': ('MoCoV3', 'IFNDMoCoV3')}
ENCODER = 'Encoder'  # the backbone alone, forward + backward + update
# The variants whose configs carry FalseNegativeDetectionHook: their steps count what they flag.
COUNTS_DETECTION = ('IFND', 'IFNDMoCoV3')

# Head width, queue length and stem of the recipes, by backbone: ResNet-50 the ImageNet recipe's
# (configs/ifnd_r50_200e_in1k.py); ViT-S/16 the MoCo v3 recipe's, read from its config file
# (backbone, heads, momentum, temperature, optimiser); others the ResNet-18 recipes' head and a
# smaller queue.
RECIPES = {'resnet50': dict(neck_hidden=2048, queue_len=65536),
           'vit_small_patch16_224': dict(config='configs/mocov3/mocov3_vit-small-p16_300e_in1k.py',
                                         cifar_stem=False)}
DEFAULT_RECIPE = dict(neck_hidden=512, neck_layers=3, out_dim=128, queue_len=16384, cifar_stem=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(
        description='Median ms per training step (forward + backward + SGD) of IFND vs SimCLR '
        'and IFNDMoCo vs MoCoV2, interleaved in one run; prints a Markdown table.',
        formatter_class=HelpFormatter)
    parser.add_argument('--pairs', nargs='+', choices=sorted(PAIRS), default=['simclr', 'moco'],
                        help='which comparisons to run')
    _add_model_arguments(parser)
    _add_timing_arguments(parser)
    add_count_arguments(parser)
    args = parser.parse_args(argv)
    _complete_and_check(parser, args)
    return args


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model, its batch and its pseudo-labels."""
    parser.add_argument('--model', default='resnet18',
                        help='timm backbone name (vit_small_patch16_224: the MoCo v3 ViT recipe)')
    parser.add_argument('--cifar-stem', action=argparse.BooleanOptionalAction, default=None,
                        help='3x3 stride-1 stem without max-pool (ResNets, small images; default: '
                        'on, except for the ViT recipe)')
    parser.add_argument('--backbone-options', nargs='+', action=DictAction, default={},
                        help='more backbone arguments, KEY=VALUE (a toy ViT: depth=1 patch_size=4 ...)')
    parser.add_argument('--batch-size', type=int, default=64, help='images per step (2 views each)')
    parser.add_argument('--image-size', type=int, default=32, help='input height and width')
    parser.add_argument('--neck-hidden', type=int, default=None,
                        help="projection (and MoCo v3's prediction) head hidden size (default: the "
                        "recipe's, 2048 for resnet50, 4096 for the ViT, else 512)")
    parser.add_argument('--neck-layers', type=int, default=None,
                        help="projection head depth (default: the recipe's, 3)")
    parser.add_argument('--out-dim', type=int, default=None,
                        help="embedding size (default: the recipe's, 256 for the ViT, else 128)")
    parser.add_argument('--queue-len', type=int, default=None,
                        help='MoCo queue length (default: 65536 for resnet50, the ImageNet '
                        'recipe, else 16384)')
    parser.add_argument('--bn-splits', type=int, default=8,
                        help='MoCo key-encoder BN sub-batches (capped so each holds >= 2 images)')
    parser.add_argument('--num-samples', type=int, default=50000,
                        help='data-set size the label bank is indexed by')
    parser.add_argument('--num-clusters', type=int, nargs='+', default=[10, 30, 100],
                        help='clusters per pseudo-label level (one level each)')
    parser.add_argument('--accepted', type=float, default=0.5,
                        help='share of samples carrying a cluster id; the rest get unique labels')


def _add_timing_arguments(parser: argparse.ArgumentParser) -> None:
    """How the steps are timed, and on what."""
    parser.add_argument('--warmup', type=int, default=None,
                        help='untimed steps per variant first (default: 10 with --compile, '
                        '3 on a GPU, else 1)')
    parser.add_argument('--repeats', type=int, default=5,
                        help='interleaved rounds; each runs --steps timed steps per variant')
    parser.add_argument('--steps', type=int, default=1, help='timed steps per variant per round')
    parser.add_argument('--device', default='auto',
                        help="'auto' (CUDA when available), 'cpu', 'cuda'")
    parser.add_argument('--amp', action='store_true',
                        help='mixed precision (CUDA): bfloat16 where supported, else float16')
    parser.add_argument('--channels-last', action='store_true',
                        help='NHWC memory format for the backbone weights and inputs')
    parser.add_argument('--compile', action='store_true', help='torch.compile the backbones')
    parser.add_argument('--compile-backend', default='inductor',
                        help="torch.compile backend ('eager' to check the wiring quickly)")
    parser.add_argument('--fused', action='store_true',
                        help="fused update of the recipe's optimiser (SGD; the ViT recipe's AdamW)")
    parser.add_argument('--detection', action=argparse.BooleanOptionalAction, default=True,
                        help="count the flagged false negatives in the steps of IFND and IFNDMoCoV3, as "
                        'their configs do (FalseNegativeDetectionHook); --no-detection times the loss alone')
    parser.add_argument('--encoder', action=argparse.BooleanOptionalAction, default=True,
                        help='time the encoder alone (fwd + bwd on both views) as a reference row')
    parser.add_argument('--threads', type=int, default=None,
                        help="torch CPU threads (default: torch's own; use 1 on a busy machine)")
    parser.add_argument('--seed', type=int, default=0, help='random seed')
    parser.add_argument('--out', default=None, help='also write the results as JSON here')


def _complete_and_check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fill the recipe defaults of the model, then refuse values out of range."""
    if args.cifar_stem and recipe_file(args.model) is not None:
        parser.error(f'--cifar-stem is a ResNet stem; the {args.model} recipe has none')
    for name, value in recipe_defaults(args.model).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ('batch_size', 'image_size', 'repeats', 'steps', 'queue_len', 'num_samples'):
        if getattr(args, name) < 1:
            parser.error(f'--{name.replace("_", "-")} must be >= 1')
    if args.warmup is not None and args.warmup < 0:
        parser.error('--warmup must be >= 0')
    if not 0.0 <= args.accepted <= 1.0:
        parser.error('--accepted must be in [0, 1]')
    if args.batch_size > args.num_samples:
        parser.error('--batch-size cannot exceed --num-samples')


@functools.cache
def recipe_file(model: str) -> Config | None:
    """The config of ``model``'s recipe where it is read from a file (None: ``RECIPES`` holds it all)."""
    path = RECIPES.get(model, {}).get('config')
    return None if path is None else Config.fromfile(osp.join(REPO, path))


def recipe_defaults(model: str) -> dict:
    """Head, queue and stem of ``model``'s recipe, the head from its config file where it has one."""
    found = {key: value for key, value in {**DEFAULT_RECIPE, **RECIPES.get(model, {})}.items()
             if key != 'config'}
    cfg = recipe_file(model)
    if cfg is not None:
        neck = cfg.model.neck
        found.update(neck_hidden=neck.hidden_dim, out_dim=neck.out_dim, neck_layers=neck.num_layers)
    return found


def realistic_labels(num_clusters: Sequence[int], num_samples: int, accepted: float,
                     generator: torch.Generator) -> torch.Tensor:
    """Pseudo labels ``[L, N]``: an ``accepted`` share with cluster ids, the rest ``-(i + 1)``."""
    levels = []
    unique = -(torch.arange(num_samples) + 1)
    for k in num_clusters:
        ids = torch.randint(0, k, (num_samples,), generator=generator)
        keep = torch.rand(num_samples, generator=generator) < accepted
        levels.append(torch.where(keep, ids, unique))
    return torch.stack(levels)


def backbone_config(args: argparse.Namespace) -> dict:
    """The backbone config shared by every variant and the encoder reference: the recipe file's at
    ``--image-size`` where it has one, else the timm model by name."""
    cfg = recipe_file(args.model)
    if cfg is not None:
        backbone = dict(cfg.model.backbone.to_dict(), img_size=args.image_size)
    else:
        backbone = dict(type='TimmBackbone', model_name=args.model, cifar_stem=args.cifar_stem)
    # Eager unless --compile, whatever the recipe's own setting ('auto' compiles on CUDA).
    compiled = dict(backend=args.compile_backend) if args.compile else False
    return {**backbone, 'channels_last': args.channels_last, 'compile': compiled, **args.backbone_options}


def variant_config(name: str, args: argparse.Namespace) -> dict:
    """One variant's model config: the shared backbone and head widths, over the recipe file's model
    where the variant is its algorithm or a preset of it (MoCo v3's momentum, temperature and
    prediction head: the IFND recipe on it changes only the type)."""
    from ifnd.registry import MODELS
    cfg = recipe_file(args.model)
    recipe = cfg.model.to_dict() if cfg is not None else {}
    widths = dict(hidden_dim=args.neck_hidden, out_dim=args.out_dim)
    neck = dict(recipe.get('neck', dict(type='MLPNeck')), num_layers=args.neck_layers, **widths)
    if recipe and not issubclass(MODELS.get(name), MODELS.get(recipe['type'])):
        recipe = {}  # another algorithm on the recipe's backbone: its own defaults
    found = dict(recipe, type=name, backbone=backbone_config(args), neck=neck)
    if 'predictor' in recipe:
        found['predictor'] = dict(recipe['predictor'], **widths)
    return found


def optimizer_settings(model: str) -> dict:
    """The optimiser of ``model``'s recipe: its config file's (the ViT recipe's AdamW), else SGD."""
    cfg = recipe_file(model)
    if cfg is None:
        return dict(type='SGD', lr=1e-3, momentum=0.9, weight_decay=1e-4)
    return cfg.optim_wrapper.optimizer.to_dict()


def make_optimizer(model: torch.nn.Module, args: argparse.Namespace) -> torch.optim.Optimizer:
    """The recipe's optimiser over ``model``'s parameters, fused with ``--fused``."""
    settings = optimizer_settings(args.model)
    kind = getattr(torch.optim, settings.pop('type'))
    return kind(model.parameters(), **settings, fused=args.fused or None)


class EncoderAlone(torch.nn.Module):
    """The backbone alone, trained on a stand-in loss: the cost floor of any contrastive step."""

    def __init__(self, backbone: torch.nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def train_step(self, data: dict, optim_wrapper: OptimWrapper) -> dict:
        """Forward of both views as one batch, backward, update: what SimCLR's encoder does."""
        with optim_wrapper.optim_context(self):
            feats = self.backbone(torch.cat(data['inputs'][:2]))
        loss = feats.float().square().mean()
        optim_wrapper.update_params(loss)
        return {'loss': loss}


def build_variant(name: str, args: argparse.Namespace, labels: torch.Tensor,
                  device: torch.device) -> torch.nn.Module:
    """One algorithm with the shared backbone/neck settings, its label bank and queue filled."""
    from ifnd.registry import MODELS
    cfg = variant_config(name, args)
    if name in ('MoCoV2', 'IFNDMoCo'):
        cfg['queue_len'] = args.queue_len
        # The head's BatchNorm1d needs two samples per sub-batch of the shuffled keys.
        cfg['bn_splits'] = max(1, min(args.bn_splits, args.batch_size // 2))
    model = MODELS.build(cfg)
    # init_weights logs every parameter at INFO level; only warnings matter here.
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        model.init_weights()  # for MoCo this also copies the query encoder into the key encoder
    finally:
        logger.setLevel(level)
    model.to(device).train()
    # Only the IFND configs named carry FalseNegativeDetectionHook; the others train without counting.
    model.track_detection = args.detection and name in COUNTS_DETECTION
    if hasattr(model, 'set_progress'):
        model.set_progress(0, 1)  # MoCo v3's momentum schedule at its start, set in a run by its hook
    if hasattr(model, 'label_bank'):
        model.label_bank.reset(labels.shape[0], labels.shape[1])
        model.label_bank.update(labels.to(device))
    if hasattr(model, 'queue_index'):
        # A queue that has wrapped around once: every key belongs to a real sample, so the
        # label lookup and masking of IFNDMoCo cover the whole queue (MoCoV2 ignores it).
        g = torch.Generator().manual_seed(args.seed + 1)
        model.queue_index.copy_(torch.randint(0, args.num_samples, (args.queue_len,), generator=g))
    return model


def make_batches(args: argparse.Namespace, device: torch.device, count: int = 4) -> list[dict]:
    """A few pre-generated batches on the device (data loading is not what is measured)."""
    g = torch.Generator().manual_seed(args.seed)
    shape = (args.batch_size, 3, args.image_size, args.image_size)
    batches = []
    for _ in range(count):
        views = [torch.rand(shape, generator=g).to(device) for _ in range(2)]
        index = torch.randperm(args.num_samples, generator=g)[:args.batch_size].to(device)
        label = torch.randint(0, 10, (args.batch_size,), generator=g).to(device)
        batches.append({'inputs': views, 'index': index, 'label': label})
    return batches


def run_benchmark(args: argparse.Namespace) -> dict:
    """Time every variant, interleaved; returns per-variant step times and the ratios."""
    device = _setup(args)
    g = torch.Generator().manual_seed(args.seed)
    labels = realistic_labels(args.num_clusters, args.num_samples, args.accepted, g)
    models, wrappers = _build_models(args, labels, device)
    times, per_round, warmup_s = _time_variants(args, models, wrappers, device)
    variants = {}
    for name in models:
        ms = [1000.0 * t for t in times[name]]
        variants[name] = {
            'median_ms': statistics.median(ms),
            'min_ms': min(ms),
            'max_ms': max(ms),
            'steps_timed': len(ms),
            'warmup_s': warmup_s[name],
            'images_per_s': args.batch_size / (statistics.median(ms) / 1000.0),
        }
    encoder = variants.pop(ENCODER, None)
    if encoder is not None:
        for name, v in variants.items():
            v['x_encoder'] = v['median_ms'] / encoder['median_ms']
    ratios = {}
    for pair in args.pairs:
        base, ifnd = PAIRS[pair]
        paired = [a / b for a, b in zip(per_round[ifnd], per_round[base])]
        ratios[f'{ifnd}/{base}'] = {
            'ratio_of_medians': variants[ifnd]['median_ms'] / variants[base]['median_ms'],
            # Each round's ratio compares steps taken moments apart: robust to slow load drift.
            'median_paired_ratio': statistics.median(paired),
        }
    settings = {key: value for key, value in vars(args).items() if key != 'out'}
    settings['optimizer'] = optimizer_settings(args.model)['type']
    return {
        'benchmark': 'step_cost',
        'device': describe_device(device),
        'torch': torch.__version__,
        'settings': settings,
        'variants': variants,
        'encoder': encoder,
        'ratios': ratios,
    }


def _setup(args: argparse.Namespace) -> torch.device:
    """Threads, seed, scope and device; the warm-up default for that device."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    init_default_scope('ifnd')
    device = resolve_device(args.device)
    if args.amp and device.type != 'cuda':
        raise SystemExit('--amp needs a CUDA device; leave it out on a CPU')
    if device.type == 'cuda':
        torch.backends.cudnn.benchmark = True
    if args.warmup is None:
        args.warmup = 10 if args.compile else 3 if device.type == 'cuda' else 1
    return device


def _build_models(args: argparse.Namespace, labels: torch.Tensor, device: torch.device
                  ) -> tuple[dict[str, torch.nn.Module], dict[str, OptimWrapper]]:
    """Each variant (and the encoder alone) with its optimiser wrapper, by name."""
    names = [name for pair in args.pairs for name in PAIRS[pair]]
    models, wrappers = {}, {}
    for name in names + ([ENCODER] if args.encoder else []):
        if name == ENCODER:
            from ifnd.registry import MODELS
            models[name] = EncoderAlone(MODELS.build(backbone_config(args))).to(device).train()
        else:
            models[name] = build_variant(name, args, labels, device)
        optimizer = make_optimizer(models[name], args)
        if args.amp:
            from mmengine.optim import AmpOptimWrapper

            from ifnd.engine import amp_options
            wrappers[name] = AmpOptimWrapper(optimizer=optimizer, **amp_options())
        else:
            wrappers[name] = OptimWrapper(optimizer=optimizer)
    return models, wrappers


def _time_variants(args: argparse.Namespace, models: dict, wrappers: dict, device: torch.device
                   ) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, float]]:
    """Seconds of every timed step, each round's median, and the warm-up time, by variant."""
    names = list(models)
    batches = make_batches(args, device)
    counter = 0

    def step(name: str) -> Callable[[], float]:
        nonlocal counter
        batch = batches[counter % len(batches)]
        counter += 1
        return time_call(lambda: models[name].train_step(batch, wrappers[name]), device)

    warmup_s = {}
    for name in names:
        tic = time.perf_counter()
        for _ in range(args.warmup):
            step(name)()  # reading each step's time waits for it
        # Compilation included with --compile: a variant whose encoders reuse the code compiled
        # for the one before (same module classes and shapes) warms up in a few steps' time.
        warmup_s[name] = time.perf_counter() - tic
    times: dict[str, list[float]] = {name: [] for name in names}
    per_round: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.repeats):
        # A whole round is queued before its times are read (on a GPU, one wait per round).
        queued = {name: [step(name) for _ in range(args.steps)] for name in names}
        for name in names:
            seconds = [read() for read in queued[name]]
            times[name].extend(seconds)
            per_round[name].append(statistics.median(seconds))
    return times, per_round, warmup_s


def speed_options(settings: dict) -> str:
    """The speed options that were on, as ', AMP, channels_last, ...' (empty when none)."""
    names = [('amp', 'AMP'), ('channels_last', 'channels_last'),
             ('fused', f"fused {settings.get('optimizer', 'SGD')}")]
    on = [label for key, label in names if settings.get(key)]
    if settings.get('compile'):
        on.append(f"torch.compile ({settings['compile_backend']})")
    return ''.join(f', {label}' for label in on)


def markdown_table(result: dict) -> str:
    """The results as a Markdown table (one row per variant, then one per ratio)."""
    s = result['settings']
    stem = ', CIFAR stem' if s['cifar_stem'] else ''
    stem += ''.join(f', {key}={value}' for key, value in s.get('backbone_options', {}).items())
    queue = f", queue {s['queue_len']}" if 'moco' in s['pairs'] else ''  # MoCo v3 has none
    lines = [
        f"Step cost on {result['device']} (torch {result['torch']}): {s['model']}{stem}, "
        f"batch {s['batch_size']} x 2 views, {s['image_size']}px, "
        f"{s['neck_layers']}-layer head {s['neck_hidden']} wide to {s['out_dim']}{queue}, "
        f"{len(s['num_clusters'])} label levels ({s['accepted']:.0%} accepted), "
        f"median of {s['repeats']} x {s['steps']} interleaved steps after {s['warmup']} warm-up "
        f"({'CUDA events' if result['device'].startswith('CUDA') else 'wall clock'})"
        f"{speed_options(s)}",
        '',
        '| Variant | ms/step (median) | min | max | images/s | x encoder |',
        '|---|---:|---:|---:|---:|---:|',
    ]
    rows = dict(result['variants'])
    if result.get('encoder'):
        rows[f'{ENCODER} (fwd+bwd, 2 x batch)'] = dict(result['encoder'], x_encoder=1.0)
    for name, v in rows.items():
        times = v.get('x_encoder')
        lines.append(f"| {name} | {v['median_ms']:.1f} | {v['min_ms']:.1f} | {v['max_ms']:.1f} | "
                     f"{v['images_per_s']:.1f} | {'-' if times is None else f'{times:.2f}'} |")
    lines += ['', '| Ratio | of medians | median of per-round ratios |', '|---|---:|---:|']
    for name, r in result['ratios'].items():
        lines.append(f"| {name} | {r['ratio_of_medians']:.3f} | {r['median_paired_ratio']:.3f} |")
    return '\n'.join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the benchmark, print the table, optionally write JSON; returns the results."""
    args = parse_args(argv)
    if args.count_ops:
        from benchmarks.op_count import count_ops, ops_table
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        result = count_ops(args)
        return report_results(result, ops_table(result), args.json or args.out)
    result = run_benchmark(args)
    return report_results(result, markdown_table(result), args.out)


if __name__ == '__main__':
    main(sys.argv[1:])
