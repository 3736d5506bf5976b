"""The fast training step: channels_last, compile, AMP choice, fused SGD / LARS, no host sync."""
import contextlib
import glob
import os.path as osp

import pytest
import torch
from helpers import TINY_BACKBONE, TINY_NECK, HostSyncOps
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.optim import AmpOptimWrapper, build_optim_wrapper
from mmengine.registry import init_default_scope

from ifnd.clustering import pad_levels
from ifnd.engine import cli
from ifnd.registry import MODELS

CONFIGS = osp.join(osp.dirname(__file__), '..', 'configs')


@pytest.fixture(autouse=True)
def scope():
    init_default_scope('ifnd')


def _views(num=8, size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(num, 3, size, size, generator=g) for _ in range(2)]


def test_channels_last_backbone_gives_the_same_features():
    torch.manual_seed(0)
    plain = MODELS.build(dict(TINY_BACKBONE))
    nhwc = MODELS.build(dict(TINY_BACKBONE, channels_last=True))
    nhwc.load_state_dict(plain.state_dict())
    assert nhwc.model.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.rand(4, 3, 16, 16)
    torch.testing.assert_close(nhwc(x), plain(x), rtol=1e-4, atol=1e-5)
    # The model base configs (GPU recipes) turn it on.
    for name in ('simclr_r50.py', 'mocov2_r50.py'):
        cfg = Config.fromfile(osp.join(CONFIGS, '_base_', 'models', name))
        assert cfg.model.backbone.channels_last is True


def test_compiled_backbone_trains_a_step_with_unchanged_state_dict_keys():
    # backend='eager' exercises the wiring; the inductor takes minutes to compile on a 2-core CPU.
    torch.manual_seed(0)
    compiled = dict(TINY_BACKBONE, compile=dict(backend='eager'), channels_last=True)
    model = MODELS.build(dict(type='MoCoV2', backbone=compiled, neck=TINY_NECK, queue_len=32,
                              bn_splits=2))
    reference = MODELS.build(dict(type='MoCoV2', backbone=TINY_BACKBONE, neck=TINY_NECK,
                                  queue_len=32, bn_splits=2))
    assert list(model.state_dict()) == list(reference.state_dict())
    wrapper = build_optim_wrapper(model, dict(optimizer=dict(type='SGD', lr=0.1, fused=True)))
    before = model.backbone.model.conv1.weight.detach().clone()
    log = model.train_step({'inputs': _views(), 'index': torch.arange(8)}, wrapper)
    assert torch.isfinite(log['loss'])
    assert model.backbone._compiled and model.momentum_backbone._compiled
    assert not torch.equal(before, model.backbone.model.conv1.weight)
    with pytest.raises(ValueError, match="compile must be a bool, 'auto' or a dict"):
        MODELS.build(dict(TINY_BACKBONE, compile='yes'))


def _import_registries() -> None:
    # Registry lookups log through the current MMLogger, and a logger created while
    # torch.cuda.is_available is faked fails its device lookup: create it (and let the registries
    # import their modules) first.
    from mmengine.logging import MMLogger
    from mmengine.registry import Registry

    from ifnd import registry
    MMLogger.get_instance('fast_step_without_cuda')
    for reg in vars(registry).values():
        if isinstance(reg, Registry):
            reg.import_from_location()


@pytest.mark.parametrize('bf16,dtype,scaler_enabled', [(True, 'bfloat16', False),
                                                       (False, 'float16', True)])
def test_amp_picks_bfloat16_without_scaler_when_supported(monkeypatch, tmp_path, bf16, dtype,
                                                          scaler_enabled):
    _import_registries()
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *a, **k: bf16)
    cfg = cli.runner_config(osp.join(CONFIGS, 'simclr', 'simclr_r18_200e_fmnist.py'),
                            str(tmp_path), amp=True)
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper' and cfg.optim_wrapper.dtype == dtype
    assert cfg.optim_wrapper.optimizer.fused is True  # the schedule's fused SGD is kept
    scale = cfg.optim_wrapper.loss_scale
    assert (scale == 'dynamic') if scaler_enabled else (scale == dict(enabled=False))
    # An explicit dtype in the config wins, and float16 always gets its dynamic scaler.
    assert cli.amp_options('float16') == dict(dtype='float16', loss_scale='dynamic')


