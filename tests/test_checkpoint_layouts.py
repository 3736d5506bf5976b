"""Published checkpoint layouts read without flags: the backbone found and its architecture inferred.

Each writer below saves a file the way its project does (key nesting, heads, momentum twins,
optimiser state, epoch/arch/meta entries, queues), around torchvision's ResNet as the source
network, an independent implementation of the architecture the loader must rebuild in timm.
"""
import argparse
import importlib.util
import os.path as osp
import pickle

import numpy as np
import pytest
import torch
import torchvision
from mmengine.config import Config
from sklearn.neighbors import KNeighborsClassifier
from torch import nn

from helpers import TINY_BACKBONE
from ifnd.models.backbones import TimmBackbone
from ifnd.models.encoder import backbone_state, infer_backbone_config, load_checkpoint_file, load_encoder
from ifnd.registry import MODELS

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
ARCHS = ('resnet18', 'resnet50', 'resnet18_cifar')
EXPECTED = {'resnet18': dict(type='TimmBackbone', model_name='resnet18'),
            'resnet50': dict(type='TimmBackbone', model_name='resnet50'),
            'resnet18_cifar': dict(type='TimmBackbone', model_name='resnet18', cifar_stem=True)}


def source_network(arch: str) -> nn.Module:
    """torchvision's ResNet; the CIFAR variant as solo-learn builds it (3x3 stride-1 conv1, no max-pool)."""
    torch.manual_seed(ARCHS.index(arch))
    net = getattr(torchvision.models, arch.split('_')[0])()
    if arch.endswith('_cifar'):
        net.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        net.maxpool = nn.Identity()
    for module in net.modules():  # non-trivial BN statistics, so a wrong load shows
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    return net.eval()


@pytest.fixture(scope='module')
def sources():
    nets = {arch: source_network(arch) for arch in ARCHS}
    bodies = {arch: {k: v for k, v in net.state_dict().items() if not k.startswith('fc.')}
              for arch, net in nets.items()}
    return nets, bodies


def _optimizer_state(num_params: int = 2) -> dict:
    return {'state': {i: {'momentum_buffer': torch.randn(3)} for i in range(num_params)},
            'param_groups': [{'lr': 0.03, 'momentum': 0.9, 'weight_decay': 1e-4, 'dampening': 0,
                              'nesterov': False, 'params': list(range(num_params))}]}


def _twin(body: dict) -> dict:
    """A momentum encoder: shares storage (small files) except conv1, so picking it shows."""
    return {k: (torch.zeros_like(v) if k == 'conv1.weight' else v) for k, v in body.items()}


def _mlp(prefix: str, dims=(64, 64, 16), bn: bool = False) -> dict:
    out, step = {}, 3 if bn else 2
    for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
        out[f'{prefix}{i * step}.weight'] = torch.randn(d_out, d_in)
        out[f'{prefix}{i * step}.bias'] = torch.zeros(d_out)
        if bn and i < len(dims) - 2:
            out.update({f'{prefix}{i * step + 1}.{n}': torch.ones(d_out)
                        for n in ('weight', 'bias', 'running_mean', 'running_var')})
            out[f'{prefix}{i * step + 1}.num_batches_tracked'] = torch.tensor(7)
    return out


def moco_v1(body, arch):
    state = {f'module.encoder_q.{k}': v for k, v in body.items()}
    state.update({f'module.encoder_k.{k}': v for k, v in _twin(body).items()})
    state.update({'module.encoder_q.fc.weight': torch.randn(128, 8), 'module.encoder_q.fc.bias': torch.zeros(128),
                  'module.encoder_k.fc.weight': torch.randn(128, 8), 'module.encoder_k.fc.bias': torch.zeros(128),
                  'module.queue': torch.randn(128, 32), 'module.queue_ptr': torch.zeros(1, dtype=torch.long)})
    return {'epoch': 200, 'arch': arch, 'state_dict': state, 'optimizer': _optimizer_state()}


def moco_v2_pcl(body, arch):
    ckpt = moco_v1(body, arch)
    state = {k: v for k, v in ckpt['state_dict'].items() if '.fc.' not in k}
    for encoder in ('encoder_q', 'encoder_k'):  # the MLP head: fc.0, ReLU, fc.2
        state.update(_mlp(f'module.{encoder}.fc.'))
    ckpt['state_dict'] = state
    return ckpt


