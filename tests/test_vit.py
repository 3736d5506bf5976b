"""Vision Transformers through timm: pooling and the frozen patch projection as config keys, the
ViT optimiser settings, the checkpoint reader's allow-list, and a tiny ViT trained through
tools/train.py whose checkpoint the evaluation entry points read with no extra flag."""
import copy
import os.path as osp

import pytest
import torch
from helpers import CONFIG_DIR, digits_config, load_tool, train_tool
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope

from ifnd.fileio import config_to_data, read_checkpoint
from ifnd.registry import MODELS

TINY_VIT = dict(type='ViTBackbone', model_name='vit_tiny_patch16_224', img_size=16, patch_size=4,
                embed_dim=32, depth=2, num_heads=2, frozen_patch_embed=True)
MOCOV3 = dict(type='MoCoV3', temperature=0.2, momentum=0.99,
              backbone=dict(TINY_VIT, sincos_pos_embed=True),
              neck=dict(type='MLPNeck', hidden_dim=64, out_dim=16, num_layers=3, with_last_bn=True,
                        last_bn_affine=False),
              predictor=dict(type='MLPNeck', hidden_dim=64, num_layers=2, with_last_bn=True,
                             last_bn_affine=False))
X = torch.rand(3, 3, 16, 16)


@pytest.fixture(autouse=True)
def scope():
    init_default_scope('ifnd')


@pytest.mark.parametrize('name, width', [('vit_tiny_patch16_224', 192), ('vit_small_patch16_224', 384),
                                         ('vit_base_patch16_224', 768)])
def test_the_named_vits_build(name, width):
    with torch.device('meta'):  # the layout alone
        backbone = MODELS.build(dict(type='ViTBackbone', model_name=name))
    assert backbone.out_dim == width and backbone.model.patch_embed.proj.kernel_size == (16, 16)


def test_the_pooling_is_the_class_token_or_the_patch_mean():
    torch.manual_seed(0)
    token = MODELS.build(dict(TINY_VIT, global_pool='token')).eval()
    avg = MODELS.build(dict(TINY_VIT, global_pool='avg')).eval()
    avg.model.load_state_dict({**token.model.state_dict(),
                               'fc_norm.weight': token.model.norm.weight,
                               'fc_norm.bias': token.model.norm.bias}, strict=False)
    with torch.no_grad():
        tokens = token.model.forward_features(X)  # [B, 1 + 16, D], after the final norm
        torch.testing.assert_close(token(X), tokens[:, 0])
        blocks = avg.model.forward_features(X)  # the same blocks; avg normalises after the mean
        torch.testing.assert_close(avg(X), avg.model.fc_norm(blocks[:, 1:].mean(dim=1)))
    assert token(X).shape == (3, 32) and not torch.allclose(token(X), avg(X))
    with pytest.raises(ValueError, match="global_pool must be 'token'"):
        MODELS.build(dict(TINY_VIT, global_pool='map'))
    with pytest.raises(ValueError, match='needs a timm Vision Transformer'):
        MODELS.build(dict(type='ViTBackbone', model_name='resnet18'))


def test_the_frozen_patch_projection_gets_no_gradient():
    frozen = MODELS.build(TINY_VIT)
    trained = MODELS.build(dict(TINY_VIT, frozen_patch_embed=False))
    for backbone, wanted in ((frozen, False), (trained, True)):
        backbone(X).sum().backward()
        for name, param in backbone.model.patch_embed.named_parameters():
            assert param.requires_grad is wanted and (param.grad is not None) is wanted, name
    assert all(p.grad is not None for p in frozen.model.blocks.parameters())


