"""Operators dispatched per training step, by part, counted in a real run of a recipe through the Runner.

``python -m benchmarks.step_cost --count-ops --recipe fmnist-device --json FILE`` (or ``--recipe jpeg``)
builds the recipe's config as ``tools/train.py`` does (every hook, the data loader, the data
preprocessor), trains two short epochs on a subset of the data and counts, with a
``TorchDispatchMode``, every operator dispatched in each iteration of the second, by part:

* ``data``: fetching the batch (the loader, the images gathered on the device) and decoding files;
* ``augmentation``: the views and their normalisation (the data preprocessor);
* ``forward``: the encoders (MoCo's key encoder included);
* ``loss``: the projection head, the normalised embeddings, the false-negative parts and the loss
  (one compiled region where the backbone compiles), MoCo's enqueue, mmengine's loss parsing;
* ``backward``, ``optimizer`` (the update, zeroing, MoCo's momentum update) and ``hooks``.

A clustering round after the first epoch accepts half of the pseudo labels (the recipe's linear
schedule over two epochs), so the second epoch's steps run the elimination masks. On a GPU each
operator is about one kernel launch, 5-10 µs of host time: the count is the step's launch budget.
Inside a compiled region only the operators it calls out to are dispatched (convolutions and
matrix products, ``roi_align``); its fused kernels are not counted here (the GPU report's profiler
counts launches). ``--compile`` forces the GPU recipes' compile settings on a CPU (inductor, with
the bfloat16 autocast); on a GPU the recipe's own settings hold. The counts do not depend on the
widths, so ``--channels`` narrows the backbone for a fast CPU run.
"""
from __future__ import annotations

import argparse
import os.path as osp
import statistics
import tempfile
from collections import Counter
from collections.abc import Callable

import torch
from mmengine.config import DictAction
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.common import REPO, describe_device, digits_as_fmnist, make_jpeg_folder

RECIPES = {'fmnist-device': 'configs/ifnd/ifnd_r18_200e_fmnist_device_aug.py',
           'jpeg': 'configs/ifnd_r50_200e_in1k.py'}
PARTS = ('data', 'augmentation', 'forward', 'loss', 'backward', 'optimizer', 'hooks')
PART_MARK = 'part:'  # the profiler ranges of the parts
FMNIST_ROOT = '/usr/share/datasets/fashion-mnist'
# Operators that launch no kernel: views and aliases, allocations, a CPU tensor made from data.
_NO_KERNEL = {'detach', 'empty', 'empty_strided', 'lift_fresh', 'alias', '_unsafe_view', 'view', 't',
              'expand', 'unsqueeze', 'squeeze', 'select', 'slice', 'permute', 'unbind', 'split', 'chunk',
              'as_strided', 'transpose', 'reshape', '_reshape_alias', 'diagonal', 'narrow', 'unfold'}


