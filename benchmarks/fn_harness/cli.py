"""The benchmark end to end: plan the runs, train them, read them back, report."""
from __future__ import annotations

import argparse
import concurrent.futures
import shlex
import sys
import time
from typing import Sequence

from ..common import report_results

from .arguments import parse_args
from .merge import check_previous, merge
from .plan import load_config, make_plans, training_data
from .protocol import METHODS, SLOT_PRESETS
from .report import markdown_tables, plot
from .results import collect
from .running import TimeLimit, run_plan, training_device
from .stats import summarise

# Options that change how the benchmark runs, not what it measures: left out of the settings.
# --previous names the results merged in (the result's merged_from), not a setting of its runs;
# a rehearsal's sizes are in the settings it sets.
_NOT_SETTINGS = ('out', 'plot', 'python', 'dry_run', 'skip_train', 'verbose', 'rerun', 'previous',
                 'rehearse', 'time_limit', 'time_limit_clock')


def _check_gpu_slot(args: argparse.Namespace, device: str) -> None:
    """Refuse a GPU-slot preset where it cannot train, before any run starts: a slot is short."""
    if args.preset not in SLOT_PRESETS or args.dry_run or args.skip_train:
        return
    if device.startswith('CPU') and not args.rehearse:
        raise SystemExit(f'error: --preset {args.preset} is sized for 8 minutes of one GPU and no '
                         'CUDA device is here: add --dry-run to print its commands, or --rehearse '
                         'to train it at toy size on this CPU')
    try:  # the images must be on this machine: a GPU machine may not reach the internet
        training_data(load_config(getattr(args, f'{args.methods[0]}_config')))
    except (OSError, ValueError) as err:
        raise SystemExit(f'error: the training data cannot be read: {err}') from None


def main(argv: Sequence[str] | None = None) -> dict:
    """Train (unless finished or --skip-train), read the results, print the tables."""
    started = time.monotonic()  # --time-limit counts from here
    args = parse_args(argv)
    device = training_device()
    if args.threads is not None:
        device += f', {args.threads} thread(s) per run, {args.jobs} run(s) at a time'
    if args.preset == 'gpu' and device.startswith('CPU') and not args.dry_run:
        print('warning: the gpu preset on a CPU takes days; use --preset cpu', file=sys.stderr)
    _check_gpu_slot(args, device)
    print(f'Training device: {device}')
    settings = {key: value for key, value in vars(args).items() if key not in _NOT_SETTINGS}
    args.time_limit_clock = TimeLimit(args.time_limit, started)
    # Earlier results are checked before any training: a refusal should not come hours later.
    previous = check_previous(args.previous, settings, args)
    for source in previous:
        print(f"Merged from {source['path']}: {len(source['runs'])} run(s) of methods and seeds "
              'not trained here', flush=True)
    plans = make_plans(args)
    _print_commands(plans, args)
    if args.dry_run:
        return {}
    tic = time.time()
    records = _run_plans(plans, args)
    runs = [collect(plan, record, args) for plan, record in zip(plans, records) if record]
    _check_finished(plans, records, runs, previous, args)
    merged = merge({
        'benchmark': 'false_negatives',
        'device': device,
        'wall_seconds': time.time() - tic,
        'settings': settings,
        'runs': runs,
    }, previous)
    result = {**{key: value for key, value in merged.items() if key != 'runs'},
              'summary': summarise(merged['runs'], merged['settings']['seeds']),
              'runs': merged['runs']}
    print()
    report_results(result, markdown_tables(result), args.out, strict=True)
    if args.plot:
        plot(result, args.plot)
    return result


def _print_commands(plans: list[dict], args: argparse.Namespace) -> None:
    """Each run's training (and linear evaluation) command, as a shell would take it."""
    env = f'OMP_NUM_THREADS={args.threads} ' if args.threads is not None else ''
    for plan in plans:
        print(f"$ {env}{shlex.join(plan['cmd'])}", flush=True)
        if plan['linear_cmd']:
            print(f"$ {env}{shlex.join(plan['linear_cmd'])}", flush=True)


def _run_plans(plans: list[dict], args: argparse.Namespace) -> list:
    """Each plan's record (empty when not finished in the time limit), ``--jobs`` at a time."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_plan, plan, args) for plan in plans]
    # Every run is tried: a failed one does not cancel those queued behind it, and finished runs
    # are read back, not retrained, when the same command runs again.
    failures = [str(future.exception()) for future in futures if future.exception() is not None]
    if failures:
        raise SystemExit('\n'.join(failures) + f'\n{len(failures)} of {len(plans)} run(s) failed; '
                         f'the others are kept in {args.work_dir}: fix the cause and run the same '
                         'command again, which trains only the runs not finished')
    return [future.result() for future in futures]


def _check_finished(plans: list[dict], records: list, runs: list[dict], previous: list[dict],
                    args: argparse.Namespace) -> None:
    """Name the runs the time limit cut short; refuse a report with no finished run at all."""
    unfinished = [plan for plan, record in zip(plans, records) if not record]
    if unfinished and args.time_limit_clock.seconds and not args.skip_train:
        print(f'{len(unfinished)} of {len(plans)} run(s) not finished in the time limit '
              f'({args.time_limit:g} s): '
              + ', '.join(f"{METHODS[p['method']].title} seed {p['seed']}" for p in unfinished)
              + '; the same command again trains them (they start over)', flush=True)
    if not runs and not any(source['runs'] for source in previous):
        if args.time_limit_clock.seconds and not args.skip_train:
            raise SystemExit(f'no run finished in the time limit ({args.time_limit:g} s); nothing '
                             'to report: raise --time-limit or lower the budget (e.g. --epochs)')
        raise SystemExit(f'no finished run in {args.work_dir} (drop --skip-train)')
