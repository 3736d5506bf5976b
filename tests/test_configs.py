"""Every config in the tree builds: its model, its data sets (on generated data) and its hooks."""
import glob
import os.path as osp

import pytest
import torchvision.datasets.cifar as tv_cifar
from fake_data import fake_cifar, fake_fmnist, rgb_image
from mmengine.config import Config
from mmengine.registry import init_default_scope

from ifnd.datasets import make_shapes_coco
from ifnd.registry import DATASETS, HOOKS, METRICS, MODELS

CONFIG_DIR = osp.join(osp.dirname(__file__), '..', 'configs')
CONFIGS = sorted(f for f in glob.glob(osp.join(CONFIG_DIR, '**', '*.py'), recursive=True)
                 if '_base_' not in f)


@pytest.fixture(scope='module')
def data_roots(tmp_path_factory):
    """Generated stand-ins for each data set's on-disk layout."""
    root = tmp_path_factory.mktemp('data')
    for split in ('train', 'val'):
        for c, wnid in enumerate(('n01440764', 'n01443537')):
            folder = root / 'imagenet' / split / wnid
            folder.mkdir(parents=True)
            for i in range(2):
                rgb_image(10 * c + i, (40, 30)).save(folder / f'{wnid}_{i}.JPEG')
    fake_cifar(root / 'cifar10', num_classes=10)
    fake_cifar(root / 'cifar100', num_classes=100)
    fake_fmnist(root / 'fmnist')
    make_shapes_coco(str(root / 'coco'), num_train=2, num_val=1, image_size=64)
    return {'CocoInstances': root / 'coco', 'ImageNet': root / 'imagenet', 'CIFAR10': root / 'cifar10',
            'CIFAR100': root / 'cifar100', 'FashionMNIST': root / 'fmnist'}


def _build_dataset(cfg: dict, data_roots: dict):
    cfg = dict(cfg)
    if cfg['type'] in data_roots:
        cfg['data_root'] = str(data_roots[cfg['type']])
    dataset = DATASETS.build(cfg)
    item = dataset[0]
    assert set(item) == {'inputs', 'index', 'label'}
    return dataset, item


def test_all_configs_are_found():
    names = {osp.relpath(f, CONFIG_DIR) for f in CONFIGS}
    for required in ('ifnd_r50_200e_in1k.py', 'simclr/simclr_r18_200e_fmnist.py',
                     'simclr/simclr_r50_1000e_cifar10.py', 'simclr/simclr_r50_1000e_cifar100.py',
                     'mocov2/mocov2_r50_200e_in1k.py', 'ifnd/ifnd_r50_1000e_cifar10.py',
                     'ifnd/ifnd_r50_1000e_cifar100.py', 'ifnd/ifnd_r18_200e_fmnist.py',
                     'ifnd/pcl_r50_1000e_cifar100.py', 'ifnd/supcon_r50_1000e_cifar100.py',
                     *(f'{method}/{method}_{recipe}.py' for method in ('debiased', 'hard_negative')
                       for recipe in ('r18_200e_fmnist', 'r50_1000e_cifar10', 'r50_1000e_cifar100',
                                      'mocov2_r50_200e_in1k')),
                     *(f'fnc/fnc_{strategy}_{recipe}.py' for strategy in ('elim', 'attr')
                       for recipe in ('r18_200e_fmnist', 'r50_1000e_cifar10', 'r50_1000e_cifar100'))):
        assert required in names


@pytest.mark.parametrize('path', CONFIGS, ids=lambda p: osp.relpath(p, CONFIG_DIR))
def test_config_builds(path, data_roots, monkeypatch):
    # Generated CIFAR files cannot match torchvision's md5 sums.
    monkeypatch.setattr(tv_cifar, 'check_integrity', lambda p, md5=None: osp.isfile(p))
    cfg = Config.fromfile(path)
    assert cfg.default_scope == 'ifnd'
    init_default_scope('ifnd')
    model = MODELS.build(cfg.model)
    if cfg.model.type == 'ImageClassifier':
        # Downstream evaluation (configs/benchmarks): one labelled view and a val loop instead of
        # two views and a contrastive loss. Its data sets (Places205 lists, SimCLR's subset files)
        # are generated and built in tests/test_linear_semi.py.
        assert cfg.val_evaluator.type == 'Accuracy' and 'val_cfg' in cfg and 'test_cfg' in cfg
        return
    if cfg.model.type == 'MaskRCNN':
        # COCO transfer (configs/benchmarks/coco): detection data, COCOeval metric, iteration loop.
        coco_root = str(data_roots['CocoInstances'])
        for section in ('train_dataloader', 'val_dataloader'):
            dataset = DATASETS.build(dict(cfg[section].dataset, data_root=coco_root))
            assert len(dataset) > 0 and 'data_samples' in dataset[0]
        METRICS.build(dict(cfg.val_evaluator, data_root=coco_root))
        for hook_cfg in cfg.get('custom_hooks', []):
            HOOKS.build(hook_cfg)
        assert cfg.train_cfg.type == 'IterBasedTrainLoop' and cfg.param_scheduler
        return
    assert model.temperature > 0
    train_set, item = _build_dataset(cfg.train_dataloader.dataset, data_roots)
    # Two views, plus FNC's support views.
    assert len(item['inputs']) == 2 + getattr(model, 'num_support_views', 0)
    for hook_cfg in cfg.get('custom_hooks', []):
        hook = HOOKS.build(hook_cfg)
        if hook_cfg['type'] == 'KNNEvalHook':
            _, val_item = _build_dataset(hook_cfg['val_dataset'], data_roots)
            assert len(val_item['inputs']) == 1, 'evaluation uses the deterministic eval view'
        if hook_cfg['type'] == 'PseudoLabelHook':
            assert hasattr(model, 'label_bank'), 'the hook needs an algorithm with pseudo labels'
            assert hook.pipeline is not None
        if hook_cfg['type'] == 'FalseNegativeDetectionHook':
            assert model.records_detection, 'the hook needs an algorithm that flags negatives'
    for name in ('optim_wrapper', 'param_scheduler', 'train_cfg', 'default_hooks'):
        assert name in cfg, f'{path} lacks {name}'


