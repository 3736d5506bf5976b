"""Metrics for pseudo labels and representations.

* :func:`false_negative_rates` -- MTPR / MTNR of the IFND paper (Sec. 4.4): how many actual
  false negatives a labelling detects, and how many actual negatives it keeps.
* :func:`detection_precision_recall` -- precision / recall of the negatives a loss flags as false
  negatives, from the counts its training steps summed.
* :func:`cluster_quality` -- NMI / AMI / ARI against the ground truth (scikit-learn).
* :func:`knn_classify` / :func:`knn_accuracy` -- weighted kNN on frozen features (InstDisc/DINO).
"""
from __future__ import annotations

from typing import Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ifnd.settings import check_knn

__all__ = ['false_negative_rates', 'pair_precision_recall', 'detection_precision_recall',
           'cluster_quality', 'knn_classify', 'knn_accuracy']

ArrayLike = Union[Tensor, np.ndarray]


def _labels_1d(labels: ArrayLike, name: str) -> np.ndarray:
    if isinstance(labels, Tensor):
        labels = labels.detach().cpu().numpy()
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f'{name} must be 1-D, got shape {labels.shape}')
    return labels


def _label_codes(pseudo_labels: ArrayLike, true_labels: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Classes and clusters as codes 0..n-1 (int64, ``[N]`` each), checked to be equally long."""
    y = _labels_1d(pseudo_labels, 'pseudo_labels')
    g = _labels_1d(true_labels, 'true_labels')
    if y.shape != g.shape:
        raise ValueError(f'pseudo_labels and true_labels differ in length: {y.shape[0]} vs '
                         f'{g.shape[0]}')
    _, gi = np.unique(g, return_inverse=True)
    _, yi = np.unique(y, return_inverse=True)
    return gi.reshape(-1).astype(np.int64), yi.reshape(-1).astype(np.int64)


def false_negative_rates(pseudo_labels: ArrayLike, true_labels: ArrayLike) -> tuple[float, float]:
    """Mean true positive / true negative rates (MTPR, MTNR) of pseudo labels, in percent.

    With ground truth ``g`` and pseudo labels ``y``, for anchor ``i``:
    ``TPR_i = |{j≠i: g_j=g_i, y_j=y_i}| / |{j≠i: g_j=g_i}|`` and
    ``TNR_i = |{j: g_j≠g_i, y_j≠y_i}| / |{j: g_j≠g_i}|``; MTPR / MTNR average them over anchors.
    Anchors whose denominator is 0 (the only member of their class for TPR; every sample in one
    class for TNR) are left out of that average; NaN when no anchor remains. Computed exactly
    from the class × cluster contingency counts (no N × N matrix). Instance labels give (0, 100).
    """
    gi, yi = _label_codes(pseudo_labels, true_labels)
    num = gi.shape[0]
    if num == 0:
        raise ValueError('false_negative_rates needs at least one sample')
    num_clusters = int(yi.max()) + 1
    class_size = np.bincount(gi)
    cluster_size = np.bincount(yi)
    cells, cell_size = np.unique(gi * num_clusters + yi, return_counts=True)
    cell_class, cell_cluster = cells // num_clusters, cells % num_clusters
    a = class_size[cell_class].astype(np.float64)  # |class of the cell|
    b = cluster_size[cell_cluster].astype(np.float64)  # |cluster of the cell|
    n = cell_size.astype(np.float64)  # anchors in the cell, all sharing TPR_i and TNR_i

    pos_den = a - 1
    pos_ok = pos_den > 0
    tpr_anchors = n[pos_ok].sum()
    mtpr = (n[pos_ok] * (n[pos_ok] - 1) / pos_den[pos_ok]).sum() / tpr_anchors \
        if tpr_anchors > 0 else float('nan')

    neg_den = num - a
    neg_ok = neg_den > 0
    tnr_anchors = n[neg_ok].sum()
    # |{j: g_j≠g_i, y_j≠y_i}| = N - |class| - |cluster| + |class ∩ cluster| (inclusion-exclusion)
    true_neg = num - a - b + n
    mtnr = (n[neg_ok] * true_neg[neg_ok] / neg_den[neg_ok]).sum() / tnr_anchors \
        if tnr_anchors > 0 else float('nan')
    return float(100.0 * mtpr), float(100.0 * mtnr)


def pair_precision_recall(pseudo_labels: ArrayLike, true_labels: ArrayLike) -> tuple[float, float]:
    """Precision and recall (%) of the pairs that pseudo labels flag, pooled over all pairs.

    A pair i ≠ j is flagged when ``y_i = y_j`` (unaccepted samples carry labels of their own, so
    flag nothing), correct when also ``g_i = g_j``: precision = correct / flagged, recall =
    correct / same-class pairs; NaN where undefined. From the contingency counts (no N × N matrix).
    """
    gi, yi = _label_codes(pseudo_labels, true_labels)

    def pairs(codes: np.ndarray) -> float:
        # np.unique, not bincount: class × cluster codes reach classes · N for unaccepted samples.
        counts = np.unique(codes, return_counts=True)[1].astype(np.float64)
        return float((counts * (counts - 1)).sum())

    cells = gi * (int(yi.max(initial=0)) + 1) + yi
    flagged, correct, same = pairs(yi), pairs(cells), pairs(gi)
    precision = 100.0 * correct / flagged if flagged > 0 else float('nan')
    recall = 100.0 * correct / same if same > 0 else float('nan')
    return precision, recall


def detection_precision_recall(counts: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Per-level precision and recall (%) of flagged false negatives; NaN where undefined.

    ``counts`` [L, 3]: flagged negatives, those of the anchor's class, and the anchor's
    same-class negatives (``ifnd.models.false_negatives.detector.false_negative_detection_counts``, summed). Precision
    = flagged of the class / flagged, recall = flagged of the class / same-class negatives.
    """
    counts = counts.detach().cpu().numpy() if isinstance(counts, Tensor) else np.asarray(counts)
    if counts.ndim != 2 or counts.shape[1] != 3:
        raise ValueError(f'counts must be [levels, 3], got shape {counts.shape}')
    flagged, correct, same = (counts[:, i].astype(np.float64) for i in range(3))
    with np.errstate(divide='ignore', invalid='ignore'):
        precision = np.where(flagged > 0, 100.0 * correct / flagged, np.nan)
        recall = np.where(same > 0, 100.0 * correct / same, np.nan)
    return precision, recall


def cluster_quality(true_labels: ArrayLike, pred_labels: ArrayLike) -> dict[str, float]:
    """NMI, AMI and ARI (fractions in [0, 1], ARI may be negative) of a clustering."""
    from sklearn.metrics import (adjusted_mutual_info_score, adjusted_rand_score,
                                 normalized_mutual_info_score)
    g = _labels_1d(true_labels, 'true_labels')
    y = _labels_1d(pred_labels, 'pred_labels')
    if y.shape != g.shape:
        raise ValueError(f'true_labels and pred_labels differ in length: {g.shape[0]} vs '
                         f'{y.shape[0]}')
    return {
        'nmi': float(normalized_mutual_info_score(g, y)),
        'ami': float(adjusted_mutual_info_score(g, y)),
        'ari': float(adjusted_rand_score(g, y)),
    }


def _as_tensor(x: ArrayLike) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x


def knn_classify(train_features: ArrayLike,
                 train_labels: ArrayLike,
                 test_features: ArrayLike,
                 num_classes: int,
                 k: int = 20,
                 temperature: float = 0.07,
                 chunk_size: int = 1024) -> Tensor:
    """Weighted kNN prediction ``[T]`` for the test features (InstDisc / DINO protocol).

    Cosine similarity to the training features, the top ``k`` neighbours vote for their class
    with weight ``exp(sim / temperature)``, and the class with the largest total wins (``k`` and
    ``temperature`` checked as the training hook's: ``check_knn``). Test rows
    are processed ``chunk_size`` at a time (memory O(chunk_size * N_train)).
    """
    train = _as_tensor(train_features)
    labels = _as_tensor(train_labels)
    test = _as_tensor(test_features)
    if train.ndim != 2 or test.ndim != 2 or train.shape[1] != test.shape[1]:
        raise ValueError(f'train_features must be [N, D] and test_features [T, D], got '
                         f'{tuple(train.shape)} and {tuple(test.shape)}')
    if labels.shape != (train.shape[0], ):
        raise ValueError(f'train_labels must be [{train.shape[0]}], got {tuple(labels.shape)}')
    num_train = train.shape[0]
    k, temperature = check_knn(k, temperature, num_train)
    if chunk_size < 1 or num_classes < 1:
        raise ValueError('chunk_size and num_classes must be positive')
    device = train.device
    train_t = F.normalize(train.detach().float(), dim=1).t().contiguous()
    labels = labels.to(device=device, dtype=torch.long)
    if num_train > 0 and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f'train_labels must lie in [0, {num_classes})')
    predictions = torch.empty(test.shape[0], dtype=torch.long, device=device)
    for start in range(0, test.shape[0], chunk_size):
        chunk = F.normalize(test[start:start + chunk_size].detach().to(device).float(), dim=1)
        sim, index = (chunk @ train_t).topk(k, dim=1)
        votes = torch.zeros(chunk.shape[0], num_classes, dtype=torch.float32, device=device)
        # Each row's weights relative to its nearest neighbour's: the same vote, never exp overflow
        # (cos / T reaches 1000 at the smallest T).
        votes.scatter_add_(1, labels[index], ((sim - sim[:, :1]) / temperature).exp())
        predictions[start:start + chunk_size] = votes.argmax(dim=1)
    return predictions


def knn_accuracy(train_features: ArrayLike,
                 train_labels: ArrayLike,
                 test_features: ArrayLike,
                 test_labels: ArrayLike,
                 num_classes: int,
                 k: int = 20,
                 temperature: float = 0.07,
                 chunk_size: int = 1024) -> float:
    """Top-1 accuracy (percent) of :func:`knn_classify` on labelled test features."""
    pred = knn_classify(train_features, train_labels, test_features, num_classes, k, temperature,
                        chunk_size)
    target = _as_tensor(test_labels).to(device=pred.device, dtype=torch.long)
    if target.shape != pred.shape:
        raise ValueError(f'test_labels must be [{pred.shape[0]}], got {tuple(target.shape)}')
    if pred.numel() == 0:
        raise ValueError('knn_accuracy needs at least one test sample')
    return float((pred == target).double().mean() * 100.0)
