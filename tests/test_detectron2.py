"""detectron2 engine: backbone export, config translation, data registration, install guard.

detectron2 itself is not needed except by the last test, which is skipped without it.
"""
import importlib.util
import os
import os.path as osp
import pickle
import sys

import numpy as np
import pytest
import torch
import yaml
from mmengine.config import Config

from ifnd.models import TimmBackbone
from ifnd.transfer import (EXTRA_NORM_HEAD, UnsupportedConfig, dataset_registrations, detectron2_available,
                           detectron2_options, from_detectron2, require_detectron2, resnet_depth,
                           run_detectron2, to_detectron2, write_detectron2_config)

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
COCO_CONFIGS = osp.join(REPO, 'configs', 'benchmarks', 'coco')
# tools/ is a folder of scripts, not a package.
_spec = importlib.util.spec_from_file_location(
    'tool_convert_to_detectron2', osp.join(REPO, 'tools', 'convert_to_detectron2.py'))
_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_tool)
convert_main = _tool.main

# detectron2's ResNet-50 backbone weights and their shapes, from its definition: BasicStem (7x7
# conv, 64 channels); bottleneck stages res2-res5 with 3/4/6/3 blocks, bottleneck/out widths
# 64/256, 128/512, 256/1024, 512/2048; a projection shortcut in block 0 of each stage; every
# conv followed by its norm.
R50_DETECTRON2 = """
    stem.conv1.weight                  64 3 7 7
    stem.conv1.norm.weight             64
    stem.conv1.norm.bias               64
    stem.conv1.norm.running_mean       64
    stem.conv1.norm.running_var        64
    res2.0.shortcut.weight             256 64 1 1
    res2.0.shortcut.norm.weight        256
    res2.0.shortcut.norm.bias          256
    res2.0.shortcut.norm.running_mean  256
    res2.0.shortcut.norm.running_var   256
    res2.0.conv1.weight                64 64 1 1
    res2.0.conv1.norm.weight           64
    res2.0.conv1.norm.bias             64
    res2.0.conv1.norm.running_mean     64
    res2.0.conv1.norm.running_var      64
    res2.0.conv2.weight                64 64 3 3
    res2.0.conv2.norm.weight           64
    res2.0.conv2.norm.bias             64
    res2.0.conv2.norm.running_mean     64
    res2.0.conv2.norm.running_var      64
    res2.0.conv3.weight                256 64 1 1
    res2.0.conv3.norm.weight           256
    res2.0.conv3.norm.bias             256
    res2.0.conv3.norm.running_mean     256
    res2.0.conv3.norm.running_var      256
    res2.1.conv1.weight                64 256 1 1
    res2.1.conv1.norm.weight           64
    res2.1.conv1.norm.bias             64
    res2.1.conv1.norm.running_mean     64
    res2.1.conv1.norm.running_var      64
    res2.1.conv2.weight                64 64 3 3
    res2.1.conv2.norm.weight           64
    res2.1.conv2.norm.bias             64
    res2.1.conv2.norm.running_mean     64
    res2.1.conv2.norm.running_var      64
    res2.1.conv3.weight                256 64 1 1
    res2.1.conv3.norm.weight           256
    res2.1.conv3.norm.bias             256
    res2.1.conv3.norm.running_mean     256
    res2.1.conv3.norm.running_var      256
    res2.2.conv1.weight                64 256 1 1
    res2.2.conv1.norm.weight           64
    res2.2.conv1.norm.bias             64
    res2.2.conv1.norm.running_mean     64
    res2.2.conv1.norm.running_var      64
    res2.2.conv2.weight                64 64 3 3
    res2.2.conv2.norm.weight           64
    res2.2.conv2.norm.bias             64
    res2.2.conv2.norm.running_mean     64
    res2.2.conv2.norm.running_var      64
    res2.2.conv3.weight                256 64 1 1
    res2.2.conv3.norm.weight           256
    res2.2.conv3.norm.bias             256
    res2.2.conv3.norm.running_mean     256
    res2.2.conv3.norm.running_var      256
    res3.0.shortcut.weight             512 256 1 1
    res3.0.shortcut.norm.weight        512
    res3.0.shortcut.norm.bias          512
    res3.0.shortcut.norm.running_mean  512
    res3.0.shortcut.norm.running_var   512
    res3.0.conv1.weight                128 256 1 1
    res3.0.conv1.norm.weight           128
    res3.0.conv1.norm.bias             128
    res3.0.conv1.norm.running_mean     128
    res3.0.conv1.norm.running_var      128
    res3.0.conv2.weight                128 128 3 3
    res3.0.conv2.norm.weight           128
    res3.0.conv2.norm.bias             128
    res3.0.conv2.norm.running_mean     128
    res3.0.conv2.norm.running_var      128
    res3.0.conv3.weight                512 128 1 1
    res3.0.conv3.norm.weight           512
    res3.0.conv3.norm.bias             512
    res3.0.conv3.norm.running_mean     512
    res3.0.conv3.norm.running_var      512
    res3.1.conv1.weight                128 512 1 1
    res3.1.conv1.norm.weight           128
    res3.1.conv1.norm.bias             128
    res3.1.conv1.norm.running_mean     128
    res3.1.conv1.norm.running_var      128
    res3.1.conv2.weight                128 128 3 3
    res3.1.conv2.norm.weight           128
    res3.1.conv2.norm.bias             128
    res3.1.conv2.norm.running_mean     128
    res3.1.conv2.norm.running_var      128
    res3.1.conv3.weight                512 128 1 1
    res3.1.conv3.norm.weight           512
    res3.1.conv3.norm.bias             512
    res3.1.conv3.norm.running_mean     512
    res3.1.conv3.norm.running_var      512
    res3.2.conv1.weight                128 512 1 1
    res3.2.conv1.norm.weight           128
    res3.2.conv1.norm.bias             128
    res3.2.conv1.norm.running_mean     128
    res3.2.conv1.norm.running_var      128
    res3.2.conv2.weight                128 128 3 3
    res3.2.conv2.norm.weight           128
    res3.2.conv2.norm.bias             128
    res3.2.conv2.norm.running_mean     128
    res3.2.conv2.norm.running_var      128
    res3.2.conv3.weight                512 128 1 1
    res3.2.conv3.norm.weight           512
    res3.2.conv3.norm.bias             512
    res3.2.conv3.norm.running_mean     512
    res3.2.conv3.norm.running_var      512
    res3.3.conv1.weight                128 512 1 1
    res3.3.conv1.norm.weight           128
    res3.3.conv1.norm.bias             128
    res3.3.conv1.norm.running_mean     128
    res3.3.conv1.norm.running_var      128
    res3.3.conv2.weight                128 128 3 3
    res3.3.conv2.norm.weight           128
    res3.3.conv2.norm.bias             128
    res3.3.conv2.norm.running_mean     128
    res3.3.conv2.norm.running_var      128
    res3.3.conv3.weight                512 128 1 1
    res3.3.conv3.norm.weight           512
    res3.3.conv3.norm.bias             512
    res3.3.conv3.norm.running_mean     512
    res3.3.conv3.norm.running_var      512
    res4.0.shortcut.weight             1024 512 1 1
    res4.0.shortcut.norm.weight        1024
    res4.0.shortcut.norm.bias          1024
    res4.0.shortcut.norm.running_mean  1024
    res4.0.shortcut.norm.running_var   1024
    res4.0.conv1.weight                256 512 1 1
    res4.0.conv1.norm.weight           256
    res4.0.conv1.norm.bias             256
    res4.0.conv1.norm.running_mean     256
    res4.0.conv1.norm.running_var      256
    res4.0.conv2.weight                256 256 3 3
    res4.0.conv2.norm.weight           256
    res4.0.conv2.norm.bias             256
    res4.0.conv2.norm.running_mean     256
    res4.0.conv2.norm.running_var      256
    res4.0.conv3.weight                1024 256 1 1
    res4.0.conv3.norm.weight           1024
    res4.0.conv3.norm.bias             1024
    res4.0.conv3.norm.running_mean     1024
    res4.0.conv3.norm.running_var      1024
    res4.1.conv1.weight                256 1024 1 1
    res4.1.conv1.norm.weight           256
    res4.1.conv1.norm.bias             256
    res4.1.conv1.norm.running_mean     256
    res4.1.conv1.norm.running_var      256
    res4.1.conv2.weight                256 256 3 3
    res4.1.conv2.norm.weight           256
    res4.1.conv2.norm.bias             256
    res4.1.conv2.norm.running_mean     256
    res4.1.conv2.norm.running_var      256
    res4.1.conv3.weight                1024 256 1 1
    res4.1.conv3.norm.weight           1024
    res4.1.conv3.norm.bias             1024
    res4.1.conv3.norm.running_mean     1024
    res4.1.conv3.norm.running_var      1024
    res4.2.conv1.weight                256 1024 1 1
    res4.2.conv1.norm.weight           256
    res4.2.conv1.norm.bias             256
    res4.2.conv1.norm.running_mean     256
    res4.2.conv1.norm.running_var      256
    res4.2.conv2.weight                256 256 3 3
    res4.2.conv2.norm.weight           256
    res4.2.conv2.norm.bias             256
    res4.2.conv2.norm.running_mean     256
    res4.2.conv2.norm.running_var      256
    res4.2.conv3.weight                1024 256 1 1
    res4.2.conv3.norm.weight           1024
    res4.2.conv3.norm.bias             1024
    res4.2.conv3.norm.running_mean     1024
    res4.2.conv3.norm.running_var      1024
    res4.3.conv1.weight                256 1024 1 1
    res4.3.conv1.norm.weight           256
    res4.3.conv1.norm.bias             256
    res4.3.conv1.norm.running_mean     256
    res4.3.conv1.norm.running_var      256
    res4.3.conv2.weight                256 256 3 3
    res4.3.conv2.norm.weight           256
    res4.3.conv2.norm.bias             256
    res4.3.conv2.norm.running_mean     256
    res4.3.conv2.norm.running_var      256
    res4.3.conv3.weight                1024 256 1 1
    res4.3.conv3.norm.weight           1024
    res4.3.conv3.norm.bias             1024
    res4.3.conv3.norm.running_mean     1024
    res4.3.conv3.norm.running_var      1024
    res4.4.conv1.weight                256 1024 1 1
    res4.4.conv1.norm.weight           256
    res4.4.conv1.norm.bias             256
    res4.4.conv1.norm.running_mean     256
    res4.4.conv1.norm.running_var      256
    res4.4.conv2.weight                256 256 3 3
    res4.4.conv2.norm.weight           256
    res4.4.conv2.norm.bias             256
    res4.4.conv2.norm.running_mean     256
    res4.4.conv2.norm.running_var      256
    res4.4.conv3.weight                1024 256 1 1
    res4.4.conv3.norm.weight           1024
    res4.4.conv3.norm.bias             1024
    res4.4.conv3.norm.running_mean     1024
    res4.4.conv3.norm.running_var      1024
    res4.5.conv1.weight                256 1024 1 1
    res4.5.conv1.norm.weight           256
    res4.5.conv1.norm.bias             256
    res4.5.conv1.norm.running_mean     256
    res4.5.conv1.norm.running_var      256
    res4.5.conv2.weight                256 256 3 3
    res4.5.conv2.norm.weight           256
    res4.5.conv2.norm.bias             256
    res4.5.conv2.norm.running_mean     256
    res4.5.conv2.norm.running_var      256
    res4.5.conv3.weight                1024 256 1 1
    res4.5.conv3.norm.weight           1024
    res4.5.conv3.norm.bias             1024
    res4.5.conv3.norm.running_mean     1024
    res4.5.conv3.norm.running_var      1024
    res5.0.shortcut.weight             2048 1024 1 1
    res5.0.shortcut.norm.weight        2048
    res5.0.shortcut.norm.bias          2048
    res5.0.shortcut.norm.running_mean  2048
    res5.0.shortcut.norm.running_var   2048
    res5.0.conv1.weight                512 1024 1 1
    res5.0.conv1.norm.weight           512
    res5.0.conv1.norm.bias             512
    res5.0.conv1.norm.running_mean     512
    res5.0.conv1.norm.running_var      512
    res5.0.conv2.weight                512 512 3 3
    res5.0.conv2.norm.weight           512
    res5.0.conv2.norm.bias             512
    res5.0.conv2.norm.running_mean     512
    res5.0.conv2.norm.running_var      512
    res5.0.conv3.weight                2048 512 1 1
    res5.0.conv3.norm.weight           2048
    res5.0.conv3.norm.bias             2048
    res5.0.conv3.norm.running_mean     2048
    res5.0.conv3.norm.running_var      2048
    res5.1.conv1.weight                512 2048 1 1
    res5.1.conv1.norm.weight           512
    res5.1.conv1.norm.bias             512
    res5.1.conv1.norm.running_mean     512
    res5.1.conv1.norm.running_var      512
    res5.1.conv2.weight                512 512 3 3
    res5.1.conv2.norm.weight           512
    res5.1.conv2.norm.bias             512
    res5.1.conv2.norm.running_mean     512
    res5.1.conv2.norm.running_var      512
    res5.1.conv3.weight                2048 512 1 1
    res5.1.conv3.norm.weight           2048
    res5.1.conv3.norm.bias             2048
    res5.1.conv3.norm.running_mean     2048
    res5.1.conv3.norm.running_var      2048
    res5.2.conv1.weight                512 2048 1 1
    res5.2.conv1.norm.weight           512
    res5.2.conv1.norm.bias             512
    res5.2.conv1.norm.running_mean     512
    res5.2.conv1.norm.running_var      512
    res5.2.conv2.weight                512 512 3 3
    res5.2.conv2.norm.weight           512
    res5.2.conv2.norm.bias             512
    res5.2.conv2.norm.running_mean     512
    res5.2.conv2.norm.running_var      512
    res5.2.conv3.weight                2048 512 1 1
    res5.2.conv3.norm.weight           2048
    res5.2.conv3.norm.bias             2048
    res5.2.conv3.norm.running_mean     2048
    res5.2.conv3.norm.running_var      2048
"""


