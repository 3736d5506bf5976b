"""Every GPU figure in one command: the CUDA-only tests and the benchmarks, into one Markdown report.

Parts, in order of value, each run as its own process and saved as ``<out-dir>/<part>.json`` when
it finishes (a run cut short keeps what it measured; a re-run skips the parts that succeeded unless
``--force``, and runs failed, timed-out or skipped ones):

- ``cuda_tests``: the tests whose real check needs CUDA (whole Runner iterations, data fetch and
  hooks included, and training steps under ``torch.cuda.set_sync_debug_mode('error')`` with device
  views, JPEGs decoded by nvJPEG on a side stream, the data preprocessor's CUDA branch, the GPU
  recipes' bf16 / compile resolution);
- ``fmnist_full``: ``throughput.py --preset fmnist-full`` with device views (all 60,000 images);
- ``step_profile``: ``step_cost.py --count-ops --profile`` on the same recipe: operators per step by
  part, then GPU time per part, the GPU's idle share and kernel launches per step (profiler);
- ``step_compiled_bf16``: ``step_cost.py`` at the ImageNet recipe (ResNet-50, 224 px, batch 256,
  channels_last, fused SGD), IFNDMoCo vs MoCo v2, compiled, bfloat16;
- ``jpeg_folder``: ``throughput.py --preset in1k-jpeg``: the ImageNet recipe end to end on 2,048
  generated JPEGs of 224 px, views and decoding on the GPU (its images/s over the step's alone);
- ``clustering``: ``clustering_cost.py``, one round of 1.28M x 128 at k = 1000, 3000, 10000;
- ``step_eager_bf16``, ``step_eager_fp32``, ``step_compiled_fp32``: the other step variants.

Each part declares its expected cost on one H100; with ``--budget`` seconds (default 420), a part
starts only if its expected cost fits what is left of the budget, and its time limit is cut to
what is left. The plan is printed first; the report names the parts skipped for the budget, and
the same command run again completes them.

The report names the device and puts each figure beside its goal. ``--dry-run`` checks every
part's command on any machine (the scripts exist, their own parsers take the arguments, the tests
are collected) and that ``--out-dir`` can be written, and renders the report from made-up
results, without running or writing anything. ``--rehearse`` runs every part on the CPU at toy
sizes (same parts, result files and report; the CUDA tests collected and skipped) and renders the
report from those results, marked as a rehearsal.

Example::

    python -m benchmarks.gpu_report --out-dir work_dirs/gpu_report    # at most 7 min of parts on one H100
    python -m benchmarks.gpu_report --rehearse                        # any machine, about a minute
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import os
import os.path as osp
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from benchmarks.common import REPO, HelpFormatter, describe_device, digits_as_fmnist

HERE = osp.dirname(osp.abspath(__file__))

BUDGET_S = 420.0  # default --budget: seven minutes of parts, what a short GPU loan leaves for them
# Tests with a CUDA branch or a CUDA-only body (they skip or check the CPU alone without a GPU).
CUDA_TESTS = ['tests/test_fast_step.py::test_whole_runner_iterations_make_no_host_sync',
              'tests/test_fast_step.py::test_device_view_train_step_makes_no_host_sync',
              'tests/test_fast_step.py::test_training_step_makes_no_host_sync',
              'tests/test_fast_step.py::test_gpu_recipes_train_in_bf16_compiled_where_cuda_is_present',
              'tests/test_gpu_report.py::test_nvjpeg_on_a_side_stream_is_ordered_before_the_callers_work',
              'tests/test_gpu_report.py::test_preprocessor_makes_device_views_of_jpegs_on_cuda',
              'tests/test_decoders.py::test_each_decoder_on_cuda_is_ordered_before_the_callers_work']
# ImageNet recipe (configs/ifnd_r50_200e_in1k.py) at one GPU's batch of 256; 3 warm-up steps per
# variant (compilation happens in the first) and 20 timed steps each, one per interleaved round.
STEP_ARGS = ['--model', 'resnet50', '--no-cifar-stem', '--image-size', '224', '--batch-size', '256',
             '--channels-last', '--fused', '--pairs', 'moco', '--no-encoder', '--warmup', '3', '--repeats', '20']
# --rehearse: a full-width ResNet-18 on 16 px images for two steps; compiled by the 'eager' backend
# (Dynamo traces the same code; inductor's C++ build would take minutes on a CPU), float32 only
# (bfloat16 autocast goes through mmengine's AmpOptimWrapper, which needs a GPU).
TOY_STEP_ARGS = ['--model', 'resnet18', '--image-size', '16', '--batch-size', '4', '--neck-hidden', '16',
                 '--out-dim', '8', '--queue-len', '64', '--num-samples', '256', '--channels-last', '--fused',
                 '--pairs', 'moco', '--no-encoder', '--warmup', '1', '--repeats', '2', '--threads', '1',
                 '--device', 'cpu']
FMNIST_ROOT = '/usr/share/datasets/fashion-mnist'  # Debian's dataset-fashion-mnist, the configs' data_root
# The Fashion-MNIST recipe's step by part: 10 steps counted, 8 profiled (--rehearse: a narrow network,
# 2 steps, scikit-learn's digits as Fashion-MNIST files where Debian's are missing).
PROFILE_ARGS = ['--profile', '--count-steps', '10', '--profile-steps', '8']
TOY_PROFILE_ARGS = ['--count-batch-size', '16', '--count-steps', '2', '--channels', '8', '16', '32', '64',
                    '--threads', '1']
# The ImageNet recipe end to end on 2,048 JPEGs of 224-280 px, one GPU's batch of 256, 8 workers reading
# the files (--rehearse: 32 files of 64 px, a narrow network and a short queue, one epoch).
JPEG_ARGS = ['--epochs', '2', '--jpeg-size', '224', '--jpeg-images', '2048', '--batch-size', '256', '--workers', '8']
TOY_JPEG_ARGS = ['--epochs', '1', '--jpeg-size', '64', '--jpeg-images', '32', '--batch-size', '16', '--workers', '1',
                 '--threads', '1', '--cfg-options', 'model.backbone.channels=(8,16,32,64)', 'model.queue_len=256']

GOALS = {
    'step': ('ResNet-50 IFNDMoCo step, compiled bf16', 4000.0, '>=', 'img/s'),
    'ratio': ('IFNDMoCo / MoCo v2 step time, compiled bf16', 1.02, '<=', 'x'),
    'syncs': ('training steps with a host sync (sync-debug tests failed)', 0.0, '<=', ''),
    'clustering': ('clustering round, 1.28M x 128, k = 1k/3k/10k', 10.0, '<=', 's'),
    'fmnist': ('end to end, Fashion-MNIST (device views)', 25000.0, '>=', 'img/s'),
    'ops': ('operators dispatched a step, Fashion-MNIST recipe', 300.0, '<=', ''),
    'jpeg': ('end to end, the ImageNet recipe on a JPEG folder at 224 px', 4000.0, '>=', 'img/s'),
    'jpeg_ratio': ('JPEG end to end / the step alone (IFNDMoCo, compiled bf16)', 0.95, '>=', 'x'),
}


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
        args = [*TOY_STEP_ARGS, *(['--compile', '--compile-backend', 'eager'] if compiled else [])]
    else:
        args = [*STEP_ARGS, *(['--compile'] if compiled else []), *(['--amp'] if bf16 else [])]
    return Part(name, 'step_cost.py', [*args, '--out', '{json}'], expected_s, rehearsal=rehearse)


def parts(work_dir: str, rehearse: bool = False) -> list[Part]:
    """Every part, in running order (the most valuable first), at the GPU's sizes or ``--rehearse``'s.

    Expected costs: the wall times measured on one H200 (docs/gpu_report_h200.md), rounded up, or
    estimated where a part has not run yet; the five most valuable fit ``BUDGET_S`` (checked by the
    tests), a second call runs the last four.
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


