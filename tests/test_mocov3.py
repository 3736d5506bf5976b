"""MoCo v3 and IFND on it: the loss against a float64 reference written from the paper (plain,
elimination, attraction; values and gradients), the model's forward (queries, keys, momentum
update) against the same reference, the cosine momentum schedule through a real Runner, and short
training runs on digits with a tiny ViT."""
import copy
import glob
import json
import math
import os.path as osp

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import HostSyncOps, digits_config
from loss_references import mocov3_reference
from mmengine.hooks import Hook
from mmengine.registry import init_default_scope

from ifnd.models.mocov3 import cosine_momentum
from ifnd.registry import MODELS, RUNNERS

TINY_VIT = dict(type='ViTBackbone', model_name='vit_tiny_patch16_224', img_size=16, patch_size=4,
                embed_dim=32, depth=2, num_heads=2, frozen_patch_embed=True)
HEAD = dict(type='MLPNeck', hidden_dim=64, out_dim=16, num_layers=3, with_last_bn=True,
            last_bn_affine=False)
PREDICTOR = dict(type='MLPNeck', hidden_dim=64, num_layers=2, with_last_bn=True,
                 last_bn_affine=False)
NUM, SAMPLES, LEVELS = 6, 20, 2


@pytest.fixture(autouse=True)
def scope():
    init_default_scope('ifnd')


def _model(kind: str = 'MoCoV3', **kwargs):
    torch.manual_seed(0)
    return MODELS.build(dict(type=kind, backbone=TINY_VIT, neck=HEAD, predictor=PREDICTOR,
                             temperature=0.2, momentum=0.9, **kwargs))


def _labels(gen: torch.Generator) -> torch.Tensor:
    """Pseudo labels [levels, samples] of 2 clusters, a third not accepted (labels of their own)."""
    labels = torch.randint(0, 2, (LEVELS, SAMPLES), generator=gen)
    rejected = torch.rand(LEVELS, SAMPLES, generator=gen) < 0.3
    return torch.where(rejected, -(torch.arange(SAMPLES) + 1), labels)


def _flags(labels: torch.Tensor, index: torch.Tensor) -> list:
    """flags[l][d][i][j]: the images' labels agree at level l (both directions alike)."""
    image = labels[:, index]
    same = (image[:, :, None] == image[:, None, :]).tolist()
    return [[level, level] for level in same]


def _unit(gen, *shape) -> torch.Tensor:
    return F.normalize(torch.randn(*shape, generator=gen, dtype=torch.float64), dim=-1)


@pytest.mark.parametrize('treatment', [None, 'elim', 'attr'])
def test_pair_loss_and_gradients_match_the_reference(treatment):
    """The loss the model runs, on given queries and keys, against the element-wise reference."""
    gen = torch.Generator().manual_seed(1)
    model = _model('MoCoV3') if treatment is None else _model('IFNDMoCoV3', treatment=treatment)
    index = torch.randperm(SAMPLES, generator=gen)[:NUM]
    flags = None
    if treatment is not None:
        labels = _labels(gen)
        model.label_bank.reset(LEVELS, SAMPLES)
        model.label_bank.update(labels)
        flags = _flags(labels, index)
        pairs = torch.tensor(flags)[:, 0][:, ~torch.eye(NUM, dtype=torch.bool)]
        assert pairs.any() and not pairs.all(), 'the batch flags some negatives, not all'
    queries, keys = _unit(gen, 2 * NUM, 8).requires_grad_(True), _unit(gen, 2 * NUM, 8)
    loss = model.pair_losses(queries, keys, {'index': index})['loss']
    (grad, ) = torch.autograd.grad(loss, queries)
    q = queries.detach().clone().requires_grad_(True)
    want = mocov3_reference(q[:NUM], q[NUM:], keys[:NUM], keys[NUM:], 0.2, flags, treatment)
    (want_grad, ) = torch.autograd.grad(want, q)
    torch.testing.assert_close(loss, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-9, atol=1e-12)
    if treatment is None:  # the paper's code: 2τ · CE(q·kᵀ/τ, arange), both directions
        ce = sum(F.cross_entropy(a @ b.t() / 0.2, torch.arange(NUM)) for a, b in
                 ((queries[:NUM], keys[NUM:]), (queries[NUM:], keys[:NUM])))
        torch.testing.assert_close(loss, 2 * 0.2 * ce)