def _gpu_recipes() -> list[str]:
    """The pre-training configs with a ResNet-50, and the device-views Fashion-MNIST config."""
    found = []
    for path in sorted(glob.glob(osp.join(CONFIGS, '**', '*.py'), recursive=True)):
        name = osp.relpath(path, CONFIGS)
        if name.startswith(('_base_', 'benchmarks')):
            continue
        if Config.fromfile(path).model.backbone.get('model_name') == 'resnet50':
            found.append(name)
    return found + ['ifnd/ifnd_r18_200e_fmnist_device_aug.py']


@pytest.mark.parametrize('cuda', [False, True], ids=['cpu', 'cuda'])
def test_gpu_recipes_train_in_bf16_compiled_where_cuda_is_present(monkeypatch, tmp_path, cuda):
    _import_registries()
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: cuda)
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *a, **k: True)
    recipes = _gpu_recipes()
    assert {'ifnd_r50_200e_in1k.py', 'mocov2/mocov2_r50_200e_in1k.py',
            'simclr/simclr_r50_1000e_cifar10.py', 'ifnd/ifnd_r50_1000e_cifar100.py'} <= set(recipes)
    tiny = MODELS.build(dict(type='SimCLR', backbone=TINY_BACKBONE, neck=TINY_NECK))

    def resolved(cfg):
        wrapper = build_optim_wrapper(tiny, cfg.optim_wrapper)
        amp = isinstance(wrapper, AmpOptimWrapper)
        if amp:  # bfloat16 autocast, no loss scaler (no inf check syncing every step)
            assert wrapper.cast_dtype == torch.bfloat16 and not wrapper.loss_scaler.is_enabled()
        backbone = built.get(repr(cfg.model.backbone))
        if backbone is None:  # the real backbones, each distinct one once
            backbone = built[repr(cfg.model.backbone)] = MODELS.build(cfg.model.backbone)
        return amp, backbone.compile_cfg is not None, backbone.channels_last

    built = {}
    for name in recipes:
        cfg = Config.fromfile(osp.join(CONFIGS, name))
        assert resolved(cfg) == (cuda, cuda, True), name
    # Each can be turned off, e.g. on a GPU.
    off = cli.runner_config(osp.join(CONFIGS, recipes[0]), str(tmp_path), cfg_options={
        'optim_wrapper.type': 'OptimWrapper', 'model.backbone.compile': False})
    assert resolved(off) == (False, False, True)
    # The CPU-views recipe stays float32 and uncompiled even where CUDA is present.
    cfg = Config.fromfile(osp.join(CONFIGS, 'simclr', 'simclr_r18_200e_fmnist.py'))
    assert resolved(cfg) == (False, False, True)
    # 'auto' compiles only a network that runs on CUDA: not this one, on the CPU.
    backbone = MODELS.build(dict(TINY_BACKBONE, compile='auto'))
    backbone(torch.rand(2, 3, 8, 8))
    assert not backbone._compiled
    if cuda:  # --amp on an AutoAmpOptimWrapper recipe: the same mixed precision
        cfg = cli.runner_config(osp.join(CONFIGS, recipes[0]), str(tmp_path), amp=True)
        assert resolved(cfg)[0]


def _schedule(name):
    return Config.fromfile(osp.join(CONFIGS, '_base_', 'schedules', name))