def pytest_collection_modifyitems(config: object, items: list) -> None:
    """Skip every collected test: this script is --rehearse's pytest plugin (no CUDA device there)."""
    import pytest
    for item in items:
        item.add_marker(pytest.mark.skip(reason='gpu_report --rehearse: collected only; runs on a CUDA device'))


def module_name(part: Part) -> str:
    """The module of a script part (``benchmarks.step_cost`` for ``step_cost.py``)."""
    return f'benchmarks.{osp.splitext(part.script)[0]}'


def command(part: Part, result_path: str) -> list[str]:
    """The part's command line, its result written to ``result_path``."""
    args = [a.replace('{json}', result_path) for a in part.args]
    if part.script == 'pytest':
        return [sys.executable, '-m', 'pytest', *args]
    return [sys.executable, '-m', module_name(part), *args]


def junit_counts(path: str) -> dict:
    """Passed, failed, skipped test counts from pytest's JUnit XML, and those of the host-sync tests."""
    counts = dict(passed=0, failed=0, skipped=0, sync_passed=0, sync_failed=0)
    for case in ET.parse(path).getroot().iter('testcase'):
        outcome = ('failed' if case.find('failure') is not None or case.find('error') is not None
                   else 'skipped' if case.find('skipped') is not None else 'passed')
        counts[outcome] += 1
        if 'no_host_sync' in case.get('name', '') and outcome != 'skipped':
            counts[f'sync_{outcome}'] += 1
    return counts