@pytest.mark.parametrize('treatment', [None, 'elim', 'attr'])
def test_a_step_is_the_reference_on_its_queries_and_updated_keys(treatment):
    """``loss``: queries h(g(f(x))) per view, the key encoder moved to m·key + (1 − m)·query
    before its keys, the symmetric loss of both, flags from the pseudo labels."""
    gen = torch.Generator().manual_seed(2)
    model = _model('MoCoV3') if treatment is None else _model('IFNDMoCoV3', treatment=treatment)
    model.init_weights()
    index = torch.randperm(SAMPLES, generator=gen)[:NUM]
    flags = None
    if treatment is not None:
        labels = _labels(gen)
        model.label_bank.reset(LEVELS, SAMPLES)
        model.label_bank.update(labels)
        flags = _flags(labels, index)
    with torch.no_grad():  # the query encoder moved away from the key encoder
        for param in model._query_params():
            param.add_(0.05 * torch.randn(param.shape, generator=gen))
    key_before = [p.detach().clone() for p in model._key_params()]
    model.set_progress(3, 10)
    m = 1 - (1 - 0.9) * (math.cos(math.pi * 3 / 10) + 1) / 2
    assert model.momentum == pytest.approx(m, rel=1e-12)
    views = [torch.rand(NUM, 3, 16, 16, generator=gen) for _ in range(2)]
    loss = model.loss(views, {'index': index})['loss']
    for before, after, query in zip(key_before, model._key_params(), model._query_params()):
        torch.testing.assert_close(after, m * before + (1 - m) * query)
    with torch.no_grad():
        q = [F.normalize(model.predictor(model.neck(model.backbone(x))), dim=1) for x in views]
        k = [F.normalize(model.momentum_neck(model.momentum_backbone(x)), dim=1) for x in views]
    want = mocov3_reference(q[0].double(), q[1].double(), k[0].double(), k[1].double(), 0.2,
                            flags, treatment)
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)



@pytest.mark.parametrize('backbone, passes', [
    (TINY_VIT, [12]),  # LayerNorm only: both views in one pass
    (dict(type='TimmBackbone', model_name='resnet18', cifar_stem=True, channels=(8, 8, 8, 8)), [6, 6]),
], ids=['vit', 'resnet'])
def test_a_batch_norm_backbone_sees_each_view_on_its_own(backbone, passes):
    """MoCo v3 runs one forward a view: a ResNet's BN statistics are each view's, in both encoders
    (the authors' two forwards); a ViT takes both views in one pass, which is the same."""
    torch.manual_seed(0)
    model = MODELS.build(dict(type='MoCoV3', backbone=backbone, neck=HEAD, predictor=PREDICTOR,
                              temperature=0.2, momentum=0.9))
    model.train()
    model.set_progress(0, 10)
    seen = {'backbone': [], 'momentum_backbone': []}
    for name in seen:
        getattr(model, name).register_forward_hook(
            lambda module, args, out, name=name: seen[name].append(args[0].shape[0]))
    views = [torch.rand(6, 3, 16, 16) for _ in range(2)]
    model.loss(views, {'index': torch.arange(6)})
    assert seen == {'backbone': passes, 'momentum_backbone': passes}

def test_the_momentum_follows_the_cosine_schedule():
    assert cosine_momentum(0.99, 0, 100) == 0.99
    assert cosine_momentum(0.99, 50, 100) == pytest.approx(0.995, rel=1e-12)
    assert cosine_momentum(0.99, 100, 100) == pytest.approx(1.0, rel=1e-12)
    for t in range(0, 101, 7):
        want = 1 - (1 - 0.99) * (math.cos(math.pi * t / 100) + 1) / 2
        assert cosine_momentum(0.99, t, 100) == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_a_training_step_without_the_schedule_is_refused():
    model = _model()
    with pytest.raises(RuntimeError, match=r"add dict\(type='MomentumScheduleHook'\)"):
        model.loss([torch.rand(4, 3, 16, 16) for _ in range(2)], {})