def _expected_shapes() -> dict[str, tuple[int, ...]]:
    rows = [line.split() for line in R50_DETECTRON2.strip().splitlines()]
    return {name: tuple(int(d) for d in dims) for name, *dims in rows}


def _config(name: str) -> Config:
    return Config.fromfile(osp.join(COCO_CONFIGS, f'{name}.py'))


@pytest.fixture(scope='module')
def resnet50_files(tmp_path_factory):
    """A resnet50 with random weights and BN statistics, saved in three layouts."""
    torch.manual_seed(0)
    backbone = TimmBackbone('resnet50')
    for module in backbone.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.weight.data.normal_()
            module.bias.data.normal_()
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2.0)
    state = {k: v.clone() for k, v in backbone.model.state_dict().items()}
    folder = tmp_path_factory.mktemp('r50')
    ours = str(folder / 'ours.pth')
    torch.save({'state_dict': state, 'meta': {'model': {'backbone': {
        'type': 'TimmBackbone', 'model_name': 'resnet50'}}}}, ours)
    moco = str(folder / 'moco.pth.tar')
    head = {'fc.0.weight': torch.randn(2048, 2048), 'fc.0.bias': torch.randn(2048),
            'fc.2.weight': torch.randn(128, 2048), 'fc.2.bias': torch.randn(128)}
    torch.save({'state_dict': {'module.encoder_q.' + k: v for k, v in {**state, **head}.items()},
                'epoch': 200}, moco)
    torchvision_style = str(folder / 'resnet50_torchvision.pth')
    torch.save({**state, 'fc.weight': torch.randn(1000, 2048), 'fc.bias': torch.randn(1000)},
               torchvision_style)
    return {'state': state, 'ours': ours, 'moco': moco, 'torchvision': torchvision_style}


