"""COCO transfer with the torchvision engine: data, model, metric and the tool end to end on CPU.

The data set is generated (drawn shapes with polygon and RLE instance masks, a crowd region per
third image, category ids with gaps) and written as real JPEG and JSON files in COCO's layout.
"""
import contextlib
import importlib.util
import io
import json
import math
import os
import os.path as osp
import re

import numpy as np
import pytest
import torch
from helpers import run_script
from mmengine.config import Config
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from ifnd.datasets import CocoInstances, make_shapes_coco
from ifnd.evaluation.coco import STAT_NAMES, detections_to_coco, evaluate_coco, format_results_table
from ifnd.hooks import recompute_bn_statistics
from ifnd.models import MaskRCNN, TimmBackbone
from ifnd.models.detection import AlignedRoIPool

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
COCO_CONFIGS = osp.join(REPO, 'configs', 'benchmarks', 'coco')
TINY_RESNET = dict(type='TimmBackbone', model_name='resnet18', channels=(8, 16, 32, 64))
TRAIN_ANN = 'annotations/instances_train2017.json'
VAL_ANN = 'annotations/instances_val2017.json'


@pytest.fixture(scope='module')
def shapes(tmp_path_factory) -> str:
    """A generated COCO-format data root."""
    root = str(tmp_path_factory.mktemp('coco_shapes'))
    make_shapes_coco(root, num_train=32, num_val=16, image_size=128, seed=0)
    return root


@pytest.fixture(scope='module')
def tiny_checkpoint(tmp_path_factory) -> str:
    """A backbone-only checkpoint of a narrow ResNet-18 (the format tools/extract_backbone.py writes)."""
    torch.manual_seed(0)
    backbone = TimmBackbone(**{k: v for k, v in TINY_RESNET.items() if k != 'type'})
    path = str(tmp_path_factory.mktemp('ckpt') / 'tiny_r18.pth')
    torch.save({'state_dict': backbone.model.state_dict(), 'meta': {'model': {'backbone': TINY_RESNET}}},
               path)
    return path


def _quiet_coco(path: str) -> COCO:
    with contextlib.redirect_stdout(io.StringIO()):
        return COCO(path)


# ----------------------------------------------------------------------------- data


def test_training_items_match_the_annotations(shapes):
    dataset = CocoInstances(shapes, TRAIN_ANN, 'train2017', train=True, flip_prob=0.0)
    coco = _quiet_coco(osp.join(shapes, TRAIN_ANN))
    assert dataset.cat_ids == [1, 3, 7]
    crowds = 0
    for i in range(len(dataset)):
        item = dataset[i]
        sample = item['data_samples']
        anns = coco.imgToAnns[sample.image_id]
        crowds += sum(a['iscrowd'] for a in anns)
        kept = [a for a in anns if not a['iscrowd']]
        assert item['inputs'].dtype == torch.uint8 and item['inputs'].shape == (3, 128, 128)
        # Independent reference: pycocotools' own rasterisation and the XYWH boxes.
        expected_masks = np.stack([coco.annToMask(a) for a in kept])
        expected_boxes = np.array([[x, y, x + w, y + h] for x, y, w, h in (a['bbox'] for a in kept)])
        expected_labels = [{1: 1, 3: 2, 7: 3}[a['category_id']] for a in kept]
        np.testing.assert_array_equal(sample.masks.numpy(), expected_masks)
        np.testing.assert_allclose(sample.boxes.numpy(), expected_boxes, rtol=0, atol=1e-4)
        assert sample.labels.tolist() == expected_labels
    assert crowds > 0, 'the generated set has crowd regions, and they are left out'


def test_flip_moves_boxes_and_masks_together(shapes):
    plain = CocoInstances(shapes, TRAIN_ANN, 'train2017', train=True, flip_prob=0.0)[0]
    flipped = CocoInstances(shapes, TRAIN_ANN, 'train2017', train=True, flip_prob=1.0)[0]
    width = plain['inputs'].shape[-1]
    assert torch.equal(flipped['inputs'], plain['inputs'].flip(-1))
    assert torch.equal(flipped['data_samples'].masks, plain['data_samples'].masks.flip(-1))
    boxes = plain['data_samples'].boxes
    expected = torch.stack([width - boxes[:, 2], boxes[:, 1], width - boxes[:, 0], boxes[:, 3]], 1)
    torch.testing.assert_close(flipped['data_samples'].boxes, expected)


