"""Running the planned commands: one subprocess per run, a finished run read instead of rerun."""
from __future__ import annotations

import argparse
import json
import math
import os
import os.path as osp
import platform
import shlex
import subprocess
import sys
import threading
import time

from ifnd.fileio import write_json

from .protocol import METHODS, REPO


def training_device() -> str:
    """The device tools/train.py will train on (CUDA when available)."""
    import torch
    if torch.cuda.is_available():
        return f'CUDA: {torch.cuda.get_device_name(0)}'
    return f'CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores'


class TimeLimit:
    """The wall-clock seconds an invocation may train (``--time-limit``), and what its runs took."""

    def __init__(self, seconds: float | None, start: float | None = None) -> None:
        self.seconds = seconds or None
        self.end = None if self.seconds is None else (start or time.monotonic()) + self.seconds
        self._took: list[float] = []
        self._lock = threading.Lock()

    def left(self) -> float:
        """Seconds left (inf without a limit)."""
        return math.inf if self.end is None else self.end - time.monotonic()

    def record(self, seconds: float) -> None:
        """Note the seconds a run, pre-training and probe, took here."""
        with self._lock:
            self._took.append(seconds)

    def expected(self) -> float:
        """Seconds a run is expected to take: the longest finished here (0 before any)."""
        with self._lock:
            return max(self._took, default=0.0)


class TimeLimitReached(Exception):
    """A command stopped because the time limit ran out."""


def _wait(proc: subprocess.Popen, limit: TimeLimit | None, what: str) -> int:
    """The command's exit code; stopped (terminated, then killed) when the time limit runs out."""
    timeout = None if limit is None or limit.end is None else max(limit.left(), 0.0)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise TimeLimitReached(f'{what}: stopped at the time limit ({limit.seconds:g} s)') from None
    except BaseException:  # as subprocess.run: no training left behind by an interrupted wait
        proc.kill()
        proc.wait()
        raise


def run_command(cmd: list[str], log_path: str, args: argparse.Namespace, what: str,
                limit: TimeLimit | None = None) -> float:
    """Run one command (output to ``log_path`` unless --verbose); returns its wall-clock seconds.

    Raises :class:`TimeLimitReached` when ``limit`` runs out first.
    """
    env = dict(os.environ)
    if args.threads is not None:
        env['OMP_NUM_THREADS'] = env['MKL_NUM_THREADS'] = str(args.threads)
    tic = time.time()
    if args.verbose:
        returncode = _wait(subprocess.Popen(cmd, cwd=REPO, env=env), limit, what)
    else:
        with open(log_path, 'w') as log:
            returncode = _wait(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log,
                                                stderr=subprocess.STDOUT), limit, what)
    if returncode != 0:
        if not args.verbose:
            with open(log_path) as f:
                print(f.read()[-4000:], file=sys.stderr)
        raise SystemExit(f'{what}: training failed with exit code {returncode} '
                         f'(log: {log_path})')
    return time.time() - tic


def run_plan(plan: dict, args: argparse.Namespace) -> dict | None:
    """Pre-train one method with one seed, then its probe; read a finished run (None: unfinished).

    A run is finished when its ``run.json`` names the same commands; it then is read, not
    trained again (unless --rerun). Under ``args.time_limit_clock`` (a :class:`TimeLimit`) a run
    is not started when less time is left than a finished run took, and stopped when none is.
    """
    work_dir, what = plan['work_dir'], f"{METHODS[plan['method']].title} seed {plan['seed']}"
    record_path = osp.join(work_dir, 'run.json')
    commands = {'pretrain': shlex.join(plan['cmd']),
                'linear': shlex.join(plan['linear_cmd']) if plan['linear_cmd'] else None}
    if not args.rerun and osp.isfile(record_path):
        with open(record_path) as f:
            record = json.load(f)
        if record.get('commands') == commands:
            print(f'{what}: finished before, read from {work_dir}', flush=True)
            return record
    if args.skip_train:
        print(f'{what}: not finished in {work_dir}; left out (--skip-train)', flush=True)
        return None
    limit = getattr(args, 'time_limit_clock', None)
    if limit is not None and limit.left() <= limit.expected():
        print(f'{what}: not started: {max(limit.left(), 0):.0f} s of the time limit left, a run '
              f'here took {limit.expected():.0f} s', flush=True)
        return None
    os.makedirs(work_dir, exist_ok=True)
    # Not finished before (or --rerun): start over, replacing what an earlier attempt left there.
    # --overwrite is left out of the recorded commands: it does not change the results.
    try:
        seconds = run_command([*plan['cmd'], '--overwrite'], osp.join(work_dir, 'train.log'),
                              args, what, limit)
        linear_seconds = None
        if plan['linear_cmd']:
            linear_seconds = run_command([*plan['linear_cmd'], '--overwrite'],
                                         osp.join(work_dir, 'linear.log'), args,
                                         f'{what} linear probe', limit)
    except TimeLimitReached as stopped:
        print(f'{stopped}; not finished', flush=True)
        return None
    if limit is not None:
        limit.record(seconds + (linear_seconds or 0.0))
    record = {'commands': commands, 'seconds': seconds, 'linear_seconds': linear_seconds,
              'finished': time.strftime('%Y-%m-%d %H:%M:%S')}
    write_json(record, record_path, indent=1, strict=True)
    print(f'{what}: finished in {seconds:.0f} s'
          + (f' + linear probe {linear_seconds:.0f} s' if linear_seconds else ''), flush=True)
    return record