class OpCounter(TorchDispatchMode):
    """Counts every operator dispatched while active, under the part on top of ``parts``.

    It lets ``torch.compile`` work under it (``ignore_compile_internals``): a compiled region's
    own kernels are not dispatched, the operators it calls out to are.
    """

    def __init__(self) -> None:
        super().__init__()
        self.parts = ['data']
        self.ops: Counter = Counter()
        self.kernels: Counter = Counter()
        self.names: Counter = Counter()  # (part, operator): over the whole count

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Let dynamo and inductor compile and run while counting."""
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace, name = func.namespace, func.__name__.split('.')[0]
        if namespace != 'profiler':  # record_function markers are not work
            self.ops[self.parts[-1]] += 1
            self.names[self.parts[-1], f'{namespace}::{name}'] += 1
            if name not in _NO_KERNEL:
                self.kernels[self.parts[-1]] += 1
        return func(*args, **(kwargs or {}))

    def counted(self, part: str, fn: Callable) -> Callable:
        """``fn`` with what it dispatches counted under ``part``."""
        def run(*args, **kwargs):
            self.parts.append(part)
            try:
                with torch.profiler.record_function(PART_MARK + part):  # for --profile
                    return fn(*args, **kwargs)
            finally:
                self.parts.pop()
        return run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--count-ops`` options of step_cost.py."""
    group = parser.add_argument_group('--count-ops: operators per step of a recipe, through the Runner')
    group.add_argument('--count-ops', action='store_true', help='count operators per step instead of timing')
    group.add_argument('--recipe', choices=sorted(RECIPES), default='fmnist-device',
                       help='the config trained (fmnist-device: Fashion-MNIST with device views; '
                       'jpeg: the ImageNet IFNDMoCo recipe on a generated JPEG folder, device views)')
    group.add_argument('--count-steps', type=int, default=10, help='steps counted (the second epoch)')
    group.add_argument('--count-batch-size', type=int, default=256, help="the recipe's batch size")
    group.add_argument('--jpeg-size', type=int, default=224, help='--recipe jpeg: side of the files')
    group.add_argument('--channels', type=int, nargs=4, help='ResNet stage widths (counts do not depend on them)')
    group.add_argument('--fmnist-root', default=FMNIST_ROOT,
                       help="Fashion-MNIST's folder; missing: scikit-learn's digits written as its files")
    group.add_argument('--count-cfg-options', nargs='+', action=DictAction, default={},
                       help='more config settings of the run, as tools/train.py --cfg-options takes them')
    group.add_argument('--profile', action='store_true',
                       help='on CUDA, also profile a third epoch: GPU time per part, the GPU idle share, launches')
    group.add_argument('--profile-steps', type=int, default=8, help='--profile: steps profiled')
    group.add_argument('--json', help='write {"ops_per_step": N, "by_part": {...}, ...} here')


def recipe_config(args: argparse.Namespace, work_dir: str):
    """The recipe's config as tools/train.py builds it, on a subset for two short epochs."""
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(REPO, RECIPES[args.recipe]))
    cfg.work_dir = work_dir
    cfg.log_level = 'WARNING'
    images = args.count_batch_size * (args.count_steps + 2)
    loader = cfg.train_dataloader
    loader.batch_size, loader.num_workers, loader.persistent_workers = args.count_batch_size, 0, False
    if args.recipe == 'jpeg':
        folder = make_jpeg_folder(osp.join(work_dir, 'jpegs'), images, args.jpeg_size)
        loader.dataset = dict(type='ImageFolder', data_root=folder, augment_on='device',
                              pipeline=loader.dataset.pipeline)
        loader.num_workers = 2  # they read the files; the views are made on the device
    else:
        root = args.fmnist_root
        if not osp.isdir(root):
            root = digits_as_fmnist(osp.join(work_dir, 'fmnist'), train=images)
        from ifnd.datasets import FashionMNIST
        loader.dataset.data_root = root
        loader.dataset.subset_fraction = min(1.0, images / len(FashionMNIST(root)))
    cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=3 if profiling(args) else 2)
    cfg.param_scheduler = []
    # A round after the first epoch accepts half of the labels; the k-means is kept short.
    hook = dict(cfg.custom_hooks[0], interval=1, num_clusters=[k for k in (10, 30, 100) if 4 * k <= images] or [2],
                num_workers=0,
                kmeans=dict(niter=5, nredo=1, min_points_per_centroid=1))
    cfg.custom_hooks = [hook] + [h for h in cfg.custom_hooks[1:] if h['type'] != 'KNNEvalHook']
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=-1, save_last=False)
    if args.channels:
        cfg.model.backbone.channels = tuple(args.channels)
    if args.compile:  # the GPU recipe's settings, forced on any device
        cfg.model.backbone.compile = True
        cfg.model.setdefault('data_preprocessor', {})['compile'] = True
        cfg.optim_wrapper.type = 'AutoAmpOptimWrapper'
        cfg.optim_wrapper.bf16_on_cpu = True
    cfg.merge_from_dict(args.count_cfg_options)
    return cfg


def profiling(args: argparse.Namespace) -> bool:
    """Whether this run profiles a third epoch (``--profile`` on a machine with CUDA)."""
    return args.profile and torch.cuda.is_available()


