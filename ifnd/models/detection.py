"""Mask R-CNN for COCO transfer, built from torchvision's detection components around our ResNets.

Two architectures, as in detectron2 (the papers' protocol):

- ``C4``: the RPN and RoIAlign run on res4 (stride 16); the RoI head is res5 on 14x14 RoI
  features (optionally followed by one extra norm layer, MoCo's choice), average-pooled for the box
  predictor and upsampled 2x by a deconvolution for 14x14 masks.
- ``FPN``: res2-res5 with a feature pyramid and a max-pooled P6; torchvision's two-FC box head on
  7x7 RoIs and four-conv mask head on 14x14 RoIs.

The backbone (and, in C4, res5 in the RoI head) comes from a pre-training checkpoint through the
shared encoder loader; ``norm`` picks SyncBN, BN or frozen BN for every ResNet norm layer.
"""
from __future__ import annotations

import copy
from collections import OrderedDict

import torch
from mmengine.model import BaseModel
from mmengine.structures import InstanceData
from timm.layers import freeze_batch_norm_2d
from torch import nn
from torchvision.models.detection import MaskRCNN as TorchvisionMaskRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.backbone_utils import BackboneWithFPN
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor
from torchvision.models.detection.mask_rcnn import MaskRCNNPredictor
from torchvision.models.detection.rpn import RPNHead
from torchvision.ops import MultiScaleRoIAlign, roi_align
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool

from ifnd.models.encoder import load_encoder
from ifnd.registry import MODELS

NORMS = ('SyncBN', 'BN', 'FrozenBN')
ARCHS = ('C4', 'FPN')
RESNET_STAGES = ('layer1', 'layer2', 'layer3', 'layer4')
MASK_THRESHOLD = 0.5  # pasted mask probabilities above this are the instance (detectron2's value)


class AlignedRoIPool(MultiScaleRoIAlign):
    """RoIAlign on one feature map with half-pixel alignment (detectron2's ROIAlignV2).

    A ``MultiScaleRoIAlign`` to torchvision's detection model (which checks the type); its own
    pooling is not aligned.
    """

    def __init__(self, output_size: int, stride: int, sampling_ratio: int = 0) -> None:
        super().__init__(['0'], output_size, sampling_ratio)
        self.stride = stride

    def forward(self, features: dict[str, torch.Tensor], boxes: list[torch.Tensor],
                image_shapes: list[tuple[int, int]]) -> torch.Tensor:
        """RoI features ``[sum(len(b)), C, S, S]`` for the boxes of each image."""
        feature = features['0']
        return roi_align(feature, [b.to(feature.dtype) for b in boxes], self.output_size,
                         spatial_scale=1.0 / self.stride, sampling_ratio=self.sampling_ratio,
                         aligned=True)


