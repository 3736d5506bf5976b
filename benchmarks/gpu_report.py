"""Every GPU figure in one command: the CUDA-only tests and the benchmarks, into one Markdown report.

Parts, each run as its own process and saved as ``<out-dir>/<part>.json`` when it finishes (a run
cut short keeps what it measured; a re-run skips the parts that succeeded unless ``--force``, and
runs failed or timed-out ones again):

- ``cuda_tests``: the tests whose real check needs CUDA (a whole training step under
  ``torch.cuda.set_sync_debug_mode('error')`` with device views, JPEGs decoded by nvJPEG on a side
  stream, the data preprocessor's CUDA branch, the GPU recipes' bf16 / compile resolution);
- ``step_{eager,compiled}_{fp32,bf16}``: ``step_cost.py`` at the ImageNet recipe (ResNet-50,
  224 px, batch 256, channels_last, fused SGD), IFNDMoCo vs MoCo v2;
- ``fmnist_full``: ``throughput.py --preset fmnist-full`` with device views (all 60,000 images);
- ``jpeg_folder``: ``throughput.py`` on a generated folder of 224 px JPEGs;
- ``clustering``: ``clustering_cost.py``, one round of 1.28M x 128 at k = 1000, 3000, 10000.

The report names the device and puts each figure beside its goal. ``--dry-run`` checks every
part's command on any machine (the scripts exist, their own parsers take the arguments, the tests
are collected) and that ``--out-dir`` can be written, and renders the report from made-up
results, without running or writing anything.

Example::

    python benchmarks/gpu_report.py --out-dir work_dirs/gpu_report   # estimated 20 min on one H100
"""
from __future__ import annotations

import argparse
import importlib
import json
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

HERE = osp.dirname(osp.abspath(__file__))
REPO = osp.dirname(HERE)
sys.path.insert(0, HERE)  # the shared helpers beside this script
from common import HelpFormatter  # noqa: E402

# Tests with a CUDA branch or a CUDA-only body (they skip or check the CPU alone without a GPU).
CUDA_TESTS = ['tests/test_fast_step.py::test_device_view_train_step_makes_no_host_sync',
              'tests/test_fast_step.py::test_training_step_makes_no_host_sync',
              'tests/test_fast_step.py::test_gpu_recipes_train_in_bf16_compiled_where_cuda_is_present',
              'tests/test_gpu_report.py']
# ImageNet recipe (configs/ifnd_r50_200e_in1k.py) at one GPU's batch of 256.
STEP_ARGS = ['--model', 'resnet50', '--no-cifar-stem', '--image-size', '224', '--batch-size', '256',
             '--channels-last', '--fused', '--pairs', 'moco', '--no-encoder']

GOALS = {
    'step': ('ResNet-50 IFNDMoCo step, compiled bf16', 4000.0, '>=', 'img/s'),
    'ratio': ('IFNDMoCo / MoCo v2 step time, compiled bf16', 1.02, '<=', 'x'),
    'syncs': ('training steps with a host sync (sync-debug tests failed)', 0.0, '<=', ''),
    'clustering': ('clustering round, 1.28M x 128, k = 1k/3k/10k', 10.0, '<=', 's'),
    'fmnist': ('end to end, Fashion-MNIST (device views)', 20000.0, '>=', 'img/s'),
    'jpeg': ('end to end, JPEG folder at 224 px (device views)', 3000.0, '>=', 'img/s'),
}


@dataclass
class Part:
    """One measured part: the script, its arguments (``{json}`` = its result file), a time limit."""

    name: str
    script: str
    args: list[str]
    timeout_s: int