@pytest.mark.parametrize('layout,extra', [('ours', []), ('moco', ['--model-name', 'resnet50']),
                                          ('torchvision', ['--model-name', 'resnet50'])])
def test_export_gives_detectron2_r50_weights(resnet50_files, tmp_path, capsys, layout, extra):
    out = str(tmp_path / 'r50_d2.pkl')
    convert_main([resnet50_files[layout], out, *extra])
    assert '265 tensors of resnet50 (MODEL.RESNETS.DEPTH 50)' in capsys.readouterr().out
    with open(out, 'rb') as f:
        raw = f.read()
    data = pickle.loads(raw, encoding='latin1')  # as detectron2's checkpointer reads .pkl files
    assert data['__author__'] == 'ifnd'
    assert data['matching_heuristics'] is True
    assert set(data) == {'model', '__author__', 'matching_heuristics'}
    model = data['model']
    expected = _expected_shapes()
    assert len(expected) == 265
    assert sorted(model) == sorted(expected)
    assert {k: tuple(v.shape) for k, v in model.items()} == expected
    assert all(type(v) is np.ndarray and v.dtype == np.float32 for v in model.values())
    assert all(v.flags.writeable for v in model.values())
    # Arrays are pickled without numpy 2's private module path, so numpy 1.x loads the file too.
    assert b'numpy._core' not in raw and b'numpy.core' not in raw

    original = {k: v for k, v in resnet50_files['state'].items() if 'num_batches_tracked' not in k}
    back = from_detectron2(model)
    assert sorted(back) == sorted(original)
    for key, value in original.items():
        assert back[key].dtype == value.dtype and torch.equal(back[key], value), key


