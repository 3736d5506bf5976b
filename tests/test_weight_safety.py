"""Weights that would load but compute nothing (NaN, inf, integers in place of floating-point
weights) are refused by every reader, naming the tensor; integer buffers still load. Finite weights
whose features overflow or collapse are refused by every tool that computes features, naming the
checkpoint."""
import os.path as osp

import numpy as np
import pytest
import torch
from helpers import digits_config, digits_config_file, load_tool, train_error, train_tool
from mmengine.registry import init_default_scope
from test_checkpoint_config_safety import REPO, _publish_as_planted

from ifnd import zoo
from ifnd.evaluation.analysis import load_feature_model
from ifnd.fileio import config_to_data
from ifnd.models import load_encoder
from ifnd.registry import MODELS

X = torch.rand(2, 3, 16, 16)
LINEAR_DIGITS = osp.join(osp.dirname(__file__), '..', 'configs', 'benchmarks', 'linear',
                         'linear_r18_100e_digits.py')
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


# Finite weights (check_weights passes them) whose features no evaluation can use:
# (keys and how each is changed, what every feature reader's error says).
FEATURE_FAULTS = {
    'a BatchNorm scale that overflows the features to NaN': (
        {'backbone.model.layer4.1.bn1.weight': ('scale', 3e38)}, 'give NaN or infinite values'),
    'a conv weight x 1e30, whose features L2-normalise to zero': (
        {'backbone.model.conv1.weight': ('scale', 1e30)}, 'give all-zero features'),
    'the stem conv zeroed and its BatchNorm bias constant: one point': (
        {'backbone.model.conv1.weight': ('scale', 0.0), 'backbone.model.bn1.bias': ('fill', 1.0)},
        'its features are (nearly) one point'),
}


def _ifnd_config(folder, **hooks) -> tuple:
    """IFND on a tenth of digits for one epoch with ``hooks`` (``digits_config``'s), and its config
    file in ``folder``."""
    folder.mkdir()
    cfg = digits_config(str(folder / 'run'), dict(type='IFND', temperature=0.5), max_epochs=1, **hooks)
    cfg.train_dataloader.dataset.subset_fraction = 0.1
    cfg.dump(str(folder / 'ifnd.py'))
    return cfg, str(folder / 'ifnd.py')


def _save_changed(cfg, path, changes: dict) -> str:
    """A training checkpoint of the model ``cfg`` builds, finite weights changed as ``changes`` says."""
    torch.manual_seed(0)
    state = MODELS.build(cfg.model).state_dict()
    for key, (how, value) in changes.items():
        state[key] = state[key] * value if how == 'scale' else state[key].fill_(value)
    assert all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point())
    torch.save({'state_dict': state, 'meta': dict(epoch=1, cfg=config_to_data(cfg))}, path)
    return str(path)


def _feature_tool_errors(path: str, ifnd_config: str, tmp_path) -> dict[str, str]:
    """Each feature-computing tool's one-line error (or exception) for the checkpoint ``path``."""
    from fake_data import fake_vocdevkit
    voc_root, _ = fake_vocdevkit(tmp_path, np.random.default_rng(0), 12, 12)
    fast = ('--num-workers', '0', '--device', 'cpu')
    errors = {
        'knn_eval': _tool_error('knn_eval', path, '--dataset', 'digits', '--batch-size', 512, *fast),
        'voc07_svm': _tool_error('voc07_svm', path, '--data-root', voc_root, '--size', 16, *fast),
        'linear': train_error(LINEAR_DIGITS, '--cfg-options', f'model.pretrained={path}',
                              f'work_dir={tmp_path / "linear"}'),
        'semi-supervised': train_error(LINEAR_DIGITS, '--cfg-options', f'model.pretrained={path}',
                                       'model.frozen=False', f'work_dir={tmp_path / "semi"}'),
        'PseudoLabelHook': train_error(ifnd_config, '--cfg-options', f'load_from={path}'),
    }
    for name, args in (('analysis/cluster_table', ('--config', ifnd_config, '--runs', 1)),
                       ('analysis/plot_embeddings', ('--config', ifnd_config, '--num-points', 60,
                                                     '--feature', 'f', '--out', tmp_path / 'map.png'))):
        with pytest.raises(ValueError) as error:  # the script prints 'error: ' and the message
            load_tool(name).main([str(a) for a in (path, *args, *fast)])
        errors[name] = f'error: {error.value}'
    return errors


@pytest.mark.parametrize('fault', list(FEATURE_FAULTS))
def test_every_feature_reader_refuses_features_that_overflow_or_collapse(tmp_path, fault):
    changes, says = FEATURE_FAULTS[fault]
    cfg, ifnd_config = _ifnd_config(tmp_path / 'ifnd', pseudo_labels=dict(num_clusters=[10]))
    path = _save_changed(cfg, tmp_path / 'finite.pth', changes)
    errors = _feature_tool_errors(path, ifnd_config, tmp_path)
    for name, message in errors.items():
        assert '\n' not in message and message.startswith(f'error: {path}'), f'{name}: {message}'
        assert says in message and 'chance' in message, f'{name}: {message}'
        assert 'earlier checkpoint' in message, f'{name}: {message}'
    assert not osp.exists(tmp_path / 'ifnd' / 'run' / 'epoch_1.pth')
    assert not any(osp.exists(tmp_path / run / 'epoch_1.pth') for run in ('linear', 'semi'))
    # The kNN hook only measures: a collapsed encoder's chance-level top-1 is logged with a
    # warning and the run goes on; non-finite features stop it.
    # (SimCLR: IFND trains only with its clustering hook, which comes first.)
    (tmp_path / 'knn').mkdir()
    knn_config = digits_config_file(tmp_path / 'knn', knn=True)
    simclr = str(tmp_path / 'simclr.pth')
    torch.save({'state_dict': {k: v for k, v in torch.load(path)['state_dict'].items()
                               if not k.startswith('label_bank.')}}, simclr)
    if 'one point' in says:
        train_tool.main([knn_config, '--cfg-options', f'load_from={simclr}'])
        log = next((tmp_path / 'knn' / 'run').rglob('*.log')).read_text()
        assert f'WARNING - {simclr} (load_from): its features are (nearly) one point' in log
        assert osp.isfile(tmp_path / 'knn' / 'run' / 'epoch_1.pth')
    else:
        message = train_error(knn_config, '--cfg-options', f'load_from={simclr}')
        assert message.startswith(f'error: {simclr} (load_from): its features are unusable')
        assert says in message
