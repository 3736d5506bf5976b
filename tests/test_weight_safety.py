"""Weights that would load but compute nothing (NaN, inf, integers in place of floating-point
weights) are refused by every reader, naming the tensor; integer buffers still load."""
import os.path as osp

import pytest
import torch
from helpers import digits_config, digits_config_file, load_tool, train_error
from mmengine.registry import init_default_scope
from test_checkpoint_config_safety import REPO, _publish_as_planted

from ifnd import zoo
from ifnd.evaluation.analysis import load_feature_model
from ifnd.fileio import config_to_data
from ifnd.models import load_encoder
from ifnd.registry import MODELS

X = torch.rand(2, 3, 16, 16)
# (key in the training checkpoint, how it is damaged, what every reader's error says)
DEFECTS = {
    'NaN in a conv weight': ('backbone.model.layer2.0.conv1.weight', 'nan',
                             'has 1 non-finite values (1 NaN, 0 infinite)'),
    'inf in a conv weight': ('backbone.model.layer2.0.conv1.weight', 'inf',
                             'has 1 non-finite values (0 NaN, 1 infinite)'),
    'NaN in a BatchNorm running_var': ('backbone.model.bn1.running_var', 'nan',
                                       'has 1 non-finite values (1 NaN, 0 infinite)'),
    'a conv weight stored as int64': ('backbone.model.conv1.weight', 'int64',
                                      'holds int64 values where the model has float32 weights'),
}


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    """A tiny SimCLR, its training config (as a file too) and a folder for checkpoints."""
    init_default_scope('ifnd')
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp('weights')
    cfg = digits_config(str(root / 'run'), dict(type='SimCLR', temperature=0.5))
    cfg.dump(str(root / 'train_config.py'))
    return MODELS.build(cfg.model).eval(), cfg, root


def _save(model, cfg, path, damage: tuple | None = None) -> str:
    """A training checkpoint of ``model`` (``damage``: key and 'nan', 'inf' or 'int64')."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    if damage is not None:
        key, kind = damage
        if kind == 'int64':
            state[key] = (state[key] * 100).round().long()
        else:
            state[key].view(-1)[3] = float(kind)
    torch.save({'state_dict': state, 'meta': dict(epoch=1, cfg=config_to_data(cfg))}, path)
    return str(path)


def _tool_error(name: str, *args) -> str:
    """A tool's one-line error (its SystemExit message) for ``args``."""
    with pytest.raises(SystemExit) as exit_info:
        load_tool(name).main([str(a) for a in args])
    message = str(exit_info.value.code)
    assert '\n' not in message and message.startswith('error: '), message
    return message


@pytest.mark.parametrize('defect', list(DEFECTS))
def test_every_reader_refuses_unusable_weights(tiny, tmp_path, monkeypatch, defect):
    model, cfg, root = tiny
    key, kind, says = DEFECTS[defect]
    path = _save(model, cfg, tmp_path / 'damaged.pth', (key, kind))
    backbone_key = key[len('backbone.model.'):]  # the encoder readers name the backbone's key
    config = str(root / 'train_config.py')
    errors = {
        'knn_eval': _tool_error('knn_eval', path, '--dataset', 'digits', '--device', 'cpu'),
        'voc07_svm': _tool_error('voc07_svm', path, '--data-root', tmp_path, '--device', 'cpu'),
        'extract_backbone': _tool_error('extract_backbone', path, tmp_path / 'backbone.pth'),
        'convert_to_detectron2': _tool_error('convert_to_detectron2', path, tmp_path / 'd2.pkl'),
    }
    if kind != 'int64':  # publishing checks the values alone (no model); its readers the dtypes
        errors['publish_model'] = _tool_error('publish_model', path, '--name', 'damaged', '--reproduce',
                                              '-', '--out-dir', tmp_path / 'published', '--index',
                                              tmp_path / 'index.yaml')
    readers = {
        'load_encoder': lambda: load_encoder(path),
        'linear / semi-supervised': lambda: MODELS.build(dict(
            type='ImageClassifier', num_classes=10, pretrained=path, backbone=cfg.model.backbone)),
        'analysis, backbone features': lambda: load_feature_model(path, 'f', config),
        'analysis, whole model': lambda: load_feature_model(path, 'z', config),
    }
    _publish_as_planted(path, tmp_path, monkeypatch)
    readers['zoo'] = lambda: zoo.get_model('planted', progress=False)
    readers['zoo, whole model'] = lambda: zoo.get_model('planted', algorithm=True, progress=False)
    readers['torch.hub'] = lambda: torch.hub.load(REPO, 'planted', source='local', progress=False)
    for name, read in readers.items():
        with pytest.raises(ValueError) as error:
            read()
        errors[name] = str(error.value)
    for name, message in errors.items():
        whole = name in ('zoo, whole model', 'publish_model')  # they name the training checkpoint's key
        assert f'{key if whole else backbone_key} {says}' in message, f'{name}: {message}'
        assert 'earlier checkpoint' in message or 'written for another model' in message, message
    assert not osp.exists(tmp_path / 'backbone.pth') and not osp.exists(tmp_path / 'd2.pkl')
    assert not osp.exists(tmp_path / 'published') and not osp.exists(tmp_path / 'index.yaml')


def test_load_from_refuses_non_finite_weights(tiny, tmp_path):
    model, cfg, _ = tiny
    key, kind, says = DEFECTS['NaN in a BatchNorm running_var']
    path = _save(model, cfg, tmp_path / 'damaged.pth', (key, kind))
    message = train_error(digits_config_file(tmp_path), '--cfg-options', f'load_from={path}')
    assert f'{path}: {key} {says}' in message and 'earlier checkpoint' in message
    assert not osp.exists(tmp_path / 'run' / 'epoch_1.pth')


def test_integer_buffers_still_load(tmp_path):
    """BatchNorm's batch counts, MoCo's queue indices and IFND's label bank hold integers."""
    init_default_scope('ifnd')
    torch.manual_seed(0)
    cfg = digits_config(str(tmp_path / 'run'), dict(type='IFNDMoCo', temperature=0.2, queue_len=64,
                                                    bn_splits=2))
    cfg.dump(str(tmp_path / 'train_config.py'))
    model = MODELS.build(cfg.model).eval()
    model.label_bank.reset(1, 10)
    model.label_bank.update(torch.arange(10).remainder(3).view(1, 10))
    model.queue_index.copy_(torch.arange(64))
    model.queue_ptr.fill_(7)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.num_batches_tracked.fill_(12)
    path = _save(model, cfg, tmp_path / 'ifnd_moco.pth')
    loaded = load_feature_model(path, 'z', str(tmp_path / 'train_config.py')).model
    for name, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    assert loaded.label_bank.labels.dtype == torch.long and int(loaded.queue_ptr) == 7
    encoder = load_encoder(path)
    torch.testing.assert_close(encoder.eval().extract_feat(X), model.extract_feat(X), rtol=0, atol=0)


def test_load_from_takes_finite_weights_with_integer_buffers(tiny, tmp_path):
    model, cfg, _ = tiny
    trained = MODELS.build(cfg.model)
    trained.load_state_dict(model.state_dict())
    for module in trained.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.num_batches_tracked.fill_(5)
    path = _save(trained, cfg, tmp_path / 'good.pth')
    load_tool('train').main([digits_config_file(tmp_path), '--cfg-options', f'load_from={path}'])
    assert osp.isfile(tmp_path / 'run' / 'epoch_1.pth')
