"""Vision Transformers through timm: pooling and the frozen patch projection as config keys, the
ViT optimiser settings, the checkpoint reader's allow-list, and a tiny ViT trained through
tools/train.py whose checkpoint every evaluation entry point reads with no architecture flag (kNN,
linear, semi-supervised fine-tuning, VOC07 SVMs, the analysis tools)."""
import copy
import os.path as osp
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fake_data import fake_vocdevkit
from helpers import CONFIG_DIR, digits_config, layer_decay_factors, load_tool, train_error, train_tool
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope

from ifnd.fileio import config_to_data, read_checkpoint
from ifnd.registry import MODELS, RUNNERS

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


@pytest.fixture(scope='module')
def trained_vit(tmp_path_factory):
    """MoCo v3 with a tiny ViT, 1 epoch on a tenth of digits through tools/train.py: the checkpoint,
    the config file (its data: the analysis tools' --config), the config and the checkpoint's content.

    Trained once for every reader below: each reads it with no architecture flag."""
    root = tmp_path_factory.mktemp('vit')
    init_default_scope('ifnd')
    eval_view = dict(type='EvalView', size=16)
    cfg = digits_config(str(root / 'run'), dict(type='MoCoV3'), max_epochs=1, eval_pipeline=eval_view,
                        val_dataset=dict(type='Digits', split='test', pipeline=eval_view))
    for key in ('backbone', 'neck', 'predictor'):
        cfg.model[key] = copy.deepcopy(MOCOV3[key])
    cfg.model.update(temperature=0.2, momentum=0.99)
    cfg.train_dataloader.dataset.subset_fraction = 0.1
    path = str(root / 'cfg.py')
    cfg.dump(path)
    train_tool.main([path])
    ckpt = str(root / 'run' / 'epoch_1.pth')
    return SimpleNamespace(ckpt=ckpt, config=path, cfg=cfg, state=read_checkpoint(ckpt))


def test_a_trained_vit_reads_back_in_every_evaluation_entry_point(trained_vit):
    """tools/knn_eval.py, the linear classifier and the feature-model loader."""
    from ifnd.evaluation.analysis import load_feature_model
    ckpt, cfg, state = trained_vit.ckpt, trained_vit.cfg, trained_vit.state
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
    loaded = load_feature_model(ckpt, 'z', trained_vit.config)
    assert type(loaded.model).__name__ == 'MoCoV3'
    loaded.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded.model.clustering_features(X, 'z'),
                                   trained.clustering_features(X, 'z'), rtol=0, atol=0)
    assert config_to_data(cfg)['model']['backbone']['frozen_patch_embed'] is True


def _semi_vit_on_digits(work_dir: str, pretrained: str) -> Config:
    """The ViT semi-supervised config on a tenth of digits at 16 pixels: the data swapped, the recipe
    (layer-wise lr decay included) and the configured backbone kept."""
    cfg = Config.fromfile(osp.join(CONFIG_DIR, 'benchmarks', 'semi', 'semi_vit-tiny-p4_20e_fmnist_10pct.py'))
    loader = dict(num_workers=0, persistent_workers=False, batch_size=32,
                  collate_fn=dict(type='default_collate'))
    view = dict(type='ContrastiveView', size=16, scale=(0.5, 1.0), jitter_p=0.0, grayscale_p=0.0,
                flip=False)
    cfg.train_dataloader = dict(cfg.train_dataloader, **loader, dataset=dict(
        type='Digits', split='train', pipeline=view, subset_fraction=0.1, subset_seed=0))
    cfg.val_dataloader = dict(cfg.val_dataloader, **loader, dataset=dict(
        type='Digits', split='test', subset_fraction=0.2, pipeline=dict(type='EvalView', size=16)))
    cfg.test_dataloader = cfg.val_dataloader
    cfg.model.pretrained = pretrained
    cfg.model.data_preprocessor = dict(type='ContrastiveDataPreprocessor', mean=(0.2,) * 3, std=(0.3,) * 3)
    cfg.merge_from_dict(dict(
        work_dir=work_dir, train_cfg=dict(max_epochs=1, val_interval=1),
        default_hooks=dict(logger=dict(interval=1), checkpoint=dict(interval=1)),
        visualizer=dict(type='Visualizer', vis_backends=[dict(type='LocalVisBackend')]),
        env_cfg=dict(cudnn_benchmark=False, dist_cfg=dict(backend='gloo')), log_level='WARNING'))
    return cfg