def test_conversion_round_trip_and_names(resnet50_files):
    state = resnet50_files['state']
    model = to_detectron2({**state, 'fc.weight': torch.zeros(3, 2048)})
    assert len(model) == 265 and not any('fc' in k for k in model)
    assert np.array_equal(model['res3.0.shortcut.norm.running_var'],
                          state['layer2.0.downsample.1.running_var'].numpy())
    assert np.array_equal(model['res5.2.conv3.weight'], state['layer4.2.conv3.weight'].numpy())
    assert np.array_equal(model['stem.conv1.norm.bias'], state['bn1.bias'].numpy())
    back = from_detectron2(model)
    assert all(torch.equal(back[k], state[k]) for k in back)
    assert resnet_depth(state) == 50


def test_export_errors(tmp_path, resnet50_files):
    cifar = TimmBackbone('resnet18', cifar_stem=True)
    path = str(tmp_path / 'cifar_r18.pth')
    torch.save({'state_dict': cifar.model.state_dict(), 'meta': {'model': {'backbone': {
        'type': 'TimmBackbone', 'model_name': 'resnet18', 'cifar_stem': True}}}}, path)
    with pytest.raises(SystemExit, match=r'^error: .*7x7.*CIFAR-stem'):  # the tool's one-line error
        convert_main([path, str(tmp_path / 'out.pkl')])
    assert not osp.exists(tmp_path / 'out.pkl')

    with pytest.raises(SystemExit, match='^error: checkpoint not found: .*missing.pth'):
        convert_main([str(tmp_path / 'missing.pth'), str(tmp_path / 'out.pkl')])
    convert_main([resnet50_files['moco'], str(tmp_path / 'out.pkl')])  # read as the ResNet-50 it is
    assert osp.exists(tmp_path / 'out.pkl')

    state = resnet50_files['state']
    with pytest.raises(ValueError, match=r'no counterpart.*layer1\.0\.se\.fc1\.weight'):
        to_detectron2({**state, 'layer1.0.se.fc1.weight': torch.zeros(1)})
    with pytest.raises(ValueError, match='not detectron2 ResNet backbone weights'):
        from_detectron2({'roi_heads.box_predictor.cls_score.weight': np.zeros(1)})
    wide = {**state, 'layer1.0.conv1.weight': torch.zeros(128, 64, 1, 1)}
    with pytest.raises(ValueError, match='128 channels wide'):
        resnet_depth(wide)
    shallow = {k: v for k, v in state.items() if not k.startswith('layer3.5.')}
    with pytest.raises(ValueError, match=r'\(3, 4, 5, 3\) bottleneck'):
        resnet_depth(shallow)


