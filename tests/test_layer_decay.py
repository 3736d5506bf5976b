"""Layer-wise lr decay for ViT fine-tuning (ifnd/engine/layer_decay.py): every parameter group
against a table written out from the parameter names, its composition with mmengine's paramwise
rules, the refusals, and the ViT semi-supervised config that uses it."""
import copy
import math
import os.path as osp

import pytest
import torch
from helpers import CONFIG_DIR, TINY_BACKBONE, layer_decay_factors
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope

from ifnd.registry import MODELS

TINY_VIT = dict(type='ViTBackbone', model_name='vit_tiny_patch16_224', img_size=16, patch_size=4,
                embed_dim=32, num_heads=2, frozen_patch_embed=False)
LR, WD = 1e-3, 0.05
# The ViT schedule's no-decay rules (adamw_coslr_300e.py) plus two lr multipliers, one through
# custom_keys and one through bias_lr_mult, which the layer factors must multiply.
PARAMWISE = dict(norm_decay_mult=0.0, bias_decay_mult=0.0, bias_lr_mult=2.0,
                 custom_keys={'pos_embed': dict(decay_mult=0.0), 'cls_token': dict(decay_mult=0.0),
                              'head': dict(lr_mult=10.0)})


@pytest.fixture(autouse=True)
def scope():
    init_default_scope('ifnd')


def _wrapper(model, rate=0.75, constructor='LayerDecayOptimWrapperConstructor', **paramwise):
    paramwise = dict(copy.deepcopy(PARAMWISE), **paramwise)
    if rate is not None:
        paramwise['layer_decay_rate'] = rate
    return build_optim_wrapper(model, dict(
        type='OptimWrapper', constructor=constructor, paramwise_cfg=paramwise,
        optimizer=dict(type='AdamW', lr=LR, weight_decay=WD)))


def _groups(wrapper, model) -> dict[str, tuple[float, float]]:
    """(lr, weight decay) of each optimised parameter by name; each in exactly one group."""
    names = {id(p): n for n, p in model.named_parameters()}
    found = [(names[id(p)], (g['lr'], g['weight_decay']))
             for g in wrapper.optimizer.param_groups for p in g['params']]
    assert len(found) == len(dict(found))
    return dict(found)


def _mmengine_rules(name: str) -> tuple[float, float]:
    """(lr multiplier, weight decay) of ``PARAMWISE`` as mmengine's documentation states its rules:
    the longest matching custom key decides alone; else norms and biases take no decay, and the
    biases of other layers twice the lr."""
    if 'head' in name:
        return 10.0, WD
    if 'pos_embed' in name or 'cls_token' in name:
        return 1.0, 0.0
    if 'norm' in name:  # the LayerNorms: norm1, norm2 in each block, the final norm
        return 1.0, 0.0
    if name.endswith('.bias'):
        return 2.0, 0.0
    return 1.0, WD


@pytest.mark.parametrize('depth', [1, 4])
@pytest.mark.parametrize('rate', [0.75, 0.5])
def test_every_group_has_its_layers_lr_and_mmengines_weight_decay(depth, rate):
    model = MODELS.build(dict(type='ImageClassifier', num_classes=10, frozen=False,
                              backbone=dict(TINY_VIT, depth=depth)))
    groups = _groups(_wrapper(model, rate), model)
    names = [n for n, _ in model.named_parameters()]
    assert set(groups) == set(names)
    factors = layer_decay_factors(names, rate, depth)
    for name in names:
        lr_mult, wd = _mmengine_rules(name)
        assert groups[name][0] == pytest.approx(LR * lr_mult * factors[name], rel=1e-12), name
        assert groups[name][1] == wd, name
    blocks = model.backbone.model.blocks
    # Spot checks of the table: the top block one step below the head, the bottom one depth steps.
    assert groups[f'backbone.model.blocks.{depth - 1}.attn.qkv.weight'][0] == pytest.approx(LR * rate)
    assert groups['backbone.model.blocks.0.mlp.fc1.weight'][0] == pytest.approx(LR * rate ** depth)
    assert groups['backbone.model.patch_embed.proj.weight'][0] == pytest.approx(LR * rate ** (depth + 1))
    assert groups['head.0.weight'] == (pytest.approx(10 * LR), WD) and len(blocks) == depth


