"""Linear evaluation and semi-supervised fine-tuning: real short runs on digits, the metric, the tools."""
import copy
import glob
import importlib.util
import os.path as osp
import warnings

import numpy as np
import pytest
import torch
import torchvision
import torchvision.datasets.cifar as tv_cifar
from fake_data import fake_cifar, fake_fmnist, rgb_image
from helpers import CONFIG_DIR, TINY_BACKBONE, digits_config
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope
from sklearn.metrics import top_k_accuracy_score

from ifnd.datasets import Digits, ImageFolder
from ifnd.engine.features import unwrap_model
from ifnd.evaluation import Accuracy
from ifnd.models import load_encoder
from ifnd.models.backbones import TimmBackbone
from ifnd.models.encoder import backbone_state, load_backbone_weights
from ifnd.registry import DATASETS, HOOKS, METRICS, MODELS, RUNNERS

TOOLS = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'tools')
BENCHMARKS = osp.join(CONFIG_DIR, 'benchmarks')
DIGITS_MEAN, DIGITS_STD = (0.2, 0.2, 0.2), (0.3, 0.3, 0.3)


def _tool(name):
    """Import tools/<name>.py as a module (the folder is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f'tool_{name}', osp.join(TOOLS, f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def scope():
    init_default_scope('ifnd')


@pytest.fixture(autouse=True, scope='module')
def one_thread():
    """Run this module's tiny models on one intra-op thread, then give the threads back."""
    # Thread hand-offs cost more than they save on these models, many times more on a busy
    # 2-core machine (a 3-iteration run: 3 s on one thread, 19 s on two).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope='module')
def pretrained(tmp_path_factory):
    """A freshly built tiny SimCLR saved as training would save it (weights + config).

    BN statistics are randomised so that "unchanged" cannot hold by accident.
    """
    folder = tmp_path_factory.mktemp('pretrain')
    init_default_scope('ifnd')
    torch.manual_seed(0)
    cfg = digits_config(str(folder), dict(type='SimCLR', temperature=0.5))
    model = MODELS.build(cfg.model)
    state = model.state_dict()
    for key in state:
        if key.endswith('running_mean'):
            state[key] = 0.1 * torch.randn_like(state[key])
        elif key.endswith('running_var'):
            state[key] = 0.5 + torch.rand_like(state[key])
    path = folder / 'simclr_digits.pth'
    torch.save({'meta': {'cfg': cfg.pretty_text}, 'state_dict': state}, path)
    return str(path)


def _checkpoint_backbone(path):
    return backbone_state(torch.load(path, map_location='cpu', weights_only=True))


def digits_benchmark(config: str, work_dir: str, pretrained: str, max_epochs: int = 1,
                     subset_fraction: float | None = None, **model) -> Config:
    """A benchmark config run on digits with the tiny ResNet: data swapped, recipe kept."""
    cfg = Config.fromfile(osp.join(BENCHMARKS, config))
    subset = {k: v for k, v in cfg.train_dataloader.dataset.items() if k.startswith('subset_')}
    if subset_fraction is not None:
        subset['subset_fraction'] = subset_fraction
    # Digits at their native 8 pixels: a quarter of the compute of the pre-training tests' 16.
    train_view = dict(type='ContrastiveView', size=8, scale=(0.5, 1.0), jitter_p=0.0,
                      grayscale_p=0.0, flip=False)
    loader = dict(num_workers=0, persistent_workers=False, batch_size=64,
                  collate_fn=dict(type='default_collate'))
    cfg.train_dataloader = dict(cfg.train_dataloader, **loader,
                                dataset=dict(type='Digits', split='train', pipeline=train_view, **subset))
    cfg.val_dataloader = dict(cfg.val_dataloader, **dict(loader, batch_size=128),
                              dataset=dict(type='Digits', split='test',
                                           pipeline=dict(type='EvalView', size=8)))
    cfg.test_dataloader = cfg.val_dataloader
    cfg.model.backbone = copy.deepcopy(TINY_BACKBONE)
    cfg.model.pretrained = pretrained
    cfg.model.data_preprocessor = dict(type='ContrastiveDataPreprocessor', mean=DIGITS_MEAN, std=DIGITS_STD)
    cfg.model.update(model)
    cfg.merge_from_dict(dict(
        work_dir=work_dir, train_cfg=dict(max_epochs=max_epochs, val_interval=max_epochs),
        default_hooks=dict(logger=dict(interval=5), checkpoint=dict(interval=max_epochs)),
        visualizer=dict(type='Visualizer', vis_backends=[dict(type='LocalVisBackend')]),
        env_cfg=dict(cudnn_benchmark=False, dist_cfg=dict(backend='gloo')), log_level='WARNING'))
    return cfg


