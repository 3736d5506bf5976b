"""Hooks for downstream evaluation: frozen-backbone and pre-trained feature checks, precise BN
statistics."""
from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable, Iterable

import torch
from mmengine.dist import all_reduce
from mmengine.hooks import Hook
from torch.utils.data import Subset

from ifnd.engine.features import extract_features, unwrap_model
from ifnd.evaluation.class_match import match_eval_classes
from ifnd.registry import HOOKS
from ifnd.settings import check_number


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
        check_number('FrozenBackboneCheckHook', 'interval', interval, int, low=1,
                     hint='epochs between checks')
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
        check_number('PreciseBNHook', 'num_iters', num_iters, int, low=1,
                     hint='batches the BN statistics are estimated from')
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


def _loop_dataset(loop: object) -> object | None:
    """The data set a built loop reads, or ``None`` (no loop, or one not built yet)."""
    return getattr(getattr(loop, 'dataloader', None), 'dataset', None)


@HOOKS.register_module()
class ClassMatchHook(Hook):
    """Evaluates validation and test labels in the training split's class ids, matched by name.

    Folder data sets number their classes per split, so a class folder empty or absent in one
    split shifts every later id, and the accuracy would compare unrelated classes. The training
    classes come from the training data set or, when only evaluating, from the loaded checkpoint's
    ``meta.dataset_meta`` (mmengine writes the training set's there). Evaluated classes the
    training split lacks are refused, by name, before any training or evaluation.
    """

    priority = 'VERY_HIGH'

    def __init__(self) -> None:
        self._checkpoint_classes: list[str] | None = None

    def _train_classes(self, runner) -> list[str] | None:
        # The private attribute: the public property would build the loop in an evaluation-only run.
        classes = getattr(_loop_dataset(getattr(runner, '_train_loop', None)), 'classes', None)
        return classes if classes is not None else self._checkpoint_classes

    def _match(self, runner, loop_attr: str, split: str) -> None:
        loop = getattr(runner, loop_attr, None)
        dataset = _loop_dataset(loop)
        train_classes = self._train_classes(runner)
        if dataset is None or train_classes is None:
            return
        if match_eval_classes(train_classes, dataset, f'the {split} images ({split} split)'):
            runner.logger.info(f'ClassMatchHook: {split} labels matched to the training classes '
                               'by name (the splits list classes differently)')
            if getattr(loop, 'evaluator', None) is not None and hasattr(dataset, 'metainfo'):
                loop.evaluator.dataset_meta = dataset.metainfo

    def before_run(self, runner) -> None:
        """Match (or refuse) the validation classes as training starts, before any epoch."""
        self._match(runner, '_val_loop', 'validation')

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """Keep the training classes a loaded checkpoint records, for evaluation-only runs."""
        meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else None
        dataset_meta = meta.get('dataset_meta') if isinstance(meta, dict) else None
        classes = dataset_meta.get('classes') if isinstance(dataset_meta, dict) else None
        if classes is not None:
            self._checkpoint_classes = list(classes)

    def before_val(self, runner) -> None:
        """Match the validation labels before each validation (a no-op once matched)."""
        self._match(runner, '_val_loop', 'validation')

    def before_test(self, runner) -> None:
        """Match the test labels before testing."""
        self._match(runner, '_test_loop', 'test')


@HOOKS.register_module()
class PretrainedFeaturesHook(Hook):
    """Refuses a classifier's pre-trained backbone whose features nothing can learn from, before
    training or testing; nothing for models without ``pretrained`` (pre-training).

    Linear and semi-supervised evaluation compute the features batch by batch inside the step,
    where a check would cost a host sync each: instead the backbone encodes up to ``num_samples``
    evenly spaced images once (the validation set's, else the training set's; the test set's when
    only testing) and they are checked as every evaluation tool checks its features: non-finite,
    zero-length or collapsed features stop the run in one line naming the checkpoint
    (``load_from`` where given, else ``model.pretrained``).
    """

    priority = 'HIGH'

    def __init__(self, num_samples: int = 1024) -> None:
        self.num_samples = check_number('PretrainedFeaturesHook', 'num_samples', num_samples, int, low=2)
        self._checked = False

    def _check(self, runner, loop_attrs: tuple[str, ...]) -> None:
        model = unwrap_model(runner.model)
        if self._checked or not hasattr(model, 'pretrained'):
            return
        source = runner.cfg.get('load_from') or model.pretrained
        if not source:  # a randomly initialised backbone (ImageClassifier warns)
            return
        loop = next((loop for loop in (getattr(runner, attr, None) for attr in loop_attrs)
                     if _loop_dataset(loop) is not None), None)
        if loop is None:
            return
        dataset = _loop_dataset(loop)
        index = torch.linspace(0, len(dataset) - 1, min(len(dataset), self.num_samples)).long().unique()
        extract_features(runner.model, Subset(dataset, index.tolist()), 'f',
                         num_workers=getattr(loop.dataloader, 'num_workers', 0),
                         desc='checking the pre-trained features', source=source)
        self._checked = True

    def before_train(self, runner) -> None:
        """Check the backbone as training starts (after loading or resuming)."""
        self._check(runner, ('_val_loop', '_train_loop'))

    def before_test(self, runner) -> None:
        """Check the backbone of an evaluation-only run."""
        self._check(runner, ('_test_loop',))