def succeeded(name: str, result: dict, rehearsal: bool = False) -> bool:
    """Whether a saved part finished, in this mode (a rehearsal's toy result is no GPU result, nor
    the reverse): exit code 0, or for the CUDA tests, its tests ran."""
    if result.get('rehearsal', False) != rehearsal:
        return False
    if name == 'cuda_tests':
        return 'tests' in result  # failing tests are a result; no JUnit file means they never ran
    return result.get('returncode') == 0


def run_part(part: Part, out_dir: str) -> dict:
    """Run one part; its result (or its failure) saved as ``<out_dir>/<name>.json``."""
    result_path = osp.join(out_dir, f'{part.name}.json')
    raw_path = osp.join(out_dir, f'{part.name}.raw.json')
    log_path = osp.join(out_dir, f'{part.name}.log')
    for stale in (raw_path, raw_path + '.xml'):  # a crashed run must not read back the last run's
        if osp.isfile(stale):
            os.remove(stale)
    cmd = command(part, raw_path)
    print(f'[{part.name}] {" ".join(cmd)} (time limit {part.timeout_s:.0f} s)', flush=True)
    # A rehearsal runs on the CPU even where a GPU is present.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='') if part.rehearsal else None
    tic = time.perf_counter()
    with open(log_path, 'w') as log:
        # Its own session, so a timeout also ends what it started (throughput.py's tools/train.py).
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=part.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = 'timeout'
    result = dict(part=part.name, command=cmd, returncode=code, wall_s=time.perf_counter() - tic, log=log_path,
                  expected_s=part.expected_s, rehearsal=part.rehearsal)
    if part.script == 'pytest' and osp.isfile(raw_path + '.xml'):
        result['tests'] = junit_counts(raw_path + '.xml')
    elif osp.isfile(raw_path):
        with open(raw_path) as f:
            result['result'] = json.load(f)
    from ifnd.fileio import write_json
    write_json(result, result_path, announce=True)
    return result


def figures(results: dict) -> dict[str, float | None]:
    """The goal figures found in the parts' results (None where a part is missing or failed)."""
    def get(part: str, read: Callable[[dict], float]) -> float | None:
        # A failed script measured nothing; failed CUDA tests still count (they are the figure).
        if part != 'cuda_tests' and results.get(part, {}).get('returncode') != 0:
            return None
        try:
            return float(read(results[part]))
        except (KeyError, TypeError, IndexError, ValueError, StopIteration, ZeroDivisionError):
            return None

    return {
        'step': get('step_compiled_bf16', lambda r: r['result']['variants']['IFNDMoCo']['images_per_s']),
        'ratio': get('step_compiled_bf16', lambda r: r['result']['ratios']['IFNDMoCo/MoCoV2']['ratio_of_medians']),
        # The sync-debug tests raise at the first host sync of a step: 0 failed of > 0 run is 0 syncs.
        'syncs': get('cuda_tests', lambda r: r['tests']['sync_failed'] if r['tests']['sync_passed']
                     + r['tests']['sync_failed'] else None),
        'clustering': get('clustering', lambda r: r['result']['rows'][0]['total_s']),
        'fmnist': get('fmnist_full', lambda r: next(x['images_per_s'] for x in r['result']['rows']
                                                    if x['views'] == 'device')),
        'ops': get('step_profile', lambda r: r['result']['ops_per_step']),
        'jpeg': get('jpeg_folder', lambda r: next(x['images_per_s'] for x in r['result']['rows']
                                                  if x['views'] == 'device')),
        'jpeg_ratio': get('jpeg_folder', lambda r: next(x['images_per_s'] for x in r['result']['rows']
                                                        if x['views'] == 'device')
                          / results['step_compiled_bf16']['result']['variants']['IFNDMoCo']['images_per_s']),
    }