def test_missing_layout_and_corrupt_images_are_named(shapes, tmp_path):
    with pytest.raises(FileNotFoundError, match='instances_train2017.json.*--data-root'):
        CocoInstances(str(tmp_path), TRAIN_ANN, 'train2017')
    broken = tmp_path / 'broken'
    make_shapes_coco(str(broken), num_train=2, num_val=1, image_size=64)
    victim = sorted(os.listdir(broken / 'val2017'))[0]
    (broken / 'val2017' / victim).write_bytes(b'not a jpeg')
    dataset = CocoInstances(str(broken), VAL_ANN, 'val2017')
    with pytest.raises(OSError, match=f"{victim}.*annotation file"):
        dataset[0]


# ----------------------------------------------------------------------------- metric


def _ground_truth_detections(coco: COCO, cat_ids: list[int]) -> list[dict]:
    """The ground truth as detections of the model's output format (score 1)."""
    detections = []
    for image_id in coco.getImgIds():
        anns = [a for a in coco.imgToAnns[image_id] if not a['iscrowd']]
        boxes = torch.tensor([[x, y, x + w, y + h] for x, y, w, h in (a['bbox'] for a in anns)])
        detections.append({
            'image_id': image_id, 'boxes': boxes, 'scores': torch.ones(len(anns)),
            'labels': torch.tensor([cat_ids.index(a['category_id']) + 1 for a in anns]),
            'masks': torch.from_numpy(np.stack([coco.annToMask(a) for a in anns])).bool()})
    return detections


def test_perfect_detections_score_100_and_match_cocoeval(shapes):
    coco = _quiet_coco(osp.join(shapes, VAL_ANN))
    cat_ids = sorted(coco.getCatIds())
    records = [r for d in _ground_truth_detections(coco, cat_ids) for r in detections_to_coco(d, cat_ids)]
    with contextlib.redirect_stdout(io.StringIO()):
        stats = evaluate_coco(coco, records)
    assert stats['bbox']['AP'] == pytest.approx(100.0) and stats['segm']['AP'] == pytest.approx(100.0)
    assert math.isnan(stats['bbox']['APl']), 'no large objects: undefined, not -100'
    # Degrade the scores of half the detections at random and compare with a direct COCOeval run.
    rng = np.random.default_rng(0)
    for r in records:
        r['score'] = float(rng.random())
        r['bbox'][0] += float(rng.integers(0, 6))
    with contextlib.redirect_stdout(io.StringIO()):
        stats = evaluate_coco(coco, records)
        for iou_type in ('bbox', 'segm'):
            reference = COCOeval(coco, coco.loadRes(records), iou_type)
            reference.evaluate(), reference.accumulate(), reference.summarize()
            for name, value in zip(STAT_NAMES, reference.stats):
                expected = 100 * value if value >= 0 else float('nan')
                assert stats[iou_type][name] == pytest.approx(expected, nan_ok=True)


def test_results_table_has_the_paper_columns():
    results = {'bbox': {'AP': 38.94, 'AP50': 58.41, 'AP75': 42.06},
               'segm': {'AP': 33.95, 'AP50': 55.22, 'AP75': 36.07}}
    table = format_results_table(results, 'ifnd_r50')
    header, rule, row = table.splitlines()
    assert header.split('|')[1:-1] == [f' {c} '.rjust(len(c) + 2) for c in
                                       ('Pre-train', 'AP^bb', 'AP^bb_50', 'AP^bb_75', 'AP^mk',
                                        'AP^mk_50', 'AP^mk_75')]
    assert [c.strip() for c in row.split('|')[1:-1]] == ['ifnd_r50', '38.9', '58.4', '42.1', '34.0',
                                                         '55.2', '36.1']


# ----------------------------------------------------------------------------- model


def _tiny_model(arch: str, checkpoint: str, **kwargs) -> MaskRCNN:
    cfg = Config.fromfile(osp.join(COCO_CONFIGS, f'mask_rcnn_{arch.lower()}_tiny_shapes.py'))
    model_cfg = cfg.model.to_dict()
    model_cfg.pop('type')
    model_cfg.update(backbone_checkpoint=checkpoint, **kwargs)
    return MaskRCNN(**model_cfg)