# The MoCo detection protocol (R50-C4, 2x), as the C4 2x config must translate on 8 GPUs.
C4_2X_PROTOCOL = {
    'MODEL.META_ARCHITECTURE': 'GeneralizedRCNN',
    'MODEL.WEIGHTS': '/weights/backbone.pkl',
    'MODEL.MASK_ON': True,
    'MODEL.PIXEL_MEAN': [123.675, 116.28, 103.53],
    'MODEL.PIXEL_STD': [58.395, 57.12, 57.375],
    'INPUT.FORMAT': 'RGB',
    'MODEL.BACKBONE.NAME': 'build_resnet_backbone',
    'MODEL.BACKBONE.FREEZE_AT': 0,
    'MODEL.RESNETS.DEPTH': 50,
    'MODEL.RESNETS.STRIDE_IN_1X1': False,
    'MODEL.RESNETS.NORM': 'SyncBN',
    'MODEL.RESNETS.OUT_FEATURES': ['res4'],
    'MODEL.RPN.IN_FEATURES': ['res4'],
    'MODEL.RPN.PRE_NMS_TOPK_TRAIN': 12000,
    'MODEL.RPN.POST_NMS_TOPK_TRAIN': 2000,
    'MODEL.RPN.PRE_NMS_TOPK_TEST': 6000,
    'MODEL.RPN.POST_NMS_TOPK_TEST': 1000,
    'MODEL.RPN.NMS_THRESH': 0.7,
    'MODEL.RPN.IOU_THRESHOLDS': [0.3, 0.7],
    'MODEL.RPN.BATCH_SIZE_PER_IMAGE': 256,
    'MODEL.RPN.POSITIVE_FRACTION': 0.5,
    'MODEL.ANCHOR_GENERATOR.SIZES': [[32, 64, 128, 256, 512]],
    'MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS': [[0.5, 1.0, 2.0]],
    'MODEL.ROI_HEADS.NAME': 'Res5ROIHeadsExtraNorm',
    'MODEL.ROI_HEADS.IN_FEATURES': ['res4'],
    'MODEL.ROI_HEADS.NUM_CLASSES': 80,
    'MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE': 512,
    'MODEL.ROI_HEADS.POSITIVE_FRACTION': 0.25,
    'MODEL.ROI_HEADS.IOU_THRESHOLDS': [0.5],
    'MODEL.ROI_HEADS.SCORE_THRESH_TEST': 0.05,
    'MODEL.ROI_HEADS.NMS_THRESH_TEST': 0.5,
    'MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION': 14,
    'MODEL.ROI_MASK_HEAD.NUM_CONV': 0,
    'TEST.DETECTIONS_PER_IMAGE': 100,
    'INPUT.MIN_SIZE_TRAIN': (640, 672, 704, 736, 768, 800),
    'INPUT.MAX_SIZE_TRAIN': 1333,
    'INPUT.MIN_SIZE_TEST': 800,
    'INPUT.MAX_SIZE_TEST': 1333,
    'SOLVER.IMS_PER_BATCH': 16,
    'SOLVER.BASE_LR': 0.02,
    'SOLVER.MOMENTUM': 0.9,
    'SOLVER.WEIGHT_DECAY': 0.0001,
    'SOLVER.WEIGHT_DECAY_NORM': 0.0,
    'SOLVER.LR_SCHEDULER_NAME': 'WarmupMultiStepLR',
    'SOLVER.STEPS': (120000, 160000),
    'SOLVER.GAMMA': 0.1,
    'SOLVER.MAX_ITER': 180000,
    'SOLVER.WARMUP_ITERS': 1000,
    'SOLVER.WARMUP_FACTOR': 0.001,
    'SOLVER.CHECKPOINT_PERIOD': 10000,
    'SOLVER.AMP.ENABLED': False,
    'TEST.EVAL_PERIOD': 0,
    'TEST.PRECISE_BN.ENABLED': True,
    'TEST.PRECISE_BN.NUM_ITER': 200,
    'DATASETS.TRAIN': ('ifnd_coco_train',),
    'DATASETS.TEST': ('ifnd_coco_val',),
    'DATALOADER.NUM_WORKERS': 4,
    'DATALOADER.ASPECT_RATIO_GROUPING': True,
    'SEED': 0,
    'OUTPUT_DIR': 'work_dirs/coco/c4_2x',
}