def _mocov3_sincos(grid_size, embed_dim, temperature=10000.):
    """moco-v3's vits.py, build_2d_sincos_position_embedding, as its authors wrote it."""
    h, w = grid_size
    grid_w = torch.arange(w, dtype=torch.float32)
    grid_h = torch.arange(h, dtype=torch.float32)
    grid_w, grid_h = torch.meshgrid(grid_w, grid_h, indexing='ij')
    pos_dim = embed_dim // 4
    omega = torch.arange(pos_dim, dtype=torch.float32) / pos_dim
    omega = 1. / (temperature**omega)
    out_w = torch.einsum('m,d->md', [grid_w.flatten(), omega])
    out_h = torch.einsum('m,d->md', [grid_h.flatten(), omega])
    pos_emb = torch.cat([torch.sin(out_w), torch.cos(out_w), torch.sin(out_h), torch.cos(out_h)],
                        dim=1)[None, :, :]
    pe_token = torch.zeros([1, 1, embed_dim], dtype=torch.float32)
    return torch.cat([pe_token, pos_emb], dim=1)


def test_the_sincos_position_embedding_is_moco_v3s_and_fixed():
    backbone = MODELS.build(dict(TINY_VIT, img_size=28, sincos_pos_embed=True))
    pos_embed = backbone.model.pos_embed
    assert pos_embed.shape == (1, 1 + 7 * 7, 32) and not pos_embed.requires_grad
    torch.testing.assert_close(pos_embed.detach(), _mocov3_sincos((7, 7), 32), rtol=0, atol=1e-6)
    learned = MODELS.build(dict(TINY_VIT, img_size=28)).model.pos_embed
    assert learned.requires_grad and not torch.allclose(learned, pos_embed)
    with pytest.raises(ValueError, match='divisible by 4'):
        MODELS.build(dict(TINY_VIT, embed_dim=30, num_heads=3, sincos_pos_embed=True))


def test_the_vit_schedule_skips_decay_on_norms_biases_and_embeddings():
    """configs/_base_/schedules/adamw_coslr_300e.py: AdamW, wd 0.1 on weights only."""
    cfg = Config.fromfile(osp.join(CONFIG_DIR, '_base_', 'schedules', 'adamw_coslr_300e.py'))
    model = MODELS.build(dict(MOCOV3, backbone=TINY_VIT))  # a learned position embedding
    wrapper = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
    assert type(wrapper.optimizer).__name__ == 'AdamW'
    decay = {id(p): group['weight_decay'] for group in wrapper.optimizer.param_groups
             for p in group['params']}
    for name, param in model.named_parameters():
        if not param.requires_grad:  # the key encoder, the frozen patch projection: not optimised
            assert id(param) not in decay, name
            continue
        undecayed = (name.endswith('.bias') or 'norm' in name or 'pos_embed' in name
                     or 'cls_token' in name or '.mlp.1.' in name or '.mlp.4.' in name)  # BN
        assert decay[id(param)] == (0.0 if undecayed else 0.1), name
    assert decay[id(model.backbone.model.blocks[0].attn.qkv.weight)] == 0.1
    assert decay[id(model.backbone.model.pos_embed)] == decay[id(model.backbone.model.cls_token)] == 0
    assert [s.type for s in cfg.param_scheduler] == ['LinearLR', 'CosineAnnealingLR']
    assert cfg.param_scheduler[0].end == 40 and cfg.train_cfg.max_epochs == 300


def test_bfloat16_and_clipping_through_the_optimiser_wrapper():
    """The recipes' AutoAmpOptimWrapper with a clip: one bfloat16 step on the CPU, finite."""
    model = MODELS.build(MOCOV3)
    model.set_progress(0, 1)
    wrapper = build_optim_wrapper(model, dict(
        type='AutoAmpOptimWrapper', bf16_on_cpu=True, clip_grad=dict(max_norm=1.0),
        optimizer=dict(type='AdamW', lr=1e-3)))
    before = model.backbone.model.blocks[0].attn.qkv.weight.detach().clone()
    with wrapper.optim_context(model):
        loss = model.loss([torch.rand(4, 3, 16, 16) for _ in range(2)], {})['loss']
    wrapper.update_params(loss)
    assert torch.isfinite(loss)
    assert not torch.equal(before, model.backbone.model.blocks[0].attn.qkv.weight)