def test_a_trained_vit_fine_tunes_semi_supervised_with_layer_decay(trained_vit, tmp_path):
    """The semi-supervised protocol: the ImageClassifier with frozen=False takes the checkpoint's ViT
    (the config's 28-pixel ViT-Tiny does not fit it) and fine-tunes it, each layer at its lr."""
    from ifnd.engine.features import unwrap_model
    torch.manual_seed(0)
    runner = RUNNERS.build(_semi_vit_on_digits(str(tmp_path), trained_vit.ckpt))
    runner.train()
    model = unwrap_model(runner.model)
    assert type(model.backbone).__name__ == 'ViTBackbone' and len(model.backbone.model.blocks) == 2
    # The recipe's training settings hold on the checkpoint's ViT: its patch projection trains
    # (the checkpoint's froze it) and its blocks drop paths.
    assert model.backbone.model.patch_embed.proj.weight.requires_grad
    assert model.backbone.model.blocks[1].drop_path1.drop_prob == pytest.approx(0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = {names[id(p)]: g for g in runner.optim_wrapper.optimizer.param_groups for p in g['params']}
    assert set(groups) == {n for n, p in model.named_parameters() if p.requires_grad}
    factors = layer_decay_factors(groups, 0.75, 2)
    for name, group in groups.items():
        assert group['initial_lr'] == pytest.approx(5e-4 * factors[name]), name
    # The warm-up moved every group's lr by one factor: the layers' ratios hold through the schedule.
    assert len({round(g['lr'] / g['initial_lr'], 12) for g in groups.values()}) == 1
    before = trained_vit.state['state_dict']
    after = model.backbone.model.state_dict()
    for key in ('blocks.0.attn.qkv.weight', 'blocks.1.mlp.fc2.weight', 'cls_token',
                'patch_embed.proj.weight'):
        assert not torch.equal(after[key], before[f'backbone.model.{key}']), key
    assert 0 < runner.message_hub.get_scalar('val/top1').current() <= 100


def test_a_trained_vit_in_voc07_svm(trained_vit, tmp_path):
    """tools/voc07_svm.py crops to the ViT's input size unless told, and refuses another size."""
    data_root, _ = fake_vocdevkit(tmp_path, np.random.default_rng(0), 36, 24)
    argv = [trained_vit.ckpt, '--data-root', data_root, '--costs', '1', '--batch-size', '16',
            '--num-workers', '0', '--jobs', '1', '--device', 'cpu']
    tool = load_tool('voc07_svm')
    result = tool.main(argv)
    assert result['size'] == 16 and result['feature_dim'] == 32
    assert 0 <= result['map_cv']['all-point'] <= 100 and result['num_test'] == 24
    with pytest.raises(SystemExit, match=r'--size 32: .* takes 16-pixel images only .* --size 16'):
        tool.main([*argv, '--size', '32'])


def test_a_trained_vit_in_the_analysis_tools(trained_vit, tmp_path):
    """tools/analysis/cluster_table.py and plot_embeddings.py on both features (the checkpoint's
    architecture, the data of --config)."""
    ckpt, config = trained_vit.ckpt, trained_vit.config
    for feature, dim in (('f', 32), ('z', 16)):
        (row,) = load_tool('analysis/cluster_table').main([
            ckpt, '--config', config, '--feature', feature, '--runs', '1', '--num-workers', '0',
            '--device', 'cpu', '--out', str(tmp_path / f'{feature}.md')])
        assert row['feature'] == f'{feature} ({dim}-d)' and 0 <= row['nmi_mean'] <= 100, row
        out = tmp_path / f'{feature}.png'
        result = load_tool('analysis/plot_embeddings').main([
            ckpt, '--config', config, '--feature', feature, '--out', str(out), '--num-points', '60',
            '--tsne-iter', '250', '--num-workers', '0', '--threads', '1'])
        assert result['coords'].shape == (60, 2) and out.stat().st_size > 5_000


def test_knn_eval_resizes_to_the_vits_input_size(trained_vit, monkeypatch, fashion_mnist):
    """A ViT trained on 16-pixel digits evaluated on 28-pixel Fashion-MNIST: its position embedding
    takes 16 pixels only, so the evaluation view resizes to 16, and the tool says so."""
    from ifnd.engine import features
    lines = []
    monkeypatch.setattr(features, 'print_log', lambda msg, **kwargs: lines.append(msg))
    result = load_tool('knn_eval').main([
        trained_vit.ckpt, '--dataset', 'fmnist', '--k', '5', '--num-workers', '0', '--device', 'cpu',
        '--cfg-options', 'train_dataset.subset_fraction=0.01', 'val_dataset.subset_fraction=0.02'])
    assert result['pipeline']['size'] == 16 and 0 <= result['top1']['5'] <= 100
    assert lines == [f'{trained_vit.ckpt} holds a network that takes 16-pixel images only (a ViT\'s '
                     'position embedding fixes its input size): the evaluation view resizes to 16 '
                     'pixels, not 28']


# ------------------------------------------------ attention heads: from the file or the user, never a guess

# 16-wide heads: the 64-wide ones a guess would take make one head of this width.
THREE_HEADS = dict(TINY_VIT, embed_dim=48, num_heads=3)
FIX_FLAG = r'pass --num-heads N \(num_heads=N in Python, model.pretrained_num_heads=N'


@pytest.fixture(scope='module')
def three_heads(tmp_path_factory):
    """SimCLR with a 3-head ViT, 1 epoch on a tenth of digits through tools/train.py, as the model
    it trained, and read back from weights alone: its backbone's bare state dict, and the run's
    checkpoint whose config a reader refuses (a head of 2**20 layers)."""
    root = tmp_path_factory.mktemp('heads')
    init_default_scope('ifnd')
    eval_view = dict(type='EvalView', size=16)
    cfg = digits_config(str(root / 'run'), dict(type='SimCLR', temperature=0.5), max_epochs=1,
                        eval_pipeline=eval_view)
    cfg.model.backbone = copy.deepcopy(THREE_HEADS)
    cfg.train_dataloader.dataset.subset_fraction = 0.1
    config = str(root / 'cfg.py')
    cfg.dump(config)
    train_tool.main([config])
    ckpt = str(root / 'run' / 'epoch_1.pth')
    state = read_checkpoint(ckpt)
    trained = MODELS.build(copy.deepcopy(cfg.model.to_dict()))
    trained.load_state_dict(state['state_dict'])
    bare = str(root / 'bare.pth')
    torch.save({k[len('backbone.model.'):]: v for k, v in state['state_dict'].items()
                if k.startswith('backbone.model.')}, bare)
    refused = str(root / 'refused.pth')
    data = copy.deepcopy(state['meta']['cfg'])
    data['model']['neck']['num_layers'] = 2 ** 20
    torch.save({'state_dict': state['state_dict'], 'meta': {'cfg': data}}, refused)
    return SimpleNamespace(ckpt=ckpt, config=config, bare=bare, refused=refused, model=trained.eval())


def _features(model) -> torch.Tensor:
    with torch.no_grad():
        return model.eval().extract_feat(X)


def test_a_vit_read_from_its_weights_alone_asks_for_its_heads(three_heads):
    """No shape shows the heads: one line asks for them; stated, the features are the trained model's."""
    from ifnd.models import load_encoder
    want = _features(three_heads.model)
    resnet = dict(type='TimmBackbone', model_name='resnet18')
    for path in (three_heads.bare, three_heads.refused):
        asks = f'^{re.escape(path)} holds a Vision Transformer 48 wide, whose attention heads .*{FIX_FLAG}'
        with pytest.raises(ValueError, match=asks):
            load_encoder(path)
        with pytest.raises(ValueError, match=asks):
            MODELS.build(dict(type='ImageClassifier', num_classes=10, pretrained=path, backbone=resnet))
        torch.testing.assert_close(_features(load_encoder(path, num_heads=3)), want, rtol=0, atol=0)
        classifier = MODELS.build(dict(type='ImageClassifier', num_classes=10, pretrained=path,
                                       backbone=resnet, pretrained_num_heads=3))
        torch.testing.assert_close(_features(classifier), want, rtol=0, atol=0)
        # The guess it replaces (64-wide heads: one) computes other features from the same weights
        # (after one epoch the attention is still near uniform, so they differ only a little).
        assert not torch.equal(_features(load_encoder(path, num_heads=1)), want)
    # The run's own checkpoint states 3: a flag that says otherwise is a slip.
    assert load_encoder(three_heads.ckpt, num_heads=3).backbone_cfg['num_heads'] == 3
    with pytest.raises(ValueError, match=r'--num-heads 2 \(num_heads\): .* states 3 attention heads'):
        load_encoder(three_heads.ckpt, num_heads=2)


def test_a_resnet_refuses_num_heads(tmp_path):
    from ifnd.models import load_encoder
    path = str(tmp_path / 'r18.pth')
    torch.save(MODELS.build(dict(type='TimmBackbone', model_name='resnet18')).model.state_dict(), path)
    with pytest.raises(ValueError, match=r'--num-heads 3 \(num_heads\): .* holds a resnet18, which has no '
                       'attention heads; leave it out'):
        load_encoder(path, num_heads=3)


TOOLS = {  # tool -> (its arguments besides the checkpoint, the loader it calls)
    'knn_eval': (['--dataset', 'digits', '--num-workers', '0', '--device', 'cpu'], 'load_encoder'),
    'voc07_svm': (['--data-root', '{tmp}', '--device', 'cpu'], 'load_encoder'),
    'extract_backbone': (['{tmp}/out.pth'], 'load_encoder'),
    'convert_to_detectron2': (['{tmp}/out.pkl'], 'export_detectron2_weights'),
    'analysis/cluster_table': (['--config', '{config}', '--feature', 'f', '--device', 'cpu',
                                '--num-workers', '0'], 'load_feature_model'),
    'analysis/plot_embeddings': (['--config', '{config}', '--feature', 'f', '--out', '{tmp}/map.png',
                                  '--num-workers', '0'], 'load_feature_model'),
}


@pytest.mark.parametrize('name', list(TOOLS))
def test_every_tool_asks_for_the_heads_and_takes_num_heads(three_heads, tmp_path, name, monkeypatch):
    """Each tool that reads an encoder: one line asking for --num-heads, and the flag reaching its loader."""
    args, loader = TOOLS[name]
    argv = [three_heads.bare, *(a.format(tmp=tmp_path, config=three_heads.config) for a in args)]
    tool = load_tool(name)
    # The analysis tools' main raises the error their command line prints as 'error: ...'.
    with pytest.raises((SystemExit, ValueError)) as refused:
        tool.main(argv)
    said = str(getattr(refused.value, 'code', refused.value)).removeprefix('error: ')
    assert re.search(f'^{re.escape(three_heads.bare)} holds a Vision Transformer 48 wide.*{FIX_FLAG}'
                     '[^\n]*$', said), said
    called = {}

    def stand_in(*args, **kwargs):
        called.update(kwargs)
        raise SystemExit('loaded')
    monkeypatch.setattr(tool, loader, stand_in)
    with pytest.raises(SystemExit, match='loaded'):
        tool.main([*argv, '--num-heads', '3'])
    assert called['num_heads'] == 3


def test_knn_eval_with_num_heads_evaluates_the_trained_vit(three_heads, capsys):
    result = load_tool('knn_eval').main([
        three_heads.bare, '--num-heads', '3', '--dataset', 'digits', '--k', '5', '--num-workers', '0',
        '--device', 'cpu', '--cfg-options', 'train_dataset.test_fraction=0.5', 'val_dataset.subset_fraction=0.2'])
    assert result['feature_dim'] == 48 and 0 <= result['top1']['5'] <= 100
    with pytest.raises(SystemExit):
        load_tool('knn_eval').main([three_heads.bare, '--num-heads', '0'])
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        'error: argument --num-heads: must be at least 1, got 0')