def moco_v3(body, arch):
    state = {f'module.base_encoder.{k}': v for k, v in body.items()}
    state.update({f'module.momentum_encoder.{k}': v for k, v in _twin(body).items()})
    for encoder in ('base_encoder', 'momentum_encoder'):
        state.update(_mlp(f'module.{encoder}.fc.', dims=(8, 16, 16, 8), bn=True))
    state.update(_mlp('module.predictor.', dims=(8, 16, 8), bn=True))
    return {'epoch': 100, 'arch': arch, 'state_dict': state, 'optimizer': _optimizer_state(),
            'scaler': {'scale': 65536.0, 'growth_factor': 2.0, 'backoff_factor': 0.5,
                       'growth_interval': 2000, '_growth_tracker': 17}}


def hcsc(body, arch):  # HCSC's pretrain.py: MoCo v2's layout plus the queue's sample indices
    ckpt = moco_v2_pcl(body, arch)
    ckpt['state_dict']['module.queue_index'] = torch.arange(32)
    return ckpt


def solo_learn(body, arch):
    state = {f'backbone.{k}': v for k, v in body.items()}
    state.update({f'momentum_backbone.{k}': v for k, v in _twin(body).items()})
    state.update(_mlp('projector.', bn=True))
    state.update(_mlp('momentum_projector.', bn=True))
    state.update({'classifier.weight': torch.randn(10, 8), 'classifier.bias': torch.zeros(10)})
    return {'epoch': 399, 'global_step': 39000, 'pytorch-lightning_version': '2.0.2',
            'state_dict': state, 'loops': {'fit_loop': {'epoch_progress': {'current': {'ready': 400}}}},
            'callbacks': {}, 'optimizer_states': [_optimizer_state()],
            'lr_schedulers': [{'base_lrs': [0.3], 'last_epoch': 400}], 'hparams_name': 'kwargs',
            'hyper_parameters': {'backbone': {'name': arch, 'kwargs': {}}, 'max_epochs': 400,
                                 'method': 'byol', 'data': {'dataset': 'cifar10'}}}


MMSELFSUP_CFG = """model = dict(type='MoCo', queue_len=65536, feat_dim=128, momentum=0.001,
    backbone=dict(type='ResNet', depth=50, in_channels=3, out_indices=[4], norm_cfg=dict(type='BN')),
    neck=dict(type='MoCoV2Neck', in_channels=2048, hid_channels=2048, out_channels=128),
    head=dict(type='ContrastiveHead', loss=dict(type='CrossEntropyLoss'), temperature=0.2))
default_scope = 'mmselfsup'
"""


def mmselfsup(body, arch):
    state = {f'backbone.{k}': v for k, v in body.items()}
    state.update({f'momentum_encoder.module.0.{k}': v for k, v in _twin(body).items()})
    state.update(_mlp('neck.mlp.'))
    state.update({'queue': torch.randn(128, 32), 'queue_ptr': torch.zeros(1, dtype=torch.long)})
    return {'meta': {'cfg': MMSELFSUP_CFG, 'epoch': 200, 'iter': 1000, 'mmselfsup_version': '1.0.0',
                     'seed': 0, 'experiment_name': 'mocov2'},
            'state_dict': state, 'optimizer': _optimizer_state()}


def vissl(body, arch):
    trunk = {f'_feature_blocks.{k}': v for k, v in body.items()}
    heads = _mlp('0.clf.0.')
    return {'classy_state_dict': {'base_model': {'model': {'trunk': trunk, 'heads': heads},
                                                 'meta': {'model_version': 1}},
                                  'optimizer': _optimizer_state()},
            'phase_idx': 399, 'iteration': 500000, 'train_phase_idx': 199, 'iteration_num': 500000,
            'type': 'checkpoint', 'loss': {'epoch': 199}}


def torchvision_file(body, arch):
    return {**body, 'fc.weight': torch.randn(1000, 8), 'fc.bias': torch.zeros(1000)}


def timm_file(body, arch):
    return {'epoch': 90, 'arch': arch, 'state_dict': torchvision_file(body, arch),
            'optimizer': _optimizer_state(), 'version': 2}


def ifnd_training(body, arch):
    cfg = Config(dict(model=dict(type='SimCLR', backbone=EXPECTED[arch],
                                 neck=dict(type='MLPNeck', hidden_dim=64, out_dim=16))))
    state = {f'backbone.model.{k}': v for k, v in body.items()}
    state.update(_mlp('neck.mlp.'))
    return {'meta': {'cfg': cfg.pretty_text, 'epoch': 200, 'iter': 1000}, 'state_dict': state,
            'optimizer': _optimizer_state()}


