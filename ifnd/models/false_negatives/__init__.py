"""False-negative handling as parts: detectors flag, treatments and weightings act on the flags.

- ``label_bank.py``: IFND's per-sample pseudo labels, filled by ``PseudoLabelHook``.
- ``detector.py``: the batch a detector sees and the base of all detectors.
- ``pseudo_labels.py`` (IFND), ``support_views.py`` (FNC), ``glofnd.py`` (GloFND), ``hcsc.py``
  (HCSC's instance selection), ``ground_truth.py`` (the oracles): one detector each.
- Any detector takes an acceptance scheme (``ifnd/clustering/acceptance.py``, below the models),
  ranking the samples in a seeded random order.
- ``treatment.py``: elimination and attraction of flagged negatives; debiased and hard weighting
  of the rest.

The checks of the parts' numeric settings live on the ground floor, ``ifnd/settings.py``.
"""
from .detector import DetectorNeeds, FalseNegativeDetector, NegativeBatch
from .glofnd import GloFND
from .ground_truth import GroundTruth
from .hcsc import HCSCSelection
from .label_bank import PseudoLabelBank
from .pseudo_labels import PseudoLabels
from .sample_state import PerSampleState
from .support_views import SupportViews
from .treatment import TREATMENTS, WEIGHTINGS, build_weighting, check_parts, flagged_loss

__all__ = [
    'DetectorNeeds',
    'FalseNegativeDetector', 'NegativeBatch', 'GloFND', 'GroundTruth', 'HCSCSelection', 'PseudoLabelBank', 'PseudoLabels', 'PerSampleState',
    'SupportViews', 'TREATMENTS', 'WEIGHTINGS', 'build_weighting', 'check_parts', 'flagged_loss',
]