def _param_lrs(optimizer, model):
    """Learning rate of each named parameter in the optimiser's groups."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: group['lr'] for group in optimizer.param_groups for p in group['params']}


def _distinct(lrs: dict, prefix: str) -> set:
    """The distinct learning rates of the parameters under ``prefix`` (rounded: 0.1 x 0.1)."""
    return {round(lr, 10) for name, lr in lrs.items() if name.startswith(prefix)}


def test_linear_protocol_keeps_the_backbone_and_evaluates(tmp_path, pretrained):
    torch.manual_seed(0)
    runner = RUNNERS.build(digits_benchmark('linear/linear_r18_100e_fmnist.py', str(tmp_path),
                                            pretrained, max_epochs=2, subset_fraction=0.5))
    runner.train()
    model = unwrap_model(runner.model)
    top1 = runner.message_hub.get_scalar('val/top1').current()
    top5 = runner.message_hub.get_scalar('val/top5').current()
    # A random tiny encoder's features carry little signal: only the range is checked.
    assert 0 < top1 <= 100 and top1 <= top5 <= 100, (top1, top5)
    # Weights and BN buffers equal the checkpoint's after training, and the BN stayed in eval mode.
    reference = _checkpoint_backbone(pretrained)
    state = model.backbone.model.state_dict()
    assert set(state) == set(reference)
    assert all(torch.equal(state[k], reference[k]) for k in reference)
    model.train()  # the runner ends in eval mode (validation); train() must leave the BN frozen
    assert model.training and model.head.training and not model.backbone.training
    assert not any(p.requires_grad for p in model.backbone.parameters())
    assert float(model.head[-1].weight.detach().abs().max()) > 0.05  # the head did learn (init std 0.01)
    assert osp.isfile(tmp_path / 'epoch_2.pth')


def test_frozen_check_hook_raises_when_the_backbone_is_trained(tmp_path, pretrained):
    cfg = digits_benchmark('linear/linear_r18_100e_fmnist.py', str(tmp_path), pretrained,
                           subset_fraction=0.1, frozen=False)
    assert [h['type'] for h in cfg.custom_hooks] == ['FrozenBackboneCheckHook']
    with pytest.raises(RuntimeError, match='backbone changed during linear evaluation'):
        RUNNERS.build(cfg).train()


def test_semi_supervised_fine_tunes_with_separate_learning_rates(tmp_path, pretrained):
    torch.manual_seed(0)
    cfg = digits_benchmark('semi/semi_r18_20e_fmnist_10pct.py', str(tmp_path), pretrained)
    runner = RUNNERS.build(cfg)
    runner.train()
    model = unwrap_model(runner.model)
    class_sizes = np.bincount(Digits(split='train').labels)
    assert len(runner.train_dataloader.dataset) == np.floor(0.1 * class_sizes + 0.5).sum()  # 10% a class
    lrs = _param_lrs(runner.optim_wrapper.optimizer, model)
    assert set(lrs) == {n for n, _ in model.named_parameters()}
    assert _distinct(lrs, 'backbone.') == {0.01} and _distinct(lrs, 'head.') == {0.1}
    assert {g['weight_decay'] for g in runner.optim_wrapper.optimizer.param_groups} == {5e-4}
    reference = _checkpoint_backbone(pretrained)
    state = model.backbone.model.state_dict()
    assert not torch.equal(state['conv1.weight'], reference['conv1.weight'])
    assert not torch.equal(state['bn1.running_mean'], reference['bn1.running_mean'])
    assert 0 < runner.message_hub.get_scalar('val/top1').current() <= 100


@pytest.mark.parametrize('config,head_lr', [('semi/semi_r50_20e_in1k_1pct.py', 1.0),
                                            ('semi/semi_r50_20e_in1k_10pct.py', 0.1),
                                            ('semi/semi_r18_20e_fmnist_1pct.py', 1.0)])
def test_semi_configs_follow_the_paper(config, head_lr):
    cfg = Config.fromfile(osp.join(BENCHMARKS, config))
    cfg.model.backbone = copy.deepcopy(TINY_BACKBONE)  # the recipe, not the ResNet-50, is under test
    model = MODELS.build(cfg.model)
    assert not model.frozen
    lrs = _param_lrs(build_optim_wrapper(model, cfg.optim_wrapper).optimizer, model)
    assert _distinct(lrs, 'backbone.') == {0.01} and _distinct(lrs, 'head.') == {head_lr}
    assert cfg.optim_wrapper.optimizer.weight_decay == 5e-4 and cfg.optim_wrapper.optimizer.momentum == 0.9
    (scheduler,) = cfg.param_scheduler
    assert scheduler.milestones == [12, 16] and scheduler.gamma == 0.2 and cfg.train_cfg.max_epochs == 20
    assert not cfg.custom_hooks


def test_linear_in1k_config_follows_the_paper():
    cfg = Config.fromfile(osp.join(BENCHMARKS, 'linear', 'linear_r50_100e_in1k.py'))
    optimizer = cfg.optim_wrapper.optimizer
    assert (optimizer.lr, optimizer.momentum, optimizer.weight_decay) == (10.0, 0.9, 0.0)
    assert cfg.train_cfg.max_epochs == 100 and cfg.train_dataloader.batch_size * 8 == 256
    assert cfg.model.frozen and cfg.model.backbone.model_name == 'resnet50'


def test_accuracy_matches_sklearn():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(203, 7)).astype(np.float32)
    labels = rng.integers(0, 7, 203)
    metric = Accuracy(topk=(1, 2, 5, 7))
    for start in range(0, 203, 50):  # several batches, as the val loop feeds it
        metric.process(None, [dict(pred_score=torch.from_numpy(s), gt_label=torch.tensor(y))
                              for s, y in zip(scores[start:start + 50], labels[start:start + 50])])
    result = metric.evaluate(203)
    assert set(result) == {'top1', 'top2', 'top5', 'top7'}
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # sklearn warns that k = n_classes is a perfect score
        for k in (1, 2, 5, 7):
            expected = 100 * top_k_accuracy_score(labels, scores, k=k, labels=np.arange(7))
            assert result[f'top{k}'] == pytest.approx(expected)
    assert METRICS.build(dict(type='Accuracy', topk=(1, 5))).topk == (1, 5)
    with pytest.raises(ValueError, match='positive'):
        Accuracy(topk=(0,))


def test_classifier_modes_and_label_checks(pretrained):
    model = MODELS.build(dict(type='ImageClassifier', backbone=TINY_BACKBONE, num_classes=10,
                              pretrained=pretrained, frozen=True, head_norm=True))
    data = model.data_preprocessor({'inputs': [torch.rand(4, 3, 8, 8)], 'label': torch.tensor([0, 1, 2, 9]),
                                    'index': torch.arange(4)}, True)
    assert model(**data, mode='tensor').shape == (4, 10)
    assert set(model(**data, mode='loss')) == {'loss'}
    predictions = model(**data, mode='predict')
    assert len(predictions) == 4 and predictions[0]['pred_score'].shape == (10,)
    assert isinstance(model.head[0], torch.nn.BatchNorm1d) and not model.head[0].affine
    data['data_samples']['label'] = torch.tensor([0, 1, 2, -1])
    with pytest.raises(ValueError, match='Unlabelled'):
        model(**data, mode='loss')
    # init_weights (called by the runner) reaches timm's own re-initialisation; the checkpoint wins.
    model.init_weights()
    reference = _checkpoint_backbone(pretrained)
    assert torch.equal(model.backbone.model.conv1.weight, reference['conv1.weight'])


def test_subsets_are_balanced_and_reproducible(tmp_path):
    make_subset = _tool('make_subset')
    config = tmp_path / 'digits.py'
    # The config's own subset_fraction must not restrict the draw.
    config.write_text("default_scope = 'ifnd'\ntrain_dataloader = dict(dataset=dict(\n"
                      "    type='Digits', split='train', subset_fraction=0.5))\n")
    full = Digits(split='train')
    out = [tmp_path / f'subset_{i}.txt' for i in range(3)]
    make_subset.main(['--config', str(config), '--fraction', '0.1', '--seed', '0', '--out', str(out[0])])
    first = make_subset.make_subset(str(config), 0.1, 0, str(out[1]))
    other = make_subset.make_subset(str(config), 0.1, 1, str(out[2]))
    assert out[0].read_text() == out[1].read_text() and first != other
    subset = Digits(split='train', subset_file=str(out[0]))
    assert list(subset.indices) == sorted(int(e) for e in first)
    counts, full_counts = np.bincount(subset.labels), np.bincount(full.labels)
    assert np.array_equal(counts, np.floor(0.1 * full_counts + 0.5).astype(int))

    # File-based data: entries are paths relative to the data root.
    for c in range(3):
        (tmp_path / 'images' / f'class{c}').mkdir(parents=True)
        for i in range(10):
            rgb_image(10 * c + i, (8, 8)).save(tmp_path / 'images' / f'class{c}' / f'img{i}.png')
    config = tmp_path / 'folder.py'
    config.write_text("train_dataloader = dict(dataset=dict(type='ImageFolder', data_root='unset'))\n")
    entries = make_subset.make_subset(str(config), 0.3, 0, str(out[2]), cfg_options={
        'train_dataloader.dataset.data_root': str(tmp_path / 'images')})
    assert len(entries) == 9 and all(e.startswith('class') and e.endswith('.png') for e in entries)
    subset = ImageFolder(str(tmp_path / 'images'), subset_file=str(out[2]))
    assert sorted(subset.get_path(i) for i in range(len(subset))) == sorted(
        str(tmp_path / 'images' / e) for e in entries)
    assert np.array_equal(np.bincount(subset.labels), [3, 3, 3])


def test_extract_backbone_round_trip(tmp_path, pretrained):
    out = tmp_path / 'backbone.pth'
    _tool('extract_backbone').main([pretrained, str(out)])
    saved = torch.load(out, map_location='cpu', weights_only=True)  # no allow-list needed
    reference = _checkpoint_backbone(pretrained)
    assert set(saved['state_dict']) == set(reference)
    assert all(torch.equal(saved['state_dict'][k], reference[k]) for k in reference)
    backbone = saved['meta']['model']['backbone']
    assert backbone['model_name'] == 'resnet18' and backbone['cifar_stem']
    encoder = load_encoder(str(out))  # settings from the file itself
    assert all(torch.equal(v, reference[k]) for k, v in encoder.backbone.model.state_dict().items())
    assert torch.allclose(encoder.data_preprocessor.mean.flatten(), torch.tensor(DIGITS_MEAN))
    assert not list(tmp_path.glob('.tmp_*'))  # written through a temporary file


@pytest.fixture(scope='module')
def moco_checkpoint(tmp_path_factory):
    """A MoCo v2 checkpoint layout around torchvision's ResNet-50 (query and key encoders, MLP head)."""
    torch.manual_seed(0)
    resnet = torchvision.models.resnet50()
    body = {k: v for k, v in resnet.state_dict().items() if not k.startswith('fc.')}
    state = {'module.encoder_q.' + k: v for k, v in body.items()}
    state.update({'module.encoder_k.' + k: torch.zeros_like(v) for k, v in body.items()})
    for encoder in ('encoder_q', 'encoder_k'):
        state.update({f'module.{encoder}.fc.0.weight': torch.randn(2048, 2048),
                      f'module.{encoder}.fc.0.bias': torch.zeros(2048),
                      f'module.{encoder}.fc.2.weight': torch.randn(128, 2048),
                      f'module.{encoder}.fc.2.bias': torch.zeros(128)})
    state.update({'module.queue': torch.randn(128, 16), 'module.queue_ptr': torch.zeros(1, dtype=torch.long)})
    path = tmp_path_factory.mktemp('moco') / 'moco_v2_200ep_pretrain.pth.tar'
    torch.save({'epoch': 200, 'arch': 'resnet50', 'state_dict': state}, path)
    return str(path), body


