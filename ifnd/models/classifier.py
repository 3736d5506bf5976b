"""A pre-trained backbone plus a linear classifier: linear evaluation and semi-supervised fine-tuning.

``frozen=True`` is the linear protocol: the backbone gets no gradients and stays in eval mode even
when the runner calls ``train()``, so neither its weights nor its BN statistics change; only the
head learns. ``frozen=False`` is the semi-supervised protocol: everything is fine-tuned (give the
backbone its own learning rate with ``paramwise_cfg=dict(custom_keys={'backbone': ...})``).

The head is a single ``Linear`` by default, as in the paper ("a fully connected layer followed by
softmax") and in MoCo/PCL, whose lr 10 recipe is calibrated for an un-normalised head.
``head_norm=True`` puts a BatchNorm without affine parameters in front of it (MAE's linear probe):
it makes the head insensitive to the feature scale, and then wants a much smaller learning rate.
"""
from __future__ import annotations

import inspect
import logging

import torch
import torch.nn.functional as F
from mmengine.logging import print_log
from mmengine.model import BaseModel
from torch import nn

from ifnd.fileio.checkpoint_layouts import backbone_state
from ifnd.registry import MODELS

from .architecture import checkpoint_architecture
from .encoder import (IMAGENET_PREPROCESSOR, backbone_fits, backbone_num_heads, load_backbone_weights,
                      load_checkpoint_file, resolve_backbone_config, stated_num_heads)


# How a backbone trains, not the shapes of its weights: kept from the configured backbone when the
# checkpoint's architecture replaces it (a fine-tuning recipe's stochastic depth, a trainable
# patch projection).
TRAINING_SETTINGS = ('drop_path_rate', 'frozen_patch_embed', 'compile', 'channels_last')


def _training_settings(configured: dict, backbone: dict) -> dict:
    """The configured backbone's training settings that the checkpoint's backbone type takes."""
    takes = inspect.signature(MODELS.get(backbone['type'])).parameters
    return {key: configured[key] for key in TRAINING_SETTINGS if key in configured and key in takes}


def _fits(backbone: dict, checkpoint: dict, source: str, stated_heads: int | None) -> bool:
    """Whether a backbone config has the checkpoint's keys and shapes, and the attention heads
    it states (``stated_heads``: its config's, MoCo v3's 12, which no shape shows)."""
    if not backbone_fits(backbone, backbone_state(checkpoint, source)):
        return False
    return stated_heads is None or backbone_num_heads(backbone) in (None, stated_heads)


