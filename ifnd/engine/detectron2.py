"""COCO transfer with detectron2: the backbone in its weight format, the config in its terms.

The COCO transfer configs (``configs/benchmarks/coco/``) are mmengine Runner configs for the
torchvision engine (``ifnd.models.detection.MaskRCNN``). This module runs the same experiment with
detectron2, the papers' protocol (MoCo's detection code path):

- ``to_detectron2`` / ``from_detectron2`` rename a timm/torchvision ResNet's weights to
  detectron2's backbone names and back; ``export_detectron2_weights`` writes a checkpoint's
  backbone as the pickle detectron2's checkpointer reads (C4: ``res5.*`` lands in the RoI head);
- ``detectron2_options`` translates a config into detectron2 config keys (every value read from
  the config, a clear error for what detectron2 cannot express), ``dataset_registrations`` finds
  the COCO files, ``write_detectron2_config`` keeps the translation as YAML;
- ``run_detectron2`` trains or evaluates through detectron2's ``DefaultTrainer`` and ``launch``.

Only the last part needs detectron2, imported inside the functions that use it:
``require_detectron2()`` says how to install it when it is missing.
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import io
import os.path as osp
import pickle
import re
from types import ModuleType

import numpy as np
import torch
import yaml
from mmengine.config import Config

from ifnd.engine.checkpoint import AtomicLocalBackend
from ifnd.engine.cli import write_json
from ifnd.evaluation.coco import RESULTS_FILE
from ifnd.models.encoder import HEAD_PREFIXES, load_encoder

DETECTRON2_MISSING = (
    'detectron2 is not installed. It is not on PyPI (the look-alike packages there are broken '
    'repackagings); install it from its source repository, which needs a C++/CUDA compiler and '
    'builds against the torch already installed here (hence no build isolation):\n'
    '    pip install --no-build-isolation '
    "'git+https://github.com/facebookresearch/detectron2.git'\n"
    'or clone it and run `pip install --no-build-isolation -e .` in the clone. '
    'Without detectron2, run the COCO transfer with --engine torchvision.')

TRAIN_DATASET = 'ifnd_coco_train'
VAL_DATASET = 'ifnd_coco_val'
EXTRA_NORM_HEAD = 'Res5ROIHeadsExtraNorm'
WEIGHTS_FILE = 'backbone_detectron2.pkl'
CONFIG_FILE = 'detectron2_config.yaml'

# detectron2 builds exactly these ResNets: (blocks per stage, bottleneck blocks) -> depth.
RESNET_DEPTHS = {((2, 2, 2, 2), False): 18, ((3, 4, 6, 3), False): 34, ((3, 4, 6, 3), True): 50,
                 ((3, 4, 23, 3), True): 101, ((3, 8, 36, 3), True): 152}
NORMS = ('BN', 'SyncBN', 'FrozenBN')

# ---------------------------------------------------------------------------------------------
# Weight conversion
# ---------------------------------------------------------------------------------------------

_BN = r'(weight|bias|running_mean|running_var)'
# (timm/torchvision name, detectron2 name); stage N of timm (layerN) is detectron2's res{N+1}.
_TO_DETECTRON2 = (
    (r'conv1\.weight', lambda m: 'stem.conv1.weight'),
    (rf'bn1\.{_BN}', lambda m: f'stem.conv1.norm.{m[1]}'),
    (r'layer([1-4])\.(\d+)\.conv([1-3])\.weight',
     lambda m: f'res{int(m[1]) + 1}.{m[2]}.conv{m[3]}.weight'),
    (rf'layer([1-4])\.(\d+)\.bn([1-3])\.{_BN}',
     lambda m: f'res{int(m[1]) + 1}.{m[2]}.conv{m[3]}.norm.{m[4]}'),
    (r'layer([1-4])\.(\d+)\.downsample\.0\.weight',
     lambda m: f'res{int(m[1]) + 1}.{m[2]}.shortcut.weight'),
    (rf'layer([1-4])\.(\d+)\.downsample\.1\.{_BN}',
     lambda m: f'res{int(m[1]) + 1}.{m[2]}.shortcut.norm.{m[3]}'),
)
_FROM_DETECTRON2 = (
    (r'stem\.conv1\.weight', lambda m: 'conv1.weight'),
    (rf'stem\.conv1\.norm\.{_BN}', lambda m: f'bn1.{m[1]}'),
    (r'res([2-5])\.(\d+)\.conv([1-3])\.weight',
     lambda m: f'layer{int(m[1]) - 1}.{m[2]}.conv{m[3]}.weight'),
    (rf'res([2-5])\.(\d+)\.conv([1-3])\.norm\.{_BN}',
     lambda m: f'layer{int(m[1]) - 1}.{m[2]}.bn{m[3]}.{m[4]}'),
    (r'res([2-5])\.(\d+)\.shortcut\.weight',
     lambda m: f'layer{int(m[1]) - 1}.{m[2]}.downsample.0.weight'),
    (rf'res([2-5])\.(\d+)\.shortcut\.norm\.{_BN}',
     lambda m: f'layer{int(m[1]) - 1}.{m[2]}.downsample.1.{m[3]}'),
)


def _rename(key: str, rules) -> str | None:
    for pattern, name in rules:
        match = re.fullmatch(pattern, key)
        if match:
            return name(match)
    return None


def _listing(keys: list[str]) -> str:
    return ', '.join(keys[:8]) + (f' ... ({len(keys)} in all)' if len(keys) > 8 else '')


def to_detectron2(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """A timm/torchvision ResNet state dict under detectron2's backbone names, as numpy arrays."""
    model, unknown = {}, []
    for key, value in state.items():
        if key.endswith('num_batches_tracked') or key.startswith(HEAD_PREFIXES):
            continue  # detectron2 keeps no batch counter; a classifier head has no place there
        name = _rename(key, _TO_DETECTRON2)
        if name is None:
            unknown.append(key)
            continue
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:
            value = value.float()  # numpy has no bfloat16; float32 holds it exactly
        model[name] = value.numpy().copy()
    if unknown:
        raise ValueError(
            f'{len(unknown)} weights have no counterpart in detectron2\'s ResNet: '
            f'[{_listing(unknown)}]. detectron2 builds the standard ResNet (one 7x7 stem '
            'convolution, basic or bottleneck blocks); other models (deep stems, SE blocks, '
            'non-ResNets) cannot be exported. Use --engine torchvision for them')
    if not model:
        raise ValueError('no ResNet weights found (expected conv1.weight, layer1.0.conv1.weight, '
                         '...)')
    stem = model.get('stem.conv1.weight')
    if stem is None or stem.shape[1:] != (3, 7, 7):
        shape = 'missing' if stem is None else f'of shape {tuple(stem.shape)}'
        raise ValueError(
            f'the stem convolution conv1.weight is {shape}, but detectron2\'s ResNet stem is a 7x7 '
            'convolution on RGB followed by max-pooling. A CIFAR-stem encoder (3x3, no max-pool, '
            'for 28/32-pixel images) has no detectron2 counterpart; transfer an encoder '
            'pre-trained with the ImageNet stem (cifar_stem=False)')
    return model