def test_moco_checkpoint_loads_and_mismatches_fail(tmp_path, moco_checkpoint):
    path, body = moco_checkpoint
    model = MODELS.build(dict(type='ImageClassifier', num_classes=5, pretrained=path,
                              backbone=dict(type='TimmBackbone', model_name='resnet50')))
    state = model.backbone.model.state_dict()
    assert set(state) == set(body)
    assert all(torch.equal(state[k], body[k]) for k in body)  # encoder_q, not encoder_k
    # A backbone that does not fit the weights is replaced by the one they describe.
    other = MODELS.build(dict(type='ImageClassifier', num_classes=5, pretrained=path,
                              backbone=dict(type='TimmBackbone', model_name='resnet18')))
    assert other.backbone.model.state_dict()['conv1.weight'].equal(body['conv1.weight'])
    with pytest.raises(ValueError) as err:  # loading into a given wrong backbone still fails loudly
        load_backbone_weights(TimmBackbone('resnet18'), path)
    message = str(err.value)
    assert 'unexpected keys [' in message and 'layer1.0.conv3.weight' in message
    assert 'shape mismatches [' in message and 'conv1.weight' in message
    assert "'model_name': 'resnet50'" in message  # what the weights are
    # The tool reads the architecture from the weights, and round-trips them.
    extract = _tool('extract_backbone')
    extract.main([path, str(tmp_path / 'r50.pth')])
    saved = torch.load(tmp_path / 'r50.pth', weights_only=True)
    assert saved['meta']['model']['backbone']['model_name'] == 'resnet50'
    assert all(torch.equal(saved['state_dict'][k], body[k]) for k in body)