def test_c4_takes_res2_to_res5_from_the_checkpoint(tiny_checkpoint):
    model = _tiny_model('C4', tiny_checkpoint, norm='BN')
    saved = torch.load(tiny_checkpoint, weights_only=True)['state_dict']
    state = model.state_dict()
    for key, value in saved.items():
        if key.startswith('layer4.'):
            target = 'detector.roi_heads.box_head.res5.' + key
        elif not key.startswith('fc.'):
            target = 'detector.backbone.' + key
        else:
            continue
        assert torch.equal(state[target], value), key
    # res5 (with its extra norm) is shared by the box and mask branches, and held once.
    assert 'detector.roi_heads.box_head.res5.norm.weight' in state
    assert not any(k.startswith('detector.roi_heads.mask_head') for k in state)
    ids = [id(p) for p in model.parameters()]
    assert len(ids) == len(set(ids))
    assert model.detector.roi_heads.box_roi_pool.stride == 16


@pytest.mark.parametrize('norm', ['SyncBN', 'FrozenBN'])
def test_norm_choice_applies_to_every_resnet_norm(tiny_checkpoint, norm):
    from torchvision.ops import FrozenBatchNorm2d
    model = _tiny_model('C4', tiny_checkpoint, norm=norm)
    kinds = {type(m) for name, m in model.named_modules()
             if isinstance(m, (torch.nn.modules.batchnorm._BatchNorm, FrozenBatchNorm2d))}
    assert kinds == {torch.nn.SyncBatchNorm if norm == 'SyncBN' else FrozenBatchNorm2d}


def test_freeze_at_freezes_stem_and_res2(tiny_checkpoint):
    model = _tiny_model('FPN', tiny_checkpoint, norm='BN', freeze_at=2)
    trunk = model.detector.backbone.body
    frozen = [n for n, p in trunk.named_parameters() if not p.requires_grad]
    assert frozen and all(n.startswith(('conv1', 'layer1')) for n in frozen)
    assert all(p.requires_grad for n, p in trunk.named_parameters()
               if n.startswith(('layer2', 'layer3', 'layer4')))


def test_aligned_roi_pool_averages_the_right_pixels():
    # A linear ramp f(x, y) = x on a stride-4 map: the pooled value at a bin centre is the continuous
    # image x-coordinate / stride - 0.5 (half-pixel alignment), computed independently here.
    feature = torch.arange(16, dtype=torch.float64).repeat(16, 1)[None, None]
    box = torch.tensor([[8.0, 8.0, 40.0, 24.0]], dtype=torch.float64)
    pooled = AlignedRoIPool(2, stride=4)({'0': feature}, [box], [(64, 64)])
    centres = torch.tensor([8 + 8.0, 8 + 24.0], dtype=torch.float64) / 4 - 0.5
    torch.testing.assert_close(pooled[0, 0], centres.repeat(2, 1))


def test_precise_bn_statistics_are_the_mean_of_batch_statistics():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).double()
    batches = [torch.randn(5, 3, 8, 8, dtype=torch.float64) * (i + 1) + i for i in range(6)]
    count = recompute_bn_statistics(model, batches, model)
    assert count == 6
    with torch.no_grad():
        outs = [model[0](b) for b in batches]
    mean = torch.stack([o.mean(dim=(0, 2, 3)) for o in outs]).mean(0)
    var = torch.stack([o.transpose(0, 1).reshape(4, -1).var(dim=1, unbiased=True) for o in outs]).mean(0)
    torch.testing.assert_close(model[1].running_mean, mean)
    torch.testing.assert_close(model[1].running_var, var)
    assert model[1].momentum == 0.1, 'the momentum is restored'


# ----------------------------------------------------------------------------- the tool