def test_paper_recipes():
    """The recipes of the paper's appendix, as written in DESIGN.md section 2."""
    in1k = Config.fromfile(osp.join(CONFIG_DIR, 'ifnd_r50_200e_in1k.py'))
    assert in1k.model.type == 'IFNDMoCo' and 'treatment' not in in1k.model  # the preset's: 'elim'
    assert in1k.model.queue_len == 65536 and in1k.model.temperature == 0.2
    assert in1k.model.neck.num_layers == 3 and in1k.model.neck.out_dim == 128
    assert in1k.optim_wrapper.optimizer.lr == 0.03 and in1k.optim_wrapper.optimizer.weight_decay == 1e-4
    assert in1k.param_scheduler[0].milestones == [120, 160] and in1k.train_cfg.max_epochs == 200
    assert in1k.train_dataloader.batch_size * 8 == 256
    hook = in1k.custom_hooks[0]
    assert hook.num_clusters == [1000, 3000, 10000] and hook.interval == 1
    assert hook.acceptance == dict(type='LinearAcceptance', final_rate=1.0)

    c100 = Config.fromfile(osp.join(CONFIG_DIR, 'ifnd', 'ifnd_r50_1000e_cifar100.py'))
    assert c100.model.type == 'IFND' and c100.model.temperature == 0.5
    assert c100.model.backbone.cifar_stem
    assert c100.optim_wrapper.optimizer.lr == 0.5 and c100.train_cfg.max_epochs == 1000
    assert c100.param_scheduler[0].end == 10 and c100.param_scheduler[1].type == 'CosineAnnealingLR'
    assert c100.train_dataloader.batch_size * 8 == 1024
    assert c100.custom_hooks[0].num_clusters == [100, 300, 1000] and c100.custom_hooks[0].interval == 20
    c10 = Config.fromfile(osp.join(CONFIG_DIR, 'ifnd', 'ifnd_r50_1000e_cifar10.py'))
    assert c10.custom_hooks[0].num_clusters == [10, 30, 100]


@pytest.mark.parametrize('options', [
    {'custom_hooks.0.acceptance.type': 'StepAcceptance', 'custom_hooks.0.acceptance.step_epoch': 100,
     'custom_hooks.0.acceptance.final_rate': 0.5},
    # The former flat keys of published commands, read as the part they name.
    {'custom_hooks.0.scheme': 'step', 'custom_hooks.0.step_epoch': 100,
     'custom_hooks.0.final_rate': 0.5}], ids=['acceptance', 'former'])
def test_ablations_through_cfg_options(options):
    """The strategy-table ablations documented as --cfg-options reach the hook's acceptance."""
    from ifnd.clustering import StepAcceptance
    from ifnd.engine.cli import runner_config
    cfg = runner_config(osp.join(CONFIG_DIR, 'ifnd', 'ifnd_r50_1000e_cifar100.py'),
                        cfg_options=options)
    init_default_scope('ifnd')
    acceptance = HOOKS.build(cfg.custom_hooks[0]).acceptance
    assert isinstance(acceptance, StepAcceptance)
    assert (acceptance.step_epoch, acceptance.final_rate) == (100, 0.5)