@pytest.fixture(scope='module')
def generated_data(tmp_path_factory):
    """Generated stand-ins for the benchmark data sets, under <root>/data/ as the configs expect."""
    root = tmp_path_factory.mktemp('benchmark_data')
    imagenet = root / 'data' / 'imagenet'
    files = []
    for split in ('train', 'val'):
        for c, wnid in enumerate(('n01440764', 'n01443537')):
            (imagenet / split / wnid).mkdir(parents=True)
            for i in range(3):
                rgb_image(10 * c + i, (40, 30)).save(imagenet / split / wnid / f'{wnid}_{i}.JPEG')
                files.append(f'{wnid}_{i}.JPEG')
    (imagenet / 'subsets').mkdir()
    # SimCLR's list files: one bare image file name a line.
    (imagenet / 'subsets' / '1percent.txt').write_text('n01440764_0.JPEG\nn01443537_1.JPEG\n')
    (imagenet / 'subsets' / '10percent.txt').write_text('\n'.join(files[:6]) + '\n')
    places = root / 'data' / 'places205'
    images = places / 'data' / 'vision' / 'torralba' / 'deeplearning' / 'images256'
    (places / 'trainvalsplit_places205').mkdir(parents=True)
    for split in ('train', 'val'):
        lines = []
        for c, scene in enumerate(('a/abbey', 'b/bamboo_forest')):
            (images / scene).mkdir(parents=True, exist_ok=True)
            for i in range(2):
                name = f'{scene}/gsun_{split}{c}{i}.jpg'
                rgb_image(c + i, (32, 32)).save(images / name)
                lines.append(f'{name} {c}')
        (places / 'trainvalsplit_places205' / f'{split}_places205.csv').write_text('\n'.join(lines) + '\n')
    fake_cifar(root / 'data' / 'cifar10', num_classes=10)
    fake_cifar(root / 'data' / 'cifar100', num_classes=100)
    fake_fmnist(root / 'fmnist', n_train=200)
    return root


