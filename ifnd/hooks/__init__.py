"""Runner hooks: online kNN evaluation and pseudo-label assignment."""
from .knn_hook import KNNEvalHook
from .pseudo_label_hook import PseudoLabelHook

__all__ = ['KNNEvalHook', 'PseudoLabelHook']