class _RecordMomentum(Hook):
    """Records the momentum the model used at each iteration."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, float]] = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.seen.append((runner.iter, runner.model.momentum))


def _scalars(work_dir) -> list[dict]:
    (path, ) = glob.glob(osp.join(str(work_dir), '*', 'vis_data', 'scalars.json'))
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize('kind', ['MoCoV3', 'IFNDMoCoV3'])
def test_short_training_runs(tmp_path, kind):
    """2 epochs of 2 iterations on a tenth of digits, AdamW as the ViT schedule sets it; IFND with
    its clustering rounds. Losses finite, momentum m_t at each iteration, patch projection fixed."""
    pseudo_labels = dict(num_clusters=[5, 10], interval=1, kmeans=dict(nredo=1, niter=5)) \
        if kind == 'IFNDMoCoV3' else None
    cfg = digits_config(str(tmp_path / 'run'), dict(type=kind, temperature=0.2, momentum=0.9),
                        max_epochs=2, pseudo_labels=pseudo_labels, batch_size=32,
                        fn_detection=kind == 'IFNDMoCoV3')
    for key, part in (('backbone', TINY_VIT), ('neck', HEAD), ('predictor', PREDICTOR)):
        cfg.model[key] = copy.deepcopy(part)  # replaced, not merged into the tiny ResNet's
    cfg.train_dataloader.dataset.subset_fraction = 0.1 / 2  # 2 iterations of 32 an epoch
    cfg.optim_wrapper = dict(
        type='OptimWrapper', clip_grad=dict(max_norm=3.0),
        optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1),
        paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0,
                           custom_keys={'pos_embed': dict(decay_mult=0.0),
                                        'cls_token': dict(decay_mult=0.0)}))
    torch.manual_seed(0)
    runner = RUNNERS.build(cfg)
    recorder = _RecordMomentum()
    runner.register_hook(recorder, 'LOWEST')
    patch = copy.deepcopy(runner.model.backbone.model.patch_embed.state_dict())
    blocks = copy.deepcopy(runner.model.backbone.model.blocks.state_dict())
    runner.train()
    steps = [s for s in _scalars(tmp_path / 'run') if 'loss' in s]
    assert len(steps) == 4 and np.isfinite([s['loss'] for s in steps]).all()
    assert [t for t, _ in recorder.seen] == [0, 1, 2, 3]  # the iterations done before each
    for t, m in recorder.seen:
        assert m == pytest.approx(1 - 0.1 * (math.cos(math.pi * t / 4) + 1) / 2, rel=1e-12)
    model = runner.model
    for name, value in patch.items():  # frozen: as initialised, in both encoders
        assert torch.equal(model.backbone.model.patch_embed.state_dict()[name], value)
        assert torch.equal(model.momentum_backbone.model.patch_embed.state_dict()[name], value)
    assert any(not torch.equal(model.backbone.model.blocks.state_dict()[k], v)
               for k, v in blocks.items()), 'the transformer blocks train'
    if kind == 'IFNDMoCoV3':
        assert (tmp_path / 'run' / 'pseudo_labels').is_dir()
        assert any(s.get('accepted', 0) > 0 for s in steps[2:]), 'epoch 2 has accepted labels'
        assert model.label_bank.any_accepted


def test_the_preset_is_its_parts_and_names_its_base():
    gen = torch.Generator().manual_seed(3)
    preset = _model('IFNDMoCoV3', agreement=2)
    parts = _model('MoCoV3', detector=dict(type='PseudoLabels', agreement=2), treatment='elim')
    parts.load_state_dict(preset.state_dict())
    labels = _labels(gen)
    index = torch.randperm(SAMPLES, generator=gen)[:NUM]
    views = [torch.rand(NUM, 3, 16, 16, generator=gen) for _ in range(2)]
    losses = []
    for model in (preset, parts):
        model.label_bank.reset(LEVELS, SAMPLES)
        model.label_bank.update(labels)
        model.set_progress(0, 1)
        losses.append(model.loss(views, {'index': index})['loss'])
    torch.testing.assert_close(losses[0], losses[1], rtol=0, atol=0)
    with pytest.raises(ValueError, match="use type='MoCoV3' with detector="):
        _model('IFNDMoCoV3', detector=dict(type='GroundTruth'))


# Parts beyond IFND's on the MoCo v3 base: each trains as on SimCLR.
PARTS = {
    'GloFND': dict(detector=dict(type='GloFND', alpha=0.1, start_epoch=1, lr=0.5),
                   treatment='elim'),
    'SupportViews': dict(detector=dict(type='SupportViews', num_support_views=1, top_k=3),
                         treatment='attr'),
    'GroundTruth-hard': dict(detector=dict(type='GroundTruth'), treatment='elim',
                             weighting=dict(type='hard', tau_plus=0.1, beta=1.0)),
    'debiased': dict(weighting=dict(type='debiased', tau_plus=0.1)),
}


@pytest.mark.parametrize('name', list(PARTS))
def test_every_kind_of_part_trains_on_mocov3(tmp_path, name):
    parts = PARTS[name]
    cfg = digits_config(str(tmp_path / 'run'), dict(type='MoCoV3', temperature=0.2, **parts),
                        max_epochs=2, batch_size=32, fn_detection='detector' in parts)
    for key, part in (('backbone', TINY_VIT), ('neck', HEAD), ('predictor', PREDICTOR)):
        cfg.model[key] = copy.deepcopy(part)
    cfg.train_dataloader.dataset.subset_fraction = 0.1 / 2
    cfg.train_dataloader.dataset.pipeline.num_views = \
        2 + parts.get('detector', {}).get('num_support_views', 0)
    torch.manual_seed(0)
    RUNNERS.build(cfg).train()
    scalars = _scalars(tmp_path / 'run')
    steps = [s for s in scalars if 'loss' in s]
    assert len(steps) == 4 and np.isfinite([s['loss'] for s in steps]).all()
    if name == 'GloFND':  # λ learns from its start epoch, over the batch's keys
        assert all(s['glofnd_lambda'] < 0.9 for s in steps[2:])
    if name == 'GroundTruth-hard':  # the oracle flags exactly the same-class keys
        detection = [s for s in scalars if 'train/fn_precision' in s]
        assert [(s['train/fn_precision'], s['train/fn_recall']) for s in detection] == \
            [(100.0, 100.0)] * 2


def test_a_resumed_run_continues_the_momentum_schedule_exactly(tmp_path):
    """A 2-epoch run resumed from its epoch-1 checkpoint ends with the same weights, bit for bit
    (the momentum comes from the runner's iteration count, which the checkpoint carries)."""
    def run(resume=False, recorder=None):
        cfg = digits_config(str(tmp_path), dict(type='MoCoV3', temperature=0.2, momentum=0.9),
                            max_epochs=2, batch_size=32, resume=resume)
        for key, part in (('backbone', TINY_VIT), ('neck', HEAD), ('predictor', PREDICTOR)):
            cfg.model[key] = copy.deepcopy(part)
        cfg.train_dataloader.dataset.subset_fraction = 0.1 / 2
        torch.manual_seed(0)
        runner = RUNNERS.build(cfg)
        runner.register_hook(recorder or _RecordMomentum(), 'LOWEST')
        runner.train()
        return runner

    straight = run()
    final = copy.deepcopy(straight.model.state_dict())
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'epoch_1.pth'))
    recorder = _RecordMomentum()
    resumed = run(resume=True, recorder=recorder)
    assert [t for t, _ in recorder.seen] == [2, 3], 'the second epoch alone, from the checkpoint'
    assert resumed.iter == straight.iter == 4
    assert resumed.model.momentum == straight.model.momentum
    for key, value in final.items():
        torch.testing.assert_close(resumed.model.state_dict()[key], value, rtol=0, atol=0, msg=key)


@pytest.mark.parametrize('kind', ['MoCoV3', 'IFNDMoCoV3'])
def test_a_step_reads_nothing_back_to_the_host(kind):
    """Loss and backward dispatch no host sync (no .item(), no boolean-mask indexing), labels
    accepted or not."""
    gen = torch.Generator().manual_seed(4)
    model = _model(kind)
    model.set_progress(1, 10)
    samples = {'index': torch.randperm(SAMPLES, generator=gen)[:NUM]}
    if kind == 'IFNDMoCoV3':
        model.label_bank.reset(LEVELS, SAMPLES)
        model.label_bank.update(_labels(gen))
    views = [torch.rand(NUM, 3, 16, 16, generator=gen) for _ in range(2)]
    with HostSyncOps(refuse=True):
        loss = model.loss(views, samples)['loss']
        loss.backward()
    assert torch.isfinite(loss)