@pytest.mark.parametrize('name', ['sgd_coslr_200e.py', 'sgd_coslr_1000e.py', 'sgd_steplr_200e.py'])
def test_sgd_schedules_build_fused_optimisers(name):
    model = MODELS.build(dict(type='SimCLR', backbone=TINY_BACKBONE, neck=TINY_NECK))
    wrapper = build_optim_wrapper(model, _schedule(name).optim_wrapper)
    assert isinstance(wrapper.optimizer, torch.optim.SGD) and wrapper.optimizer.defaults['fused']
    loss = model.loss(_views(), {})['loss']
    wrapper.update_params(loss)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_lars_schedule_excludes_bn_and_bias_and_matches_the_lars_update():
    torch.manual_seed(0)
    cfg = _schedule('lars_coslr_1000e.py')
    assert cfg.auto_scale_lr == dict(base_batch_size=256, enable=True)  # lr = 0.3 x batch / 256
    assert cfg.param_scheduler[1].type == 'CosineAnnealingLR' and cfg.train_cfg.max_epochs == 1000
    model = MODELS.build(dict(type='SimCLR', backbone=TINY_BACKBONE, neck=TINY_NECK))
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    opt = wrapper.optimizer
    assert type(opt).__name__ == 'Lars'
    decay = {id(p): g['weight_decay'] for g in opt.param_groups for p in g['params']}
    named = dict(model.named_parameters())
    assert decay[id(named['backbone.model.bn1.weight'])] == 0.0
    assert decay[id(named['backbone.model.bn1.bias'])] == 0.0
    assert decay[id(named['backbone.model.conv1.weight'])] == 1e-6
    model.loss(_views(), {})['loss'].backward()
    conv, bn = named['backbone.model.conv1.weight'], named['backbone.model.bn1.weight']
    expected = {}
    lr, eta, wd = opt.param_groups[0]['lr'], 0.001, 1e-6
    for p, weight_decay in ((conv, wd), (bn, 0.0)):
        w, g = p.detach().double(), p.grad.double()
        if weight_decay:  # LARS (You et al.): local lr = eta ||w|| / (||g|| + wd ||w||)
            local = eta * w.norm() / (g.norm() + wd * w.norm())
            expected[p] = w - lr * local * (g + wd * w)
        else:  # excluded: plain SGD (the first momentum step is the gradient itself)
            expected[p] = w - lr * g
    wrapper.step()
    for p, want in expected.items():
        torch.testing.assert_close(p.detach().double(), want, rtol=1e-5, atol=1e-7)


@contextlib.contextmanager
def _host_sync_forbidden():
    """Make every Python-level device-to-host read raise."""
    def refuse(name):
        def method(self, *args, **kwargs):
            raise AssertionError(f'Tensor.{name} (a host sync) called in the training step')
        return method

    names = ('item', 'tolist', '__bool__', '__int__', '__float__')
    saved = {name: getattr(torch.Tensor, name) for name in names}
    try:
        for name in names:
            setattr(torch.Tensor, name, refuse(name))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def _filled(model, levels=2, num_samples=40, clusters=(3, 5)):
    g = torch.Generator().manual_seed(1)
    labels = torch.stack([torch.randint(0, k, (num_samples,), generator=g) for k in clusters])
    accepted = torch.rand(levels, num_samples, generator=g) < 0.5
    unique = -(torch.arange(num_samples) + 1)
    if hasattr(model, 'label_bank'):
        model.label_bank.reset(levels, num_samples)
        centroids = [torch.nn.functional.normalize(torch.randn(k, TINY_NECK['out_dim']), dim=1)
                     for k in clusters]
        padded, concentration = pad_levels(centroids, [torch.rand(k) + 0.5 for k in clusters])
        model.label_bank.update(torch.where(accepted, labels, unique), padded, concentration,
                                clusters)
    if hasattr(model, 'queue_index'):
        model.queue_index.copy_(torch.randint(0, num_samples, model.queue_index.shape, generator=g))
    return model


# The other false-negative methods: debiased, hard negatives (SimCLR and MoCo bases) and FNC.
NEW_FN_METHODS = [
    dict(type='DebiasedCL'), dict(type='HardNegativeCL'),
    dict(type='DebiasedMoCo', queue_len=32, bn_splits=2),
    dict(type='HardNegativeMoCo', queue_len=32, bn_splits=2),
    dict(type='FNC', treatment='elim', num_support_views=2, top_k=3),
    dict(type='FNC', treatment='attr', num_support_views=1, top_k=None, threshold=0.2)]