def backbone_only(body, arch):  # tools/extract_backbone.py's output
    return {'state_dict': dict(body), 'meta': {'model': {'backbone': EXPECTED[arch]}, 'source': 'x.pth'}}


LAYOUTS = dict(moco_v1=moco_v1, moco_v2_pcl=moco_v2_pcl, moco_v3=moco_v3, hcsc=hcsc, solo_learn=solo_learn,
               mmselfsup=mmselfsup, vissl=vissl, torchvision=torchvision_file, timm=timm_file,
               ifnd_training=ifnd_training, backbone_only=backbone_only)


@pytest.fixture(scope='module')
def files(tmp_path_factory, sources):
    _, bodies = sources
    root = tmp_path_factory.mktemp('layouts')
    out = {}
    for layout, write in LAYOUTS.items():
        for arch in ARCHS:
            path = root / f'{layout}_{arch}.pth'
            torch.save(write(bodies[arch], arch), path)
            out[layout, arch] = str(path)
    return out


@pytest.mark.parametrize('arch', ARCHS)
@pytest.mark.parametrize('layout', list(LAYOUTS))
def test_every_layout_loads_without_flags(layout, arch, files, sources):
    _, bodies = sources
    encoder = load_encoder(files[layout, arch])
    assert {k: v for k, v in encoder.backbone_cfg.items() if k != 'pretrained'} == EXPECTED[arch]
    state = encoder.backbone.model.state_dict()
    body = bodies[arch]
    assert set(state) == set(body)
    assert all(torch.equal(state[k], body[k]) for k in body)  # the query/base encoder, not its twin