# ------------------------------------------------ ViT settings refused in one line

@pytest.mark.parametrize('setting, said', [
    ('model.backbone.num_heads=0', r'ViTBackbone num_heads must be an int in \[1, 1048576\], got 0: set '
     'model.backbone.num_heads'),
    ('model.backbone.num_heads=5', 'ViTBackbone num_heads=5 does not divide embed_dim=192 .* set '
     r'model.backbone.num_heads to a divisor of 192 \(1, 2, 3, 4, 6, 8'),
    ('model.backbone.img_size=16', None),  # fits the data: trains
    (None, r'model.backbone.img_size=28, but the data\'s images are 16x16 pixels .* set '
     'model.backbone.img_size=16'),
])
def test_vit_settings_are_refused_in_one_line(tmp_path, setting, said):
    """configs/_base_/models/vit-tiny-p4.py (28-pixel images) on 16-pixel digits through
    tools/train.py: heads of 0 or not dividing the width refused at build, the image size at the
    first batch, each naming the key and the fix."""
    base = Config.fromfile(osp.join(CONFIG_DIR, '_base_', 'models', 'vit-tiny-p4.py'))
    cfg = digits_config(str(tmp_path / 'run'), dict(type='SimCLR', temperature=0.5), max_epochs=1)
    cfg.model.backbone = dict(base.vit_tiny_p4, depth=1)
    cfg.train_dataloader.dataset.subset_fraction = 0.1
    path = str(tmp_path / 'cfg.py')
    cfg.dump(path)
    argv = [path, *(['--cfg-options', setting] if setting else [])]
    if said is None:
        train_tool.main(argv)
        assert osp.isfile(tmp_path / 'run' / 'epoch_1.pth')
    else:
        assert re.search(said, train_error(*argv))
