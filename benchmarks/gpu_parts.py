"""The GPU report's parts: what each measures, its command's arguments at the GPU's sizes and at
``--rehearse``'s toy sizes, its expected cost on one H100, and the plan against ``--budget``.

Each part runs one benchmark (or the CUDA-only tests) as its own process; ``gpu_report`` runs them
and ``gpu_figures`` renders their results.
"""
from __future__ import annotations

import math
import os.path as osp
from collections.abc import Sequence
from dataclasses import dataclass

BUDGET_S = 420.0  # default --budget: seven minutes of parts, what a short GPU loan leaves for them
# Tests with a CUDA branch or a CUDA-only body (they skip or check the CPU alone without a GPU).
CUDA_TESTS = ['tests/test_fast_step.py::test_whole_runner_iterations_make_no_host_sync',
              'tests/test_fast_step.py::test_device_view_train_step_makes_no_host_sync',
              'tests/test_fast_step.py::test_training_step_makes_no_host_sync',
              'tests/test_fast_step.py::test_gpu_recipes_train_in_bf16_compiled_where_cuda_is_present',
              'tests/test_gpu_report.py::test_nvjpeg_on_a_side_stream_is_ordered_before_the_callers_work',
              'tests/test_gpu_report.py::test_preprocessor_makes_device_views_of_jpegs_on_cuda',
              'tests/test_decoders.py::test_each_decoder_on_cuda_is_ordered_before_the_callers_work']
# One GPU's batch of 256 at 224 px; 3 warm-up steps per variant (compilation happens in the first)
# and 20 timed steps each, one per interleaved round.
GPU_STEPS = ['--image-size', '224', '--batch-size', '256', '--fused', '--no-encoder', '--warmup', '3',
             '--repeats', '20']
# --rehearse: 4 images for two steps on the CPU; float32 only (bfloat16 autocast goes through
# mmengine's AmpOptimWrapper, which needs a GPU).
TOY_STEPS = ['--batch-size', '4', '--neck-hidden', '16', '--out-dim', '8', '--num-samples', '256', '--fused',
             '--no-encoder', '--warmup', '1', '--repeats', '2', '--threads', '1', '--device', 'cpu']
# Compiled by the 'eager' backend on the CPU: Dynamo traces the same code; inductor's C++ build would
# take minutes there.
TOY_COMPILE = ['--compile', '--compile-backend', 'eager']
# The ImageNet recipe (configs/ifnd_r50_200e_in1k.py), IFNDMoCo vs MoCo v2; --rehearse: a full-width
# ResNet-18 on 8 px images.
STEP_ARGS = ['--model', 'resnet50', '--no-cifar-stem', '--channels-last', '--pairs', 'moco', *GPU_STEPS]
TOY_STEP_ARGS = ['--model', 'resnet18', '--image-size', '8', '--queue-len', '64', '--channels-last',
                 '--pairs', 'moco', *TOY_STEPS]
# The MoCo v3 ViT recipe (configs/mocov3/mocov3_vit-small-p16_300e_in1k.py: ViT-S/16, its heads, AdamW),
# IFNDMoCoV3 vs MoCo v3, compiled, bfloat16; --rehearse: the same recipe's ViT at one block of width 32,
# 2 heads, patches of 4 px on 16 px images.
VIT_ARGS = ['--model', 'vit_small_patch16_224', '--pairs', 'mocov3', *GPU_STEPS, '--compile', '--amp']
TOY_VIT_ARGS = ['--model', 'vit_small_patch16_224', '--image-size', '16', '--backbone-options', 'patch_size=4',
                'depth=1', 'embed_dim=32', 'num_heads=2', '--pairs', 'mocov3', *TOY_STEPS, *TOY_COMPILE]
FMNIST_ROOT = '/usr/share/datasets/fashion-mnist'  # Debian's dataset-fashion-mnist, the configs' data_root
# The Fashion-MNIST recipe's step by part: 10 steps counted, 8 profiled (--rehearse: a narrow network,
# 2 steps, scikit-learn's digits as Fashion-MNIST files where Debian's are missing).
PROFILE_ARGS = ['--profile', '--count-steps', '10', '--profile-steps', '8']
TOY_PROFILE_ARGS = ['--count-batch-size', '16', '--count-steps', '2', '--channels', '8', '16', '32', '64',
                    '--threads', '1']
