"""Class ids across splits: labels of an evaluated split re-expressed in the training split's ids.

Folder data sets number their classes per split (sorted folder names with images), so a class
missing from one split shifts every later id; predictions learned on the training split are
therefore compared with evaluation labels by class name, never by raw id.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def class_id_map(train_classes: Sequence[str] | None, eval_classes: Sequence[str] | None,
                 evaluated: str = 'the evaluated images (validation split)',
                 metric: str = 'accuracy') -> np.ndarray | None:
    """Map from the evaluated split's class ids to the training split's by name; None when equal.

    Raises ``ValueError`` naming the evaluated classes the training split does not have.
    """
    if train_classes is None or eval_classes is None or list(train_classes) == list(eval_classes):
        return None
    position = {name: i for i, name in enumerate(train_classes)}
    missing = [name for name in eval_classes if name not in position]
    if missing:
        shown = ', '.join(map(repr, missing[:5])) + (f' and {len(missing) - 5} more'
                                                      if len(missing) > 5 else '')
        raise ValueError(f'{evaluated} have classes the training split '
                         f'lacks: {shown}; class ids would not match, so the {metric} would be '
                         'meaningless. Give both data sets the same class list, e.g. '
                         'classes=[...] on ImageFolder, or the same class folders')
    return np.asarray([position[name] for name in eval_classes], dtype=np.int64)


def match_eval_classes(train_classes: Sequence[str] | None, eval_set: Any,
                       evaluated: str = 'the evaluated images (validation split)',
                       metric: str = 'accuracy') -> bool:
    """Re-express ``eval_set``'s labels (in place) in the training split's class ids, by name.

    Data sets without ``classes`` are left alone; returns whether labels were changed. Unknown
    labels (-1) stay -1. Afterwards ``eval_set.classes`` is the training list, so a second call
    changes nothing.
    """
    mapping = class_id_map(train_classes, getattr(eval_set, 'classes', None), evaluated, metric)
    if mapping is None:
        return False
    labels = np.asarray(eval_set.labels, dtype=np.int64)
    known = labels >= 0
    matched = labels.copy()
    matched[known] = mapping[labels[known]]
    eval_set.labels = matched
    eval_set.classes = list(train_classes)
    if hasattr(eval_set, 'num_classes'):
        eval_set.num_classes = len(train_classes)
    return True
