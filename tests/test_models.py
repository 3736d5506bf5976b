"""Backbones, necks, the data preprocessor, MoCo's queue and key encoder, the label bank."""
import os.path as osp
import subprocess
import sys

import pytest
import torch
from helpers import TINY_BACKBONE, TINY_NECK
from mmengine.registry import init_default_scope

from ifnd.registry import MODELS

REPO = osp.join(osp.dirname(__file__), '..')


@pytest.fixture(autouse=True)
def scope():
    init_default_scope('ifnd')


@pytest.mark.parametrize('cfg,size,dim', [
    (dict(model_name='resnet18', cifar_stem=True, channels=(8, 16, 32, 64)), 32, 64),
    (dict(model_name='resnet18', channels=(8, 16, 32, 64)), 64, 64),
    (dict(model_name='vit_tiny_patch16_224', img_size=32, patch_size=8), 32, 192),
], ids=['resnet-cifar-stem', 'resnet', 'vit'])
def test_timm_backbones_give_pooled_features(cfg, size, dim):
    backbone = MODELS.build(dict(type='TimmBackbone', **cfg))
    assert backbone.out_dim == dim
    assert backbone(torch.rand(2, 3, size, size)).shape == (2, dim)


def test_cifar_stem_keeps_resolution():
    backbone = MODELS.build(dict(type='TimmBackbone', model_name='resnet18', cifar_stem=True))
    assert backbone.model.conv1.kernel_size == (3, 3) and backbone.model.conv1.stride == (1, 1)
    assert isinstance(backbone.model.maxpool, torch.nn.Identity)


def test_backbone_errors_name_the_fix():
    with pytest.raises(ValueError, match="no model named 'resnet_typo'"):
        MODELS.build(dict(type='TimmBackbone', model_name='resnet_typo'))
    with pytest.raises(ValueError, match='cifar_stem=True needs a ResNet'):
        MODELS.build(dict(type='TimmBackbone', model_name='vit_tiny_patch16_224', cifar_stem=True))


@pytest.mark.parametrize('layers', [2, 3])
def test_mlp_neck(layers):
    neck = MODELS.build(dict(type='MLPNeck', in_dim=16, hidden_dim=32, out_dim=128, num_layers=layers))
    linears = [m for m in neck.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == layers and linears[-1].out_features == 128
    assert neck(torch.rand(4, 16)).shape == (4, 128)


def test_data_preprocessor_normalises_each_view():
    pre = MODELS.build(dict(type='ContrastiveDataPreprocessor', mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)))
    views = [torch.full((2, 3, 4, 4), 0.75), torch.zeros(2, 3, 4, 4)]
    out = pre({'inputs': views, 'index': torch.tensor([3, 4]), 'label': torch.tensor([0, 1])})
    assert torch.allclose(out['inputs'][0], torch.ones(2, 3, 4, 4))
    assert torch.allclose(out['inputs'][1], torch.full((2, 3, 4, 4), -2.0))
    assert out['data_samples']['index'].tolist() == [3, 4]


def _moco(**kw):
    torch.manual_seed(0)
    model = MODELS.build(dict(type='IFNDMoCo', backbone=TINY_BACKBONE, neck=TINY_NECK, queue_len=10,
                              momentum=0.9, **kw))
    model.init_weights()
    return model


def test_moco_key_encoder_starts_equal_and_follows_by_ema():
    model = _moco()
    for q, k in zip(model._query_params(), model._key_params()):
        assert torch.equal(q, k) and not k.requires_grad
    with torch.no_grad():
        for q in model._query_params():
            q.add_(1.0)
    before = [k.clone() for k in model._key_params()]
    model._momentum_update()
    for q, k, k0 in zip(model._query_params(), model._key_params(), before):
        torch.testing.assert_close(k, 0.9 * k0 + 0.1 * q)


def test_moco_queue_wraps_and_records_sample_indices():
    model = _moco()
    keys = torch.nn.functional.normalize(torch.rand(6, 32), dim=1)
    model._enqueue(keys, torch.arange(6))
    model._enqueue(keys, torch.arange(10, 16))
    # 12 keys into a queue of 10: the last two overwrite slots 0 and 1.
    assert model.queue_index.tolist() == [14, 15, 2, 3, 4, 5, 10, 11, 12, 13]
    assert int(model.queue_ptr) == 2
    torch.testing.assert_close(model.queue[0], keys[4])