def render(results: dict, device: str, all_parts: Sequence[Part] = (), skipped: dict[str, float] | None = None,
           budget_s: float = BUDGET_S, rehearsal: bool = False) -> str:
    """The Markdown report: device, each figure beside its goal, every step-cost variant, the step's
    parts (operators, GPU time), the JPEG decoder, each part's state.

    ``skipped``: the parts left out for the budget, with the seconds that were left of it.
    """
    if rehearsal:
        lines = [f'# GPU report rehearsal: {device}', '',
                 '**Rehearsal**: every part ran on the CPU at toy sizes (`--rehearse`), to check the parts '
                 'and this report. No figure below is a GPU figure or says anything about its goal.', '']
    else:
        lines = [f'# GPU report: {device}', '']
    lines += [f'torch {torch.__version__}', '', '| Figure | Measured | Goal | Met |', '|---|---:|---:|:---:|']
    for key, value in figures(results).items():
        label, goal, op, unit = GOALS[key]
        met = ('-' if value is None or rehearsal else
               'yes' if (value >= goal if op == '>=' else value <= goal) else 'NO')
        shown = 'not measured' if value is None else f'{value:,.3f}' if unit == 'x' else f'{value:,.1f}'
        lines.append(f'| {label} | {shown} {unit} | {op} {goal:,g} {unit} | {met} |')
    nredo = results.get('clustering', {}).get('result', {}).get('settings', {}).get('nredo')
    if nredo is not None:
        lines += ['', f'The clustering round restarts k-means {nredo} time(s) per level (nredo {nredo}); the '
                  'configs use 5, and the k-means time grows in proportion.']
    lines += _step_lines(results) + _profile_lines(results)
    tests = results.get('cuda_tests', {}).get('tests')
    if tests:
        lines += ['', f"CUDA-only tests: {tests['passed']} passed, {tests['failed']} failed, "
                  f"{tests['skipped']} skipped."]
    return '\n'.join(lines + _part_lines(results, all_parts, skipped or {}, budget_s)) + '\n'


def _step_lines(results: dict) -> list[str]:
    """The step-cost variants, one row each."""
    lines = ['', '| Step variant | MoCo v2 img/s | IFNDMoCo img/s | IFNDMoCo / MoCo v2 | '
             'Warm-up s (MoCo v2 / IFNDMoCo) |', '|---|---:|---:|---:|---:|']
    for name in sorted(r for r in results if r.startswith('step_') and r != 'step_profile'):
        res = results[name].get('result')
        if res:
            v, ratio = res['variants'], res['ratios']['IFNDMoCo/MoCoV2']['ratio_of_medians']
            warm = ' / '.join('-' if v[k].get('warmup_s') is None else f"{v[k]['warmup_s']:.1f}"
                              for k in ('MoCoV2', 'IFNDMoCo'))
            lines.append(f"| {name[5:].replace('_', ', ')} | {v['MoCoV2']['images_per_s']:,.0f} | "
                         f"{v['IFNDMoCo']['images_per_s']:,.0f} | {ratio:.3f} | {warm} |")
    return lines


def _profile_lines(results: dict) -> list[str]:
    """The Fashion-MNIST step by part (operators, GPU time, idle share, launches) and the JPEG decoder."""
    lines = []
    profile = results.get('step_profile', {}).get('result')
    if profile:
        from benchmarks.op_count import ops_table
        lines += ['', ops_table(profile)]
    decode = results.get('jpeg_folder', {}).get('result', {}).get('decode')
    if decode:
        from benchmarks.throughput import decode_line
        lines += ['', f'The ImageNet recipe on JPEGs. {decode_line(decode)}']
    return lines


def _part_lines(results: dict, all_parts: Sequence[Part], skipped: dict[str, float], budget_s: float
                ) -> list[str]:
    """Each part's expected cost, state, exit code, wall time and log; the parts skipped for the budget."""
    lines = ['', '| Part | Expected (one H100) | State | Exit code | Wall time | Log |',
             '|---|---:|---|---:|---:|---|']
    expected = {p.name: p.expected_s for p in all_parts}
    for name in [p.name for p in all_parts] + [r for r in results if r not in expected]:
        exp = f'{expected[name]} s' if name in expected else '-'
        r = results.get(name)
        if r is not None:
            state = 'saved' if r.get('kept') else 'ran'
            lines.append(f"| {name} | {exp} | {state} | {r['returncode']} | {r['wall_s']:.0f} s | {r['log']} |")
        elif name in skipped:
            lines.append(f'| {name} | {exp} | skipped: budget ({skipped[name]:.0f} s left) | - | - | - |')
        else:
            lines.append(f'| {name} | {exp} | not run (--parts) | - | - | - |')
    if skipped:
        lines += ['', f"Skipped for the budget (--budget {budget_s:g} s): {', '.join(skipped)}. Run the same "
                  'command again: the parts done are kept and these run.']
    return lines