def _instrument(runner, counter: OpCounter) -> None:
    """Count each part of the runner's steps under its name (see the module's docstring)."""
    import ifnd.models.data_preprocessor as preprocessor
    model = runner.model
    preprocessor.decode_images = counter.counted('data', preprocessor.decode_images)
    model.forward = counter.counted('forward', model.forward)  # what the parts below leave
    model.data_preprocessor.forward = counter.counted('augmentation', model.data_preprocessor.forward)
    for name in ('backbone', 'momentum_backbone'):
        if hasattr(model, name):
            getattr(model, name).forward = counter.counted('forward', getattr(model, name).forward)
    compiled = model.compiled
    model.compiled = lambda method, device: counter.counted('loss', compiled(method, device))
    for name, part in (('_shuffled_keys', 'forward'), ('_momentum_update', 'optimizer'),
                       ('_enqueue', 'loss'), ('parse_losses', 'loss'), ('_add_detection', 'loss')):
        if hasattr(model, name):
            setattr(model, name, counter.counted(part, getattr(model, name)))
    runner.call_hook = counter.counted('hooks', runner.call_hook)


def _counting_hook(counter: OpCounter, per_step: list):
    """A hook that counts the second epoch's iterations, each from the end of the one before."""
    from mmengine.hooks import Hook

    class CountSteps(Hook):
        priority = 'LOWEST'

        def before_train(self, runner) -> None:
            wrapper = runner.optim_wrapper
            wrapper.update_params = counter.counted('backward', wrapper.update_params)  # the loss' scaling
            wrapper.backward = counter.counted('backward', wrapper.backward)
            for name in ('step', 'zero_grad'):
                setattr(wrapper, name, counter.counted('optimizer', getattr(wrapper, name)))

        def before_train_epoch(self, runner) -> None:
            if runner.epoch == 1:
                counter.__enter__()
                for counts in (counter.ops, counter.kernels, counter.names):
                    counts.clear()

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
            if runner.epoch == 1:
                per_step.append((dict(counter.ops), dict(counter.kernels)))
                counter.ops.clear()
                counter.kernels.clear()

        def after_train_epoch(self, runner) -> None:
            if runner.epoch == 1:
                counter.__exit__(None, None, None)

    return CountSteps()


def _profiling_hook(first: int, steps: int, found: dict):
    """A hook that profiles steps ``first`` to ``first + steps - 1`` of the third epoch (CUDA)."""
    from mmengine.hooks import Hook
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]

    class ProfileSteps(Hook):
        priority = 'HIGHEST'  # the window opens before any other hook of its first step

        def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
            if runner.epoch == 2 and batch_idx == first:
                found['profiler'] = torch.profiler.profile(activities=activities)
                found['profiler'].__enter__()

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
            if runner.epoch == 2 and batch_idx == first + steps - 1:
                torch.cuda.synchronize()
                found['profiler'].__exit__(None, None, None)
                found['steps'] = steps

    return ProfileSteps()