def test_c4_2x_config_translates_to_the_moco_protocol():
    options = detectron2_options(_config('mask_rcnn_r50_c4_2x_coco'), '/weights/backbone.pkl',
                                 'work_dirs/coco/c4_2x', num_gpus=8)
    assert {k: options.get(k) for k in C4_2X_PROTOCOL} == C4_2X_PROTOCOL
    assert options['MODEL.ROI_HEADS.NAME'] == EXTRA_NORM_HEAD


def test_schedules_and_fpn_configs():
    one_x = detectron2_options(_config('mask_rcnn_r50_c4_1x_coco'), 'w.pkl', 'out', num_gpus=8)
    assert (one_x['SOLVER.MAX_ITER'], one_x['SOLVER.STEPS']) == (90000, (60000, 80000))
    assert one_x['MODEL.ROI_HEADS.NAME'] == 'Res5ROIHeadsExtraNorm'

    for name, max_iter, steps in (('mask_rcnn_r50_fpn_1x_coco', 90000, (60000, 80000)),
                                  ('mask_rcnn_r50_fpn_2x_coco', 180000, (120000, 160000))):
        fpn = detectron2_options(_config(name), 'w.pkl', 'out', num_gpus=8)
        assert (fpn['SOLVER.MAX_ITER'], fpn['SOLVER.STEPS']) == (max_iter, steps)
        assert {k: fpn[k] for k in (
            'MODEL.BACKBONE.NAME', 'MODEL.RESNETS.OUT_FEATURES', 'MODEL.FPN.IN_FEATURES',
            'MODEL.ANCHOR_GENERATOR.SIZES', 'MODEL.RPN.IN_FEATURES', 'MODEL.ROI_HEADS.NAME',
            'MODEL.ROI_HEADS.IN_FEATURES', 'MODEL.ROI_BOX_HEAD.NAME', 'MODEL.ROI_BOX_HEAD.NUM_FC',
            'MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION', 'MODEL.ROI_MASK_HEAD.NUM_CONV',
            'MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION', 'MODEL.RPN.PRE_NMS_TOPK_TRAIN',
            'MODEL.RPN.POST_NMS_TOPK_TRAIN', 'MODEL.RPN.PRE_NMS_TOPK_TEST',
            'MODEL.RPN.POST_NMS_TOPK_TEST', 'MODEL.RESNETS.NORM', 'SOLVER.IMS_PER_BATCH')} == {
            'MODEL.BACKBONE.NAME': 'build_resnet_fpn_backbone',
            'MODEL.RESNETS.OUT_FEATURES': ['res2', 'res3', 'res4', 'res5'],
            'MODEL.FPN.IN_FEATURES': ['res2', 'res3', 'res4', 'res5'],
            'MODEL.ANCHOR_GENERATOR.SIZES': [[32], [64], [128], [256], [512]],
            'MODEL.RPN.IN_FEATURES': ['p2', 'p3', 'p4', 'p5', 'p6'],
            'MODEL.ROI_HEADS.NAME': 'StandardROIHeads',
            'MODEL.ROI_HEADS.IN_FEATURES': ['p2', 'p3', 'p4', 'p5'],
            'MODEL.ROI_BOX_HEAD.NAME': 'FastRCNNConvFCHead',
            'MODEL.ROI_BOX_HEAD.NUM_FC': 2,
            'MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION': 7,
            'MODEL.ROI_MASK_HEAD.NUM_CONV': 4,
            'MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION': 14,
            'MODEL.RPN.PRE_NMS_TOPK_TRAIN': 2000,
            'MODEL.RPN.POST_NMS_TOPK_TRAIN': 1000,
            'MODEL.RPN.PRE_NMS_TOPK_TEST': 1000,
            'MODEL.RPN.POST_NMS_TOPK_TEST': 1000,
            'MODEL.RESNETS.NORM': 'SyncBN',
            'SOLVER.IMS_PER_BATCH': 16,
        }


