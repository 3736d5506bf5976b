"""Training-step outputs logged without a host sync in every iteration."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from numbers import Number

import torch
from mmengine.hooks import CheckpointHook, LoggerHook, RuntimeInfoHook

from ifnd.registry import HOOKS

# Message-hub info (not saved in checkpoints) with the iterations of the last flush:
# ``[(iteration, {'train/<key>': value, ...}), ...]``, iterations counted from 1.
FLUSHED_INFO = 'train/flushed_iterations'


@HOOKS.register_module()
class BufferedRuntimeInfoHook(RuntimeInfoHook):
    """mmengine's ``RuntimeInfoHook`` that copies the step outputs to the host every N iterations.

    mmengine's hook writes every output of ``train_step`` into the message hub in every
    iteration, and each ``.item()`` waits for the device to finish the step. Here the outputs are
    kept on the device (detached) and copied to the host together, with one wait, when a value is
    needed: every ``interval`` iterations (default: the ``LoggerHook`` interval), whenever a
    ``LoggerHook`` logs, at the end of each epoch, before an iteration-based checkpoint, in the
    first iteration of a run and in the last. Every buffered iteration is then written into the
    message hub in order, so the logged values and their smoothing windows are those of
    mmengine's hook. The flushed iterations are also published as ``FLUSHED_INFO`` for hooks that
    check each of them (``FiniteLossHook``).
    """

    def __init__(self, interval: int | None = None) -> None:
        if interval is not None and (not isinstance(interval, int) or interval < 1):
            raise ValueError(f'BufferedRuntimeInfoHook interval must be a positive integer or None '
                             f'(the LoggerHook interval), got {interval!r}')
        self.interval = interval
        self._every = interval or 1  # set from the logger in before_train when interval is None
        self._pending: list[tuple[int, dict]] = []
        self._first = True
        self._log_intervals: list[int] = []
        self._checkpoint_intervals: list[int] = []

    def before_train(self, runner) -> None:
        """Find when the logger and iteration-based checkpoints read the message hub."""
        super().before_train(runner)
        runner.message_hub.pop_info(FLUSHED_INFO)  # a former run's, in a hub of the same name
        hooks = runner.hooks
        self._log_intervals = [h.interval for h in hooks if isinstance(h, LoggerHook)]
        self._checkpoint_intervals = [h.interval for h in hooks
                                      if isinstance(h, CheckpointHook) and not h.by_epoch
                                      and h.interval > 0]
        self._every = self.interval or min(self._log_intervals, default=50)
        self._pending = []
        self._first = True

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        """Keep this iteration's outputs on the device; write the buffer to the hub when due."""
        if outputs is not None:
            self._pending.append((runner.iter + 1, self._detached(outputs)))
        if self._due(runner, batch_idx):
            self.flush(runner)

    def after_train_epoch(self, runner) -> None:
        """Write what is left (an epoch whose last batch was not counted by the loader's length)."""
        self.flush(runner)

    def after_train(self, runner) -> None:
        """Write what is left, then let mmengine's hook close the training stage."""
        self.flush(runner)
        super().after_train(runner)

    def _due(self, runner, batch_idx: int) -> bool:
        if self._first:  # the first step: its keys enter the hub in mmengine's order
            self._first = False
            return True
        return (self.every_n_inner_iters(batch_idx, self._every)
                or any(self.every_n_inner_iters(batch_idx, n) for n in self._log_intervals)
                or any(self.every_n_train_iters(runner, n) for n in self._checkpoint_intervals)
                or self.end_of_epoch(runner.train_dataloader, batch_idx)
                or self.is_last_train_iter(runner))

    @staticmethod
    def _detached(outputs: dict) -> dict:
        values = {}
        for key, value in outputs.items():
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise ValueError(f'train_step output {key!r} has shape {tuple(value.shape)}; '
                                     'logged outputs must be scalars (e.g. reduce it with .mean())')
                value = value.detach().reshape(())  # the autograd graph is not kept alive
            elif not isinstance(value, Number):
                raise TypeError(f'train_step output {key!r} is a {type(value).__name__}; logged '
                                'outputs must be scalar tensors or numbers')
            values[key] = value
        return values

    def flush(self, runner) -> None:
        """Copy the buffered outputs to the host at once and write them into the message hub."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        host = _to_host([v for _, values in pending for v in values.values()])
        flushed = []
        for iteration, values in pending:
            scalars = {f'train/{key}': next(host) for key in values}
            for key, value in scalars.items():
                runner.message_hub.update_scalar(key, value)
            flushed.append((iteration, scalars))
        runner.message_hub.update_info(FLUSHED_INFO, flushed, resumed=False)


def _to_host(values: list) -> Iterator:
    """The values as Python numbers, in order: the tensors of each device in one copy."""
    out = list(values)
    groups: dict[torch.device, dict[torch.dtype, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, value in enumerate(values):
        if isinstance(value, torch.Tensor):
            groups[value.device][value.dtype].append(i)
    for device, by_dtype in groups.items():
        # float64 holds every float32/bf16/fp16 value exactly, and the message hub stores float64.
        wide = torch.float32 if device.type == 'mps' else torch.float64
        positions = [i for group in by_dtype.values() for i in group]
        stacked = torch.cat([torch.stack([values[i] for i in group]).to(wide)
                             for group in by_dtype.values()])
        for i, number in zip(positions, stacked.cpu().tolist()):
            out[i] = number
    return iter(out)
