"""PASCAL VOC 2007 classification with linear SVMs on frozen features (fair-ssl / PCL protocol).

One ``LinearSVC`` per class on L2-normalised features (class weights {1: 2, -1: 1}, squared hinge,
intercept, dual solver, at most 2000 iterations), as in the fair self-supervision benchmark
(Goyal et al. 2019) that PCL and IFND follow. Per class the cost is chosen by k-fold
cross-validation on trainval, scored with scikit-learn's average precision (the benchmark's
``train_svm_kfold.py``). Test AP leaves out the "difficult" images of the class.

Average precision comes in three definitions (``interpolation``):

* ``'all-point'`` (default): the area under the interpolated precision envelope
  ``p(r) = max_{r' >= r} precision(r')``, summed over every recall step. This is what the
  benchmark code computes (fair-ssl's ``svm_helper.calculate_ap``, reused verbatim by PCL's
  ``eval_svm_voc.py`` and by VISSL), and the VOC devkit since 2010; VOC07 figures quoted by
  MoCo/PCL/IFND come from it.
* ``'11-point'``: the VOC2007 devkit's ``VOCevalcls``, the mean of that envelope at recall
  0, 0.1, ..., 1. Usually within a fraction of a point of ``'all-point'``.
* ``'none'``: non-interpolated, ``sum_n (R_n - R_{n-1}) P_n``; equals scikit-learn's
  ``average_precision_score`` (the cross-validation score).

Two test mAPs are reported: with the costs chosen by cross-validation (the benchmark's number),
and the best over the cost grid of the test mAP with one cost for all classes (what PCL's script
prints, and what several papers quote; it selects on the test set, so it is optimistic).
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from torch import Tensor

__all__ = ['AP_DEFINITIONS', 'DEFAULT_SVM_COSTS', 'VOC07SVMs', 'voc07_average_precision',
           'voc07_mean_average_precision', 'train_svms', 'evaluate_voc07']

AP_DEFINITIONS = {
    'all-point': 'all-point interpolated AP (area under the precision envelope; fair-ssl/PCL code, '
                 'VOC devkit since 2010)',
    '11-point': '11-point interpolated AP (VOC2007 devkit)',
    'none': 'non-interpolated AP (scikit-learn average_precision_score)',
}
# The useful range for L2-normalised features (PCL's default is 0.5); widen it with --costs.
DEFAULT_SVM_COSTS = (0.01, 0.1, 0.5, 1.0, 10.0)


def _as_numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x)


def _precision_recall_steps(scores: np.ndarray, positive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Precision and recall at each distinct score threshold, from the highest score down."""
    order = np.argsort(-scores, kind='mergesort')
    ranked, hits = scores[order], positive[order]
    tp = np.cumsum(hits, dtype=np.float64)
    fp = np.cumsum(~hits, dtype=np.float64)
    # Tied scores form one threshold: the curve is only defined after the whole tie block, which
    # makes AP independent of how a sort orders ties (scikit-learn does the same).
    last = np.r_[np.flatnonzero(np.diff(ranked)), len(ranked) - 1]
    tp, fp = tp[last], fp[last]
    return tp / (tp + fp), tp / tp[-1]


def voc07_average_precision(scores, targets, interpolation: str = 'all-point') -> float:
    """Average precision (percent) of one class's scores against VOC targets in {1, -1, 0}.

    Images marked 0 (difficult) are left out, as in the VOC devkit and the fair-ssl benchmark.
    ``interpolation`` is ``'all-point'`` (the benchmark code's definition), ``'11-point'``
    (VOC2007 devkit) or ``'none'`` (scikit-learn's ``average_precision_score``); see the module
    docstring.
    """
    scores = _as_numpy(scores).astype(np.float64).reshape(-1)
    targets = _as_numpy(targets).reshape(-1)
    if scores.shape != targets.shape:
        raise ValueError(f'scores and targets differ in length: {scores.shape[0]} vs {targets.shape[0]}')
    if not np.isin(targets, (1, -1, 0)).all():
        raise ValueError('VOC targets must be 1 (present), -1 (absent) or 0 (difficult)')
    if not np.isfinite(scores).all():
        raise ValueError('scores must be finite')
    if interpolation not in AP_DEFINITIONS:
        raise ValueError(f'interpolation must be one of {list(AP_DEFINITIONS)}, got {interpolation!r}')
    keep = targets != 0
    positive = targets[keep] == 1
    if not positive.any():
        raise ValueError('average precision is undefined without a positive (non-difficult) image')
    precision, recall = _precision_recall_steps(scores[keep], positive)
    if interpolation == '11-point':
        # Thresholds k/10 and recalls tp/npos are both correctly rounded divisions, so a recall
        # of exactly 3/10 compares equal to the 0.3 threshold (0.1 * 3 would not).
        thresholds = np.arange(11) / 10
        envelope = [precision[recall >= t].max() if (recall >= t).any() else 0.0 for t in thresholds]
        return float(100.0 * np.mean(envelope))
    if interpolation == 'all-point':
        precision = np.maximum.accumulate(precision[::-1])[::-1]
    steps = np.diff(np.r_[0.0, recall])
    return float(100.0 * np.sum(steps * precision))