def test_mocov3_recipes():
    """MoCo v3's ViT recipes (Chen, Xie and He, ICCV 2021) and IFND on them."""
    small = Config.fromfile(osp.join(CONFIG_DIR, 'mocov3', 'mocov3_vit-small-p16_300e_in1k.py'))
    model = small.model
    assert model.type == 'MoCoV3' and model.momentum == 0.99 and model.temperature == 0.2
    assert model.backbone.model_name == 'vit_small_patch16_224' and model.backbone.num_heads == 12
    assert model.backbone.frozen_patch_embed and model.backbone.global_pool == 'token'
    for head, layers in ((model.neck, 3), (model.predictor, 2)):
        assert (head.hidden_dim, head.out_dim, head.num_layers) == (4096, 256, layers)
        assert head.with_last_bn and not head.last_bn_affine
    optimizer = small.optim_wrapper.optimizer
    assert optimizer.type == 'AdamW' and optimizer.lr == 1.5e-4 and optimizer.weight_decay == 0.1
    assert small.auto_scale_lr == dict(base_batch_size=256, enable=True)
    assert small.train_dataloader.batch_size * 16 == 4096 and small.train_cfg.max_epochs == 300
    assert small.param_scheduler[0].end == 40 and small.param_scheduler[1].T_max == 260
    base = Config.fromfile(osp.join(CONFIG_DIR, 'mocov3', 'mocov3_vit-base-p16_300e_in1k.py'))
    assert base.model.backbone.model_name == 'vit_base_patch16_224' and base.model.momentum == 0.99
    ifnd = Config.fromfile(osp.join(CONFIG_DIR, 'ifnd', 'ifnd_mocov3_vit-small-p16_300e_in1k.py'))
    assert ifnd.model.type == 'IFNDMoCoV3' and ifnd.model.backbone == model.backbone
    assert ifnd.custom_hooks[0].num_clusters == [1000, 3000, 10000]
    assert ifnd.custom_hooks[0].feature == 'z'


def test_mocov3_r50_recipes_and_a_step_of_one(data_roots):
    """MoCo v3's ResNet-50 recipes (CONFIG.md of facebookresearch/moco-v3), and a LARS training step
    of the 100-epoch one built from its config, on 32-pixel views of the ImageNet stand-in on the CPU."""
    import torch
    from mmengine.optim import build_optim_wrapper

    from ifnd.datasets.base import batch_collate
    r50 = Config.fromfile(osp.join(CONFIG_DIR, 'mocov3', 'mocov3_r50_100e_in1k.py'))
    model_cfg = r50.model
    assert model_cfg.type == 'MoCoV3' and model_cfg.temperature == 1.0 and model_cfg.momentum == 0.99
    assert model_cfg.backbone.model_name == 'resnet50'
    for head in (model_cfg.neck, model_cfg.predictor):
        assert (head.hidden_dim, head.out_dim, head.num_layers) == (4096, 256, 2)
    assert model_cfg.neck.with_last_bn and not model_cfg.neck.last_bn_affine and not model_cfg.predictor.with_last_bn
    views = r50.train_dataloader.dataset.pipeline.transforms
    assert [(v.scale, v.blur_p, v.get('solarize_p', 0.0)) for v in views] == [((0.2, 1.0), 1.0, 0.0),
                                                                              ((0.2, 1.0), 0.1, 0.2)]
    assert r50.train_dataloader.batch_size * 16 == 4096 and r50.sync_bn == 'torch'
    assert r50.auto_scale_lr == dict(base_batch_size=256, enable=True) and r50.param_scheduler[0].end == 10
    recipes = {'100e': (0.6, 1e-6, 0.99, 100), '300e': (0.3, 1e-6, 0.99, 300), '1000e': (0.3, 1.5e-6, 0.996, 1000)}
    for name, (lr, wd, momentum, epochs) in recipes.items():
        cfg = Config.fromfile(osp.join(CONFIG_DIR, 'mocov3', f'mocov3_r50_{name}_in1k.py'))
        optimizer = cfg.optim_wrapper.optimizer
        assert (optimizer.type, optimizer.lr, optimizer.weight_decay, optimizer.momentum) == ('LARS', lr, wd, 0.9)
        assert cfg.model.momentum == momentum and cfg.train_cfg.max_epochs == epochs
        assert 'end' not in cfg.param_scheduler[1]  # the cosine runs to max_epochs
    ifnd = Config.fromfile(osp.join(CONFIG_DIR, 'ifnd', 'ifnd_mocov3_r50_100e_in1k.py'))
    assert ifnd.model.type == 'IFNDMoCoV3' and ifnd.model.backbone == model_cfg.backbone

    init_default_scope('ifnd')
    torch.manual_seed(0)
    model = MODELS.build(model_cfg)
    pipeline = dict(r50.train_dataloader.dataset.pipeline, transforms=[dict(v, size=32) for v in views])
    dataset = DATASETS.build(dict(r50.train_dataloader.dataset, data_root=str(data_roots['ImageNet']),
                                  pipeline=pipeline))
    batch = batch_collate([dataset[i] for i in range(4)])
    wrapper = build_optim_wrapper(model, r50.optim_wrapper)
    decay = {id(p): group['weight_decay'] for group in wrapper.param_groups for p in group['params']}
    bn = model.backbone.model.bn1
    assert decay[id(bn.weight)] == 0.0 and decay[id(model.backbone.model.conv1.weight)] == 1e-6
    model.set_progress(0, 100)
    before = model.backbone.model.conv1.weight.detach().clone()
    log = model.train_step(batch, wrapper)
    assert torch.isfinite(log['loss']) and not torch.equal(before, model.backbone.model.conv1.weight)