def fake_results(all_parts: list[Part]) -> dict:
    """Made-up results in each part's real format, for --dry-run's rendering."""
    step = dict(variants={'MoCoV2': dict(images_per_s=4200.0, warmup_s=80.0),
                          'IFNDMoCo': dict(images_per_s=4150.0, warmup_s=1.0)},
                ratios={'IFNDMoCo/MoCoV2': dict(ratio_of_medians=1.012)})
    made = {'cuda_tests': dict(tests=dict(passed=40, failed=0, skipped=0, sync_passed=30, sync_failed=0)),
            'clustering': dict(result=dict(rows=[dict(total_s=7.5)], settings=dict(nredo=1))),
            'fmnist_full': dict(result=dict(rows=[dict(views='device', images_per_s=30000.0)])),
            'step_profile': dict(result=dict(
                config='configs/ifnd/ifnd_r18_200e_fmnist_device_aug.py', device='CUDA: Fake GPU', torch='2',
                compiled=False, batch_size=256, steps_counted=10, ops_per_step_min=150, ops_per_step_max=153,
                labels_accepted=True, ops_per_step=150, kernels_per_step=70,
                by_part=dict(data=3, augmentation=5, forward=23, loss=8, backward=105, optimizer=1, hooks=5),
                kernels_by_part=dict(data=2, augmentation=5, forward=22, loss=7, backward=33, optimizer=1, hooks=0),
                profile=dict(gpu_ms_per_step_by_part=dict(data=0.01, augmentation=0.3, forward=2.0, loss=0.4,
                                                          backward=3.5, optimizer=0.2, hooks=0.0),
                             gpu_ms_per_step=6.5, timeline_ms_per_step=7.0, gpu_idle_share=0.07,
                             launches_per_step=160.0, steps_profiled=8))),
            'jpeg_folder': dict(result=dict(rows=[dict(views='device', images_per_s=4100.0)],
                                            decode=dict(decoder='torchvision', device='cuda:0', images=256,
                                                        ms_per_batch=dict(torchvision=20.0))))}
    return {p.name: dict(made.get(p.name, dict(result=step)), returncode=0, wall_s=1.0, log=f'{p.name}.log')
            for p in all_parts}


def check_commands(all_parts: list[Part], out_dir: str) -> None:
    """Each part's script exists and its own parser takes the arguments; the tests are collected."""
    for part in all_parts:
        json_path = osp.join(out_dir, f'{part.name}.raw.json')
        args = [a.replace('{json}', json_path) for a in part.args]
        if part.script == 'pytest':
            collect = [a for a in args if not a.startswith('--junitxml')]
            done = subprocess.run([sys.executable, '-m', 'pytest', '--collect-only', *collect], cwd=REPO,
                                  capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                raise SystemExit(f'error: {part.name}: pytest cannot collect {" ".join(CUDA_TESTS)}:\n'
                                 f'{done.stdout[-2000:]}')
        else:
            if not osp.isfile(osp.join(HERE, part.script)):
                raise SystemExit(f'error: {part.name}: benchmarks/{part.script} not found')
            module = importlib.import_module(module_name(part))
            try:
                module.parse_args(args)
            except SystemExit as err:
                raise SystemExit(f'error: {part.name}: benchmarks/{part.script} refuses {" ".join(args)} '
                                 f'(exit {err.code})') from None
        print(f'[{part.name}] ok: {" ".join(command(part, json_path))}')


def check_out_dir(out_dir: str) -> None:
    """Refuse, in one line, an ``--out-dir`` that is a file or cannot be made or written."""
    existing = out_dir
    while not osp.exists(existing) and osp.dirname(existing) != existing:
        existing = osp.dirname(existing)  # where the folder would be made
    if not osp.isdir(existing):
        raise SystemExit(f'error: --out-dir {out_dir}: {existing} is a file, not a folder; '
                         'choose another --out-dir')
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SystemExit(f'error: --out-dir {out_dir}: {existing} is not writable (permissions '
                         'or a read-only file system); choose another --out-dir')


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


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description='Run the CUDA-only tests and every GPU benchmark; write '
                                     'one Markdown report with each figure beside its goal.',
                                     formatter_class=HelpFormatter)
    parser.add_argument('--out-dir', default=None,
                        help='results per part, logs and report.md (default: work_dirs/gpu_report, '
                        'with --rehearse work_dirs/gpu_report_rehearsal)')
    parser.add_argument('--parts', nargs='+', help='run only these parts (default: all)')
    parser.add_argument('--budget', type=float, default=BUDGET_S,
                        help='seconds of parts: a part starts only if its expected cost on one H100 fits '
                        'what is left, and its time limit is cut to that (default: %(default)g)')
    parser.add_argument('--force', action='store_true', help='run parts whose results are already saved')
    parser.add_argument('--dry-run', action='store_true',
                        help='check every command and render the report from made-up results; run nothing')
    parser.add_argument('--rehearse', action='store_true',
                        help='run every part on the CPU at toy sizes (no budget) and render the report from '
                        'those results, marked as a rehearsal')
    args = parser.parse_args(argv)
    if not args.budget > 0:
        parser.error(f'--budget must be > 0 seconds, got {args.budget:g}')
    # Absolute: each part runs with the repository as its working directory.
    args.out_dir = osp.abspath(args.out_dir or ('work_dirs/gpu_report_rehearsal' if args.rehearse
                                                else 'work_dirs/gpu_report'))
    names = [p.name for p in parts(args.out_dir)]
    unknown = sorted(set(args.parts or []) - set(names))
    if unknown:
        parser.error(f'unknown --parts {unknown}; choose from {", ".join(names)}')
    return args