def parts(work_dir: str) -> list[Part]:
    """Every part, in running order (the cheap and decisive ones first)."""
    found = [Part('cuda_tests', 'pytest', ['-q', '-p', 'no:cacheprovider', *CUDA_TESTS,
                                           '--junitxml={json}.xml'], 300)]
    for compiled in (False, True):
        for bf16 in (False, True):
            name = f"step_{'compiled' if compiled else 'eager'}_{'bf16' if bf16 else 'fp32'}"
            found.append(Part(name, 'step_cost.py', [*STEP_ARGS, *(['--compile'] if compiled else []),
                                                     *(['--amp'] if bf16 else []), '--out', '{json}'],
                              360 if compiled else 180))
    found.append(Part('clustering', 'clustering_cost.py', [
        '--device', 'cuda', '--backends', 'torch', '--num-samples', '1281167', '--ks', '1000,3000,10000',
        '--nredo', '5', '--out', '{json}'], 240))
    found.append(Part('fmnist_full', 'throughput.py', [
        '--preset', 'fmnist-full', '--views', 'device', '--epochs', '2',
        '--work-dir', osp.join(work_dir, 'fmnist_full'), '--out', '{json}'], 300))
    found.append(Part('jpeg_folder', 'throughput.py', [
        '--data', 'jpeg', '--jpeg-size', '224', '--jpeg-crop', '224', '--jpeg-images', '2048',
        '--batch-size', '256', '--workers', '8', '--work-dir', osp.join(work_dir, 'jpeg_folder'),
        '--out', '{json}'], 300))
    return found


def command(part: Part, result_path: str) -> list[str]:
    """The part's command line, its result written to ``result_path``."""
    args = [a.replace('{json}', result_path) for a in part.args]
    if part.script == 'pytest':
        return [sys.executable, '-m', 'pytest', *args]
    return [sys.executable, osp.join(HERE, part.script), *args]


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


def succeeded(name: str, result: dict) -> bool:
    """Whether a saved part finished: exit code 0, or for the CUDA tests, its tests ran."""
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
    print(f'[{part.name}] {" ".join(cmd)}', flush=True)
    tic = time.perf_counter()
    with open(log_path, 'w') as log:
        # Its own session, so a timeout also ends what it started (throughput.py's tools/train.py).
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=part.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = 'timeout'
    result = dict(part=part.name, command=cmd, returncode=code, wall_s=time.perf_counter() - tic, log=log_path)
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
        except (KeyError, TypeError, IndexError, ValueError, StopIteration):
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
        'jpeg': get('jpeg_folder', lambda r: next(x['images_per_s'] for x in r['result']['rows']
                                                  if x['augment_on'] == 'device')),
    }


def render(results: dict, device: str) -> str:
    """The Markdown report: device, each figure beside its goal, every step-cost variant, each part's state."""
    lines = [f'# GPU report: {device}', '', f'torch {torch.__version__}', '',
             '| Figure | Measured | Goal | Met |', '|---|---:|---:|:---:|']
    for key, value in figures(results).items():
        label, goal, op, unit = GOALS[key]
        met = '-' if value is None else ('yes' if (value >= goal if op == '>=' else value <= goal) else 'NO')
        shown = 'not measured' if value is None else f'{value:,.3f}' if unit == 'x' else f'{value:,.1f}'
        lines.append(f'| {label} | {shown} {unit} | {op} {goal:,g} {unit} | {met} |')
    lines += ['', '| Step variant | MoCo v2 img/s | IFNDMoCo img/s | IFNDMoCo / MoCo v2 |', '|---|---:|---:|---:|']
    for name in sorted(r for r in results if r.startswith('step_')):
        res = results[name].get('result')
        if res:
            v, ratio = res['variants'], res['ratios']['IFNDMoCo/MoCoV2']['ratio_of_medians']
            lines.append(f"| {name[5:].replace('_', ', ')} | {v['MoCoV2']['images_per_s']:,.0f} | "
                         f"{v['IFNDMoCo']['images_per_s']:,.0f} | {ratio:.3f} |")
    tests = results.get('cuda_tests', {}).get('tests')
    if tests:
        lines += ['', f"CUDA-only tests: {tests['passed']} passed, {tests['failed']} failed, "
                  f"{tests['skipped']} skipped."]
    lines += ['', '| Part | Exit code | Wall time | Log |', '|---|---:|---:|---|']
    for name, r in results.items():
        lines.append(f"| {name} | {r['returncode']} | {r['wall_s']:.0f} s | {r['log']} |")
    return '\n'.join(lines) + '\n'


