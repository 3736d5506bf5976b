"""A COCO transfer config in detectron2's terms.

The COCO transfer configs (``configs/benchmarks/coco/``) are mmengine Runner configs for the
torchvision engine (``ifnd.models.detection.MaskRCNN``). ``detectron2_options`` translates one into
detectron2 config keys (every value read from the config, a clear error for what detectron2 cannot
express), ``dataset_registrations`` finds the COCO files, ``write_detectron2_config`` keeps the
translation as YAML. Nothing here needs detectron2.
"""
from __future__ import annotations

import inspect
import os.path as osp
import re

import yaml
from mmengine.config import Config

from ifnd.fileio import AtomicLocalBackend

TRAIN_DATASET = 'ifnd_coco_train'
VAL_DATASET = 'ifnd_coco_val'
EXTRA_NORM_HEAD = 'Res5ROIHeadsExtraNorm'
NORMS = ('BN', 'SyncBN', 'FrozenBN')


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
    depth, kw = _checked_model(settings, depth)
    rpn = _iou_thresholds(kw['rpn_bg_iou_thresh'], kw['rpn_fg_iou_thresh'], single=False)
    roi = _iou_thresholds(kw['box_bg_iou_thresh'], kw['box_fg_iou_thresh'], single=True)
    sizes = [int(s) for s in settings['anchor_sizes']]
    pooler = int(settings['pooler_resolution'])
    options = _shared_model_options(settings, depth, kw, rpn, roi, pooler)
    if settings['arch'] == 'C4':
        options.update(_c4_options(settings, sizes, pooler))
    else:
        options.update(_fpn_options(settings, sizes, pooler))
    options.update({
        'INPUT.FORMAT': 'RGB',
        'INPUT.MIN_SIZE_TRAIN': tuple(int(s) for s in settings['min_size_train']),
        'INPUT.MIN_SIZE_TRAIN_SAMPLING': 'choice',
        'INPUT.MAX_SIZE_TRAIN': int(settings['max_size']),
        'INPUT.MIN_SIZE_TEST': int(settings['min_size_test']),
        'INPUT.MAX_SIZE_TEST': int(settings['max_size']),
    })
    return options


def _checked_model(settings: dict, depth: int | None) -> tuple[int, dict]:
    """The backbone depth and the detector keywords, once detectron2 can express the model."""
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
    return depth, kw


def _shared_model_options(settings: dict, depth: int, kw: dict, rpn: tuple[list, list],
                          roi: tuple[list, list], pooler: int) -> dict[str, object]:
    """The options of both architectures: normalisation, ResNet, RPN and box head sampling."""
    pixel_mean, pixel_std = list(settings['pixel_mean']), list(settings['pixel_std'])
    (rpn_ious, rpn_labels), (roi_ious, roi_labels) = rpn, roi
    return {
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
        'MODEL.RESNETS.NORM': settings['norm'],
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


def _c4_options(settings: dict, sizes: list[int], pooler: int) -> dict[str, object]:
    """C4: RPN and RoIAlign on res4; res5 is the RoI head, shared by box and mask branches."""
    return {
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
    }


def _fpn_options(settings: dict, sizes: list[int], pooler: int) -> dict[str, object]:
    """FPN: torchvision's heads on five pyramid levels."""
    if settings['res5_extra_norm']:
        raise _unsupported('model.res5_extra_norm belongs to the C4 RoI head; set it False '
                           'for FPN')
    if len(sizes) != 5:
        raise _unsupported(f'FPN has five levels (P2-P6), one anchor size each; got {sizes}')
    # torchvision's FPN heads: two 1024-d FCs on 7x7 boxes, four 256-d convs on masks pooled at
    # twice the box resolution; no norm in FPN or heads.
    return {
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
    }


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


def config_dict(cfg: Config | dict) -> dict:
    """A config as a plain dict (a ``Config`` converted, a dict copied)."""
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
    cfg = config_dict(cfg)
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
    cfg = config_dict(cfg)
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
