"""Runner hooks: online kNN evaluation and pseudo-label assignment."""
from .knn_hook import KNNEvalHook
from .pseudo_label_hook import PseudoLabelHook
from .eval_hooks import FrozenBackboneCheckHook, PreciseBNHook, recompute_bn_statistics, state_fingerprint

__all__ = ['KNNEvalHook', 'PseudoLabelHook', 'FrozenBackboneCheckHook', 'PreciseBNHook',
           'recompute_bn_statistics', 'state_fingerprint']