def test_moco_queue_labels_come_from_the_bank_and_never_match_for_empty_slots():
    model = _moco()
    model.label_bank.reset(2, 20)
    model.label_bank.update(torch.arange(40).view(2, 20) % 3)
    model.queue_index[:4] = torch.tensor([0, 1, 2, 3])
    labels = model.detector.labels(model.queue_index)
    assert labels[:, :4].tolist() == [[0, 1, 2, 0], [2, 0, 1, 2]]
    empty = labels[:, 4:]
    assert (empty < -20).all() and empty[0].unique().numel() == 6


def test_shuffled_key_batches_are_unshuffled():
    model = _moco(bn_splits=4)
    model.eval()  # BN on running statistics: the chunking must not change any key
    x = torch.rand(8, 3, 16, 16)
    torch.testing.assert_close(model._shuffled_keys(x), model._key_embed(x))
    model.train()
    assert model._shuffled_keys(torch.rand(3, 3, 16, 16)).shape == (3, 32)  # fewer images than splits


def test_label_bank_adopts_the_stored_size():
    src = _moco()
    src.label_bank.reset(3, 50)
    dst = _moco()
    dst.load_state_dict(src.state_dict(), strict=True)
    assert dst.label_bank.labels.shape == (3, 50)
    assert torch.equal(dst.label_bank.labels, src.label_bank.labels)
    with pytest.raises(RuntimeError, match='another dataset'):
        dst.label_bank.lookup(torch.tensor([60]))


def test_a_treatment_needs_a_detector():
    with pytest.raises(ValueError, match="add a detector"):
        MODELS.build(dict(type='SimCLR', backbone=TINY_BACKBONE, neck=TINY_NECK, treatment='elim'))


def test_issue_command_builds_the_imagenet_moco_without_imports():
    code = ("from mmengine import Config; from ifnd.registry import MODELS; "
            "m = MODELS.build(Config.fromfile('configs/mocov2/mocov2_r50_200e_in1k.py').model); "
            "print(type(m).__name__, m.queue.shape[0])")
    out = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ['MoCoV2', '65536']


def _double_moco(**kw):
    model = _moco(**kw).double()
    model.train()
    return model


