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
- ``vit_step``: ``step_cost.py --pairs mocov3`` at the MoCo v3 ViT recipe (ViT-S/16, 224 px, batch
  256, AdamW), IFNDMoCoV3 vs MoCo v3, compiled, bfloat16, beside timm's published ViT-S/16 figure;
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

This module runs the parts and writes the report; the parts, their sizes and costs are in
``gpu_parts``, the figures, goals and the report's Markdown in ``gpu_figures``.

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
from collections.abc import Sequence


if not __package__:  # started as `python benchmarks/NAME.py`: import the package from the repository
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from benchmarks.common import REPO, HelpFormatter, describe_device, digits_as_fmnist
from benchmarks.gpu_figures import fake_results, render
from benchmarks.gpu_parts import BUDGET_S, CUDA_TESTS, FMNIST_ROOT, Part, parts, print_plan

HERE = osp.dirname(osp.abspath(__file__))


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