def main(argv: Sequence[str] | None = None) -> str:
    """Run (or with --dry-run check) the parts within the budget and write the report; returns its text."""
    args = parse_args(argv)
    all_parts = parts(args.out_dir, args.rehearse)
    chosen = [p for p in all_parts if not args.parts or p.name in args.parts]
    budget_s = math.inf if args.rehearse else args.budget
    check_out_dir(args.out_dir)  # before any part runs: its results and the report go there
    if args.dry_run:
        print_plan(chosen, [], budget_s)
        check_commands(chosen, args.out_dir)
        report = render(fake_results(chosen), 'dry run (made-up results)', all_parts)
        print(report)
        return report
    if args.rehearse:
        device = f'{describe_device(torch.device("cpu"))}, toy sizes'
    elif torch.cuda.is_available():
        device = torch.cuda.get_device_name()
    else:
        raise SystemExit('error: the GPU report needs a CUDA device; on a CPU, pass --rehearse to run every '
                         'part at toy sizes, or --dry-run to check the commands')
    from ifnd.fileio import AtomicLocalBackend
    os.makedirs(args.out_dir, exist_ok=True)
    saved = {}
    for part in all_parts:
        path = osp.join(args.out_dir, f'{part.name}.json')
        if osp.isfile(path):
            with open(path) as f:
                saved[part.name] = dict(json.load(f), kept=True)
    done = {name for name, r in saved.items() if succeeded(name, r, args.rehearse)}
    to_run = [p for p in chosen if args.force or p.name not in done]
    print_plan(to_run, [p.name for p in chosen if p not in to_run], budget_s)
    if args.rehearse and any(p.name == 'fmnist_full' for p in to_run) and not osp.isdir(FMNIST_ROOT):
        digits_as_fmnist(osp.join(args.out_dir, 'fmnist_digits'))
    results: dict = {}
    skipped: dict[str, float] = {}
    spent = 0.0  # the parts' own wall time: what the budget pays for
    for part in all_parts:
        left = budget_s - spent
        if part in to_run and part.expected_s > left:
            print(f'[{part.name}] skipped: expected {part.expected_s} s, {left:.0f} s of the budget left', flush=True)
            skipped[part.name] = left
        elif part in to_run:
            results[part.name] = run_part(dataclasses.replace(part, timeout_s=min(part.timeout_s, left)),
                                          args.out_dir)
            spent += results[part.name]['wall_s']
        elif part.name in saved and saved[part.name].get('rehearsal', False) == args.rehearse:
            print(f'[{part.name}] saved result kept: {osp.join(args.out_dir, part.name)}.json '
                  '(--force runs it again)')
            results[part.name] = saved[part.name]
        report = render(results, device, all_parts, skipped, args.budget, args.rehearse)
        AtomicLocalBackend().put_text(report, osp.join(args.out_dir, 'report.md'))  # as far as it got
    print(report)
    print(f'Report written to {osp.join(args.out_dir, "report.md")}')
    return report


if __name__ == '__main__':
    main()