@pytest.mark.parametrize('arch', ARCHS)
def test_inferred_backbone_computes_the_source_network(arch, files, sources):
    nets, _ = sources
    encoder = load_encoder(files['moco_v2_pcl', arch]).eval()
    reference = nets[arch]
    reference.fc = nn.Identity()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(encoder.backbone(x), reference(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('backbone', [
    dict(type='TimmBackbone', model_name='resnet18', channels=(32, 64, 128, 256)),  # the demo's
    TINY_BACKBONE,
    dict(type='TimmBackbone', model_name='resnet34'),
    dict(type='TimmBackbone', model_name='seresnet18'),
    dict(type='TimmBackbone', model_name='resnet18d'),
])
def test_width_depth_and_variants_are_inferred(backbone):
    torch.manual_seed(0)
    source = MODELS.build(backbone).eval()
    inferred = infer_backbone_config(source.model.state_dict())
    assert inferred == backbone
    if backbone.get('channels'):  # reduced width: same network, same outputs
        rebuilt = MODELS.build(inferred).eval()
        rebuilt.model.load_state_dict(source.model.state_dict())
        x = torch.randn(2, 3, 32, 32)
        with torch.no_grad():
            torch.testing.assert_close(rebuilt(x), source(x))


def test_ambiguous_names_list_the_candidates_and_the_flag(tmp_path):
    source = TimmBackbone('resnet34d')  # resnetaa34d has the same weights (its blur has none)
    path = str(tmp_path / 'r34d.pth')
    torch.save({'state_dict': {f'module.encoder_q.{k}': v for k, v in source.model.state_dict().items()}},
               path)
    with pytest.raises(ValueError, match=r'r34d\.pth.*ResNet-34.*deep stem.*resnet34d, resnetaa34d.*--model-name'):
        load_encoder(path)
    encoder = load_encoder(path, model_name='resnet34d')
    assert encoder.backbone_cfg['model_name'] == 'resnet34d'
    with pytest.raises(ValueError, match='not a ResNet.*--model-name'):
        infer_backbone_config({'patch_embed.proj.weight': torch.zeros(8, 3, 16, 16)})


def test_unknown_layout_lists_top_level_keys_and_prefixes(tmp_path):
    path = str(tmp_path / 'odd.pth')
    torch.save({'epoch': 3, 'net': {'trunk.conv1.weight': torch.zeros(1)},
                'weights': {'student.trunk.conv1.weight': torch.zeros(1), 'student.trunk.bn1.bias': torch.zeros(1)}},
               path)
    with pytest.raises(ValueError, match=r'odd\.pth: unknown checkpoint layout\. Top-level keys: \[epoch, net, '
                       r'weights\].*prefixes: \[none\].*module\.encoder_q\.'):
        load_encoder(path)
    torch.save({'state_dict': {'student.trunk.conv1.weight': torch.zeros(1)}}, path)
    with pytest.raises(ValueError, match=r'prefixes: \[student\.trunk\. \(1\)\]'):
        backbone_state(load_checkpoint_file(path), path)


def test_objects_that_safe_loading_refuses_give_a_clear_error(tmp_path, sources):
    _, bodies = sources
    ckpt = solo_learn(bodies['resnet18'], 'resnet18')
    ckpt['hyper_parameters'] = argparse.Namespace(method='byol')  # not plain data
    path = str(tmp_path / 'solo.ckpt')
    torch.save(ckpt, path)
    with pytest.raises(ValueError, match=r'solo\.ckpt holds Python objects \(argparse\.Namespace\)'
                       r'.*save the weights alone'):
        load_encoder(path)


def test_old_files_without_num_batches_tracked_load(tmp_path, sources):
    _, bodies = sources
    body = {k: v for k, v in bodies['resnet18'].items() if not k.endswith('num_batches_tracked')}
    path = str(tmp_path / 'resnet18-5c106cde.pth')
    torch.save(body, path)
    state = load_encoder(path).backbone.model.state_dict()
    assert all(torch.equal(state[k], body[k]) for k in body)


def test_linear_classifier_takes_the_checkpoints_backbone(files, sources):
    _, bodies = sources
    path = files['solo_learn', 'resnet18_cifar']
    fits = MODELS.build(dict(type='ImageClassifier', num_classes=10, pretrained=path,
                             backbone=dict(EXPECTED['resnet18_cifar'])))
    # A config for another network (the ResNet-50 linear configs) is replaced by the checkpoint's.
    other = MODELS.build(dict(type='ImageClassifier', num_classes=10, pretrained=path,
                              backbone=dict(type='TimmBackbone', model_name='resnet50')))
    for model in (fits, other):
        state = model.backbone.model.state_dict()
        assert all(torch.equal(state[k], v) for k, v in bodies['resnet18_cifar'].items())
        assert model.head[-1].in_features == 512


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, osp.join(REPO, 'tools', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_extract_and_convert_moco_resnet50_without_flags(tmp_path, files, sources, capsys):
    _, bodies = sources
    body = bodies['resnet50']
    out = tmp_path / 'moco_r50_backbone.pth'
    _tool('extract_backbone').main([files['moco_v2_pcl', 'resnet50'], str(out)])
    saved = torch.load(out, weights_only=True)
    assert saved['meta']['model']['backbone'] == EXPECTED['resnet50']  # the architecture alone
    assert all(torch.equal(saved['state_dict'][k], body[k]) for k in body)

    pkl = tmp_path / 'moco_r50.pkl'
    _tool('convert_to_detectron2').main([files['moco_v2_pcl', 'resnet50'], str(pkl)])
    assert 'resnet50 (MODEL.RESNETS.DEPTH 50)' in capsys.readouterr().out
    with open(pkl, 'rb') as f:
        model = pickle.load(f)['model']
    assert np.array_equal(model['res5.2.conv3.weight'], body['layer4.2.conv3.weight'].numpy())
    assert np.array_equal(model['stem.conv1.weight'], body['conv1.weight'].numpy())


def test_knn_eval_on_a_moco_resnet50_without_flags(files):
    knn_eval = _tool('knn_eval')
    data = ['--dataset', 'digits', '--k', '5', '--num-workers', '0', '--device', 'cpu', '--cfg-options',
            'train_dataset.test_fraction=0.5', 'val_dataset.test_fraction=0.5',
            'val_dataset.subset_fraction=0.3']
    result = knn_eval.main([files['moco_v2_pcl', 'resnet50'], *data])
    assert result['feature_dim'] == 2048
    # Independently: the source network's features on the same inputs, sklearn's weighted kNN.
    from ifnd.engine import build_eval_dataset, extract_features
    from ifnd.models.encoder import Encoder
    settings = knn_eval.data_settings(Config.fromfile(osp.join(REPO, 'configs', '_base_', 'datasets',
                                                               'digits.py')))
    settings['train_dataset'].update(test_fraction=0.5)
    settings['val_dataset'].update(test_fraction=0.5, subset_fraction=0.3)
    reference = Encoder(dict(type='TimmBackbone', model_name='resnet50'))
    reference.backbone.model = source_network('resnet50')
    reference.backbone.model.fc = nn.Identity()
    feats = [extract_features(reference, build_eval_dataset(settings[k], settings['pipeline']),
                              feature='f', batch_size=256, num_workers=0)
             for k in ('train_dataset', 'val_dataset')]
    (bank, bank_labels), (query, query_labels) = [(f.numpy(), np.asarray(y)) for f, y in feats]
    sk = KNeighborsClassifier(n_neighbors=5, metric='cosine', algorithm='brute',
                              weights=lambda d: np.exp((1 - d) / 0.07)).fit(bank, bank_labels)
    sk_top1 = 100 * np.mean(sk.predict(query) == query_labels)
    assert result['top1']['5'] == pytest.approx(sk_top1, abs=100 / len(query) + 1e-9)


def test_knn_eval_asks_for_data_when_a_peer_config_is_not_ours(files):
    with pytest.raises(SystemExit, match='--config FILE.*--dataset'):
        _tool('knn_eval').main([files['mmselfsup', 'resnet18']])


# Vision Transformers: timm's VisionTransformer as the source network, at 16 pixels in 4-pixel
# patches. MoCo v3's ViTs have 12 heads (its vits.py), which its file's arch states; DINO's ViT-S
# 6 (its vision_transformer.py), which its file does not (the zoo's index does).
VIT_SOURCES = {'moco_v3': dict(embed_dim=48, num_heads=12), 'dino': dict(embed_dim=96, num_heads=6),
               'dino_hub': dict(embed_dim=96, num_heads=6)}
# The heads the file states (None: the reader asks for them).
VIT_STATED_HEADS = {'moco_v3': 12, 'dino': None, 'dino_hub': None}
VIT_EXPECTED = {'moco_v3': dict(type='ViTBackbone', model_name='vit_small_patch16_224', img_size=16,
                                patch_size=4, embed_dim=48, depth=2, num_heads=12),
                'dino': dict(type='ViTBackbone', model_name='vit_small_patch16_224', img_size=16,
                             patch_size=4, embed_dim=96, depth=2, num_heads=6)}
VIT_EXPECTED['dino_hub'] = VIT_EXPECTED['dino']


def vit_source(kind: str) -> nn.Module:
    """A tiny timm ViT (depth 2, 16 px, patch 4) with non-trivial weights, class-token pooled."""
    from timm.models.vision_transformer import VisionTransformer
    torch.manual_seed(len(kind))
    net = VisionTransformer(img_size=16, patch_size=4, depth=2, num_classes=0, **VIT_SOURCES[kind])
    with torch.no_grad():
        for name, p in net.named_parameters():
            if name.endswith(('cls_token', 'pos_embed')) or 'norm' in name:
                p.add_(torch.randn_like(p) * 0.1)  # timm starts these at 0 / 1: a wrong load shows
    return net.eval()


def moco_v3_vit(body: dict) -> dict:
    """MoCo v3's main_moco.py checkpoint of a ViT: the projection MLP is the ViT's ``head``."""
    width = body['cls_token'].shape[-1]
    state = {f'module.base_encoder.{k}': v for k, v in body.items()}
    state.update({f'module.momentum_encoder.{k}': (v + 1 if k == 'cls_token' else v) for k, v in body.items()})
    for encoder in ('base_encoder', 'momentum_encoder'):
        mlp = _mlp(f'module.{encoder}.head.', dims=(width, 16, 16, 8), bn=True)
        state.update({k: v for k, v in mlp.items() if not k.endswith('.bias') or '.1.' in k or '.4.' in k})
    state.update(_mlp('module.predictor.', dims=(8, 16, 8), bn=True))
    return {'epoch': 300, 'arch': 'vit_small', 'state_dict': state, 'optimizer': _optimizer_state(),
            'scaler': {'scale': 65536.0, 'growth_factor': 2.0, 'backoff_factor': 0.5,
                       'growth_interval': 2000, '_growth_tracker': 3}}


def dino_backbone_only(body: dict) -> dict:
    """DINO's "backbone only" file: the teacher's ViT state dict, bare timm-style keys, no head."""
    return dict(body)


HF_NAMES = {'norm1': 'layernorm_before', 'attn.proj': 'attention.output.dense', 'norm2': 'layernorm_after',
            'mlp.fc1': 'intermediate.dense', 'mlp.fc2': 'output.dense'}


def dino_hub_transformers(body: dict) -> dict:
    """The Hub's transformers copy of a DINO ViT, as convert_dino_to_pytorch.py renames it for a
    ViTModel without pooler: ``embeddings.*``, ``encoder.layer.N.*`` (q, k, v apart), ``layernorm.*``."""
    width = body['cls_token'].shape[-1]
    out = {'embeddings.cls_token': body['cls_token'], 'embeddings.position_embeddings': body['pos_embed'],
           'layernorm.weight': body['norm.weight'], 'layernorm.bias': body['norm.bias']}
    for kind in ('weight', 'bias'):
        out[f'embeddings.patch_embeddings.projection.{kind}'] = body[f'patch_embed.proj.{kind}']
    for i in range(1 + max(int(k.split('.')[1]) for k in body if k.startswith('blocks.'))):
        for kind in ('weight', 'bias'):
            for timm_name, hf_name in HF_NAMES.items():
                out[f'encoder.layer.{i}.{hf_name}.{kind}'] = body[f'blocks.{i}.{timm_name}.{kind}']
            for part, value in zip(('query', 'key', 'value'), body[f'blocks.{i}.attn.qkv.{kind}'].split(width)):
                out[f'encoder.layer.{i}.attention.attention.{part}.{kind}'] = value.clone()
    return out


VIT_LAYOUTS = {'moco_v3': moco_v3_vit, 'dino': dino_backbone_only, 'dino_hub': dino_hub_transformers}


@pytest.mark.parametrize('kind', list(VIT_LAYOUTS))
def test_vit_layouts_load_and_compute_the_source_network(kind, tmp_path):
    """Without a flag where the file states the heads; otherwise one line asks for them."""
    net = vit_source(kind)
    body = net.state_dict()
    path = str(tmp_path / f'{kind}_vit.pth')
    torch.save(VIT_LAYOUTS[kind](body), path)
    heads = VIT_STATED_HEADS[kind]
    if heads is None:
        with pytest.raises(ValueError, match=f'^{path} holds a Vision Transformer 96 wide, whose '
                           'attention heads .* pass --num-heads N'):
            load_encoder(path)
    encoder = load_encoder(path, num_heads=None if heads else VIT_SOURCES[kind]['num_heads']).eval()
    assert {k: v for k, v in encoder.backbone_cfg.items() if k != 'pretrained'} == VIT_EXPECTED[kind]
    state = encoder.backbone.model.state_dict()
    assert set(state) == set(body) and all(torch.equal(state[k], body[k]) for k in body)
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(encoder.backbone(x), net(x), rtol=0, atol=0)


@pytest.mark.parametrize('name, heads, expected', [
    ('vit_small_patch16_224', 6, dict(type='ViTBackbone', model_name='vit_small_patch16_224', num_heads=6)),
    ('vit_base_patch16_224', 12, dict(type='ViTBackbone', model_name='vit_base_patch16_224', num_heads=12)),
    ('vit_small_patch16_224', 12, dict(type='ViTBackbone', model_name='vit_small_patch16_224', num_heads=12)),
])
def test_published_vit_sizes_are_read_from_their_shapes(name, heads, expected):
    import timm

    from ifnd.models.vit_architecture import UnstatedHeads
    with torch.device('meta'):  # ViT-S/16, ViT-B/16: DINO's and MoCo v3's shapes, no memory
        state = timm.create_model(name, num_classes=0).state_dict()
    assert infer_backbone_config(state, heads) == expected
    with pytest.raises(UnstatedHeads):  # the same shapes have 6 heads in DINO, 12 in MoCo v3
        infer_backbone_config(state)


def test_linear_classifier_keeps_the_heads_a_moco_v3_vit_states(tmp_path):
    net = vit_source('moco_v3')
    path = str(tmp_path / 'vit-s.pth.tar')
    torch.save(moco_v3_vit(net.state_dict()), path)
    six_heads = {k: v for k, v in VIT_EXPECTED['moco_v3'].items() if k != 'num_heads'}  # same shapes
    for backbone in (dict(six_heads, num_heads=4), VIT_EXPECTED['moco_v3']):
        model = MODELS.build(dict(type='ImageClassifier', num_classes=10, pretrained=path, backbone=backbone))
        assert model.backbone.model.blocks[0].attn.num_heads == 12
        x = torch.randn(2, 3, 16, 16)
        with torch.no_grad():
            torch.testing.assert_close(model.extract_feat(x), net(x), rtol=0, atol=0)