@pytest.mark.parametrize('cfg', [
    dict(type='SimCLR'), dict(type='IFND', treatment='elim'), dict(type='IFND', treatment='attr'),
    dict(type='SupCon'), dict(type='OracleElim'), dict(type='PCL'),
    dict(type='MoCoV2', queue_len=32, bn_splits=2),
    dict(type='IFNDMoCo', queue_len=32, bn_splits=2),
    dict(type='NNCLR', support_size=32, predictor=dict(type='MLPNeck', hidden_dim=32)),
    dict(type='NNCLR', support_size=32, predictor=dict(type='MLPNeck', hidden_dim=32),
         detector=dict(type='PseudoLabels'), treatment='elim'),
    *NEW_FN_METHODS,
], ids=lambda c: c['type'] + c.get('treatment', ''))
def test_training_step_makes_no_host_sync(cfg):
    torch.manual_seed(0)
    model = _filled(MODELS.build(dict(cfg, backbone=TINY_BACKBONE, neck=TINY_NECK)))
    model.track_detection = model.records_detection  # the detection counts are summed too
    wrapper = build_optim_wrapper(model, _schedule('sgd_coslr_200e.py').optim_wrapper)
    views = _views() + _views(seed=1)[:getattr(model, 'num_support_views', 0)]
    batch = {'inputs': views, 'index': torch.randperm(40)[:8], 'label': torch.arange(8) % 3}
    if cfg['type'] in ('SupCon', 'OracleElim'):
        model.loss(batch['inputs'], batch)  # the ground-truth labels are checked once, first
    with _host_sync_forbidden():
        losses = model.loss(batch['inputs'], batch)
        wrapper.update_params(sum(v for k, v in losses.items() if 'loss' in k))
    assert all(torch.isfinite(v) for v in losses.values())
    if torch.cuda.is_available():  # the real check, where a GPU is present
        model.cuda()
        batch = {k: [x.cuda() for x in v] if k == 'inputs' else v.cuda() for k, v in batch.items()}
        torch.cuda.set_sync_debug_mode('error')
        try:
            model.loss(batch['inputs'], batch)['loss'].backward()
        finally:
            torch.cuda.set_sync_debug_mode('default')


def _reference(anchors, candidates, positive_index, self_index, anchor_labels, candidate_labels,
               treatment, temperature):
    """The former implementation: full boolean masks per level, then masked_info_nce."""
    from loss_references import label_masks, masked_info_nce
    logits = anchors @ candidates.t() / temperature
    columns = torch.arange(candidates.shape[0]).unsqueeze(0)
    positive = columns == positive_index.unsqueeze(1)
    excluded = columns == self_index.unsqueeze(1)
    total = 0
    for level in range(anchor_labels.shape[0]):
        total = total + masked_info_nce(logits, *label_masks(
            anchor_labels[level], candidate_labels[level], positive, excluded, treatment))
    return total / anchor_labels.shape[0]


