"""Pieces shared by the benchmark scripts: argparse help, device choice and timing."""
import argparse
import platform

import torch

from ifnd.engine.cli import resolve_device

__all__ = ['HelpFormatter', 'describe_device', 'resolve_device', 'synchronize']


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