@pytest.mark.parametrize('batch,bn_splits', [(16, 4), (16, 8), (12, 8)])
def test_split_batchnorm_key_encoder_equals_the_chunked_forwards(batch, bn_splits):
    import copy
    model = _double_moco(bn_splits=bn_splits)
    ref = copy.deepcopy(model)
    for m in (model, ref):  # the float64 embeddings themselves (_key_embed casts to float32)
        m._key_embed = lambda x, m=m: m.momentum_neck(m.momentum_backbone(x))
    x = torch.rand(batch, 3, 16, 16, dtype=torch.float64)
    for _ in range(2):  # twice: the running statistics compound
        torch.manual_seed(3)
        keys = model._shuffled_keys(x)
        # The former path: one forward per chunk of the shuffled batch, plain BN in each.
        torch.manual_seed(3)
        perm = torch.randperm(batch)
        splits = min(bn_splits, batch // 2)
        with torch.no_grad():
            expected = torch.cat([ref._key_embed(c) for c in x[perm].chunk(splits)])
        torch.testing.assert_close(keys, expected[torch.argsort(perm)], rtol=0, atol=1e-10)
    for (name, got), want in zip(model.state_dict().items(), ref.state_dict().values()):
        if name.startswith('momentum_'):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-10, msg=name)
    # The key encoder keeps BatchNorm's state-dict keys; the query encoder keeps plain BN.
    state = model.state_dict()
    keys_q = {k.split('.', 1)[1] for k in state if k.startswith(('backbone.', 'neck.'))}
    keys_k = {k.split('.', 1)[1] for k in state if k.startswith('momentum_')}
    assert keys_q == keys_k
    norms = [m for m in model.backbone.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and all(type(m) is torch.nn.BatchNorm2d for m in norms)


@pytest.mark.parametrize('momentum', [None, 0.3])
def test_split_batchnorm_layer_equals_sequential_batchnorm(momentum):
    from ifnd.models.split_bn import SplitBatchNorm, split_batchnorm
    torch.manual_seed(0)
    plain = torch.nn.BatchNorm2d(5, momentum=momentum).double()
    split = SplitBatchNorm(5, momentum=momentum).double()
    with torch.no_grad():
        plain.weight.uniform_(), plain.bias.uniform_()
    split.load_state_dict(plain.state_dict())
    x = torch.randn(12, 5, 4, 4, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    with split_batchnorm(split, 3):
        out = split(x)
    expected = torch.cat([plain(x[g::3]) for g in range(3)])  # group g: rows i with i % 3 == g
    torch.testing.assert_close(out[torch.cat([torch.arange(g, 12, 3) for g in range(3)])],
                               expected, rtol=0, atol=1e-10)
    for name, buf in plain.state_dict().items():
        torch.testing.assert_close(split.state_dict()[name], buf, rtol=0, atol=1e-10)
    assert split.num_splits == 1


def _former_moco_loss(model, inputs, samples):
    """The former loss: the queue cloned and its labels gathered from the bank every step."""
    from loss_references import queue_contrastive_loss
    q = model.embed(inputs[0])
    model._momentum_update()
    k = model._shuffled_keys(inputs[1])
    masked = model.label_bank.any_accepted
    labels = model.label_bank.lookup(samples['index'])
    loss = queue_contrastive_loss(q, k, model.queue.clone(), labels if masked else None,
                                  model.detector.labels(model.queue_index) if masked else None,
                                  model.temperature, model.treatment)
    model._enqueue(k, samples['index'])
    return loss


def test_queue_labels_follow_the_bank_and_the_loss_equals_the_former_loss():
    import copy
    model = _moco()
    model.label_bank.reset(2, 30)
    ref = copy.deepcopy(model)
    g = torch.Generator().manual_seed(0)
    for step in range(6):
        if step in (1, 4):  # a clustering round: new labels, old queue entries relabelled
            labels = torch.randint(0, 3, (2, 30), generator=g)
            labels = torch.where(torch.rand(2, 30, generator=g) < 0.6, labels,
                                 -(torch.arange(30) + 1))
            model.label_bank.update(labels)
            ref.label_bank.update(labels)
        if step == 3:  # a resume: the queue's labels come from the loaded state
            model.load_state_dict(copy.deepcopy(model.state_dict()))
        inputs = [torch.rand(4, 3, 16, 16, generator=g) for _ in range(2)]
        samples = {'index': torch.randperm(30, generator=g)[:4]}
        seed = int(torch.randint(0, 1000, (1,), generator=g))
        torch.manual_seed(seed)
        loss = model.loss(inputs, samples)['loss']
        torch.manual_seed(seed)
        expected = _former_moco_loss(ref, inputs, samples)
        torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-7, msg=f'step {step}')
    assert torch.equal(model.queue_index, ref.queue_index)


def test_moco_loss_uses_the_queue_uncopied_with_exact_gradients(monkeypatch):
    import copy
    model = _moco()
    model.label_bank.reset(2, 30)
    model.label_bank.update(torch.arange(60).view(2, 30) % 4)
    model.queue_index.copy_(torch.arange(10) % 30)
    ref = copy.deepcopy(model)
    inputs = [torch.rand(4, 3, 16, 16) for _ in range(2)]
    samples = {'index': torch.tensor([3, 7, 11, 20])}
    queue_shape = model.queue.shape
    real_clone = torch.Tensor.clone

    def clone(self, *args, **kwargs):
        assert self.shape != queue_shape, 'the queue was copied'
        return real_clone(self, *args, **kwargs)

    torch.manual_seed(5)
    with monkeypatch.context() as patch:
        patch.setattr(torch.Tensor, 'clone', clone)
        loss = model.loss(inputs, samples)['loss']
        loss.backward()
    torch.manual_seed(5)
    expected = _former_moco_loss(ref, inputs, samples)
    expected.backward()
    assert torch.equal(loss, expected)
    for (name, p), p_ref in zip(model.named_parameters(), ref.parameters()):
        if p.requires_grad:
            torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-5, msg=name)
    # A second write into the queue before the backward would make the saved rows wrong: refused.
    loss = model.loss(inputs, samples)['loss']
    model._enqueue(torch.nn.functional.normalize(torch.rand(4, 32), dim=1), samples['index'])
    with pytest.raises(RuntimeError, match='modified 2 times'):
        loss.backward()
