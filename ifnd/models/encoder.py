"""The pre-trained encoder used by every evaluation: a backbone, its preprocessing and its weights.

Weights come from any of: a checkpoint written by training (the algorithm's ``backbone.*``), a
backbone-only file (``tools/extract_backbone.py``), a MoCo/PCL-style ``state_dict`` with
``module.encoder_q.*`` keys, or a torchvision/timm ResNet state dict.
"""
import copy

import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.model import BaseModel

from ifnd.engine.checkpoint import mmengine_checkpoint_globals
from ifnd.registry import MODELS

# Key prefixes of the backbone inside known checkpoint layouts, tried in this order.
BACKBONE_PREFIXES = ('backbone.model.', 'module.encoder_q.', 'encoder_q.', 'module.backbone.model.',
                     'module.', 'model.')
# Keys that belong to a classifier or projection head, never to the backbone.
HEAD_PREFIXES = ('fc.', 'head.', 'classifier.')
IMAGENET_PREPROCESSOR = dict(type='ContrastiveDataPreprocessor', mean=(0.485, 0.456, 0.406),
                             std=(0.229, 0.224, 0.225))


@MODELS.register_module()
class Encoder(BaseModel):
    """A backbone alone with its data preprocessor: features f(x) for evaluation."""

    def __init__(self, backbone: dict, data_preprocessor: dict | None = None,
                 init_cfg: dict | None = None) -> None:
        super().__init__(data_preprocessor=MODELS.build(data_preprocessor or IMAGENET_PREPROCESSOR),
                         init_cfg=init_cfg)
        self.backbone = MODELS.build(backbone)

    def extract_feat(self, inputs: torch.Tensor) -> torch.Tensor:
        """Backbone features f(x)."""
        return self.backbone(inputs)

    @torch.no_grad()
    def clustering_features(self, inputs: torch.Tensor, feature: str = 'f') -> torch.Tensor:
        """L2-normalised backbone features (an encoder has no projection head, so no 'z')."""
        if feature != 'f':
            raise ValueError(f"an Encoder gives backbone features only (feature='f'), got {feature!r}")
        return F.normalize(self.extract_feat(inputs).float(), dim=1)

    def forward(self, inputs, data_samples=None, mode: str = 'tensor'):
        """Backbone features of the first view."""
        views = inputs[0] if isinstance(inputs, (list, tuple)) else inputs
        return self.extract_feat(views)


def load_checkpoint_file(path: str) -> dict:
    """A checkpoint loaded with ``weights_only=True`` (mmengine's plain-data state allowed)."""
    try:
        with torch.serialization.safe_globals(mmengine_checkpoint_globals()):
            obj = torch.load(path, map_location='cpu', weights_only=True)
    except FileNotFoundError:
        raise FileNotFoundError(f'checkpoint not found: {path}') from None
    if not isinstance(obj, dict):
        raise ValueError(f'{path} holds a {type(obj).__name__}, not a state dict or checkpoint')
    return obj


def backbone_state(checkpoint: dict) -> dict[str, torch.Tensor]:
    """The backbone's weights under timm/torchvision key names, from any supported layout."""
    state = checkpoint.get('state_dict', checkpoint.get('model', checkpoint))
    state = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    for prefix in BACKBONE_PREFIXES:
        if any(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            break
    return {k: v for k, v in state.items() if not k.startswith(HEAD_PREFIXES)}


def load_backbone_weights(backbone: torch.nn.Module, path: str) -> None:
    """Load a checkpoint's backbone into a ``TimmBackbone``, failing loudly on any mismatch."""
    state = backbone_state(load_checkpoint_file(path))
    target = backbone.model.state_dict()
    missing = sorted(set(target) - set(state))
    unexpected = sorted(set(state) - set(target))
    wrong_shape = sorted(f'{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(target[k].shape)}'
                         for k in set(state) & set(target) if state[k].shape != target[k].shape)
    if missing or unexpected or wrong_shape:
        def listing(keys):
            return ', '.join(keys[:12]) + (f' ... ({len(keys)} in all)' if len(keys) > 12 else '')
        raise ValueError(
            f'{path} does not match the backbone {type(backbone.model).__name__}: '
            f'missing keys [{listing(missing)}]; unexpected keys [{listing(unexpected)}]; '
            f'shape mismatches [{listing(wrong_shape)}]. Check the backbone name and options '
            '(e.g. model_name, cifar_stem) against the checkpoint')
    backbone.model.load_state_dict(state, strict=True)


def checkpoint_model_config(checkpoint: dict) -> dict | None:
    """The model config a checkpoint carries: training's full config, or a backbone-only file's."""
    meta = checkpoint.get('meta') or {}
    if isinstance(meta.get('cfg'), str):
        return Config.fromstring(meta['cfg'], '.py').model.to_dict()
    if isinstance(meta.get('model'), dict):
        return copy.deepcopy(meta['model'])
    return None


def load_encoder(path: str, model_name: str | None = None, data_preprocessor: dict | None = None,
                 default_backbone: dict | None = None, **backbone_kwargs) -> Encoder:
    """An ``Encoder`` with a checkpoint's backbone weights.

    The backbone's settings come from the checkpoint when it carries them (our checkpoints do);
    other files (MoCo, torchvision, timm) need ``model_name`` and, for small images,
    ``cifar_stem=True``, or a ``default_backbone`` config to read them as. Explicit arguments
    override what the checkpoint says.
    """
    checkpoint = load_checkpoint_file(path)
    model_cfg = checkpoint_model_config(checkpoint) or {}
    backbone = copy.deepcopy(dict(model_cfg.get('backbone') or default_backbone
                                  or dict(type='TimmBackbone')))
    if model_name is not None:
        backbone['model_name'] = model_name
    backbone.update(backbone_kwargs)
    if 'model_name' not in backbone:
        raise ValueError(f'{path} carries no model config: pass model_name (e.g. "resnet50") and, '
                         'for 28/32-pixel images, cifar_stem=True')
    backbone['pretrained'] = False
    encoder = Encoder(backbone, data_preprocessor or model_cfg.get('data_preprocessor'))
    load_backbone_weights(encoder.backbone, path)
    return encoder