def from_detectron2(model: dict) -> dict[str, torch.Tensor]:
    """detectron2 backbone weights (numpy arrays or tensors) under timm/torchvision names."""
    state, unknown = {}, []
    for key, value in model.items():
        name = _rename(key, _FROM_DETECTRON2)
        if name is None:
            unknown.append(key)
            continue
        state[name] = torch.as_tensor(value).clone()
    if unknown:
        raise ValueError(
            f'{len(unknown)} weights are not detectron2 ResNet backbone weights: '
            f'[{_listing(unknown)}]; expected stem.conv1.*, res2.0.conv1.* ... res5.*.shortcut.*')
    return state


def resnet_depth(state: dict[str, torch.Tensor]) -> int:
    """The depth (18, 34, 50, 101 or 152) of a standard ResNet state dict with timm names."""
    blocks = []
    for stage in range(1, 5):
        indices = {int(m[1]) for k in state if (m := re.match(rf'layer{stage}\.(\d+)\.', k))}
        if not indices or indices != set(range(len(indices))):
            raise ValueError(f'not a ResNet: the blocks of layer{stage} are {sorted(indices)}')
        blocks.append(len(indices))
    bottleneck = 'layer1.0.conv3.weight' in state
    depth = RESNET_DEPTHS.get((tuple(blocks), bottleneck))
    if depth is None:
        kind = 'bottleneck' if bottleneck else 'basic'
        raise ValueError(f'a ResNet with {tuple(blocks)} {kind} blocks per stage is none of the '
                         'depths detectron2 builds (18, 34, 50, 101, 152)')
    # detectron2 derives every width from the depth (64 channels in res2, one group): a wide or
    # grouped ResNet (wide_resnet*, resnext*) would not fit its layers.
    conv1, conv2 = state['layer1.0.conv1.weight'], state['layer1.0.conv2.weight']
    if conv1.shape[0] != 64 or conv2.shape[1] != conv2.shape[0]:
        groups = conv2.shape[0] // conv2.shape[1]
        raise ValueError(f'res2 is {conv1.shape[0]} channels wide with {groups} groups; detectron2 '
                         'is set up here for the standard ResNet (64 channels, 1 group)')
    return depth


class _PortablePickler(pickle.Pickler):
    """Arrays as ``numpy.ndarray(shape, dtype, buffer)``: the file loads under numpy 1.x and 2.x.

    numpy 2 pickles arrays through ``numpy._core``, which numpy 1.x (still common beside
    detectron2) cannot import.
    """

    def reducer_override(self, obj):
        if type(obj) is np.ndarray:
            data = bytearray(np.ascontiguousarray(obj).tobytes())  # bytearray: writable on load
            return np.ndarray, (obj.shape, obj.dtype.str, data)
        return NotImplemented


def export_detectron2_weights(checkpoint_path: str, out: str, model_name: str | None = None,
                              default_backbone: dict | None = None) -> dict:
    """Write a checkpoint's backbone as a detectron2 weight file; return its name, depth and size.

    The file is ``{'model': {name: array}, '__author__': 'ifnd', 'matching_heuristics': True}``:
    detectron2's checkpointer then matches ``res2.0.conv1.weight`` to
    ``backbone.res2.0.conv1.weight`` and, in C4 models, ``res5.*`` to ``roi_heads.res5.*``.
    ``model_name`` overrides the checkpoint's backbone; ``default_backbone`` is how to read files
    that carry no model config (MoCo, torchvision).
    """
    # Building the encoder checks every key and shape against the named backbone.
    encoder = load_encoder(checkpoint_path, model_name=model_name,
                           default_backbone=default_backbone)
    timm_model = encoder.backbone.model
    state = timm_model.state_dict()
    model = to_detectron2(state)
    depth = resnet_depth(state)
    buffer = io.BytesIO()
    _PortablePickler(buffer, protocol=4).dump(
        {'model': model, '__author__': 'ifnd', 'matching_heuristics': True})
    AtomicLocalBackend().put(buffer.getvalue(), out)
    name = getattr(timm_model, 'pretrained_cfg', {}).get('architecture') or model_name
    return {'out': out, 'model_name': name, 'depth': depth, 'num_tensors': len(model)}