def test_run_settings_follow_the_config(tmp_path):
    cfg = _config('mask_rcnn_r50_c4_2x_coco')
    four = detectron2_options(cfg, 'w.pkl', 'out', num_gpus=4, depth=101)
    assert (four['SOLVER.IMS_PER_BATCH'], four['SOLVER.BASE_LR']) == (8, 0.02)
    assert four['MODEL.RESNETS.DEPTH'] == 101
    cfg.auto_scale_lr.enable = True
    assert detectron2_options(cfg, 'w.pkl', 'out', num_gpus=4)['SOLVER.BASE_LR'] == 0.01
    assert detectron2_options(cfg, 'w.pkl', 'out', 8, amp=True)['SOLVER.AMP.ENABLED'] is True
    cfg.optim_wrapper.type = 'AmpOptimWrapper'
    cfg.optim_wrapper.loss_scale = 'dynamic'
    assert detectron2_options(cfg, 'w.pkl', 'out', 8)['SOLVER.AMP.ENABLED'] is True
    cfg.train_cfg.val_interval = 20000
    cfg.custom_hooks = []
    cfg.model.res5_extra_norm = False
    options = detectron2_options(cfg, 'w.pkl', 'out', 8)
    assert options['TEST.EVAL_PERIOD'] == 20000
    assert options['TEST.PRECISE_BN.ENABLED'] is False
    assert options['MODEL.ROI_HEADS.NAME'] == 'Res5ROIHeads'

    path = str(tmp_path / 'd2.yaml')
    write_detectron2_config(options, path)
    with open(path) as f:
        nested = yaml.safe_load(f)
    assert nested['SOLVER']['STEPS'] == [120000, 160000]
    assert nested['MODEL']['ROI_HEADS']['NAME'] == 'Res5ROIHeads'
    assert nested['MODEL']['ANCHOR_GENERATOR']['SIZES'] == [[32, 64, 128, 256, 512]]
    assert nested['TEST']['PRECISE_BN']['ENABLED'] is False
    assert nested['INPUT']['FORMAT'] == 'RGB'


@pytest.mark.parametrize('change,message', [
    (lambda c: c.merge_from_dict({'param_scheduler': [
        dict(type='CosineAnnealingLR', by_epoch=False, begin=0, end=180000)]}),
     "'CosineAnnealingLR'.*WarmupMultiStepLR"),
    (lambda c: c.merge_from_dict({'param_scheduler': [
        dict(type='MultiStepLR', by_epoch=True, milestones=[8, 11])]}), 'by_epoch=False'),
    (lambda c: c.merge_from_dict({'train_cfg': dict(type='EpochBasedTrainLoop', max_epochs=12)}),
     'IterBasedTrainLoop'),
    (lambda c: c.merge_from_dict({'model.backbone.model_name': 'vit_base_patch16_224'}),
     'not a standard ResNet'),
    (lambda c: c.merge_from_dict({'model.backbone.model_name': 'resnet18'}), 'depth >= 50'),
    (lambda c: c.merge_from_dict({'model.detector_kwargs.rpn_head': 'x'}),
     r"detector_kwargs has \['rpn_head'\]"),
    (lambda c: c.merge_from_dict({'optim_wrapper.optimizer.type': 'AdamW'}), 'SGD'),
    (lambda c: c.merge_from_dict({'optim_wrapper.clip_grad': dict(max_norm=1.0)}), 'clip_grad'),
    (lambda c: c.merge_from_dict({'custom_hooks': [dict(type='EMAHook')]}), "'EMAHook'"),
])
def test_what_detectron2_cannot_express_fails_clearly(change, message):
    cfg = _config('mask_rcnn_r50_c4_2x_coco')
    change(cfg)
    with pytest.raises(UnsupportedConfig, match=message) as err:
        detectron2_options(cfg, 'w.pkl', 'out', num_gpus=8)
    assert '--engine torchvision' in str(err.value)


