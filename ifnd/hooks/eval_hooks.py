"""Hooks for downstream evaluation: frozen-backbone checks and precise BN statistics."""
from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable, Iterable

import torch
from mmengine.dist import all_reduce
from mmengine.hooks import Hook

from ifnd.engine.features import unwrap_model
from ifnd.registry import HOOKS


def state_fingerprint(module: torch.nn.Module) -> dict[str, str]:
    """A SHA-256 digest of every parameter and buffer of ``module``, by state-dict key."""
    digests = {}
    for name, tensor in module.state_dict().items():
        data = tensor.detach().cpu().contiguous().reshape(-1)
        digest = hashlib.sha256(str((data.dtype, tuple(tensor.shape))).encode())
        digest.update(data.view(torch.uint8).numpy().tobytes())
        digests[name] = digest.hexdigest()
    return digests


@HOOKS.register_module()
class FrozenBackboneCheckHook(Hook):
    """Fails the run if the backbone (weights or BN buffers) changes during linear evaluation.

    The backbone's state is fingerprinted before training and compared after every
    ``interval`` epochs and after training; any difference raises ``RuntimeError`` naming the
    changed tensors, so a linear-evaluation number never comes from a fine-tuned encoder.
    """

    priority = 'VERY_LOW'

    def __init__(self, backbone: str = 'backbone', interval: int = 1) -> None:
        if interval < 1:
            raise ValueError(f'FrozenBackboneCheckHook interval must be >= 1, got {interval}')
        self.backbone = backbone
        self.interval = interval
        self._reference: dict[str, str] | None = None

    def _module(self, runner) -> torch.nn.Module:
        model = unwrap_model(runner.model)
        module = getattr(model, self.backbone, None)
        if not isinstance(module, torch.nn.Module):
            raise AttributeError(f'FrozenBackboneCheckHook: {type(model).__name__} has no module '
                                 f'{self.backbone!r}; set the hook\'s `backbone` to its attribute name')
        return module

    def before_train(self, runner) -> None:
        """Fingerprint the backbone as training starts (after loading or resuming)."""
        self._reference = state_fingerprint(self._module(runner))

    def check(self, runner) -> None:
        """Raise if the backbone differs from its fingerprint at the start of training."""
        if self._reference is None:
            return
        current = state_fingerprint(self._module(runner))
        changed = sorted(k for k in set(current) | set(self._reference)
                         if current.get(k) != self._reference.get(k))
        if changed:
            shown = ', '.join(changed[:10]) + (f' ... ({len(changed)} in all)' if len(changed) > 10 else '')
            raise RuntimeError(
                f'The backbone changed during linear evaluation (epoch {runner.epoch}): {shown}. '
                'The linear protocol needs a frozen backbone in eval mode: set model.frozen=True '
                'and keep the backbone out of the optimiser')

    def after_train_epoch(self, runner) -> None:
        """Check every ``interval`` epochs, so a violation stops the run early."""
        if self.every_n_epochs(runner, self.interval):
            self.check(runner)

    def after_train(self, runner) -> None:
        """Check once more at the end of training."""
        self.check(runner)


def recompute_bn_statistics(model: torch.nn.Module, batches: Iterable,
                            forward: Callable[[object], object]) -> int:
    """Set each training-mode BN layer's running mean/var to the average of its batch statistics.

    ``forward(batch)`` runs the model on one batch (in training mode, without gradients). Averages
    are also averaged over processes, so plain BN gets the same statistics on every rank. Returns
    the number of batches used.
    """
    layers = [m for m in model.modules()
              if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training
              and m.track_running_stats]
    momenta = [m.momentum for m in layers]
    for m in layers:
        m.reset_running_stats()
        m.momentum = None  # cumulative average: running stat = mean of the batch stats seen
    count = 0
    try:
        with torch.no_grad():
            for batch in batches:
                forward(batch)
                count += 1
    finally:
        for m, momentum in zip(layers, momenta):
            m.momentum = momentum
    if count == 0:
        raise ValueError('no batches to estimate BN statistics from')
    for m in layers:
        all_reduce(m.running_mean, op='mean')
        all_reduce(m.running_var, op='mean')
    return count


@HOOKS.register_module()
class PreciseBNHook(Hook):
    """Re-estimates BN statistics on ``num_iters`` training batches before each evaluation.

    Statistics tracked with momentum during training lag behind the weights; averaging fresh batch
    statistics of the final weights (detectron2's TEST.PRECISE_BN) gives evaluation the right ones.
    It runs after the last training iteration (before the final checkpoint is written) and at
    every validation interval.
    """

    priority = 'ABOVE_NORMAL'

    def __init__(self, num_iters: int = 200) -> None:
        if num_iters < 1:
            raise ValueError(f'num_iters must be >= 1, got {num_iters}')
        self.num_iters = num_iters

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        """Recompute the statistics at the last iteration and at validation intervals."""
        val_interval = getattr(runner.train_loop, 'val_interval', 0) or 0
        if not (self.is_last_train_iter(runner)
                or (val_interval and self.every_n_train_iters(runner, val_interval))):
            return
        model = unwrap_model(runner.model)

        def forward(batch):
            model(**model.data_preprocessor(batch, True), mode='loss')

        start = time.perf_counter()
        count = recompute_bn_statistics(model, itertools.islice(iter(runner.train_dataloader),
                                                                self.num_iters), forward)
        runner.logger.info(f'Precise BN: statistics from {count} training batches '
                           f'in {time.perf_counter() - start:.1f} s')
