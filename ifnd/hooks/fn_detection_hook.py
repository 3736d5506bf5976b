"""Per-epoch precision and recall of the negatives a loss flags as false negatives."""
import math

import numpy as np
from mmengine.dist import is_main_process
from mmengine.hooks import Hook

from ifnd.dist import all_reduce_sum
from ifnd.engine.features import unwrap_model
from ifnd.evaluation.metrics import detection_precision_recall
from ifnd.registry import HOOKS


@HOOKS.register_module()
class FalseNegativeDetectionHook(Hook):
    """Logs how well a method's flagged false negatives match the batch's ground-truth classes.

    Flagged are the negatives the loss treats as false negatives: for IFND (and the other
    label-masked losses) the candidates sharing the anchor's pseudo label at a level, other than
    its own views; for FNC those found through the support views; on every base (SimCLR's views,
    MoCo's queue, whose keys carry their classes, MoCo v3's keys). The training step sums, on the
    device and without host syncs, per level: flagged negatives, flagged ones of the anchor's
    class, and negatives of the anchor's class (``data_samples['label']``; unknown classes, -1,
    are left out). After each epoch the counts are summed over the processes and read once:
    precision = flagged of the class / flagged and recall = flagged of the class / same-class
    negatives, in percent, logged as ``train/fn_precision`` and ``train/fn_recall`` (the mean of
    the levels' values, as the loss averages its levels) and, with several levels, per level as
    ``train/fn_precision/k<clusters>`` etc., to the visualiser at step = epochs done (beside
    PseudoLabelHook's MTPR/MTNR) and in one log line; a data set without labels is skipped with one
    log line. They are not put in the message hub, whose ``train/`` scalars the logger would write
    again at every logged iteration, under the iteration's step.
    """

    priority = 'NORMAL'

    def __init__(self) -> None:
        self._warned = False  # the "nothing to measure" line is logged once

    def before_train(self, runner) -> None:
        """Switch the model's counting on; refuse algorithms that flag nothing."""
        model = unwrap_model(runner.model)
        if not getattr(model, 'records_detection', False):
            raise TypeError(f'FalseNegativeDetectionHook counts the negatives a detector flags; '
                            f'{type(model).__name__} has a weighting and no detector, which flags '
                            'none (its correction is in expectation): remove the hook from '
                            'custom_hooks')
        model.track_detection = True

    def before_train_epoch(self, runner) -> None:
        """Start the epoch's counts from zero."""
        unwrap_model(runner.model).detection_counts = None

    def after_train_epoch(self, runner) -> None:
        """Sum the epoch's counts over the processes, then log precision and recall."""
        model = unwrap_model(runner.model)
        counts = model.detection_counts
        if counts is None:  # every rank sees the same batches' keys: none counted anywhere
            return self._skip(runner, 'the batches carry no ground-truth labels')
        counts = all_reduce_sum(counts.clone()).cpu()  # the epoch's one host read
        if not bool((counts[:, 2] > 0).any()):
            return self._skip(runner, 'no labelled negative of an anchor\'s class was seen (a '
                              'data set without labels gives -1)')
        precision, recall = detection_precision_recall(counts)
        names = self._level_names(model, len(counts))
        scalars = {}
        for key, values in (('fn_precision', precision), ('fn_recall', recall)):
            defined = values[~np.isnan(values)]
            if defined.size:
                scalars[f'train/{key}'] = float(defined.mean())
            if len(values) > 1:
                scalars.update({f'train/{key}/{name}': float(v) for name, v in zip(names, values)
                                if not math.isnan(v)})
        if is_main_process():
            epoch = runner.epoch + 1
            runner.visualizer.add_scalars(scalars, step=epoch)
            # Counted over (anchor view, candidate view) pairs of the epoch's batches.
            levels = '; '.join(f'{name + ": " if len(names) > 1 else ""}precision '
                               f'{"undefined (nothing flagged)" if math.isnan(p) else f"{p:.1f}%"}, '
                               f'recall {r:.1f}% ({int(c[0])} flagged, {int(c[2])} same-class '
                               'negative pairs)'
                               for name, p, r, c in zip(names, precision, recall, counts.tolist()))
            runner.logger.info(f'False negatives flagged in epoch {epoch}: {levels}')

    def _skip(self, runner, why: str) -> None:
        if not self._warned and is_main_process():
            runner.logger.warning(f'FalseNegativeDetectionHook: nothing to measure, {why}; '
                                  'precision and recall are not logged')
        self._warned = True

    @staticmethod
    def _level_names(model, levels: int) -> list[str]:
        bank = getattr(model, 'label_bank', None)
        ks = bank.cluster_counts if bank is not None else []
        if len(ks) == levels and all(k > 0 for k in ks):
            return [f'k{k}' for k in ks]
        return [f'level{i}' for i in range(levels)]