def _transfer(args: list[str], cwd: str = REPO) -> str:
    """Run tools/transfer_coco.py; return its output (stdout and stderr)."""
    result = run_script('tools/transfer_coco.py', *args, cwd=cwd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def _cocoeval_summary(output: str) -> dict[str, list[float]]:
    """COCOeval's own printed summary: the twelve numbers per IoU type."""
    summaries = {}
    for iou_type, block in re.findall(r'COCOeval summary \((\w+)\):\n((?:.*\n){12})', output):
        summaries[iou_type] = [float(line.rsplit('=', 1)[1]) for line in block.splitlines()]
    return summaries


def _printed_table(output: str) -> dict[str, float]:
    """The last table the tool printed: column header -> value."""
    lines = [line for line in output.splitlines() if line.startswith('|')]
    header, row = lines[-3], lines[-1]
    cells = [c.strip() for c in row.split('|')[1:-1]]
    return dict(zip([c.strip() for c in header.split('|')[1:-1]], cells))


# FPN's config trains 100 iterations like C4's; 40 find shapes already, in a third of the time.
@pytest.mark.parametrize('arch,iters', [('c4', 100), ('fpn', 40)])
def test_transfer_trains_evaluates_and_prints_cocoeval_numbers(arch, iters, shapes, tiny_checkpoint,
                                                               tmp_path):
    work_dir = str(tmp_path / arch)
    config = f'configs/benchmarks/coco/mask_rcnn_{arch}_tiny_shapes.py'
    schedule = [] if iters == 100 else [
        '--cfg-options', f'train_cfg.max_iters={iters}', f'train_cfg.val_interval={iters}',
        f'default_hooks.checkpoint.interval={iters}']
    output = _transfer([tiny_checkpoint, '--engine', 'torchvision', '--config', config,
                        '--data-root', shapes, '--work-dir', work_dir, *schedule])
    # Progress line: iteration, losses, lr and ETA.
    assert re.search(rf'Iter\(train\) \[{iters}/{iters}\].*lr: .*eta: .*loss: .*loss_mask: ', output)
    assert 'Precise BN: statistics from 4 training batches' in output
    assert osp.isfile(osp.join(work_dir, f'iter_{iters}.pth'))
    summary = _cocoeval_summary(output)
    table = _printed_table(output)
    with open(osp.join(work_dir, 'coco_results.json')) as f:
        results = json.load(f)
    for iou_type, prefix in (('bbox', 'bb'), ('segm', 'mk')):
        for index, (stat, suffix) in enumerate((('AP', ''), ('AP50', '_50'), ('AP75', '_75'))):
            printed = float(table[f'AP^{prefix}{suffix}'])
            # The table shows percent to 0.1, COCOeval fractions to 0.001: the same digits.
            assert printed == pytest.approx(100 * summary[iou_type][index], abs=0.051)
            assert printed == pytest.approx(results[iou_type][stat], abs=0.051)
    assert max(results['bbox']['AP50'], results['segm']['AP50']) > 0, 'training finds some shapes'
    # The saved detections give the same statistics through an independent COCOeval run.
    coco = _quiet_coco(osp.join(shapes, VAL_ANN))
    with open(osp.join(work_dir, 'coco_detections.json')) as f:
        detections = json.load(f)
    with contextlib.redirect_stdout(io.StringIO()):
        for iou_type in ('bbox', 'segm'):
            reference = COCOeval(coco, coco.loadRes(detections), iou_type)
            reference.evaluate(), reference.accumulate(), reference.summarize()
            expected = [100 * s if s >= 0 else float('nan') for s in reference.stats]
            got = [results[iou_type][name] for name in STAT_NAMES]
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9)
    if arch == 'c4':
        # Evaluating the saved detector again gives the same numbers.
        again = _transfer([tiny_checkpoint, '--engine', 'torchvision', '--config', config,
                           '--data-root', shapes, '--work-dir', work_dir, '--eval-only'])
        assert _printed_table(again) == table


def test_resume_continues_from_the_last_checkpoint(shapes, tiny_checkpoint, tmp_path):
    work_dir = str(tmp_path / 'resume')
    common = [tiny_checkpoint, '--engine', 'torchvision', '--data-root', shapes, '--work-dir', work_dir,
              '--config', 'configs/benchmarks/coco/mask_rcnn_c4_tiny_shapes.py']
    _transfer(common + ['--cfg-options', 'train_cfg.max_iters=10', 'train_cfg.val_interval=10',
                        'default_hooks.checkpoint.interval=10'])
    output = _transfer(common + ['--resume', '--cfg-options', 'train_cfg.max_iters=20',
                                 'train_cfg.val_interval=20', 'default_hooks.checkpoint.interval=10'])
    assert 'resumed' in output.lower() and 'iter_10.pth' in output
    assert 'Iter(train) [20/20]' in output and 'Iter(train) [10/20]' not in output


