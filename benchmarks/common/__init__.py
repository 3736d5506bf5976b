"""Pieces shared by the benchmark scripts and the harness: argparse help, device choice, timing, the
report, generated data.

A package of its own, below both the scripts (``benchmarks.*``) and the harness
(``benchmarks.fn_harness``), so that neither package imports the other back.
"""
import argparse
import os
import os.path as osp
import platform
import struct
import time
from collections.abc import Callable

import numpy as np
import torch

from ifnd.engine.arguments import resolve_device
from ifnd.fileio import write_json

__all__ = ['REPO', 'HelpFormatter', 'describe_device', 'digits_as_fmnist', 'make_jpeg_folder', 'report_results',
           'resolve_device', 'synchronize', 'time_call']

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


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


def digits_as_fmnist(root: str, train: int = 320, test: int = 100) -> str:
    """scikit-learn's digits written as Fashion-MNIST IDX files (28 px), for a rehearsal without the data set."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    # 8 px to 24 px by repeating each pixel, padded to Fashion-MNIST's 28 px.
    images = np.pad(np.kron(images, np.ones((3, 3), np.uint8)), ((0, 0), (2, 2), (2, 2)))
    labels = digits.target.astype(np.uint8)
    order = np.arange(train + test) % len(images)  # repeated where more images are asked than it has
    images, labels = images[order], labels[order]
    os.makedirs(root, exist_ok=True)
    for prefix, rows in (('train', slice(0, train)), ('t10k', slice(train, train + test))):
        for stem, array in (('images-idx3', images[rows]), ('labels-idx1', labels[rows])):
            header = struct.pack('>BBBB', 0, 0, 0x08, array.ndim) + struct.pack(f'>{array.ndim}i', *array.shape)
            with open(osp.join(root, f'{prefix}-{stem}-ubyte'), 'wb') as f:
                f.write(header + array.tobytes())
    return root


def make_jpeg_folder(root: str, n: int, size: int, seed: int = 0) -> str:
    """``n`` JPEG files of about ``size`` pixels (sides vary by up to 25%) in 4 class folders."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    done = osp.join(root, f'.done-{n}-{size}')
    if osp.isfile(done):
        return root
    for i in range(n):
        h, w = (int(size * f) for f in rng.uniform(1.0, 1.25, 2))
        yy, xx = np.mgrid[0:h, 0:w] / size
        base = np.stack([np.sin(xx * rng.uniform(2, 12)), np.cos(yy * rng.uniform(2, 12)),
                         np.sin((xx + yy) * rng.uniform(2, 12))], -1)
        img = np.clip(127 + 100 * base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)
        folder = osp.join(root, f'class{i % 4}')
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(img).save(osp.join(folder, f'{i:05d}.jpg'), quality=90)
    open(done, 'w').close()
    return root
