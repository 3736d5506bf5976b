"""Top-k classification accuracy as an mmengine metric, for the val/test loops of classifiers."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from mmengine.evaluator import BaseMetric

from ifnd.registry import METRICS


@METRICS.register_module()
class Accuracy(BaseMetric):
    """Top-k accuracy in percent, reported as ``top1``, ``top5``, ... .

    Takes the per-sample ``dict(pred_score, gt_label)`` that ``ImageClassifier.predict`` returns.
    Only the k best class ids of each sample are kept between batches (not the full score
    vector), so ImageNet-size validation sets stay small in memory. A ``k`` at or above the
    number of classes counts every sample as a hit, as scikit-learn's ``top_k_accuracy_score``.
    """

    default_prefix: str | None = ''  # keys are plain 'top1', 'top5' (logged as 'val/top1')

    def __init__(self, topk: int | Sequence[int] = (1, 5), collect_device: str = 'cpu',
                 prefix: str | None = None) -> None:
        super().__init__(collect_device=collect_device, prefix=prefix)
        topk = (topk,) if isinstance(topk, int) else tuple(topk)
        if not topk or any(int(k) < 1 for k in topk):
            raise ValueError(f'topk must hold positive integers, got {topk!r}')
        self.topk = tuple(int(k) for k in topk)

    def process(self, data_batch: Any, data_samples: Sequence[dict]) -> None:
        """Keep each sample's label and its ``max(topk)`` best class ids."""
        if not data_samples:
            return
        scores = torch.stack([torch.as_tensor(s['pred_score']) for s in data_samples]).float().cpu()
        labels = [int(s['gt_label']) for s in data_samples]
        maxk = min(max(self.topk), scores.shape[1])
        best = scores.topk(maxk, dim=1).indices.numpy()
        # One result per sample: mmengine trims the gathered results to the data set's size,
        # which drops the samples a distributed sampler repeats to even out the ranks.
        self.results.extend((label, ids, scores.shape[1]) for label, ids in zip(labels, best))

    def compute_metrics(self, results: list) -> dict[str, float]:
        """Top-k accuracies (%) over all processed samples."""
        if not results:
            raise ValueError('Accuracy got no predictions: is the validation set empty?')
        labels = np.array([r[0] for r in results])
        best = np.stack([r[1] for r in results])
        num_classes = results[0][2]
        metrics = {}
        for k in self.topk:
            if k >= num_classes:
                hits = np.ones(len(labels), dtype=bool)
            else:
                hits = (best[:, :k] == labels[:, None]).any(axis=1)
            metrics[f'top{k}'] = float(hits.mean() * 100.0)
        return metrics