# The ImageNet recipe end to end on 2,048 JPEGs of 224-280 px, one GPU's batch of 256, 8 workers reading
# the files (--rehearse: 32 files of 64 px, views and the clustering round's images of 32 px, a narrow
# network and a short queue, one epoch).
JPEG_ARGS = ['--epochs', '2', '--jpeg-size', '224', '--jpeg-images', '2048', '--batch-size', '256', '--workers', '8']
TOY_JPEG_ARGS = ['--epochs', '1', '--jpeg-size', '64', '--jpeg-images', '32', '--batch-size', '16', '--workers', '1',
                 '--threads', '1', '--cfg-options', 'model.backbone.channels=(8,16,32,64)', 'model.queue_len=256',
                 'train_dataloader.dataset.pipeline.transforms.size=32', 'custom_hooks.0.pipeline.size=32']


@dataclass
class Part:
    """One measured part: the script, its arguments (``{json}`` = its result file), its expected
    cost in seconds on one H100, a time limit (default three times that), and whether it is a
    ``--rehearse`` toy run."""

    name: str
    script: str
    args: list[str]
    expected_s: int
    timeout_s: float = 0
    rehearsal: bool = False

    def __post_init__(self) -> None:
        if not self.timeout_s:
            self.timeout_s = max(60, 3 * self.expected_s)


def step_part(compiled: bool, bf16: bool, expected_s: int, rehearse: bool) -> Part:
    """The ``step_cost.py`` part of one (eager / compiled, float32 / bfloat16) variant."""
    name = f"step_{'compiled' if compiled else 'eager'}_{'bf16' if bf16 else 'fp32'}"
    if rehearse:
        args = [*TOY_STEP_ARGS, *(TOY_COMPILE if compiled else [])]
    else:
        args = [*STEP_ARGS, *(['--compile'] if compiled else []), *(['--amp'] if bf16 else [])]
    return Part(name, 'step_cost.py', [*args, '--out', '{json}'], expected_s, rehearsal=rehearse)


def vit_part(rehearse: bool) -> Part:
    """The ``step_cost.py`` part of the MoCo v3 ViT recipe: IFNDMoCoV3 vs MoCo v3, compiled, bfloat16."""
    # Start-up and the four ViT-S/16 encoders and 4096-wide heads built (8 s); inductor compiles
    # ViT-S/16's forward and backward in bfloat16 once (typically 60-90 s: 75), the momentum encoder's
    # forward once (20), each model's heads and loss (2 x 10; IFNDMoCoV3's encoders reuse MoCo v3's
    # code, as IFNDMoCo's do MoCo v2's); 2 x 23 steps of about 0.1 s (4 forwards and 2 backwards of
    # ViT-S/16 on 256 images, about 8 forwards of 4.6 GMACs each: 19 TFLOP a step, at about 20% of an
    # H100's bfloat16 peak): 8 + 75 + 20 + 20 + 5, and a margin. Not measured yet.
    args = TOY_VIT_ARGS if rehearse else VIT_ARGS
    return Part('vit_step', 'step_cost.py', [*args, '--out', '{json}'], 130, rehearsal=rehearse)


