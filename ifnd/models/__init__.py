"""Models: backbones, necks, losses and algorithms.

Every module of the package is imported here, so the parts it registers (a base such as
``nnclr.py``, a detector) are known to the registry with no line added elsewhere.
"""
import importlib
import pkgutil

from .contrastive import ContrastiveAlgorithm, SimCLR
from .false_negatives import GloFND, GroundTruth, PseudoLabelBank, PseudoLabels, SupportViews
from .moco import MoCoV2
from .mocov3 import MoCoV3
from .presets import (FNC, IFND, PCL, DebiasedCL, DebiasedMoCo, HardNegativeCL, HardNegativeMoCo,
                      IFNDMoCo, IFNDMoCoV3, OracleElim, SupCon)
from .backbones import TimmBackbone, ViTBackbone
from .data_preprocessor import ContrastiveDataPreprocessor
from .encoder import Encoder, load_backbone_weights, load_encoder
from .losses import contrastive_loss, proto_nce_loss
from .necks import MLPNeck
from .classifier import ImageClassifier

__all__ = [
    'ContrastiveAlgorithm', 'SimCLR', 'IFND', 'SupCon', 'OracleElim', 'PCL', 'MoCoV2', 'IFNDMoCo', 'MoCoV3', 'IFNDMoCoV3',
    'PseudoLabelBank',
    'DebiasedCL', 'HardNegativeCL', 'DebiasedMoCo', 'HardNegativeMoCo', 'FNC',
    'PseudoLabels', 'SupportViews', 'GloFND', 'GroundTruth',
    'TimmBackbone', 'ViTBackbone', 'MLPNeck', 'ContrastiveDataPreprocessor', 'contrastive_loss',
    'proto_nce_loss', 'Encoder', 'load_encoder', 'load_backbone_weights',
    'ImageClassifier',
]
from .detection import MaskRCNN  # noqa: E402

__all__ += ['MaskRCNN']

for _module in pkgutil.walk_packages(__path__, prefix=f'{__name__}.'):
    importlib.import_module(_module.name)
