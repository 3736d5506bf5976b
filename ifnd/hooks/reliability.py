"""Hooks that make runs resumable to the bit, stop them early when training diverges and keep a
full disk's error readable."""
import logging
import math
import os
import random
import sys

import numpy as np
import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook

from ifnd.datasets.samplers import sample_seed
from ifnd.engine.features import unwrap_model
from ifnd.hooks.runtime_info import FLUSHED_INFO
from ifnd.registry import HOOKS


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CPU and every CUDA device) global generators."""
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    # The generators torch.manual_seed seeds that training uses, without its checks of every other
    # backend (100 times the cost, paid each iteration).
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


@HOOKS.register_module()
class ReseedHook(Hook):
    """Re-seeds every global generator at the start of each training epoch and iteration.

    mmengine seeds once, when the runner starts, and does not save the generators' states, so a
    resumed run would draw other random numbers than the uninterrupted one (MoCo's key shuffle,
    augmentation on the device), and so would a run whose loader started its workers at another
    epoch. Seeds derived from (run seed, epoch or iteration, rank) make each step's randomness the
    same whether the run got there in one go or through a checkpoint.
    """

    priority = 'VERY_HIGH'

    def before_train_epoch(self, runner) -> None:
        """Seed for this epoch's loader start (its workers' base seed, or in-process loading)."""
        seed_everything(sample_seed(~runner.seed, runner.epoch, get_rank()))

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        """Seed for this iteration's step, whatever the loader drew before it."""
        seed_everything(sample_seed(runner.seed, runner.iter, get_rank()))


# The usual ranges of the settings that scale the loss (the configs and benchmark presets): a
# diverged run names the settings outside them.
USUAL_TEMPERATURE = (0.05, 1.0)
USUAL_MAX_BETA = 2.0


@HOOKS.register_module()
class FiniteLossHook(Hook):
    """Stops training at a NaN or infinite loss, naming its iteration, the last finite loss and the
    settings that scale the loss and its gradients (lr, temperature, τ⁺, β), not the lr alone.

    It reads the losses the runtime-info hook has already copied to the host for logging, so it
    adds no device synchronisation. With ``BufferedRuntimeInfoHook`` (the default runtime) that
    happens every N iterations: each flush is checked iteration by iteration, so the first
    non-finite one is named even though training stops a few steps later. With mmengine's
    ``RuntimeInfoHook`` every iteration is checked as it ends.
    """

    priority = 'HIGH'  # after the runtime-info hook (VERY_HIGH) has recorded the losses

    def __init__(self, key: str = 'train/loss') -> None:
        self.key = key
        self._last_finite: tuple[int, float] | None = None
        self._checked = 0  # the last iteration checked

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        """Raise ``FloatingPointError`` at the first loss that is not finite."""
        self._check(runner, in_iteration=True)

    def after_train_epoch(self, runner) -> None:
        """Check what the runtime-info hook flushed at the epoch's end, before any checkpoint."""
        self._check(runner, in_iteration=False)

    def _losses(self, runner, in_iteration: bool) -> list[tuple[int, float]]:
        """(iteration, loss) of the iterations not checked yet that reached the host."""
        flushed = runner.message_hub.get_info(FLUSHED_INFO)
        if flushed is not None:
            return [(iteration, values[self.key]) for iteration, values in flushed
                    if iteration > self._checked and self.key in values]
        # mmengine's RuntimeInfoHook: the hub holds the loss of the iteration that just ended.
        history = runner.message_hub.log_scalars.get(self.key)
        if history is None or not in_iteration:
            return []
        return [(runner.iter + 1, float(history.current()))]

    def _check(self, runner, in_iteration: bool) -> None:
        for iteration, loss in self._losses(runner, in_iteration):
            self._checked = iteration
            if math.isfinite(loss):
                self._last_finite = (iteration, loss)
                continue
            last = ('no finite loss before it' if self._last_finite is None else
                    f'the last finite loss was {self._last_finite[1]:.6g} at iteration '
                    f'{self._last_finite[0]}')
            settings, fixes = loss_settings(runner)
            raise FloatingPointError(
                f'the loss became {loss} at iteration {iteration} (epoch {runner.epoch + 1}); '
                f'{last}. The settings that scale the loss and its gradients: {settings}. Lower '
                'the learning rate or clip gradients (optim_wrapper.clip_grad=dict(max_norm=...))'
                f'{fixes}, then continue from the last checkpoint with --resume')


def loss_settings(runner) -> tuple[str, str]:
    """The run's settings that scale the loss and its gradients (``'lr=0.3, temperature=0.1'``),
    those out of their usual range marked, and the fix of the marked ones (or '')."""
    named, unusual = [], False
    try:
        lrs = runner.optim_wrapper.get_lr()
    except (AttributeError, KeyError, IndexError):  # no optimiser built: nothing to name
        lrs = {}
    for key, values in lrs.items():
        values = sorted(set(float(v) for v in values))
        named.append(f'{key}={values[0]:g}' if len(values) == 1 else
                     f'{key}=[{", ".join(f"{v:g}" for v in values)}]')
    model = unwrap_model(runner.model)
    temperature = getattr(model, 'temperature', None)
    if isinstance(temperature, (int, float)):
        low = temperature < USUAL_TEMPERATURE[0]
        usual = f' (the recipes use {USUAL_TEMPERATURE[0]:g} to {USUAL_TEMPERATURE[1]:g})'
        named.append(f'temperature={temperature:g}' + (usual if low else ''))
        unusual |= low
    weighting = getattr(model, 'weighting', None)
    if weighting is not None:  # a registered weighting part (Debiased, HardNegatives)
        named.append(f'weighting tau_plus={weighting.tau_plus:g}')
        high = weighting.beta > USUAL_MAX_BETA
        named.append(f'weighting beta={weighting.beta:g}' + (
            f' (the recipes use at most {USUAL_MAX_BETA:g})' if high else ''))
        unusual |= high
    return ', '.join(named) or 'none found', (', bring the marked settings to their usual range'
                                              if unusual else '')


@HOOKS.register_module()
class LogFileErrorHook(Hook):
    """A log file that can no longer be written (a full disk) costs one warning line, not a traceback.

    Python's logging prints a traceback to stderr for every record its file handler fails to
    write, so a full disk buries the run's one-line error (e.g. the checkpoint that could not be
    saved) under tracebacks. Here the first failed write logs one warning naming the file and the
    fix, then the log goes on on the console only.
    """

    priority = 'VERY_HIGH'

    def before_run(self, runner) -> None:
        """Guard each file handler of the runner's logger."""
        for handler in runner.logger.handlers:
            if isinstance(handler, logging.FileHandler):
                handler.handleError = self._on_write_error(runner.logger, handler)

    @staticmethod
    def _on_write_error(logger: logging.Logger, handler: logging.FileHandler):
        original = handler.handleError

        def handle_error(record: logging.LogRecord) -> None:
            err = sys.exc_info()[1]
            if not isinstance(err, OSError):
                original(record)
                return
            # A new list, not remove(): the logger may be iterating over its handlers right now.
            logger.handlers = [h for h in logger.handlers if h is not handler]
            try:
                handler.close()
            except OSError:
                pass  # its buffer cannot be written either
            logger.warning(f'could not write the log file {handler.baseFilename} '
                           f'({err.strerror or err}); logging to the console only from here. Free '
                           f'space in {os.path.dirname(handler.baseFilename)} to keep the next '
                           "run's log")

        return handle_error
