"""Hooks for downstream evaluation."""
from __future__ import annotations

import hashlib

import torch
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