def _local_dataset(cfg, root) -> dict:
    cfg = copy.deepcopy(cfg.to_dict())
    for key, value in cfg.items():
        if isinstance(value, str) and value.startswith('data/'):
            cfg[key] = str(root / value)
    if cfg['type'] == 'FashionMNIST':
        cfg['data_root'] = str(root / 'fmnist')
    return cfg


# Classification benchmarks; the COCO transfer configs are built in tests/test_configs.py.
BENCHMARK_CONFIGS = sorted(osp.relpath(f, BENCHMARKS) for protocol in ('linear', 'semi')
                           for f in glob.glob(osp.join(BENCHMARKS, protocol, '*.py')))


def test_every_benchmark_config_is_there():
    assert set(BENCHMARK_CONFIGS) >= {
        'linear/linear_r50_100e_in1k.py', 'linear/linear_r50_100e_places205.py',
        'linear/linear_r50_100e_cifar10.py', 'linear/linear_r50_100e_cifar100.py',
        'linear/linear_r18_100e_fmnist.py', 'semi/semi_r50_20e_in1k_1pct.py',
        'semi/semi_r50_20e_in1k_10pct.py', 'semi/semi_r18_20e_fmnist_1pct.py',
        'semi/semi_r18_20e_fmnist_10pct.py'}