def test_rate_one_gives_mmengines_default_groups():
    model = MODELS.build(dict(type='ImageClassifier', num_classes=10, frozen=False, backbone=TINY_VIT))
    default = _groups(_wrapper(model, None, 'DefaultOptimWrapperConstructor'), model)
    assert _groups(_wrapper(model, 1.0), model) == default
    assert default['backbone.model.blocks.0.attn.qkv.bias'] == (2 * LR, 0.0)


def test_the_vit_inside_mocov3_decays_and_the_heads_do_not():
    model = MODELS.build(dict(
        type='MoCoV3', temperature=0.2, momentum=0.99, backbone=dict(TINY_VIT, depth=3,
                                                                      frozen_patch_embed=True),
        neck=dict(type='MLPNeck', hidden_dim=64, out_dim=16, num_layers=3, with_last_bn=True),
        predictor=dict(type='MLPNeck', hidden_dim=64, num_layers=2, with_last_bn=True)))
    groups = _groups(_wrapper(model, 0.5, custom_keys={}, bias_lr_mult=1.0), model)
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert set(groups) == set(trained)  # not the momentum encoder, not the frozen patch projection
    assert not any(n.startswith(('momentum_', 'backbone.model.patch_embed.')) for n in groups)
    factors = layer_decay_factors(trained, 0.5, 3)
    for name in trained:
        assert groups[name][0] == pytest.approx(LR * factors[name]), name
    assert {groups[n][0] for n in trained if n.startswith(('neck.', 'predictor.'))} == {LR}


@pytest.mark.parametrize('rate', [0, -0.5, 1.5, math.nan, True, '0.75', None])
def test_a_rate_outside_zero_to_one_is_refused(rate):
    model = MODELS.build(dict(type='ImageClassifier', num_classes=10, frozen=False, backbone=TINY_VIT))
    with pytest.raises(ValueError, match=r'layer_decay_rate in \(0, 1\].*1 turns the decay off'):
        _wrapper(model, rate)


def test_a_model_without_vit_blocks_is_refused():
    model = MODELS.build(dict(type='ImageClassifier', num_classes=10, frozen=False,
                              backbone=copy.deepcopy(TINY_BACKBONE)))
    with pytest.raises(ValueError, match="has none.*use a ViTBackbone, or remove "
                                         "constructor='LayerDecayOptimWrapperConstructor'"):
        _wrapper(model)
    with pytest.raises(ValueError, match='optimizer.lr, which is not set'):
        build_optim_wrapper(model, dict(constructor='LayerDecayOptimWrapperConstructor',
                                        optimizer=dict(type='AdamW'),
                                        paramwise_cfg=dict(layer_decay_rate=0.75)))


def test_the_vit_semi_supervised_config_fine_tunes_with_layer_decay():
    cfg = Config.fromfile(osp.join(CONFIG_DIR, 'benchmarks', 'semi',
                                   'semi_vit-tiny-p4_20e_fmnist_10pct.py'))
    with torch.device('meta'):  # the layout alone: ViT-Tiny, 12 blocks
        model = MODELS.build(cfg.model)
    wrapper = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
    groups = _groups(wrapper, model)
    assert not model.frozen and not model.backbone.frozen_patch_embed
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert set(groups) == set(trained) and 'backbone.model.pos_embed' not in groups  # sin-cos
    lr = cfg.optim_wrapper.optimizer.lr
    factors = layer_decay_factors(trained, 0.75, 12)
    for name in trained:
        decayed = not (name.endswith('.bias') or 'norm' in name or name.endswith('cls_token'))
        assert groups[name] == (pytest.approx(lr * factors[name]), 0.05 if decayed else 0.0), name
    assert groups['backbone.model.blocks.11.mlp.fc2.weight'][0] == pytest.approx(lr * 0.75)
    assert cfg.train_dataloader.dataset.subset_fraction == 0.1 and cfg.train_cfg.max_epochs == 20
    assert [s.type for s in cfg.param_scheduler] == ['LinearLR', 'CosineAnnealingLR']
    assert not cfg.custom_hooks and cfg.model.backbone.drop_path_rate == 0.1
