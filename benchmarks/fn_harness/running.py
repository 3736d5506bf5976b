"""Running the planned commands: one subprocess per run, a finished run read instead of rerun."""
from __future__ import annotations

import argparse
import json
import os
import os.path as osp
import platform
import shlex
import subprocess
import sys
import time

from ifnd.fileio import write_json

from .protocol import REPO, TITLES


def training_device() -> str:
    """The device tools/train.py will train on (CUDA when available)."""
    import torch
    if torch.cuda.is_available():
        return f'CUDA: {torch.cuda.get_device_name(0)}'
    return f'CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores'


def run_command(cmd: list[str], log_path: str, args: argparse.Namespace, what: str) -> float:
    """Run one command (output to ``log_path`` unless --verbose); returns its wall-clock seconds."""
    env = dict(os.environ)
    if args.threads is not None:
        env['OMP_NUM_THREADS'] = env['MKL_NUM_THREADS'] = str(args.threads)
    tic = time.time()
    if args.verbose:
        proc = subprocess.run(cmd, cwd=REPO, env=env)
    else:
        with open(log_path, 'w') as log:
            proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        if not args.verbose:
            with open(log_path) as f:
                print(f.read()[-4000:], file=sys.stderr)
        raise SystemExit(f'{what}: training failed with exit code {proc.returncode} '
                         f'(log: {log_path})')
    return time.time() - tic


def run_plan(plan: dict, args: argparse.Namespace) -> dict | None:
    """Pre-train one method with one seed, then its probe; read a finished run (None: unfinished).

    A run is finished when its ``run.json`` names the same commands; it then is read, not
    trained again (unless --rerun).
    """
    work_dir, what = plan['work_dir'], f"{TITLES[plan['method']]} seed {plan['seed']}"
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
    os.makedirs(work_dir, exist_ok=True)
    # Not finished before (or --rerun): start over, replacing what an earlier attempt left there.
    # --overwrite is left out of the recorded commands: it does not change the results.
    seconds = run_command([*plan['cmd'], '--overwrite'], osp.join(work_dir, 'train.log'), args,
                          what)
    linear_seconds = None
    if plan['linear_cmd']:
        linear_seconds = run_command([*plan['linear_cmd'], '--overwrite'],
                                     osp.join(work_dir, 'linear.log'), args, f'{what} linear probe')
    record = {'commands': commands, 'seconds': seconds, 'linear_seconds': linear_seconds,
              'finished': time.strftime('%Y-%m-%d %H:%M:%S')}
    write_json(record, record_path, indent=1, strict=True)
    print(f'{what}: finished in {seconds:.0f} s'
          + (f' + linear probe {linear_seconds:.0f} s' if linear_seconds else ''), flush=True)
    return record
