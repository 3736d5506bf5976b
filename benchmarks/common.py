"""Pieces shared by the benchmark scripts: argparse help, device choice, timing, the report."""
import argparse
import platform
import time
from collections.abc import Callable

import torch

from ifnd.engine.arguments import resolve_device
from ifnd.fileio import write_json

__all__ = ['HelpFormatter', 'describe_device', 'report_results', 'resolve_device', 'synchronize',
           'time_call']


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except unset ones and those the help text already explains."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False) or 'default' in (action.help or ''):
            return action.help or ''
        return super()._get_help_string(action)


def describe_device(device: torch.device) -> str:
    """Human-readable name of the device, with the CPU thread count."""
    if device.type == 'cuda':
        return f'CUDA: {torch.cuda.get_device_name(device)}'
    cpu = platform.processor() or platform.machine()
    return f'CPU: {cpu}, {torch.get_num_threads()} torch threads'


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels, so wall-clock time covers all the work timed."""
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device) -> Callable[[], float]:
    """Run ``fn`` and return a function that gives the seconds it took.

    On a GPU, CUDA events recorded around it on the current stream time the work ``fn`` queued,
    without a host sync between calls (read the time once a round's calls are queued); on a CPU,
    ``perf_counter``.
    """
    if device.type == 'cuda':
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()

        def seconds() -> float:
            end.synchronize()
            return start.elapsed_time(end) / 1000.0

        return seconds
    tic = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - tic
    return lambda: elapsed


def report_results(result: dict, table: str, out: str | None, strict: bool = False) -> dict:
    """Print the results' table; with ``out``, also write the results there as JSON. Returns them.

    ``strict``: non-finite floats are written as null (strict JSON) instead of NaN / Infinity.
    """
    print(table, flush=True)
    if out:
        write_json(result, out, indent=1, strict=strict)
        print(f'\nWrote {out}')
    return result