@pytest.mark.parametrize('config', BENCHMARK_CONFIGS)
def test_benchmark_config_builds(config, generated_data, monkeypatch):
    monkeypatch.setattr(tv_cifar, 'check_integrity', lambda p, md5=None: osp.isfile(p))
    cfg = Config.fromfile(osp.join(BENCHMARKS, config))
    assert cfg.default_scope == 'ifnd' and cfg.runner_type == 'SafeLoadRunner'
    model = MODELS.build(cfg.model)
    assert model.pretrained is None and model.frozen == config.startswith('linear/')
    size = (224 if ('in1k' in config or 'places' in config) else 28 if 'fmnist' in config
            else 16 if 'digits' in config else 32)
    train_set = DATASETS.build(_local_dataset(cfg.train_dataloader.dataset, generated_data))
    val_set = DATASETS.build(_local_dataset(cfg.val_dataloader.dataset, generated_data))
    for dataset in (train_set, val_set):
        item = dataset[0]
        assert len(item['inputs']) == 1 and item['inputs'][0].shape == (3, size, size)
        assert 0 <= item['label'] < cfg.model.num_classes
    if 'in1k_1pct' in config:
        assert len(train_set) == 2
    batch = {'inputs': [torch.stack([train_set[0]['inputs'][0], val_set[0]['inputs'][0]])],
             'label': torch.tensor([train_set[0]['label'], val_set[0]['label']])}
    model.eval()
    with torch.no_grad():
        assert model(**model.data_preprocessor(batch), mode='tensor').shape == (2, cfg.model.num_classes)
    assert METRICS.build(cfg.val_evaluator).topk == (1, 5) and cfg.test_evaluator == cfg.val_evaluator
    hooks = [HOOKS.build(h) for h in cfg.custom_hooks]
    assert [type(h).__name__ for h in hooks] == (['FrozenBackboneCheckHook'] if model.frozen else [])
    for name in ('optim_wrapper', 'param_scheduler', 'train_cfg', 'val_cfg', 'test_cfg', 'default_hooks'):
        assert name in cfg, f'{config} lacks {name}'