class Res5BoxHead(nn.Module):
    """res5 on RoI features, average-pooled: the C4 box head's representation."""

    def __init__(self, res5: nn.Module) -> None:
        super().__init__()
        self.res5 = res5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled res5 features ``[R, C]``."""
        return self.res5(x).mean(dim=(2, 3))


class SharedRes5(nn.Module):
    """Runs the box head's res5 for the mask branch, without owning it.

    torchvision pools mask RoIs separately; C4 applies the same res5 to them. Keeping the module
    out of this one's children makes its parameters appear once (optimiser groups, checkpoints).
    """

    def __init__(self, box_head: Res5BoxHead) -> None:
        super().__init__()
        self._box_head = (box_head,)  # a tuple: not registered as a child

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """res5 features ``[R, C, S/2, S/2]`` of mask RoIs."""
        return self._box_head[0].res5(x)


def resnet_trunk(backbone: nn.Module) -> nn.Module:
    """The timm ResNet inside a ``TimmBackbone``, checked to have a stem and four stages."""
    trunk = getattr(backbone, 'model', backbone)
    needed = ('conv1', 'bn1', 'act1', 'maxpool') + RESNET_STAGES
    if not all(hasattr(trunk, name) for name in needed):
        raise ValueError(f'COCO transfer needs a ResNet backbone (stem conv1/bn1 and layer1-layer4); '
                         f'got {type(trunk).__name__}. Pre-train with a timm ResNet (e.g. resnet50)')
    return trunk


def stage_channels(stage: nn.Module) -> int:
    """Output channels of a ResNet stage (its last block's last convolution)."""
    return [m for m in stage.modules() if isinstance(m, nn.Conv2d)][-1].out_channels


def apply_norm(module: nn.Module, norm: str) -> nn.Module:
    """The module with its BatchNorm layers as SyncBN, BN (unchanged) or frozen BN."""
    if norm == 'SyncBN':
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    if norm == 'FrozenBN':
        return freeze_batch_norm_2d(module)
    return module


@MODELS.register_module()
class MaskRCNN(BaseModel):
    """Mask R-CNN (C4 or FPN) over a pre-trained ResNet; torchvision's detection model inside.

    Inputs are uint8 images ``[3, H, W]`` (any sizes); ``data_samples`` are ``CocoInstances``'
    ``InstanceData`` (``boxes`` XYXY in pixels, ``labels`` in 1..num_classes, ``masks``).
    ``mode='loss'`` returns torchvision's losses; ``mode='predict'`` returns per image ``boxes``,
    ``scores``, ``labels`` and boolean ``masks`` at the original image size, plus ``image_id``.
    """

    def __init__(self, num_classes: int, arch: str = 'C4', backbone: dict | None = None,
                 backbone_checkpoint: str | None = None, norm: str = 'SyncBN',
                 res5_extra_norm: bool = True, freeze_at: int = 0,
                 min_size_train: tuple[int, ...] = (800,), min_size_test: int = 800,
                 max_size: int = 1333, pixel_mean: tuple[float, ...] = (0.485, 0.456, 0.406),
                 pixel_std: tuple[float, ...] = (0.229, 0.224, 0.225),
                 anchor_sizes: tuple[int, ...] = (32, 64, 128, 256, 512),
                 aspect_ratios: tuple[float, ...] = (0.5, 1.0, 2.0), pooler_resolution: int = 14,
                 fpn_channels: int = 256, detector_kwargs: dict | None = None,
                 data_preprocessor: dict | None = None, init_cfg: dict | None = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor or dict(type='BaseDataPreprocessor'),
                         init_cfg=init_cfg)
        if arch not in ARCHS:
            raise ValueError(f'arch must be one of {ARCHS}, got {arch!r}')
        if norm not in NORMS:
            raise ValueError(f'norm must be one of {NORMS}, got {norm!r}')
        if not 0 <= freeze_at <= 5:
            raise ValueError(f'freeze_at counts the stem and res2-res5 (0-5), got {freeze_at}')
        self.arch = arch
        self.num_classes = num_classes
        self.min_size_train = tuple(min_size_train)
        self.min_size_test = min_size_test
        trunk = resnet_trunk(self._pretrained_backbone(backbone, backbone_checkpoint))
        self._freeze(trunk, freeze_at)
        kwargs = dict(min_size=self.min_size_train, max_size=max_size, image_mean=list(pixel_mean),
                      image_std=list(pixel_std), **(detector_kwargs or {}))
        if arch == 'C4':
            self.detector = self._c4(trunk, norm, res5_extra_norm, anchor_sizes, aspect_ratios,
                                     pooler_resolution, kwargs)
        else:
            self.detector = self._fpn(trunk, norm, anchor_sizes, aspect_ratios, pooler_resolution,
                                      fpn_channels, kwargs)

    @staticmethod
    def _pretrained_backbone(backbone: dict | None, checkpoint: str | None) -> nn.Module:
        """The pre-trained ``TimmBackbone`` (random init without a checkpoint)."""
        backbone = copy.deepcopy(backbone or dict(type='TimmBackbone', model_name='resnet50'))
        if checkpoint is None:
            return MODELS.build(backbone)
        # The checkpoint's own backbone settings win; files without them (MoCo, torchvision) are
        # read as the configured model.
        return load_encoder(checkpoint, default_backbone=backbone).backbone

    @staticmethod
    def _freeze(trunk: nn.Module, freeze_at: int) -> None:
        """Freeze the stem (1) and res2.. res{freeze_at} as detectron2's FREEZE_AT does."""
        stages = [nn.ModuleList([trunk.conv1, trunk.bn1])] + [getattr(trunk, s) for s in RESNET_STAGES]
        for stage in stages[:freeze_at]:
            for p in stage.parameters():
                p.requires_grad_(False)
        if freeze_at >= 1:
            trunk.bn1 = freeze_batch_norm_2d(trunk.bn1)
        for name in RESNET_STAGES[:max(freeze_at - 1, 0)]:
            setattr(trunk, name, freeze_batch_norm_2d(getattr(trunk, name)))

    def _c4(self, trunk, norm, res5_extra_norm, anchor_sizes, aspect_ratios, pooler_resolution,
            kwargs) -> TorchvisionMaskRCNN:
        body = nn.Sequential(OrderedDict(
            conv1=trunk.conv1, bn1=trunk.bn1, act1=trunk.act1, maxpool=trunk.maxpool,
            layer1=trunk.layer1, layer2=trunk.layer2, layer3=trunk.layer3))
        body = apply_norm(body, norm)
        body.out_channels = stage_channels(trunk.layer3)
        res5_channels = stage_channels(trunk.layer4)
        res5 = nn.Sequential(OrderedDict(layer4=trunk.layer4))
        if res5_extra_norm:
            res5.add_module('norm', nn.BatchNorm2d(res5_channels))
        res5 = apply_norm(res5, norm)
        stride = self._stride(body)
        pooler = AlignedRoIPool(pooler_resolution, stride)
        anchors = AnchorGenerator((tuple(anchor_sizes),), (tuple(aspect_ratios),))
        box_predictor = FastRCNNPredictor(res5_channels, self.num_classes + 1)
        mask_predictor = MaskRCNNPredictor(res5_channels, 256, self.num_classes + 1)
        self._init_predictors(box_predictor, mask_predictor)
        box_head = Res5BoxHead(res5)
        return TorchvisionMaskRCNN(
            body, num_classes=None, rpn_anchor_generator=anchors,
            rpn_head=RPNHead(body.out_channels, anchors.num_anchors_per_location()[0]),
            box_roi_pool=pooler, box_head=box_head, box_predictor=box_predictor,
            mask_roi_pool=pooler, mask_head=SharedRes5(box_head), mask_predictor=mask_predictor,
            **kwargs)

    def _fpn(self, trunk, norm, anchor_sizes, aspect_ratios, pooler_resolution, fpn_channels,
             kwargs) -> TorchvisionMaskRCNN:
        if len(anchor_sizes) != 5:
            raise ValueError(f'FPN has five levels (P2-P6), one anchor size each; got {anchor_sizes}')
        trunk = apply_norm(trunk, norm)
        backbone = BackboneWithFPN(
            trunk, return_layers={s: str(i) for i, s in enumerate(RESNET_STAGES)},
            in_channels_list=[stage_channels(getattr(trunk, s)) for s in RESNET_STAGES],
            out_channels=fpn_channels, extra_blocks=LastLevelMaxPool())
        anchors = AnchorGenerator(tuple((s,) for s in anchor_sizes),
                                  (tuple(aspect_ratios),) * len(anchor_sizes))
        levels = [str(i) for i in range(len(RESNET_STAGES))]
        detector = TorchvisionMaskRCNN(
            backbone, num_classes=self.num_classes + 1, rpn_anchor_generator=anchors,
            box_roi_pool=MultiScaleRoIAlign(levels, pooler_resolution, sampling_ratio=0),
            mask_roi_pool=MultiScaleRoIAlign(levels, 2 * pooler_resolution, sampling_ratio=0),
            **kwargs)
        self._init_predictors(detector.roi_heads.box_predictor, detector.roi_heads.mask_predictor)
        return detector

    @staticmethod
    @torch.no_grad()
    def _stride(body: nn.Module) -> int:
        """The output stride of the C4 body, measured (a CIFAR stem changes it)."""
        was_training = body.training
        body.eval()
        size = 64
        out = body(torch.zeros(1, 3, size, size))
        body.train(was_training)
        return size // out.shape[-1]

    @staticmethod
    def _init_predictors(box_predictor: nn.Module, mask_predictor: nn.Module) -> None:
        """detectron2's initialisation of the output layers (small normal weights, zero bias)."""
        nn.init.normal_(box_predictor.cls_score.weight, std=0.01)
        nn.init.normal_(box_predictor.bbox_pred.weight, std=0.001)
        nn.init.normal_(mask_predictor.mask_fcn_logits.weight, std=0.001)
        for layer in (box_predictor.cls_score, box_predictor.bbox_pred, mask_predictor.mask_fcn_logits):
            nn.init.zeros_(layer.bias)

    def forward(self, inputs: list[torch.Tensor], data_samples: list[InstanceData] | None = None,
                mode: str = 'tensor'):
        """Losses (``'loss'``), detections (``'predict'``) or raw detector output (``'tensor'``)."""
        images = [image.float() / 255 for image in inputs]
        transform = self.detector.transform
        if mode == 'loss':
            transform.min_size = self.min_size_train
            targets = [{'boxes': s.boxes, 'labels': s.labels, 'masks': s.masks} for s in data_samples]
            return self.detector(images, targets)
        transform.min_size = (self.min_size_test,)
        detections = self.detector(images)
        if mode == 'tensor':
            return detections
        if mode != 'predict':
            raise ValueError(f'mode must be "loss", "predict" or "tensor", got {mode!r}')
        for det, sample in zip(detections, data_samples or [None] * len(detections)):
            det['masks'] = det['masks'][:, 0] > MASK_THRESHOLD
            det['image_id'] = None if sample is None else sample.image_id
        return detections

