"""Tells the model's false-negative detector the training set's size and the epoch."""
import numpy as np
import torch
from mmengine.hooks import Hook

from ifnd.engine.features import unwrap_model
from ifnd.models.false_negatives import FalseNegativeDetector
from ifnd.registry import HOOKS


def _detector(runner) -> FalseNegativeDetector | None:
    """The model's false-negative detector; None for models without one (or whose ``detector``
    is something else, such as the COCO transfer's Mask R-CNN)."""
    detector = getattr(unwrap_model(runner.model), 'detector', None)
    return detector if isinstance(detector, FalseNegativeDetector) else None


@HOOKS.register_module()
class NegativeDetectorHook(Hook):
    """Sets up the detector's per-sample state before training and its epoch before each epoch.

    GloFND sizes its thresholds by the training set and starts at its ``start_epoch``; an
    acceptance schedule draws its sample order and follows the epochs; the ground-truth detector
    gets the training set's labels (for MoCo's queued keys). A checkpoint's state,
    loaded before ``before_train``, is kept. Models without a detector are left alone, so the
    hook sits in every config's ``default_hooks``.
    """

    priority = 'ABOVE_NORMAL'  # before PseudoLabelHook and the detection counts

    def before_train(self, runner) -> None:
        """Size the detector's state for the training set."""
        detector = _detector(runner)
        if detector is None:
            return
        device = next(unwrap_model(runner.model).parameters()).device
        dataset = runner.train_dataloader.dataset
        detector.setup(len(dataset), runner.max_epochs, device)
        # Known only now (train_cfg.max_epochs): a start past the run's end is a silent no-op.
        for warning in detector.idle_warnings(runner.max_epochs):
            runner.logger.warning(f'{warning}: {type(detector).__name__} flags no false negative '
                                  'in this run, which trains as if it had no detector; lower the '
                                  'setting or raise train_cfg.max_epochs')
        labels = getattr(dataset, 'labels', None)
        if detector.needs.classes and labels is not None:
            detector.set_classes(torch.as_tensor(np.asarray(labels), dtype=torch.long, device=device))

    def before_train_epoch(self, runner) -> None:
        """The epoch about to start."""
        detector = _detector(runner)
        if detector is not None:
            detector.set_epoch(runner.epoch)
