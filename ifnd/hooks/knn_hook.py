"""Online weighted-kNN evaluation of the backbone during training."""
from collections.abc import Sequence

import torch
from mmengine.dist import is_main_process
from mmengine.hooks import Hook

from ifnd.engine.features import build_eval_dataset, extract_features, trained_model_source
from ifnd.evaluation.class_match import class_id_map
from ifnd.evaluation.metrics import knn_accuracy
from ifnd.settings import check_knn, check_number
from ifnd.registry import HOOKS


def query_class_ids(bank_classes: Sequence[str] | None,
                    query_classes: Sequence[str] | None) -> torch.Tensor | None:
    """Map from the query split's class ids to the bank split's by class name; None when equal.

    Raises ``ValueError`` naming the query classes the bank (training) split does not have.
    """
    mapping = class_id_map(bank_classes, query_classes, 'the kNN queries (validation split)',
                           'kNN accuracy')
    return None if mapping is None else torch.from_numpy(mapping)


@HOOKS.register_module()
class KNNEvalHook(Hook):
    """Weighted kNN top-1 (cosine, k neighbours, temperature T) every ``interval`` epochs.

    The memory bank is the training set under ``pipeline`` (the eval transform) unless
    ``train_dataset`` is given; queries come from ``val_dataset``. The result is logged as the
    scalar ``knn/top1`` (and ``knn/top1`` at step 0 for the untrained encoder when
    ``eval_at_start``).
    """

    priority = 'LOW'

    def __init__(self, val_dataset: dict, pipeline: dict | None = None,
                 train_dataset: dict | None = None, interval: int = 1, k: int = 20,
                 temperature: float = 0.07, feature: str = 'f', batch_size: int = 256,
                 num_workers: int = 2, chunk_size: int = 1024, eval_at_start: bool = False) -> None:
        owner = 'KNNEvalHook'
        check_number(owner, 'interval', interval, int, low=1, hint='epochs between evaluations')
        check_number(owner, 'batch_size', batch_size, int, low=1)
        check_number(owner, 'num_workers', num_workers, int, low=0)
        check_number(owner, 'chunk_size', chunk_size, int, low=1, hint='queries compared at once')
        self.val_dataset = val_dataset
        self.train_dataset = train_dataset
        self.pipeline = pipeline
        self.interval = interval
        self.k, self.temperature = check_knn(k, temperature)  # its range in the bank: at the first evaluation
        self.feature = feature
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.chunk_size = chunk_size
        self.eval_at_start = eval_at_start
        self._datasets = None

    def _build_datasets(self, runner):
        if self._datasets is None:
            train_cfg = self.train_dataset or runner.cfg.train_dataloader.dataset
            self._datasets = (build_eval_dataset(train_cfg, self.pipeline),
                              build_eval_dataset(self.val_dataset, self.pipeline))
            # Refuse splits whose classes cannot be matched now, before any feature extraction.
            query_class_ids(*(getattr(d, 'classes', None) for d in self._datasets))
        return self._datasets

    def evaluate(self, runner, epochs_done: int) -> float:
        """kNN top-1 (%) of the current backbone, logged at ``epochs_done``; on every rank."""
        bank_set, query_set = self._build_datasets(runner)
        # A collapsed encoder's chance-level top-1 is a true measurement: logged with a warning.
        # Unusable (non-finite) features stop the run.
        source = trained_model_source(runner, epochs_done)
        kwargs = dict(feature=self.feature, batch_size=self.batch_size, num_workers=self.num_workers,
                      source=source, on_collapse='warn')
        bank, bank_labels = extract_features(runner.model, bank_set, desc='kNN bank', **kwargs)
        query, query_labels = extract_features(runner.model, query_set, desc='kNN queries',
                                               **kwargs)
        to_bank_ids = query_class_ids(getattr(bank_set, 'classes', None),
                                      getattr(query_set, 'classes', None))
        if to_bank_ids is not None:  # the splits list classes differently: compare by name
            known = query_labels >= 0
            query_labels = query_labels.clone()
            query_labels[known] = to_bank_ids.to(query_labels.device)[query_labels[known]]
        num_classes = int(max(bank_labels.max(), query_labels.max())) + 1
        top1 = knn_accuracy(bank, bank_labels, query, query_labels, num_classes, k=self.k,
                            temperature=self.temperature, chunk_size=self.chunk_size)
        runner.message_hub.update_scalar('knn/top1', top1)
        if is_main_process():
            runner.logger.info(f'After {epochs_done} epochs: kNN top-1 {top1:.2f}% '
                               f'(k={self.k}, T={self.temperature}, {len(query)} queries)')
            runner.visualizer.add_scalars({'knn/top1': top1}, step=epochs_done)
        return top1

    def before_train(self, runner) -> None:
        """Evaluate the encoder as initialised, once, when asked (not on resume)."""
        if self.eval_at_start and runner.epoch == 0:
            self.evaluate(runner, 0)

    def after_train_epoch(self, runner) -> None:
        """Evaluate every ``interval`` epochs and after the last one."""
        done = runner.epoch + 1
        if done % self.interval == 0 or done == runner.max_epochs:
            self.evaluate(runner, done)