def test_help_documents_every_option():
    result = run_script('tools/transfer_coco.py', '--help')
    assert result.returncode == 0, result.stderr
    for option in ('--config', '--engine', '--data-root', '--work-dir', '--model-name', '--resume',
                   '--eval-only', '--detector', '--amp', '--cfg-options', '--launcher', '--num-gpus',
                   '--num-machines', '--machine-rank', '--dist-url'):
        line = next((ln for ln in result.stdout.splitlines() if ln.strip().startswith(option)), None)
        assert line is not None, option
    assert 'detectron2' in result.stdout and 'torchvision' in result.stdout


def test_bad_command_lines_say_what_to_do(shapes, tiny_checkpoint, tmp_path):
    def fails(args, pattern):
        result = run_script('tools/transfer_coco.py', *args)
        assert result.returncode != 0 and re.search(pattern, result.stderr + result.stdout), \
            result.stderr[-2000:]
    tiny = 'configs/benchmarks/coco/mask_rcnn_c4_tiny_shapes.py'
    fails([tiny_checkpoint, '--engine', 'torchvision', '--config', tiny, '--data-root',
           str(tmp_path / 'nowhere'), '--work-dir', str(tmp_path / 'w')], r'not found.*--data-root')
    fails([tiny_checkpoint, '--engine', 'torchvision', '--config',
           'configs/benchmarks/linear/linear_r18_100e_fmnist.py'], 'not a COCO transfer config')
    fails([tiny_checkpoint, '--detector', 'x.pth'], '--detector is for --eval-only')
    if not torch.cuda.is_available():
        fails([tiny_checkpoint, '--engine', 'torchvision', '--config', tiny, '--amp'],
              '--amp needs a GPU')
    if importlib.util.find_spec('detectron2') is None:
        fails([tiny_checkpoint, '--engine', 'detectron2', '--data-root', shapes],
              r'(?s)detectron2 is not installed.*pip install.*--engine torchvision')
    fails([str(tmp_path / 'missing.pth'), '--engine', 'torchvision', '--config', tiny,
           '--data-root', shapes, '--work-dir', str(tmp_path / 'w2')], 'checkpoint not found')


def test_aspect_ratio_batches_never_mix_orientations(tmp_path):
    from mmengine.dataset import DefaultSampler

    from ifnd.datasets import AspectRatioBatchSampler
    root = tmp_path / 'mixed'
    make_shapes_coco(str(root), num_train=9, num_val=1, image_size=64)
    ann = root / TRAIN_ANN
    data = json.loads(ann.read_text())
    for i, image in enumerate(data['images']):
        if i % 3 == 0:  # portrait per the annotations; the sampler never decodes images
            image['height'] = 96
    ann.write_text(json.dumps(data))
    dataset = CocoInstances(str(root), TRAIN_ANN, 'train2017', train=True)
    portrait = {i for i in range(len(dataset)) if dataset.is_portrait(i)}
    assert len(portrait) == 3
    batches = list(AspectRatioBatchSampler(DefaultSampler(dataset, shuffle=True, seed=1), 2))
    assert sorted(i for b in batches for i in b) == list(range(len(dataset))), 'each image once'
    for batch in batches:
        assert len({i in portrait for i in batch}) == 1, batch
    assert sum(len(b) == 2 for b in batches) >= 3
    with pytest.raises(TypeError, match='is_portrait'):
        AspectRatioBatchSampler(DefaultSampler(list(range(4)), shuffle=False), 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason='the check is for machines without GPUs')
def test_distributed_syncbn_on_cpus_is_refused_up_front():
    spec = importlib.util.spec_from_file_location('transfer_coco', osp.join(REPO, 'tools', 'transfer_coco.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tool.check_norm(Config(dict(model=dict(norm='BN'), launcher='pytorch')))
    tool.check_norm(Config(dict(model=dict(norm='SyncBN'), launcher='none')))
    with pytest.raises(SystemExit, match='model.norm=BN'):
        tool.check_norm(Config(dict(model=dict(norm='SyncBN'), launcher='pytorch')))