def voc07_mean_average_precision(scores, targets,
                                 interpolation: str = 'all-point') -> tuple[float, np.ndarray]:
    """Mean AP (percent) over classes and the per-class APs, from ``[N, C]`` scores and targets."""
    scores, targets = _as_numpy(scores), _as_numpy(targets)
    if scores.ndim != 2 or scores.shape != targets.shape:
        raise ValueError(f'scores and targets must both be [N, C], got {scores.shape} and {targets.shape}')
    aps = np.array([voc07_average_precision(scores[:, c], targets[:, c], interpolation)
                    for c in range(scores.shape[1])])
    return float(aps.mean()), aps


def _normalise(feats) -> np.ndarray:
    # float64 once here, rather than a copy inside every liblinear fit.
    feats = _as_numpy(feats).astype(np.float64)
    if feats.ndim != 2:
        raise ValueError(f'features must be [N, D], got shape {feats.shape}')
    return feats / np.maximum(np.linalg.norm(feats, axis=1, keepdims=True), 1e-12)


def _svm_labels(targets: np.ndarray, difficult: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows to train on and their labels in {1, -1} for one class."""
    if difficult == 'negative':
        return np.ones(len(targets), dtype=bool), np.where(targets == 1, 1, -1)
    keep = targets != 0
    return keep, np.where(targets[keep] == 1, 1, -1)


def _fit_one(feats: np.ndarray, labels: np.ndarray, cost: float, cv_folds: int, max_iter: int,
             seed: int):
    """Cross-validated AP (percent) of one cost, and the SVM fitted on all rows."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.svm import LinearSVC

    clf = LinearSVC(C=cost, class_weight={1: 2, -1: 1}, intercept_scaling=1.0, penalty='l2',
                    loss='squared_hinge', tol=1e-4, dual=True, max_iter=max_iter, random_state=seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always', ConvergenceWarning)
        # Unshuffled stratified folds: what cross_val_score(cv=3) does in the benchmark.
        cv_scores = cross_val_score(clf, feats, labels, cv=StratifiedKFold(cv_folds),
                                    scoring='average_precision')
        clf.fit(feats, labels)
    not_converged = sum(issubclass(w.category, ConvergenceWarning) for w in caught)
    cv_ap = float(100.0 * np.nanmean(cv_scores)) if np.isfinite(cv_scores).any() else float('nan')
    return cv_ap, clf, not_converged


@dataclass
class VOC07SVMs:
    """One linear SVM per class and cost, the cross-validated APs and the chosen cost per class."""

    costs: list[float]
    cv_ap: np.ndarray  # [classes, costs], percent
    chosen: np.ndarray  # [classes], index into costs
    models: list[list] = field(repr=False)  # [classes][costs] LinearSVC fitted on all of trainval
    not_converged: int = 0  # fits (CV folds included) that stopped at max_iter

    @property
    def chosen_costs(self) -> list[float]:
        """The cost chosen for each class."""
        return [self.costs[i] for i in self.chosen]

    def decision_function(self, feats, cost_index: int | None = None) -> np.ndarray:
        """SVM scores ``[N, classes]``: with each class's chosen cost, or one cost for all."""
        feats = _normalise(feats)
        return np.stack([row[self.chosen[c] if cost_index is None else cost_index].decision_function(feats)
                         for c, row in enumerate(self.models)], axis=1)


def train_svms(train_feats, train_targets, costs: Sequence[float] = DEFAULT_SVM_COSTS,
               cv_folds: int = 3, train_difficult: str = 'negative', n_jobs: int = 1,
               max_iter: int = 2000, seed: int = 0) -> VOC07SVMs:
    """Per-class linear SVMs for every cost, the cost chosen per class by cross-validated AP.

    Features are L2-normalised here. ``train_difficult='negative'`` trains on difficult images
    as negatives, as the benchmark's full-data script does; ``'ignore'`` leaves them out (its
    low-shot script, VISSL). ``n_jobs`` fits (class, cost) pairs in that many processes
    (liblinear's random state is global, so threads would make fits irreproducible).
    """
    from joblib import Parallel, delayed

    feats = _normalise(train_feats)
    targets = _as_numpy(train_targets)
    if targets.ndim != 2 or len(targets) != len(feats):
        raise ValueError(f'train_targets must be [{len(feats)}, classes], got shape {targets.shape}')
    costs = [float(c) for c in costs]
    if not costs or min(costs) <= 0:
        raise ValueError(f'costs must be a non-empty list of positive numbers, got {costs}')
    if train_difficult not in ('negative', 'ignore'):
        raise ValueError(f"train_difficult must be 'negative' or 'ignore', got {train_difficult!r}")
    if cv_folds < 2:
        raise ValueError(f'cv_folds must be >= 2, got {cv_folds}')
    jobs = []
    for c in range(targets.shape[1]):
        rows, labels = _svm_labels(targets[:, c], train_difficult)
        num_pos, num_neg = int((labels == 1).sum()), int((labels == -1).sum())
        if min(num_pos, num_neg) < cv_folds:
            raise ValueError(f'class {c} has {num_pos} positive and {num_neg} negative training images; '
                             f'{cv_folds}-fold cross-validation needs at least {cv_folds} of each')
        class_feats = feats if rows.all() else feats[rows]
        jobs += [(class_feats, labels, cost) for cost in costs]
    results = Parallel(n_jobs=n_jobs)(
        delayed(_fit_one)(f, y, cost, cv_folds, max_iter, seed) for f, y, cost in jobs)
    num_classes, num_costs = targets.shape[1], len(costs)
    cv_ap = np.array([r[0] for r in results]).reshape(num_classes, num_costs)
    models = [[results[c * num_costs + k][1] for k in range(num_costs)] for c in range(num_classes)]
    # The first of equal CV scores wins, as the benchmark's argmax; NaN rows fall back to cost 0.
    chosen = np.array([int(np.nanargmax(row)) if np.isfinite(row).any() else 0 for row in cv_ap])
    return VOC07SVMs(costs, cv_ap, chosen, models, sum(r[2] for r in results))


def evaluate_voc07(train_feats, train_targets, test_feats, test_targets,
                   costs: Sequence[float] = DEFAULT_SVM_COSTS, cv_folds: int = 3,
                   train_difficult: str = 'negative', n_jobs: int = 1,
                   class_names: Sequence[str] | None = None, max_iter: int = 2000,
                   seed: int = 0) -> dict:
    """Train the SVMs on trainval and report test mAP (percent) under every AP definition.

    ``map_cv`` uses each class's cross-validated cost (the benchmark's figure);
    ``map_best_over_costs`` is the maximum over the cost grid of the test mAP with one cost for
    all classes (PCL's printed figure; selected on the test set). Keys of the per-definition
    dicts are those of ``AP_DEFINITIONS``.
    """
    svms = train_svms(train_feats, train_targets, costs, cv_folds, train_difficult, n_jobs,
                      max_iter, seed)
    test_targets = _as_numpy(test_targets)
    num_classes = test_targets.shape[1]
    names = list(class_names) if class_names is not None else [str(c) for c in range(num_classes)]
    if len(names) != num_classes or len(svms.models) != num_classes:
        raise ValueError(f'train ({len(svms.models)}), test ({num_classes}) and class_names '
                         f'({len(names)}) disagree on the number of classes')
    feats = _normalise(test_feats)
    # Scores of every class under every cost: [costs, N, classes]; AP needs nothing else.
    scores = np.stack([svms.decision_function(feats, k) for k in range(len(svms.costs))])
    chosen_scores = scores[svms.chosen, :, np.arange(num_classes)].T
    result = dict(
        classes=names, costs=svms.costs, cv_folds=cv_folds, train_difficult=train_difficult,
        ap_definitions=dict(AP_DEFINITIONS),
        chosen_costs=dict(zip(names, svms.chosen_costs)),
        cv_ap={n: dict(zip(map(str, svms.costs), map(float, row))) for n, row in zip(names, svms.cv_ap)},
        map_cv={}, per_class_ap={}, map_per_cost={}, map_best_over_costs={}, best_cost={},
        not_converged=svms.not_converged,
    )
    for definition in AP_DEFINITIONS:
        mean_ap, aps = voc07_mean_average_precision(chosen_scores, test_targets, definition)
        result['map_cv'][definition] = mean_ap
        result['per_class_ap'][definition] = dict(zip(names, map(float, aps)))
        per_cost = [voc07_mean_average_precision(s, test_targets, definition)[0] for s in scores]
        best = int(np.argmax(per_cost))
        result['map_per_cost'][definition] = dict(zip(map(str, svms.costs), per_cost))
        result['map_best_over_costs'][definition] = per_cost[best]
        result['best_cost'][definition] = svms.costs[best]
    return result