# ---------------------------------------------------------------------------------------------
# Config translation
# ---------------------------------------------------------------------------------------------

class UnsupportedConfig(ValueError):
    """A config setting that the detectron2 engine cannot express."""


def _unsupported(what: str) -> UnsupportedConfig:
    return UnsupportedConfig(f'detectron2 engine: {what}. Change it with --cfg-options, or run '
                             'this config with --engine torchvision')


def _check_keys(section: dict, allowed, where: str) -> None:
    unknown = sorted(set(section) - set(allowed))
    if unknown:
        raise _unsupported(f'{where} has {unknown}, which have no detectron2 counterpart '
                           f'(known: {sorted(allowed)})')


def _signature_defaults(func) -> dict:
    return {name: p.default for name, p in inspect.signature(func).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _model_settings(model: dict) -> dict:
    """The model config with the torchvision engine's defaults filled in, so both engines agree."""
    # The torchvision engine's model: its defaults are what a config means by leaving a key out.
    from ifnd.models.detection import MaskRCNN

    if model.get('type') != 'MaskRCNN':
        raise _unsupported(f"model.type must be 'MaskRCNN', got {model.get('type')!r}")
    defaults = _signature_defaults(MaskRCNN.__init__)
    _check_keys(model, set(defaults) | {'type', 'num_classes'}, 'model')
    settings = {**defaults, **model}
    if 'num_classes' not in settings:
        raise _unsupported('model.num_classes (foreground classes, 80 for COCO) is not set')
    preprocessor = settings.get('data_preprocessor')
    if preprocessor and preprocessor.get('type') != 'BaseDataPreprocessor':
        raise _unsupported('model.data_preprocessor: detectron2 normalises with '
                           'model.pixel_mean/pixel_std only')
    if settings.get('init_cfg'):
        raise _unsupported('model.init_cfg: detectron2 initialises its heads itself')
    return settings


def _detector_kwargs(kwargs: dict | None) -> dict:
    """torchvision MaskRCNN's arguments with its own defaults for those a config leaves out."""
    from torchvision.models.detection import MaskRCNN

    translated = {
        'rpn_pre_nms_top_n_train', 'rpn_pre_nms_top_n_test', 'rpn_post_nms_top_n_train',
        'rpn_post_nms_top_n_test', 'rpn_nms_thresh', 'rpn_fg_iou_thresh', 'rpn_bg_iou_thresh',
        'rpn_batch_size_per_image', 'rpn_positive_fraction', 'rpn_score_thresh',
        'box_score_thresh', 'box_nms_thresh', 'box_detections_per_img', 'box_fg_iou_thresh',
        'box_bg_iou_thresh', 'box_batch_size_per_image', 'box_positive_fraction',
        'bbox_reg_weights'}
    kwargs = dict(kwargs or {})
    _check_keys(kwargs, translated, 'model.detector_kwargs')
    defaults = _signature_defaults(MaskRCNN.__init__)
    return {name: kwargs.get(name, defaults[name]) for name in translated}


def _depth_from_name(backbone: dict) -> int:
    name = str(backbone.get('model_name', ''))
    match = re.fullmatch(r'(?:tv_)?resnet(18|34|50|101|152)(?:\.\w+)?', name)
    if backbone.get('type', 'TimmBackbone') != 'TimmBackbone' or not match:
        raise _unsupported(f'model.backbone {name!r} is not a standard ResNet (resnet18/34/50/101/'
                           '152), the only backbones detectron2 builds')
    if backbone.get('cifar_stem'):
        raise _unsupported('model.backbone.cifar_stem: detectron2\'s ResNet has the 7x7 stem only')
    return int(match[1])


def _iou_thresholds(bg: float, fg: float, single: bool) -> tuple[list[float], list[int]]:
    """detectron2's (IOU_THRESHOLDS, IOU_LABELS) for torchvision's (bg, fg): ignored between."""
    if bg > fg:
        raise _unsupported(f'a background IoU threshold {bg} above the foreground one {fg}')
    if single and bg == fg:  # the RoI heads' usual form: one threshold, nothing ignored
        return [float(fg)], [0, 1]
    return [float(bg), float(fg)], [0, -1, 1]


def _model_options(model: dict, depth: int | None) -> dict[str, object]:
    settings = _model_settings(model)
    arch, norm = settings['arch'], settings['norm']
    if arch not in ('C4', 'FPN'):
        raise _unsupported(f"model.arch must be 'C4' or 'FPN', got {arch!r}")
    if norm not in NORMS:
        raise _unsupported(f'model.norm must be one of {NORMS}, got {norm!r}')
    if not 0 <= settings['freeze_at'] <= 5:
        raise _unsupported('model.freeze_at counts stem and res2-res5 (0-5), got '
                           f"{settings['freeze_at']}")
    depth = depth or _depth_from_name(settings.get('backbone') or {})
    if arch == 'C4' and depth < 50:
        raise _unsupported(f'a C4 model needs a bottleneck ResNet (depth >= 50) for its res5 RoI '
                           f'head, got depth {depth}; use arch FPN')
    kw = _detector_kwargs(settings.get('detector_kwargs'))
    if kw['rpn_score_thresh']:
        raise _unsupported('detector_kwargs.rpn_score_thresh: detectron2\'s RPN keeps proposals '
                           'of any score')
    pixel_mean, pixel_std = list(settings['pixel_mean']), list(settings['pixel_std'])
    if max(pixel_mean) > 1 or max(pixel_std) > 1:
        raise _unsupported('model.pixel_mean/pixel_std are in 0-1 units (torchvision\'s); got '
                           f'{pixel_mean} / {pixel_std}')
    rpn_ious, rpn_labels = _iou_thresholds(kw['rpn_bg_iou_thresh'], kw['rpn_fg_iou_thresh'],
                                           single=False)
    roi_ious, roi_labels = _iou_thresholds(kw['box_bg_iou_thresh'], kw['box_fg_iou_thresh'],
                                           single=True)
    sizes = [int(s) for s in settings['anchor_sizes']]
    pooler = int(settings['pooler_resolution'])
    options = {
        'MODEL.META_ARCHITECTURE': 'GeneralizedRCNN',
        'MODEL.MASK_ON': True,
        # torchvision's normalisation is on 0-1 RGB; detectron2 normalises 0-255 pixels.
        'MODEL.PIXEL_MEAN': [round(255 * v, 6) for v in pixel_mean],
        'MODEL.PIXEL_STD': [round(255 * v, 6) for v in pixel_std],
        'MODEL.BACKBONE.FREEZE_AT': int(settings['freeze_at']),
        'MODEL.RESNETS.DEPTH': depth,
        'MODEL.RESNETS.RES2_OUT_CHANNELS': 256 if depth >= 50 else 64,
        # timm/torchvision ResNets stride in the 3x3 convolution, not in the first 1x1.
        'MODEL.RESNETS.STRIDE_IN_1X1': False,
        'MODEL.RESNETS.NORM': norm,
        'MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS': [[float(r) for r in settings['aspect_ratios']]],
        'MODEL.RPN.PRE_NMS_TOPK_TRAIN': int(kw['rpn_pre_nms_top_n_train']),
        'MODEL.RPN.PRE_NMS_TOPK_TEST': int(kw['rpn_pre_nms_top_n_test']),
        'MODEL.RPN.POST_NMS_TOPK_TRAIN': int(kw['rpn_post_nms_top_n_train']),
        'MODEL.RPN.POST_NMS_TOPK_TEST': int(kw['rpn_post_nms_top_n_test']),
        'MODEL.RPN.NMS_THRESH': float(kw['rpn_nms_thresh']),
        'MODEL.RPN.IOU_THRESHOLDS': rpn_ious,
        'MODEL.RPN.IOU_LABELS': rpn_labels,
        'MODEL.RPN.BATCH_SIZE_PER_IMAGE': int(kw['rpn_batch_size_per_image']),
        'MODEL.RPN.POSITIVE_FRACTION': float(kw['rpn_positive_fraction']),
        'MODEL.ROI_HEADS.NUM_CLASSES': int(settings['num_classes']),
        'MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE': int(kw['box_batch_size_per_image']),
        'MODEL.ROI_HEADS.POSITIVE_FRACTION': float(kw['box_positive_fraction']),
        'MODEL.ROI_HEADS.IOU_THRESHOLDS': roi_ious,
        'MODEL.ROI_HEADS.IOU_LABELS': roi_labels,
        'MODEL.ROI_HEADS.SCORE_THRESH_TEST': float(kw['box_score_thresh']),
        'MODEL.ROI_HEADS.NMS_THRESH_TEST': float(kw['box_nms_thresh']),
        'MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS': tuple(
            float(w) for w in (kw['bbox_reg_weights'] or (10.0, 10.0, 5.0, 5.0))),
        'MODEL.ROI_BOX_HEAD.POOLER_TYPE': 'ROIAlignV2',
        'MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION': pooler,
        'TEST.DETECTIONS_PER_IMAGE': int(kw['box_detections_per_img']),
    }
    if arch == 'C4':
        # RPN and RoIAlign on res4; res5 is the RoI head, shared by box and mask branches.
        options.update({
            'MODEL.BACKBONE.NAME': 'build_resnet_backbone',
            'MODEL.RESNETS.OUT_FEATURES': ['res4'],
            'MODEL.ANCHOR_GENERATOR.SIZES': [sizes],
            'MODEL.RPN.IN_FEATURES': ['res4'],
            'MODEL.ROI_HEADS.NAME': (EXTRA_NORM_HEAD if settings['res5_extra_norm']
                                     else 'Res5ROIHeads'),
            'MODEL.ROI_HEADS.IN_FEATURES': ['res4'],
            'MODEL.ROI_MASK_HEAD.NAME': 'MaskRCNNConvUpsampleHead',
            'MODEL.ROI_MASK_HEAD.NUM_CONV': 0,
            'MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION': pooler,
        })
    else:
        if settings['res5_extra_norm']:
            raise _unsupported('model.res5_extra_norm belongs to the C4 RoI head; set it False '
                               'for FPN')
        if len(sizes) != 5:
            raise _unsupported(f'FPN has five levels (P2-P6), one anchor size each; got {sizes}')
        # torchvision's FPN heads: two 1024-d FCs on 7x7 boxes, four 256-d convs on masks pooled at
        # twice the box resolution; no norm in FPN or heads.
        options.update({
            'MODEL.BACKBONE.NAME': 'build_resnet_fpn_backbone',
            'MODEL.RESNETS.OUT_FEATURES': ['res2', 'res3', 'res4', 'res5'],
            'MODEL.FPN.IN_FEATURES': ['res2', 'res3', 'res4', 'res5'],
            'MODEL.FPN.OUT_CHANNELS': int(settings['fpn_channels']),
            'MODEL.FPN.NORM': '',
            'MODEL.ANCHOR_GENERATOR.SIZES': [[s] for s in sizes],
            'MODEL.RPN.IN_FEATURES': ['p2', 'p3', 'p4', 'p5', 'p6'],
            'MODEL.ROI_HEADS.NAME': 'StandardROIHeads',
            'MODEL.ROI_HEADS.IN_FEATURES': ['p2', 'p3', 'p4', 'p5'],
            'MODEL.ROI_BOX_HEAD.NAME': 'FastRCNNConvFCHead',
            'MODEL.ROI_BOX_HEAD.NUM_CONV': 0,
            'MODEL.ROI_BOX_HEAD.NUM_FC': 2,
            'MODEL.ROI_BOX_HEAD.FC_DIM': 1024,
            'MODEL.ROI_BOX_HEAD.NORM': '',
            'MODEL.ROI_MASK_HEAD.NAME': 'MaskRCNNConvUpsampleHead',
            'MODEL.ROI_MASK_HEAD.NUM_CONV': 4,
            'MODEL.ROI_MASK_HEAD.CONV_DIM': 256,
            'MODEL.ROI_MASK_HEAD.NORM': '',
            'MODEL.ROI_MASK_HEAD.POOLER_TYPE': 'ROIAlignV2',
            'MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION': 2 * pooler,
        })
    options.update({
        'INPUT.FORMAT': 'RGB',
        'INPUT.MIN_SIZE_TRAIN': tuple(int(s) for s in settings['min_size_train']),
        'INPUT.MIN_SIZE_TRAIN_SAMPLING': 'choice',
        'INPUT.MAX_SIZE_TRAIN': int(settings['max_size']),
        'INPUT.MIN_SIZE_TEST': int(settings['min_size_test']),
        'INPUT.MAX_SIZE_TEST': int(settings['max_size']),
    })
    return options


def _schedule_options(cfg: dict) -> dict[str, object]:
    """Linear warm-up + step decay, by iteration: detectron2's WarmupMultiStepLR."""
    train_cfg = cfg.get('train_cfg') or {}
    if train_cfg.get('type') != 'IterBasedTrainLoop':
        raise _unsupported(f"train_cfg.type must be 'IterBasedTrainLoop' (detectron2 counts "
                           f"iterations), got {train_cfg.get('type')!r}")
    max_iters = int(train_cfg['max_iters'])
    schedulers = cfg.get('param_scheduler') or []
    if isinstance(schedulers, dict):
        schedulers = [schedulers]
    warmup, steps = [], []
    for scheduler in schedulers:
        kind = scheduler.get('type')
        if kind not in ('LinearLR', 'MultiStepLR'):
            raise _unsupported(f'param_scheduler {kind!r}: detectron2\'s WarmupMultiStepLR is a '
                               'LinearLR warm-up followed by a MultiStepLR only')
        if scheduler.get('by_epoch', True) or scheduler.get('begin', 0) != 0:
            raise _unsupported(f'param_scheduler {kind} must count iterations from 0 '
                               '(by_epoch=False, begin=0)')
        (warmup if kind == 'LinearLR' else steps).append(scheduler)
    if len(warmup) > 1 or len(steps) > 1:
        raise _unsupported('param_scheduler has more than one LinearLR or MultiStepLR')
    options = {'SOLVER.LR_SCHEDULER_NAME': 'WarmupMultiStepLR', 'SOLVER.MAX_ITER': max_iters,
               'SOLVER.STEPS': (), 'SOLVER.GAMMA': 0.1, 'SOLVER.WARMUP_METHOD': 'linear',
               'SOLVER.WARMUP_ITERS': 0, 'SOLVER.WARMUP_FACTOR': 1.0}
    if warmup:
        (linear,) = warmup
        if linear.get('end_factor', 1.0) != 1.0 or 'end' not in linear:
            raise _unsupported('the LinearLR warm-up must end at factor 1.0 at a set end iteration')
        options['SOLVER.WARMUP_ITERS'] = int(linear['end'])
        # 1/3 is mmengine's default start factor.
        options['SOLVER.WARMUP_FACTOR'] = float(linear.get('start_factor', 1.0 / 3))
    if steps:
        (multistep,) = steps
        if multistep.get('end', max_iters) < max_iters:
            raise _unsupported('the MultiStepLR must last until the end of training')
        options['SOLVER.STEPS'] = tuple(int(m) for m in multistep['milestones'])
        options['SOLVER.GAMMA'] = float(multistep.get('gamma', 0.1))
    return options


def _solver_options(cfg: dict, num_gpus: int, amp: bool) -> dict[str, object]:
    wrapper = dict(cfg.get('optim_wrapper') or {})
    wrapper_type = wrapper.get('type', 'OptimWrapper')
    if wrapper_type not in ('OptimWrapper', 'AmpOptimWrapper'):
        raise _unsupported(f'optim_wrapper.type {wrapper_type!r}')
    _check_keys(wrapper, {'type', 'optimizer', 'paramwise_cfg', 'clip_grad', 'loss_scale', 'dtype',
                          'accumulative_counts'}, 'optim_wrapper')
    if wrapper.get('clip_grad'):
        # detectron2 clips each parameter's gradient on its own, not the global norm.
        raise _unsupported('optim_wrapper.clip_grad (global-norm clipping)')
    if wrapper.get('accumulative_counts', 1) != 1:
        raise _unsupported('optim_wrapper.accumulative_counts (gradient accumulation)')
    if (wrapper.get('dtype') not in (None, 'float16')
            or wrapper.get('loss_scale', 'dynamic') != 'dynamic'):
        raise _unsupported('AMP other than float16 with a dynamic loss scale')
    optimizer = dict(wrapper.get('optimizer') or {})
    if optimizer.get('type') != 'SGD':
        raise _unsupported(f"optimizer {optimizer.get('type')!r}: detectron2 trains with SGD")
    _check_keys(optimizer, {'type', 'lr', 'momentum', 'weight_decay', 'nesterov', 'dampening'},
                'optim_wrapper.optimizer')
    if optimizer.get('dampening', 0):
        raise _unsupported('SGD dampening')
    paramwise = dict(wrapper.get('paramwise_cfg') or {})
    # bias_decay_mult and friends would hit norm biases differently in detectron2.
    _check_keys(paramwise, {'norm_decay_mult'}, 'optim_wrapper.paramwise_cfg')
    loader = cfg['train_dataloader']
    ims_per_batch = int(loader['batch_size']) * num_gpus
    lr = float(optimizer['lr'])
    scale = cfg.get('auto_scale_lr') or {}
    if scale.get('enable'):
        lr *= ims_per_batch / scale['base_batch_size']  # mmengine's linear scaling rule
    weight_decay = float(optimizer.get('weight_decay', 0.0))
    checkpoint = (cfg.get('default_hooks') or {}).get('checkpoint') or {}
    if checkpoint.get('by_epoch', True):
        raise _unsupported('default_hooks.checkpoint must save by iteration (by_epoch=False)')
    schedule = _schedule_options(cfg)
    # mmengine's interval -1 saves never; detectron2 saves model_final at the end regardless.
    interval = int(checkpoint.get('interval', -1))
    interval = interval if interval > 0 else schedule['SOLVER.MAX_ITER']
    return {
        'SOLVER.IMS_PER_BATCH': ims_per_batch,
        'SOLVER.REFERENCE_WORLD_SIZE': 0,  # the batch is the config's; no rescaling by detectron2
        'SOLVER.BASE_LR': lr,
        'SOLVER.MOMENTUM': float(optimizer.get('momentum', 0.0)),
        'SOLVER.NESTEROV': bool(optimizer.get('nesterov', False)),
        'SOLVER.WEIGHT_DECAY': weight_decay,
        'SOLVER.WEIGHT_DECAY_NORM': weight_decay * float(paramwise.get('norm_decay_mult', 1.0)),
        'SOLVER.WEIGHT_DECAY_BIAS': weight_decay,  # mmengine decays biases like weights
        'SOLVER.BIAS_LR_FACTOR': 1.0,
        **schedule,
        'SOLVER.CHECKPOINT_PERIOD': interval,
        'SOLVER.AMP.ENABLED': bool(amp or wrapper_type == 'AmpOptimWrapper'),
    }


def _test_options(cfg: dict) -> dict[str, object]:
    from mmengine.runner import IterBasedTrainLoop

    train_cfg = cfg['train_cfg']
    max_iters = int(train_cfg['max_iters'])
    interval = int(train_cfg.get('val_interval',
                                 _signature_defaults(IterBasedTrainLoop.__init__)['val_interval']))
    precise_bn = {'TEST.PRECISE_BN.ENABLED': False}
    for hook in cfg.get('custom_hooks') or []:
        if hook.get('type') != 'PreciseBNHook':
            raise _unsupported(f"custom hook {hook.get('type')!r}; detectron2's trainer runs "
                               'PreciseBNHook only (remove others with --cfg-options '
                               'custom_hooks=[])')
        _check_keys(hook, {'type', 'num_iters', 'priority'}, 'PreciseBNHook')
        precise_bn = {'TEST.PRECISE_BN.ENABLED': True,
                      'TEST.PRECISE_BN.NUM_ITER': int(hook['num_iters'])}
    # detectron2 always evaluates after the last iteration; 0 means only then.
    return {'TEST.EVAL_PERIOD': 0 if interval >= max_iters else interval,
            **precise_bn}


def _data_options(cfg: dict) -> dict[str, object]:
    for section in ('train_dataloader', 'val_dataloader'):
        dataset = cfg[section]['dataset']
        if dataset.get('type') != 'CocoInstances':
            raise _unsupported(f"{section}.dataset.type must be 'CocoInstances', got "
                               f"{dataset.get('type')!r}")
        _check_keys(dataset, {'type', 'data_root', 'ann_file', 'img_dir', 'train', 'flip_prob'},
                    f'{section}.dataset')
    batch_sampler = (cfg['train_dataloader'].get('batch_sampler') or {}).get('type')
    if batch_sampler not in (None, 'AspectRatioBatchSampler'):
        raise _unsupported(f'train_dataloader.batch_sampler {batch_sampler!r}: detectron2 groups '
                           'by aspect ratio or not at all')
    flip = cfg['train_dataloader']['dataset'].get('flip_prob', 0.5)
    if flip not in (0, 0.5):
        raise _unsupported(f'flip_prob {flip}: detectron2 flips with probability 0.5 or never')
    randomness = cfg.get('randomness') or {}
    seed = randomness.get('seed')
    return {
        'INPUT.RANDOM_FLIP': 'horizontal' if flip else 'none',
        'DATASETS.TRAIN': (TRAIN_DATASET,),
        'DATASETS.TEST': (VAL_DATASET,),
        'DATALOADER.NUM_WORKERS': int(cfg['train_dataloader'].get('num_workers', 0)),
        'DATALOADER.ASPECT_RATIO_GROUPING': batch_sampler == 'AspectRatioBatchSampler',
        'SEED': -1 if seed is None else int(seed),
        'CUDNN_BENCHMARK': bool((cfg.get('env_cfg') or {}).get('cudnn_benchmark', False)),
    }


def _plain(cfg) -> dict:
    return cfg.to_dict() if hasattr(cfg, 'to_dict') else dict(cfg)


def detectron2_options(cfg: Config, weights: str, output_dir: str, num_gpus: int,
                       amp: bool = False, depth: int | None = None) -> dict[str, object]:
    """detectron2 config keys (dotted) and values for a COCO transfer config.

    ``num_gpus`` counts all GPUs of the run (SOLVER.IMS_PER_BATCH = batch per GPU x num_gpus);
    ``depth`` is the exported backbone's (default: from ``model.backbone.model_name``).
    ``run_detectron2`` applies the kept-checkpoint count; log intervals stay detectron2's own.
    """
    if num_gpus < 1:
        raise ValueError(f'num_gpus must be at least 1, got {num_gpus}')
    cfg = _plain(cfg)
    options = {'MODEL.WEIGHTS': weights, **_model_options(cfg['model'], depth)}
    options.update(_data_options(cfg))
    options.update(_solver_options(cfg, num_gpus, amp))
    options.update(_test_options(cfg))
    options['OUTPUT_DIR'] = output_dir
    return options


def _nested(options: dict[str, object]) -> dict:
    nested: dict = {}
    for key, value in options.items():
        *parents, leaf = key.split('.')
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = _yaml_value(value)
    return nested


def _yaml_value(value):
    if isinstance(value, (tuple, list)):
        return [_yaml_value(v) for v in value]
    return value


def write_detectron2_config(options: dict[str, object], path: str) -> None:
    """Write the options as a detectron2 YAML config (``get_cfg().merge_from_file`` reads it)."""
    # VERSION: detectron2's config format, which it would otherwise guess with a warning.
    text = yaml.safe_dump({'VERSION': 2, **_nested(options)}, sort_keys=False,
                          default_flow_style=None)
    AtomicLocalBackend().put_text(text, path)


def dataset_registrations(cfg: Config, data_root: str | None,
                          include_train: bool = True) -> list[tuple[str, str, str]]:
    """``(name, json_file, image_root)`` of the train and val COCO sets, checked to exist."""
    cfg = _plain(cfg)
    splits = ([(TRAIN_DATASET, 'train_dataloader')] if include_train else []) + \
        [(VAL_DATASET, 'val_dataloader')]
    registrations, missing = [], []
    for name, section in splits:
        dataset = cfg[section]['dataset']
        if dataset.get('type') != 'CocoInstances':
            raise _unsupported(f"{section}.dataset.type must be 'CocoInstances', got "
                               f"{dataset.get('type')!r}")
        root = data_root if data_root is not None else dataset.get('data_root', '')
        json_file = osp.join(root, dataset['ann_file'])
        image_root = osp.join(root, dataset['img_dir'])
        missing += [p for p, ok in ((json_file, osp.isfile), (image_root, osp.isdir)) if not ok(p)]
        registrations.append((name, json_file, image_root))
    if missing:
        from ifnd.datasets.coco import COCO_LAYOUT
        raise FileNotFoundError(
            f'COCO not found: {", ".join(missing)}. The data root should hold {COCO_LAYOUT}; pass '
            '--data-root DIR, or name other files with --cfg-options '
            'train_dataloader.dataset.ann_file=... train_dataloader.dataset.img_dir=... '
            '(and the same for val_dataloader)')
    return registrations


# ---------------------------------------------------------------------------------------------
# Running detectron2 (imported lazily)
# ---------------------------------------------------------------------------------------------

def detectron2_available() -> bool:
    """Whether detectron2 can be imported."""
    try:
        return importlib.util.find_spec('detectron2') is not None
    except (ImportError, ValueError):
        return False


def require_detectron2() -> ModuleType:
    """The detectron2 module, or an ImportError that says how to install it."""
    try:
        import detectron2
    except ImportError as err:
        raise ImportError(DETECTRON2_MISSING) from err
    return detectron2


def register_extra_norm_head() -> type:
    """Register (once) the C4 RoI head with one more norm layer after res5, MoCo's choice."""
    require_detectron2()
    from detectron2.layers import get_norm
    from detectron2.modeling import ROI_HEADS_REGISTRY
    from detectron2.modeling.roi_heads import Res5ROIHeads

    if EXTRA_NORM_HEAD in ROI_HEADS_REGISTRY:
        head = ROI_HEADS_REGISTRY.get(EXTRA_NORM_HEAD)
        if not getattr(head, '_ifnd_extra_norm', False):
            raise RuntimeError(f'another {EXTRA_NORM_HEAD} is registered in detectron2')
        return head

    class Res5ROIHeadsExtraNorm(Res5ROIHeads):
        """Res5ROIHeads whose res5 ends in a norm layer (``MODEL.RESNETS.NORM``)."""

        _ifnd_extra_norm = True

        @classmethod
        def _build_res5_block(cls, cfg):
            res5, out_channels = super()._build_res5_block(cfg)
            # The same name as in the torchvision engine's res5 (res5.norm).
            res5.add_module('norm', get_norm(cfg.MODEL.RESNETS.NORM, out_channels))
            return res5, out_channels

    ROI_HEADS_REGISTRY.register(Res5ROIHeadsExtraNorm)
    return Res5ROIHeadsExtraNorm


def build_detectron2_config(options: dict[str, object]):
    """A frozen detectron2 ``CfgNode``: its defaults with the options set."""
    require_detectron2()
    from detectron2.config import get_cfg

    cfg = get_cfg()
    for key, value in options.items():
        *parents, leaf = key.split('.')
        node = cfg
        for part in parents:
            node = getattr(node, part)
        if leaf not in node:
            raise KeyError(f'this detectron2 has no config key {key}; update detectron2')
        setattr(node, leaf, value)
    cfg.freeze()
    return cfg


def _trainer_class(max_to_keep: int | None):
    """detectron2's DefaultTrainer with COCO evaluation, kept results and checkpoint retention."""
    from detectron2.engine import DefaultTrainer, hooks
    from detectron2.evaluation import COCOEvaluator

    class Trainer(DefaultTrainer):
        last_results = None

        @classmethod
        def build_evaluator(cls, cfg, dataset_name, output_folder=None):
            return COCOEvaluator(dataset_name, output_dir=output_folder or osp.join(
                cfg.OUTPUT_DIR, 'inference'))

        @classmethod
        def test(cls, cfg, model, evaluators=None):
            # Kept for the results file: DefaultTrainer.train returns them only when checking
            # expected results.
            cls.last_results = super().test(cfg, model, evaluators)
            return cls.last_results

        def build_hooks(self):
            built = super().build_hooks()
            for hook in built:
                if isinstance(hook, hooks.PeriodicCheckpointer):
                    hook.max_to_keep = max_to_keep  # default_hooks.checkpoint.max_keep_ckpts
            return built

    return Trainer


def _register_datasets(registrations: list[tuple[str, str, str]]) -> None:
    from detectron2.data import DatasetCatalog, MetadataCatalog
    from detectron2.data.datasets import register_coco_instances

    for name, json_file, image_root in registrations:
        if name in DatasetCatalog.list():  # a second run in the same process
            DatasetCatalog.remove(name)
            MetadataCatalog.remove(name)
        register_coco_instances(name, {}, json_file, image_root)


def _detectron2_worker(job: dict) -> None:
    """One process of the run (started by detectron2's ``launch``)."""
    from detectron2.checkpoint import DetectionCheckpointer
    from detectron2.engine import default_setup
    from detectron2.utils import comm

    register_extra_norm_head()
    _register_datasets(job['registrations'])
    cfg = build_detectron2_config(job['options'])
    default_setup(cfg, argparse.Namespace(config_file=job['config_file'],
                                          eval_only=job['eval_only'], resume=job['resume']))
    Trainer = _trainer_class(job['max_to_keep'])
    if job['eval_only']:
        model = Trainer.build_model(cfg)
        checkpointer = DetectionCheckpointer(model, save_dir=cfg.OUTPUT_DIR)
        if job['detector_weights']:
            checkpointer.resume_or_load(job['detector_weights'], resume=False)
        else:  # the work dir's last checkpoint (run_detectron2 checked it is there)
            checkpointer.resume_or_load(cfg.MODEL.WEIGHTS, resume=True)
        results = Trainer.test(cfg, model)
    else:
        trainer = Trainer(cfg)
        trainer.resume_or_load(resume=job['resume'])
        trainer.train()
        results = Trainer.last_results
        if results is None:
            results = Trainer.test(cfg, trainer.model)
    if comm.is_main_process():
        write_json(_plain_results(results), osp.join(cfg.OUTPUT_DIR, RESULTS_FILE))


def _plain_results(results) -> dict:
    """COCOEvaluator's nested OrderedDicts (already in percent) as plain dicts of floats."""
    return {task: {name: float(value) for name, value in metrics.items()}
            for task, metrics in results.items()}


def run_detectron2(cfg: Config, checkpoint: str | None, work_dir: str, *, data_root: str | None,
                   model_name: str | None, num_gpus: int, num_machines: int, machine_rank: int,
                   dist_url: str, resume: bool, eval_only: bool, detector_weights: str | None,
                   amp: bool) -> None:
    """Fine-tune (or evaluate) Mask R-CNN with detectron2; write ``work_dir/coco_results.json``.

    The checkpoint's backbone is exported to ``work_dir/backbone_detectron2.pkl`` and starts the
    detector, unless ``load_from`` in the config names a detectron2 detector checkpoint.
    """
    require_detectron2()
    from detectron2.engine import launch

    plain = _plain(cfg)
    registrations = dataset_registrations(plain, data_root, include_train=not eval_only)
    if eval_only:
        # detectron2's checkpointer records its latest file in last_checkpoint.
        detector = detector_weights or osp.join(work_dir, 'last_checkpoint')
        if '://' not in detector and not osp.isfile(detector):
            raise FileNotFoundError(f'No detector checkpoint to evaluate: {detector} (pass '
                                    '--detector PATH, or train first)')
    weights, depth = plain.get('load_from') or '', None
    if checkpoint is not None and not weights:
        exported = export_detectron2_weights(checkpoint, osp.join(work_dir, WEIGHTS_FILE),
                                             model_name=model_name,
                                             default_backbone=plain['model'].get('backbone'))
        weights, depth = exported['out'], exported['depth']
        print(f"Backbone {exported['model_name']} (ResNet-{depth}) exported to {weights}")
    elif not weights and not eval_only:
        raise ValueError('no pre-trained checkpoint to start the detector from')
    if osp.exists(weights):
        weights = osp.abspath(weights)  # detectron2 also takes URLs, left as they are
    options = detectron2_options(plain, weights, work_dir, num_gpus * num_machines, amp=amp,
                                 depth=depth)
    config_file = osp.join(work_dir, CONFIG_FILE)
    write_detectron2_config(options, config_file)
    checkpoint_hook = (plain.get('default_hooks') or {}).get('checkpoint') or {}
    max_keep = checkpoint_hook.get('max_keep_ckpts', -1)
    job = {'options': options, 'registrations': registrations, 'config_file': config_file,
           'eval_only': eval_only, 'resume': resume, 'detector_weights': detector_weights,
           'max_to_keep': max_keep if max_keep and max_keep > 0 else None}
    launch(_detectron2_worker, num_gpus, num_machines=num_machines, machine_rank=machine_rank,
           dist_url=dist_url, args=(job,))