def test_a_vit_checkpoint_config_keeps_its_architecture(monkeypatch):
    from ifnd.models import architecture
    lines = []
    monkeypatch.setattr(architecture, 'print_log', lambda msg, **kwargs: lines.append(msg))
    model = MODELS.build(MOCOV3)
    config = dict(MOCOV3, backbone=dict(TINY_VIT, global_pool='avg', compile='auto',
                                        drop_path_rate=0.1, sincos_pos_embed=True))
    checkpoint = {'state_dict': MODELS.build(config).state_dict(), 'meta': {'cfg': {'model': config}}}
    kept = architecture.checkpoint_architecture(checkpoint, 'vit.pth')
    assert kept['backbone'] == dict(TINY_VIT, global_pool='avg', sincos_pos_embed=True)
    assert kept['predictor'] == MOCOV3['predictor'] and kept['neck'] == MOCOV3['neck']
    # Neither decides the weights: stochastic depth is training's (its name matches 'path').
    assert 'model.backbone.compile' in lines[-1] and 'model.backbone.drop_path_rate' in lines[-1]
    for key, value, why in (('global_pool', 'map', "is not one of 'token', 'avg'"),
                            ('frozen_patch_embed', 'yes', 'is not True or False'),
                            ('patch_size', 2.5, 'is not a whole number')):
        bad = {'state_dict': model.state_dict(),
               'meta': {'cfg': {'model': dict(MOCOV3, backbone=dict(TINY_VIT, **{key: value}))}}}
        assert architecture.checkpoint_architecture(bad, 'bad.pth') is None
        assert f'model.backbone.{key}={value!r} {why}' in lines[-1]


def test_a_trained_vit_reads_back_in_every_evaluation_entry_point(tmp_path):
    """MoCo v3 with a tiny ViT, 1 epoch through tools/train.py, then tools/knn_eval.py, the linear
    classifier and the feature-model loader on its checkpoint, with no architecture flag."""
    from ifnd.evaluation.analysis import load_feature_model
    cfg = digits_config(str(tmp_path / 'run'), dict(type='MoCoV3'), max_epochs=1)
    for key in ('backbone', 'neck', 'predictor'):
        cfg.model[key] = copy.deepcopy(MOCOV3[key])
    cfg.model.update(temperature=0.2, momentum=0.99)
    cfg.train_dataloader.dataset.subset_fraction = 0.1
    path = str(tmp_path / 'cfg.py')
    cfg.dump(path)
    train_tool.main([path])
    ckpt = str(tmp_path / 'run' / 'epoch_1.pth')
    state = read_checkpoint(ckpt)
    assert state['meta']['cfg']['model']['backbone']['type'] == 'ViTBackbone'

    result = load_tool('knn_eval').main([
        ckpt, '--dataset', 'digits', '--k', '5', '--num-workers', '0', '--device', 'cpu',
        '--cfg-options', 'train_dataset.test_fraction=0.5', 'val_dataset.subset_fraction=0.2'])
    assert result['feature_dim'] == 32 and 0 <= result['top1']['5'] <= 100

    trained = MODELS.build(copy.deepcopy(cfg.model.to_dict()))
    trained.load_state_dict(state['state_dict'])
    trained.eval()
    classifier = MODELS.build(dict(type='ImageClassifier', num_classes=10, pretrained=ckpt,
                                   backbone=dict(type='TimmBackbone', model_name='resnet18')))
    classifier.eval()
    with torch.no_grad():
        torch.testing.assert_close(classifier.backbone(X), trained.extract_feat(X), rtol=0, atol=0)
    loaded = load_feature_model(ckpt, 'z', path)
    assert type(loaded.model).__name__ == 'MoCoV3'
    loaded.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded.model.clustering_features(X, 'z'),
                                   trained.clustering_features(X, 'z'), rtol=0, atol=0)
    assert config_to_data(cfg)['model']['backbone']['frozen_patch_embed'] is True