def _coco_layout(root):
    os.makedirs(osp.join(root, 'annotations'))
    for split in ('train2017', 'val2017'):
        os.makedirs(osp.join(root, split))
        with open(osp.join(root, 'annotations', f'instances_{split}.json'), 'w') as f:
            f.write('{}')


def test_dataset_registrations(tmp_path):
    root = str(tmp_path / 'coco')
    _coco_layout(root)
    cfg = _config('mask_rcnn_r50_c4_2x_coco')
    expected = [
        ('ifnd_coco_train', osp.join(root, 'annotations/instances_train2017.json'),
         osp.join(root, 'train2017')),
        ('ifnd_coco_val', osp.join(root, 'annotations/instances_val2017.json'),
         osp.join(root, 'val2017')),
    ]
    assert dataset_registrations(cfg, root) == expected
    assert dataset_registrations(cfg, root, include_train=False) == expected[1:]
    cfg.merge_from_dict({'train_dataloader.dataset.data_root': root,
                         'val_dataloader.dataset.data_root': root})
    assert dataset_registrations(cfg, None) == expected

    os.rmdir(osp.join(root, 'val2017'))
    with pytest.raises(FileNotFoundError) as err:
        dataset_registrations(cfg, root)
    message = str(err.value)
    assert osp.join(root, 'val2017') in message
    for hint in ('instances_{train,val}2017.json', '--data-root',
                 '--cfg-options train_dataloader.dataset.ann_file='):
        assert hint in message
    with pytest.raises(FileNotFoundError, match='instances_train2017.json'):
        dataset_registrations(cfg, str(tmp_path / 'elsewhere'))


def test_missing_detectron2_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, 'detectron2', None)  # makes `import detectron2` fail
    assert detectron2_available() is False
    with pytest.raises(ImportError) as err:
        require_detectron2()
    message = str(err.value)
    for hint in ('detectron2 is not installed', '--no-build-isolation', 'compiler',
                 'git+https://github.com/facebookresearch/detectron2.git', '--engine torchvision'):
        assert hint in message
    with pytest.raises(ImportError, match='detectron2 is not installed'):
        run_detectron2(_config('mask_rcnn_r50_c4_2x_coco'), 'ckpt.pth', str(tmp_path),
                       data_root=None, model_name=None, num_gpus=1, num_machines=1,
                       machine_rank=0, dist_url='auto', resume=False, eval_only=False,
                       detector_weights=None, amp=False)
    assert os.listdir(tmp_path) == []


def test_with_detectron2_head_config_and_weights(resnet50_files, tmp_path):
    """The extra-norm head registers once; the options build a model that takes the weights."""
    pytest.importorskip('detectron2')
    from detectron2.checkpoint import DetectionCheckpointer
    from detectron2.config import get_cfg
    from detectron2.modeling import ROI_HEADS_REGISTRY, build_model

    from ifnd.transfer import build_detectron2_config, register_extra_norm_head

    head = register_extra_norm_head()
    assert register_extra_norm_head() is head
    assert ROI_HEADS_REGISTRY.get(EXTRA_NORM_HEAD) is head

    weights = str(tmp_path / 'r50.pkl')
    convert_main([resnet50_files['ours'], weights])
    options = detectron2_options(_config('mask_rcnn_r50_c4_2x_coco'), weights, str(tmp_path), 1)
    options.update({'MODEL.DEVICE': 'cpu', 'MODEL.RESNETS.NORM': 'BN'})
    cfg = build_detectron2_config(options)
    assert cfg.is_frozen() and cfg.MODEL.ROI_HEADS.NAME == EXTRA_NORM_HEAD
    model = build_model(cfg)
    assert isinstance(model.roi_heads.res5.norm, torch.nn.BatchNorm2d)
    DetectionCheckpointer(model).load(weights)
    state = resnet50_files['state']
    assert torch.equal(model.backbone.res2[0].conv1.weight, state['layer1.0.conv1.weight'])
    assert torch.equal(model.roi_heads.res5[2].conv3.norm.running_var,
                       state['layer4.2.bn3.running_var'])

    path = str(tmp_path / 'd2.yaml')
    write_detectron2_config(options, path)
    merged = get_cfg()
    merged.merge_from_file(path)
    assert tuple(merged.SOLVER.STEPS) == (120000, 160000)
    assert merged.MODEL.ROI_HEADS.NAME == EXTRA_NORM_HEAD