@MODELS.register_module()
class ImageClassifier(BaseModel):
    """Backbone + linear head trained with cross-entropy; ``frozen`` selects the linear protocol.

    ``pretrained`` is any checkpoint :func:`load_backbone_weights` reads (training checkpoints,
    backbone-only files, MoCo, PCL, HCSC, solo-learn, mmselfsup, VISSL, DINO, torchvision/timm,
    transformers ViTs); ``tools/train.py`` turns a model zoo name, ``zoo:NAME``, into its
    downloaded, verified file. ``backbone``
    is used when it fits the checkpoint's weights (and the attention heads the file states);
    otherwise the checkpoint's own backbone (its config, or the ResNet or ViT its weights
    describe) replaces it, with a warning. ``pretrained_num_heads`` gives the attention heads of
    a ViT read from its weights alone, which no shape shows, where its file does not state them.
    ``predict`` returns one ``dict(pred_score, gt_label)`` per sample for the ``Accuracy`` metric.
    """

    def __init__(self, backbone: dict, num_classes: int, pretrained: str | None = None,
                 frozen: bool = True, head_norm: bool = False, data_preprocessor: dict | None = None,
                 init_cfg: dict | None = None, pretrained_num_heads: int | None = None) -> None:
        super().__init__(data_preprocessor=MODELS.build(data_preprocessor or IMAGENET_PREPROCESSOR),
                         init_cfg=init_cfg)
        if num_classes < 1:
            raise ValueError(f'num_classes must be >= 1, got {num_classes}')
        checkpoint = load_checkpoint_file(pretrained) if pretrained else None
        architecture, stated = None, pretrained_num_heads
        if checkpoint is not None and stated is None and backbone_num_heads(backbone) is not None:
            architecture = checkpoint_architecture(checkpoint, pretrained)
            stated = stated_num_heads(checkpoint, architecture)
        if checkpoint is not None and not _fits(backbone, checkpoint, pretrained, stated):
            configured, backbone = backbone, resolve_backbone_config(
                checkpoint, pretrained, architecture=architecture, num_heads=pretrained_num_heads)
            kept = _training_settings(configured, backbone)
            backbone.update(kept)
            print_log(f'ImageClassifier: model.backbone {dict(configured)} does not fit {pretrained}; '
                      f'using the checkpoint\'s backbone {backbone}'
                      + (f' (the configured {", ".join(kept)} kept)' if kept else ''),
                      logger='current', level=logging.WARNING)
        self.backbone = MODELS.build(backbone)
        self.num_classes = num_classes
        self.pretrained = pretrained
        self.frozen = frozen
        feat_dim = self.backbone.out_dim
        norm = [nn.BatchNorm1d(feat_dim, affine=False, eps=1e-6)] if head_norm else []
        self.head = nn.Sequential(*norm, nn.Linear(feat_dim, num_classes))
        self._init_head()
        if pretrained:
            # Loaded here too, so a model built outside a runner is complete and a wrong
            # checkpoint fails before any data is read.
            load_backbone_weights(self.backbone, pretrained, checkpoint)
        elif frozen:
            print_log('ImageClassifier: frozen backbone without `pretrained` weights: this '
                      'evaluates a randomly initialised encoder. Pass '
                      '--cfg-options model.pretrained=CKPT', logger='current', level=logging.WARNING)
        if frozen:
            self.backbone.requires_grad_(False)
            self.backbone.eval()

    def _init_head(self) -> None:
        linear = self.head[-1]
        nn.init.normal_(linear.weight, std=0.01)  # MoCo's linear-classifier initialisation
        nn.init.zeros_(linear.bias)

    def init_weights(self) -> None:
        """Initialise the head; the backbone keeps its pre-trained weights."""
        if self.is_init:  # mmengine initialises once; a second call must not reset a trained head
            return
        super().init_weights()
        self._init_head()

    def train(self, mode: bool = True) -> ImageClassifier:
        """Set training mode; a frozen backbone stays in eval mode (fixed BN statistics)."""
        super().train(mode)
        if self.frozen:
            self.backbone.eval()
        return self

    def extract_feat(self, inputs: torch.Tensor) -> torch.Tensor:
        """Backbone features f(x); without autograd when the backbone is frozen."""
        if self.frozen:
            with torch.no_grad():
                return self.backbone(inputs)
        return self.backbone(inputs)

    @torch.no_grad()
    def clustering_features(self, inputs: torch.Tensor, feature: str = 'f') -> torch.Tensor:
        """L2-normalised backbone features, as feature extraction reads every model's."""
        if feature != 'f':
            raise ValueError(f"a classifier gives backbone features only (feature='f'), got {feature!r}")
        return F.normalize(self.backbone(inputs).float(), dim=1)

    def forward(self, inputs: torch.Tensor | list[torch.Tensor], data_samples: dict | None = None,
                mode: str = 'tensor') -> torch.Tensor | dict[str, torch.Tensor] | list[dict]:
        """Logits (``'tensor'``), the cross-entropy loss (``'loss'``) or per-sample predictions."""
        views = inputs[0] if isinstance(inputs, (list, tuple)) else inputs
        logits = self.head(self.extract_feat(views))
        if mode == 'tensor':
            return logits
        labels = self._labels(data_samples, len(logits))
        if mode == 'loss':
            return {'loss': F.cross_entropy(logits, labels)}
        if mode == 'predict':
            # One device-to-host copy per batch; the metric then reads plain CPU tensors.
            scores, labels = logits.detach().float().cpu(), labels.cpu()
            return [dict(pred_score=s, gt_label=y) for s, y in zip(scores, labels)]
        raise ValueError(f"mode must be 'loss', 'predict' or 'tensor', got {mode!r}")

    def _labels(self, data_samples: dict | None, batch: int) -> torch.Tensor:
        if not data_samples or 'label' not in data_samples:
            raise ValueError("ImageClassifier needs ground-truth labels: the batch has no 'label'")
        labels = torch.as_tensor(data_samples['label']).long().view(-1)
        if labels.numel() != batch:
            raise ValueError(f'{labels.numel()} labels for a batch of {batch} images')
        if bool(((labels < 0) | (labels >= self.num_classes)).any()):  # one device sync
            raise ValueError(f'labels must lie in [0, {self.num_classes}) (num_classes); got '
                             f'[{int(labels.min())}, {int(labels.max())}]. Unlabelled images (-1) '
                             'cannot train a classifier: check the data set or num_classes')
        return labels