@pytest.mark.parametrize('treatment', [None, 'elim', 'attr'])
@pytest.mark.parametrize('levels', [1, 3])
def test_fused_masks_equal_the_former_masks(treatment, levels):
    from loss_references import contrastive_loss_from_candidates, queue_contrastive_loss
    g = torch.Generator().manual_seed(levels)
    num, dim = 12, 8
    z = torch.nn.functional.normalize(torch.randn(2 * num, dim, generator=g), dim=1)
    labels = torch.randint(0, 3, (levels, num), generator=g)
    labels = torch.where(torch.rand(levels, num, generator=g) < 0.6, labels,
                         -(torch.arange(num) + 1))
    view_labels = labels.repeat(1, 2)
    index = torch.arange(num)
    positive_index, self_index = torch.cat([index + num, index]), torch.arange(2 * num)
    for temperature in (0.1, 0.5):
        new = contrastive_loss_from_candidates(z, z, positive_index, self_index, view_labels,
                                               view_labels, temperature, treatment)
        old = _reference(z, z, positive_index, self_index, view_labels, view_labels, treatment,
                         temperature)
        torch.testing.assert_close(new, old, rtol=1e-5, atol=1e-5)
    # The queue: the own key is column 0, the queue has no excluded entry.
    q, k = z[:num], z[num:]
    queue = torch.nn.functional.normalize(torch.randn(20, dim, generator=g), dim=1)
    queue_labels = torch.randint(0, 3, (levels, 20), generator=g)
    new = queue_contrastive_loss(q, k, queue, labels, queue_labels, 0.2, treatment)
    # Row by row: each query sees its own key (with its own label) and the queue.
    ref = torch.stack([
        _reference(q[i:i + 1], torch.cat([k[i:i + 1], queue]), torch.tensor([0]),
                   torch.tensor([-1]), labels[:, i:i + 1],
                   torch.cat([labels[:, i:i + 1], queue_labels], dim=1), treatment, 0.2)
        for i in range(num)]).mean()
    torch.testing.assert_close(new, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('treatment', ['elim', 'attr'])
def test_unaccepted_batch_is_exactly_instance_discrimination(treatment):
    from loss_references import contrastive_loss_from_candidates
    g = torch.Generator().manual_seed(0)
    num = 10
    z = torch.randn(2 * num, 8, generator=g)
    index = torch.arange(num)
    args = (torch.cat([index + num, index]), torch.arange(2 * num))
    unique = -(torch.arange(num) + 1).repeat(3, 2)  # three levels, nothing accepted
    grads = []
    for labels in (None, unique):
        leaf = z.clone().requires_grad_(True)
        emb = torch.nn.functional.normalize(leaf, dim=1)
        loss = contrastive_loss_from_candidates(emb, emb, *args, labels, labels, 0.5, treatment,
                                                instance_if_unaccepted=True).mean()
        loss.backward()
        grads.append((loss.detach(), leaf.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_step_cost_benchmark_speed_options_and_encoder_row(capsys):
    from benchmarks import step_cost as bench
    result = bench.main(['--pairs', 'simclr', '--batch-size', '4', '--image-size', '8',
                         '--neck-hidden', '16', '--out-dim', '8', '--num-samples', '64',
                         '--warmup', '0', '--repeats', '1', '--threads', '1', '--device', 'cpu',
                         '--channels-last', '--fused', '--compile', '--compile-backend', 'eager'])
    text = capsys.readouterr().out
    assert 'channels_last, fused SGD, torch.compile (eager)' in text
    assert '| Encoder (fwd+bwd, 2 x batch) |' in text
    encoder = result['encoder']['median_ms']
    for name in ('SimCLR', 'IFND'):
        v = result['variants'][name]
        assert v['x_encoder'] == pytest.approx(v['median_ms'] / encoder)
    with pytest.raises(SystemExit, match='--amp needs a CUDA device'):
        bench.main(['--amp', '--device', 'cpu', '--pairs', 'simclr', '--num-samples', '64'])


def _device_view_batch(kind, view, root, num_views=2):
    from ifnd.datasets import Digits, ImageFolder
    from ifnd.datasets.base import batch_collate
    pipeline = dict(type='MultiView', num_views=num_views, transforms=view)
    if kind == 'digits':
        ds = Digits(split='train', pipeline=pipeline, augment_on='device')
        indices = torch.randperm(40)[:8].tolist()
    else:
        import numpy as np
        from PIL import Image
        rng = np.random.default_rng(0)
        for i, (h, w) in enumerate([(20, 30), (24, 24), (31, 17), (18, 26), (40, 36), (22, 22)]):
            (root / f'c{i % 2}').mkdir(exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / f'c{i % 2}' / f'{i}.jpg')
        ds = ImageFolder(str(root), pipeline=pipeline, augment_on='device')
        indices = list(range(len(ds)))
    return batch_collate(ds.__getitems__(indices))


# The second: SimCLR's view with blur, and solarisation
@pytest.mark.parametrize('view', [dict(type='MoCoV2View', size=16),
                                  dict(type='ContrastiveView', size=16, scale=(0.08, 1.0), jitter=(0.8, 0.8, 0.8, 0.2),
                                       blur_p=0.5, solarize_p=0.5)], ids=['mocov2', 'simclr_blur_solarize'])
@pytest.mark.parametrize('kind', ['digits', 'jpeg'])
@pytest.mark.parametrize('cfg', [dict(type='IFND', treatment='elim'),
                                 dict(type='IFNDMoCo', queue_len=32, bn_splits=2), *NEW_FN_METHODS],
                         ids=lambda c: c['type'] + c.get('treatment', ''))
def test_device_view_train_step_makes_no_host_sync(cfg, kind, view, tmp_path):
    """A whole train_step: the preprocessor makes the views (JPEGs decoded), forward, backward, SGD step."""
    torch.manual_seed(0)
    preprocessor = dict(type='ContrastiveDataPreprocessor', mean=(0.5,) * 3, std=(0.25,) * 3)
    model = _filled(MODELS.build(dict(cfg, backbone=TINY_BACKBONE, neck=TINY_NECK, data_preprocessor=preprocessor)))
    model.track_detection = model.records_detection
    wrapper = build_optim_wrapper(model, _schedule('sgd_coslr_200e.py').optim_wrapper)
    batch = _device_view_batch(kind, view, tmp_path, 2 + getattr(model, 'num_support_views', 0))
    assert 'augment' in batch  # the views are made in the step, not by the loader
    before = model.backbone.model.conv1.weight.detach().clone()
    with _host_sync_forbidden(), HostSyncOps(refuse=True):
        log = model.train_step(batch, wrapper)
    assert torch.isfinite(log['loss']) and not torch.equal(before, model.backbone.model.conv1.weight)
    if torch.cuda.is_available():  # the real check, where a GPU is present (JPEGs decoded by nvJPEG)
        model.cuda()
        wrapper = build_optim_wrapper(model, _schedule('sgd_coslr_200e.py').optim_wrapper)
        model.train_step(batch, wrapper)  # first-use set-up (cuDNN, allocator) may sync once
        torch.cuda.set_sync_debug_mode('error')
        try:
            log = model.train_step(batch, wrapper)
        finally:
            torch.cuda.set_sync_debug_mode('default')
        assert torch.isfinite(log['loss'])


def test_sync_refusal_catches_the_ops_it_names():
    x = torch.tensor([1.0, 0.0])
    for op in (lambda: bool(x[0]), lambda: x.nonzero(), lambda: x[x > 0], lambda: torch.equal(x, x)):
        with pytest.raises(AssertionError, match='host sync'), HostSyncOps(refuse=True):
            op()


class _IterationSyncs(Hook):
    """Per training iteration, the host syncs from the end of the previous one's hooks to the end of its
    own: the data fetch, every hook and the step. Where CUDA is present, those of the iterations inside
    an epoch (not its first, whose loader starts, nor its last, whose logs are copied to the host) run
    under ``torch.cuda.set_sync_debug_mode('error')``: a sync there raises."""

    priority = 'LOWEST'  # after every other hook of the iteration

    def __init__(self, mode: HostSyncOps) -> None:
        self.mode, self.seen, self.per_iteration = mode, 0, []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.per_iteration.append((runner.epoch, batch_idx, len(self.mode.seen) - self.seen))
        self.seen = len(self.mode.seen)
        if torch.cuda.is_available():
            inside = 0 <= batch_idx < len(runner.train_dataloader) - 2
            torch.cuda.set_sync_debug_mode('error' if inside else 'default')

    def after_train_epoch(self, runner) -> None:
        self.seen = len(self.mode.seen)


def test_whole_runner_iterations_make_no_host_sync(tmp_path):
    """IFND with device views through the Runner, every hook of the recipes (pseudo labels accepted
    in the second epoch, detection counts, buffered logs): no iteration inside an epoch reads a
    device value on the host, from the data fetch to its last hook."""
    from helpers import digits_config

    from ifnd.registry import RUNNERS
    cfg = digits_config(str(tmp_path), dict(type='IFND', temperature=0.5), max_epochs=2, fn_detection=True,
                        pseudo_labels=dict(num_clusters=[5, 10], interval=1, kmeans=dict(nredo=1, niter=5)))
    cfg.train_dataloader.dataset.update(augment_on='device', subset_fraction=0.5)
    cfg.train_dataloader.update(num_workers=0, persistent_workers=False)
    cfg.default_hooks.logger.interval = 1000  # the logs are copied to the host at each epoch's end
    torch.manual_seed(0)
    runner = RUNNERS.build(cfg)
    mode = HostSyncOps()
    counts = _IterationSyncs(mode)
    runner.register_hook(counts, priority='LOWEST')
    try:
        with mode:
            runner.train()
    finally:
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode('default')
    steps = len(runner.train_dataloader)
    inside = [(e, i, n) for e, i, n in counts.per_iteration if 0 < i < steps - 1]
    assert len(inside) == 2 * (steps - 2) and bool((runner.model.label_bank.labels >= 0).any())
    assert all(n == 0 for *_, n in inside), inside