def parts(work_dir: str, rehearse: bool = False) -> list[Part]:
    """Every part, in running order (the most valuable first), at the GPU's sizes or ``--rehearse``'s.

    Expected costs: the wall times measured on one H200 (docs/gpu_report_h200.md), rounded up, or
    estimated where a part has not run yet; the five most valuable fit ``BUDGET_S`` (checked by the
    tests), a second call runs the last five.
    """
    toy = rehearse
    # 50 tests of tiny models, each a CPU step then CUDA steps: 11 s on a 2-core CPU for the CPU
    # halves, plus pytest's start-up (3 s) and the CUDA context, cuDNN and nvJPEG first uses (8 s).
    found = [Part('cuda_tests', 'pytest', [
        '-q', '-p', 'no:cacheprovider', *CUDA_TESTS, '--junitxml={json}.xml',
        # As a pytest plugin this script marks every collected test skipped (pytest_collection_modifyitems).
        *(['-p', 'benchmarks.gpu_report'] if toy else [])], 45, rehearsal=toy)]  # measured 32 s and 46 s
    # Two epochs of 234 steps of 256: the first compiles and trains without accepted pseudo labels
    # (the linear schedule starts at 0), the second is timed. tools/train.py start-up and 60k + 10k
    # images loaded (12 s), ResNet-18 compiled for training (30 s) and for extraction at the hooks'
    # two batch sizes (2 x 12 s), three clustering rounds (6 s), the epochs (about 5 s each at
    # 10-20k img/s) and the final kNN (3 s).
    found.append(Part('fmnist_full', 'throughput.py', [
        '--preset', 'fmnist-full', '--views', 'device', '--epochs', '2',
        '--work-dir', osp.join(work_dir, 'fmnist_full'), '--out', '{json}',
        *(fmnist_toy_args(work_dir) if toy else [])], 85, rehearsal=toy))  # measured 83 s (before the views compiled)
    # The same recipe's step taken apart: operators per part, then a profiled third epoch (GPU time per
    # part, idle share, launches). Same shapes as fmnist_full, so inductor's cache holds most graphs:
    # start-up (10 s), the views', the head's and loss' graphs (3 x 10 s), three short epochs and
    # rounds on 3,072 images (10 s). Not measured yet.
    found.append(Part('step_profile', 'step_cost.py', [
        '--count-ops', '--recipe', 'fmnist-device', '--json', '{json}',
        *([*TOY_PROFILE_ARGS, '--fmnist-root', osp.join(work_dir, 'fmnist_digits')] if toy else PROFILE_ARGS)],
        60, rehearsal=toy))
    # Inductor compiles ResNet-50 fwd + bwd in bfloat16 once (typically 40-90 s: 60) and the key
    # encoder's forward once (20); IFNDMoCo's encoders reuse MoCo v2's compiled code (same module
    # classes and shapes: torch 2.11 compiles a second instance's first step to nothing), then
    # 2 x 23 steps of about 0.15 s: 8 + 60 + 20 + 7.
    found.append(step_part(True, True, 110, toy))  # measured 109 s (89 s compiling)
    # The ImageNet recipe through tools/train.py on 2,048 JPEGs of 224-280 px written first (10 s), views
    # and decoding on the GPU: start-up (8 s), ResNet-50's graphs from the step part's cache and the
    # head's, loss' and views' compiled (40 s), two epochs of 8 steps, three rounds and the kNN (15 s),
    # one batch decoded alone (5 s). Not measured yet.
    found.append(Part('jpeg_folder', 'throughput.py', [
        '--preset', 'in1k-jpeg', '--views', 'device', *(TOY_JPEG_ARGS if toy else JPEG_ARGS),
        '--work-dir', osp.join(work_dir, 'jpeg_folder'), '--out', '{json}'], 120, rehearsal=toy))
    found.append(vit_part(toy))
    # 1.28M random features made on the CPU (3 s), one round at nredo 1: 20 Lloyd steps over
    # 1M / 1.28M / 1.28M points at k = 1k / 3k / 10k, about 90 TFLOP of distances (2-5 s):
    # 8 + 3 + 5, and a margin.
    found.append(Part('clustering', 'clustering_cost.py', [
        '--device', 'cpu' if toy else 'cuda', '--backends', 'torch',
        *(['--num-samples', '3000', '--ks', '10,30,100', '--threads', '1'] if toy else
          ['--num-samples', '1281167', '--ks', '1000,3000,10000']),
        '--nredo', '1', '--out', '{json}'], 25, rehearsal=toy))  # measured 21 s
    # Eager: no compilation; 2 x 23 steps of about 0.2 s in bfloat16, 0.35 s in float32 (TF32
    # convolutions), with cuDNN's benchmark search in the first.
    found.append(step_part(False, True, 25, toy))  # measured 24 s
    found.append(step_part(False, False, 60, toy))  # measured 56 s on a fresh machine
    # As compiled bfloat16 with steps of about 0.3 s (8 + 60 + 20 + 14), less about 7 s: Triton's
    # launcher, built once per machine, is in its on-disk cache after the parts before.
    found.append(step_part(True, False, 110, toy))  # not measured yet: as compiled bfloat16
    return found


def fmnist_toy_args(work_dir: str) -> list[str]:
    """--rehearse: a few hundred Fashion-MNIST images (Debian's, else digits written as Fashion-MNIST files)."""
    small = ['--threads', '1', '--cfg-options', 'train_dataloader.batch_size=32',
             'model.backbone.channels=(8,16,32,64)']
    if osp.isdir(FMNIST_ROOT):
        return [*small, 'train_dataloader.dataset.subset_fraction=0.005',
                'custom_hooks.1.val_dataset.subset_fraction=0.01']
    return ['--fmnist-root', osp.join(work_dir, 'fmnist_digits'), *small]


def print_plan(to_run: Sequence[Part], kept: Sequence[str], budget_s: float) -> None:
    """The parts to run in order, each with its expected cost on one H100 and the running total."""
    limit = 'no budget (--rehearse)' if math.isinf(budget_s) else f'budget {budget_s:g} s'
    print(f'Plan: {len(to_run)} part(s), {limit}; expected seconds on one H100', flush=True)
    total = 0
    for part in to_run:
        total += part.expected_s
        late = '  (past the budget: runs if parts before it finish early or are skipped)' if total > budget_s else ''
        print(f'  {part.name:<20} {part.expected_s:>4} s  cumulative {total:>4} s{late}')
    if kept:
        print(f"  kept, saved before (--force runs them again): {', '.join(kept)}")
    print(flush=True)