def gpu_profile(events: list, steps: int) -> dict:
    """GPU time per part (ms a step), the GPU's idle share and kernel launches a step, from the
    profiler's events of ``steps`` steps.

    A kernel counts for the part whose range (``part:NAME``) encloses the host call that launched it;
    the autograd engine launches the backward's kernels from threads of its own, outside every range.
    The idle share is the time between the first kernel's start and the last one's end when no
    kernel or copy ran.
    """
    gpu_ms = dict.fromkeys(PARTS, 0.0)
    launches = 0
    for event in events:
        if event.kernels:
            part = event
            while part is not None and not part.name.startswith(PART_MARK):
                part = part.cpu_parent
            name = 'backward' if part is None else part.name[len(PART_MARK):]
            gpu_ms[name] += sum(k.duration for k in event.kernels) / 1000.0
        if 'LaunchKernel' in event.name or event.name.startswith('cudaGraphLaunch'):
            launches += 1
    spans = sorted((e.time_range.start, e.time_range.end) for e in events
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    busy, end = 0.0, None
    for start, stop in spans:
        if end is None or start > end:
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    span = spans[-1][1] - spans[0][0] if spans else 0.0
    kernel_ms = sum(e.time_range.end - e.time_range.start for e in events
                    if e.device_type == torch.autograd.DeviceType.CUDA) / 1000.0
    return {'gpu_ms_per_step_by_part': {p: round(ms / steps, 3) for p, ms in gpu_ms.items()},
            # Kernels whose launch the profiler links to no host call (e.g. some compiled ones).
            'gpu_ms_per_step_unattributed': round(max(0.0, kernel_ms - sum(gpu_ms.values())) / steps, 3),
            'gpu_ms_per_step': round(busy / 1000.0 / steps, 3), 'timeline_ms_per_step': round(span / 1000.0 / steps, 3),
            'gpu_idle_share': round(1 - busy / span, 4) if span else None,
            'launches_per_step': round(launches / steps, 1), 'steps_profiled': steps}


def count_ops(args: argparse.Namespace) -> dict:
    """Train the recipe two short epochs and count the second's operators per step, by part (and, with
    ``--profile`` on CUDA, profile a third)."""
    from mmengine.registry import init_default_scope

    from ifnd.registry import RUNNERS
    init_default_scope('ifnd')
    profiled: dict = {}
    with tempfile.TemporaryDirectory() as work_dir:
        cfg = recipe_config(args, work_dir)
        runner = RUNNERS.build(cfg)
        counter, per_step = OpCounter(), []
        _instrument(runner, counter)
        runner.register_hook(_counting_hook(counter, per_step), priority='LOWEST')
        if profiling(args):
            runner.register_hook(_profiling_hook(2, min(args.profile_steps, args.count_steps), profiled))
        runner.train()
        device = next(runner.model.parameters()).device
        accepted = bool((runner.model.label_bank.labels >= 0).any())
    if len(per_step) < 1:
        raise SystemExit(f'--count-ops: the second epoch ran no step (batch {args.count_batch_size})')
    totals = [sum(ops.values()) for ops, _ in per_step]
    ops, kernels = per_step[totals.index(statistics.median_low(totals))]  # the median step
    result = {'benchmark': 'step_cost --count-ops', 'recipe': args.recipe, 'config': RECIPES[args.recipe],
              'device': describe_device(device), 'torch': torch.__version__, 'compiled': bool(args.compile),
              'batch_size': args.count_batch_size, 'labels_accepted': accepted,
              'ops_per_step': sum(ops.values()), 'by_part': {p: ops.get(p, 0) for p in PARTS},
              'kernels_per_step': sum(kernels.values()),
              'kernels_by_part': {p: kernels.get(p, 0) for p in PARTS}, 'steps_counted': len(per_step),
              'ops_per_step_min': min(totals), 'ops_per_step_max': max(totals),
              'ops_per_step_mean': statistics.fmean(totals),
              'top_ops': {part: [[name, round(n / len(per_step), 1)] for (p, name), n in counter.names.most_common()
                                 if p == part][:5] for part in PARTS},
              'profile': None}
    if 'steps' in profiled:
        result['profile'] = gpu_profile(list(profiled['profiler'].events()), profiled['steps'])
    return result


def ops_table(result: dict) -> str:
    """The counts (and the GPU profile, where there is one) as a Markdown table, one row per part."""
    how = 'compile settings forced' if result['compiled'] else "the recipe's own compile settings"
    profile = result.get('profile')
    lines = [f"Operators per training step of `{result['config']}` on {result['device']} (torch "
             f"{result['torch']}), batch {result['batch_size']}, {how}; the median of {result['steps_counted']} "
             f"steps of epoch 2 (min {result['ops_per_step_min']}, max {result['ops_per_step_max']}), "
             f"pseudo labels {'accepted' if result['labels_accepted'] else 'NOT accepted'}", '',
             '| Part | Operators | of them kernels |' + (' GPU ms a step |' if profile else ''),
             '|---|---:|---:|' + ('---:|' if profile else '')]
    for part in PARTS:
        gpu = f" {profile['gpu_ms_per_step_by_part'][part]:.2f} |" if profile else ''
        lines.append(f"| {part} | {result['by_part'][part]} | {result['kernels_by_part'][part]} |{gpu}")
    gpu = f" **{profile['gpu_ms_per_step']:.2f}** |" if profile else ''
    lines.append(f"| **step** | **{result['ops_per_step']}** | **{result['kernels_per_step']}** |{gpu}")
    if profile:
        lines += ['', f"GPU profile of {profile['steps_profiled']} steps of epoch 3: "
                  f"{profile['launches_per_step']:.0f} kernel launches a step, the GPU idle "
                  f"{100 * profile['gpu_idle_share']:.1f}% of its timeline "
                  f"({profile['timeline_ms_per_step']:.2f} ms a step)."]
    return '\n'.join(lines)