def fake_results(all_parts: list[Part]) -> dict:
    """Made-up results in each part's real format, for --dry-run's rendering."""
    step = dict(variants={'MoCoV2': dict(images_per_s=4200.0), 'IFNDMoCo': dict(images_per_s=4150.0)},
                ratios={'IFNDMoCo/MoCoV2': dict(ratio_of_medians=1.012)})
    made = {'cuda_tests': dict(tests=dict(passed=40, failed=0, skipped=0, sync_passed=30, sync_failed=0)),
            'clustering': dict(result=dict(rows=[dict(total_s=7.5)])),
            'fmnist_full': dict(result=dict(rows=[dict(views='device', images_per_s=21000.0)])),
            'jpeg_folder': dict(result=dict(rows=[dict(augment_on='cpu', images_per_s=900.0),
                                                  dict(augment_on='device', images_per_s=3500.0)]))}
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
            module = importlib.import_module(osp.splitext(part.script)[0])
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


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description='Run the CUDA-only tests and every GPU benchmark; write '
                                     'one Markdown report with each figure beside its goal.',
                                     formatter_class=HelpFormatter)
    parser.add_argument('--out-dir', default='work_dirs/gpu_report',
                        help='results per part, logs and report.md (default: %(default)s)')
    parser.add_argument('--parts', nargs='+', help='run only these parts (default: all)')
    parser.add_argument('--force', action='store_true', help='run parts whose results are already saved')
    parser.add_argument('--dry-run', action='store_true',
                        help='check every command and render the report from made-up results; run nothing')
    args = parser.parse_args(argv)
    # Absolute: each part runs with the repository as its working directory.
    args.out_dir = osp.abspath(args.out_dir)
    names = [p.name for p in parts(args.out_dir)]
    unknown = sorted(set(args.parts or []) - set(names))
    if unknown:
        parser.error(f'unknown --parts {unknown}; choose from {", ".join(names)}')
    return args


def main(argv: Sequence[str] | None = None) -> str:
    """Run (or with --dry-run check) the parts and write the report; returns its text."""
    args = parse_args(argv)
    chosen = [p for p in parts(args.out_dir) if not args.parts or p.name in args.parts]
    check_out_dir(args.out_dir)  # before any part runs: its results and the report go there
    if args.dry_run:
        check_commands(chosen, args.out_dir)
        report = render(fake_results(chosen), 'dry run (made-up results)')
        print(report)
        return report
    if not torch.cuda.is_available():
        raise SystemExit('error: the GPU report needs a CUDA device; on a CPU, pass --dry-run to check '
                         'the commands')
    from ifnd.fileio import AtomicLocalBackend
    os.makedirs(args.out_dir, exist_ok=True)
    device = torch.cuda.get_device_name()
    results: dict = {}
    for part in parts(args.out_dir):
        path = osp.join(args.out_dir, f'{part.name}.json')
        saved = None
        if osp.isfile(path):
            with open(path) as f:
                saved = json.load(f)
        if part in chosen and (args.force or saved is None or not succeeded(part.name, saved)):
            results[part.name] = run_part(part, args.out_dir)
        elif saved is not None:
            print(f'[{part.name}] saved result kept: {path} (--force runs it again)')
            results[part.name] = saved
        report = render(results, device)
        AtomicLocalBackend().put_text(report, osp.join(args.out_dir, 'report.md'))  # as far as it got
    print(report)
    print(f'Report written to {osp.join(args.out_dir, "report.md")}')
    return report


if __name__ == '__main__':
    main()
