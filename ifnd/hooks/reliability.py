"""Hooks that make runs resumable to the bit and stop them early when training diverges."""
import math
import random

import numpy as np
import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook

from ifnd.datasets.samplers import sample_seed
from ifnd.registry import HOOKS


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CPU and every CUDA device) global generators."""
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


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


@HOOKS.register_module()
class FiniteLossHook(Hook):
    """Stops training at the first NaN or infinite loss, naming the iteration and the last finite loss.

    It reads the loss the runtime-info hook has already copied to the host for logging, so it adds
    no device synchronisation.
    """

    priority = 'HIGH'  # after RuntimeInfoHook (VERY_HIGH) has recorded this iteration's loss

    def __init__(self, key: str = 'train/loss') -> None:
        self.key = key
        self._last_finite: tuple[int, float] | None = None

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        """Raise ``FloatingPointError`` when this iteration's loss is not finite."""
        history = runner.message_hub.log_scalars.get(self.key)
        if history is None:
            return
        loss = float(history.current())
        iteration = runner.iter + 1
        if math.isfinite(loss):
            self._last_finite = (iteration, loss)
            return
        last = ('no finite loss before it' if self._last_finite is None else
                f'the last finite loss was {self._last_finite[1]:.6g} at iteration {self._last_finite[0]}')
        raise FloatingPointError(
            f'the loss became {loss} at iteration {iteration} (epoch {runner.epoch + 1}); {last}. '
            'Lower the learning rate or clip gradients (optim_wrapper.clip_grad=dict(max_norm=...)), '
            'then continue from the last checkpoint with --resume')
