"""A checkpoint's config is data, never code: planted payloads run in no reader, tools still work."""
import copy
import hashlib
import math
import os
import os.path as osp
import re
import sys

import pytest
import torch
import yaml
from helpers import TINY_BACKBONE, digits_config, load_tool, run_script
from mmengine.config import Config
from mmengine.registry import init_default_scope
from torch.utils._python_dispatch import TorchDispatchMode

from ifnd import zoo
from ifnd.fileio import checkpoint_config, config_to_data
from ifnd.evaluation.analysis import load_feature_model
from ifnd.models import load_encoder
from ifnd.registry import MODELS

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
X = torch.rand(2, 3, 16, 16)


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    """A tiny SimCLR's weights and its training config."""
    init_default_scope('ifnd')
    torch.manual_seed(0)
    cfg = digits_config(str(tmp_path_factory.mktemp('run')), dict(type='SimCLR', temperature=0.5))
    return MODELS.build(cfg.model).eval(), cfg


def payloads(cfg: Config, marker: str, evil_py: str) -> dict:
    """``meta`` contents that run ``os.mkdir(marker)`` when a reader executes or builds them."""
    code = f"__import__('os').mkdir({marker!r})"
    text = cfg.pretty_text
    assert "model_name='resnet18'" in text
    with open(evil_py, 'w') as f:
        f.write(f'import os\nos.mkdir({marker!r})\nmodel = dict(type="SimCLR")\n')
    mkdir_type = dict(type='os.mkdir', path=marker)  # mmengine's registry imports and calls it
    data = config_to_data(cfg)
    data['model']['data_preprocessor'] = mkdir_type
    return {
        'text, first line': {'cfg': f'_x = {code}\n' + text},
        'text, nested value': {'cfg': text.replace("model_name='resnet18'",
                                                   f"model_name={code} or 'resnet18'")},
        'text, dict(**...) call': {'cfg': text + f'\nextra = dict(**({code} or {{}}))\n'},
        'text, _base_ file': {'cfg': f'_base_ = [{evil_py!r}]\n' + text},
        'text, {{_base_}} placeholder': {'cfg': f'_base_ = [{evil_py!r}]\nmodel = {{{{_base_.model}}}}\n'},
        'text, registry type': {'cfg': text.replace("type='ContrastiveDataPreprocessor'",
                                                    f"type='os.mkdir', path={marker!r}")},
        'data, registry type': {'cfg': data},
        "backbone file, meta['model']": {'model': {'backbone': data['model']['backbone'],
                                                   'data_preprocessor': mkdir_type}},
    }


@pytest.fixture(scope='module')
def planted(tiny, tmp_path_factory):
    """One checkpoint file per payload, and the marker they would create."""
    model, cfg = tiny
    folder = tmp_path_factory.mktemp('planted')
    marker = str(folder / 'RAN')
    files = {}
    for i, (name, meta) in enumerate(payloads(cfg, marker, str(folder / 'evil_base.py')).items()):
        files[name] = str(folder / f'planted_{i}.pth')
        torch.save({'state_dict': model.state_dict(), 'meta': dict(meta, epoch=1)}, files[name])
    return files, marker


def _publish_as_planted(path, tmp_path, monkeypatch) -> None:
    """A zoo index whose entry 'planted' is the file at ``path``, served from a folder mirror."""
    mirror = tmp_path / 'mirror'
    mirror.mkdir()
    data = open(path, 'rb').read()
    (mirror / 'planted.pth').write_bytes(data)
    index = tmp_path / 'models.yaml'
    index.write_text(yaml.safe_dump({'models': [dict(
        name='planted', algorithm='SimCLR', backbone='resnet18', dataset='Digits', epochs=1,
        config='configs/simclr/simclr_r18_200e_fmnist.py', file='planted.pth', size=len(data),
        sha256=hashlib.sha256(data).hexdigest(), urls=[], reproduce='-')]}))
    monkeypatch.setenv('IFND_ZOO_INDEX', str(index))
    monkeypatch.setenv('IFND_HOME', str(tmp_path / 'home'))
    monkeypatch.setenv('IFND_ZOO_URL', str(mirror))


NAMES = ['text, first line', 'text, nested value', 'text, dict(**...) call', 'text, _base_ file',
         'text, {{_base_}} placeholder', 'text, registry type', 'data, registry type',
         "backbone file, meta['model']"]


def _same_features(encoder, model) -> None:
    torch.testing.assert_close(encoder.eval().extract_feat(X), model.extract_feat(X), rtol=0, atol=0)


@pytest.mark.parametrize('name', NAMES)
def test_in_process_readers_never_run_the_payload(planted, tiny, name, tmp_path, monkeypatch):
    files, marker = planted
    model, cfg = tiny
    path = files[name]
    checkpoint = torch.load(path, weights_only=True)
    read = checkpoint_config(checkpoint, path)
    if name == 'text, _base_ file':
        assert read is not None and '_base_' not in read and read.model.type == 'SimCLR'
    else:
        assert read is None
    # The encoder loader: the ResNet is read from the weights.
    _same_features(load_encoder(path), model)
    # A linear config's model.pretrained: a backbone that does not fit makes it read the file.
    classifier = MODELS.build(dict(type='ImageClassifier', num_classes=10, pretrained=path,
                                   backbone=dict(type='TimmBackbone', model_name='resnet18')))
    torch.testing.assert_close(classifier.backbone(X), model.extract_feat(X), rtol=0, atol=0)
    # The analysis tools' loader: the data come from a config the user names, never the file's.
    with pytest.raises(ValueError, match='pass the training config'):
        load_feature_model(path, 'f')
    # The zoo and torch.hub, from a folder mirror.
    _publish_as_planted(path, tmp_path, monkeypatch)
    _same_features(zoo.get_model('planted', progress=False), model)
    _same_features(torch.hub.load(REPO, 'planted', source='local', progress=False), model)
    if read is None:
        with pytest.raises(ValueError, match='algorithm=True'):
            zoo.get_model('planted', algorithm=True, progress=False)
    assert not osp.exists(marker), f'{name}: a reader ran the payload'


def _one_line_error(out, *fragments) -> None:
    assert out.returncode != 0 and 'Traceback' not in out.stderr, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert all(f in last for f in fragments), out.stderr[-3000:]


@pytest.mark.parametrize('tool', ['knn_eval', 'extract_backbone', 'convert_to_detectron2',
                                  'cluster_table', 'plot_embeddings', 'publish_model'])
def test_tools_never_run_the_payload(planted, tmp_path, tool):
    files, marker = planted
    text, backbone_file = files['text, first line'], files["backbone file, meta['model']"]
    if tool == 'knn_eval':
        _one_line_error(run_script('tools/knn_eval.py', text, '--device', 'cpu'),
                        'Give the data with --config FILE', '--dataset')
    elif tool == 'extract_backbone':
        for i, path in enumerate((text, backbone_file, files['text, _base_ file'])):
            out = run_script(f'tools/{tool}.py', path, str(tmp_path / f'out_{i}.pth'))
            assert out.returncode == 0, out.stderr[-3000:]
            assert osp.isfile(tmp_path / f'out_{i}.pth')
    elif tool == 'convert_to_detectron2':  # the backbone is read; its CIFAR stem has no counterpart
        for path in (text, backbone_file):
            _one_line_error(run_script(f'tools/{tool}.py', path, str(tmp_path / 'out.pkl')),
                            'error: ', 'no detectron2 counterpart')
    elif tool == 'cluster_table':
        _one_line_error(run_script('tools/analysis/cluster_table.py', text, '--device', 'cpu'),
                        '--config')
    elif tool == 'plot_embeddings':
        _one_line_error(run_script('tools/analysis/plot_embeddings.py', text, '--out',
                                   str(tmp_path / 'map.png'), '--device', 'cpu'), '--config')
    else:
        _one_line_error(run_script('tools/publish_model.py', text, '--name', 'planted', '--reproduce',
                                   '-', '--out-dir', str(tmp_path / 'files'), '--index',
                                   str(tmp_path / 'models.yaml')), 'carries no usable training config')
        assert not (tmp_path / 'files').exists()
    assert not osp.exists(marker), f'{tool} ran the payload'


def test_published_file_carries_the_config_as_data(planted, tmp_path):
    files, marker = planted
    out = run_script('tools/publish_model.py', files['text, _base_ file'], '--name', 'planted',
                     '--reproduce', '-', '--out-dir', str(tmp_path / 'files'), '--index',
                     str(tmp_path / 'models.yaml'))
    assert out.returncode == 0, out.stderr[-3000:]
    published = torch.load(next((tmp_path / 'files').iterdir()), weights_only=True)
    cfg = published['meta']['cfg']
    assert isinstance(cfg, dict) and '_base_' not in cfg and cfg['model']['type'] == 'SimCLR'
    assert not any(isinstance(v, str) and 'import' in v for v in published['meta'].values())
    assert not osp.exists(marker)


def test_runner_checkpoints_store_the_config_as_plain_data(tmp_path):
    from mmengine.runner import Runner

    from ifnd.registry import RUNNERS
    cfg = digits_config(str(tmp_path / 'run'), dict(type='SimCLR', temperature=0.5), max_epochs=1,
                        batch_size=256)
    runner = RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
    runner.train()
    checkpoint = torch.load(tmp_path / 'run' / 'epoch_1.pth', weights_only=False)
    stored = checkpoint['meta']['cfg']
    assert isinstance(stored, dict)

    def plain(value):
        if isinstance(value, dict):
            return all(isinstance(k, str) and plain(v) for k, v in value.items())
        if isinstance(value, (list, tuple)):
            return all(plain(v) for v in value)
        return isinstance(value, (str, int, float, bool, type(None)))
    assert plain(stored)
    assert checkpoint_config(checkpoint).to_dict() == Config(cfg.to_dict()).to_dict()

    # mmengine's resume runs Config.fromstring on meta['config'] text: the runner drops it.
    marker = tmp_path / 'RAN'
    checkpoint['meta']['config'] = f"_x = __import__('os').mkdir({str(marker)!r})\ngpu_ids = [0]\n"
    torch.save(checkpoint, tmp_path / 'planted.pth')
    cfg.merge_from_dict(dict(resume=True, load_from=str(tmp_path / 'planted.pth')))
    resumed = RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
    resumed.train()
    assert resumed.epoch == 1 and not marker.exists()


# ------------------------------------------------ a checkpoint's config decides the architecture only

def acting_values(cfg: Config, root: str) -> dict:
    """Config values that would run, fetch or write if a reader passed them on, by kind."""
    url = 'http://127.0.0.1:9/resnet18-f37072fd.pth'  # any fetch is caught before it connects
    shell = f"sh -c 'touch {root}/COMPILER_RAN' x"
    return {
        'compile options (the compiler command line)': dict(backbone=dict(
            compile=dict(backend='inductor', options={'cpp.cxx': (shell,)}))),
        'compile=True': dict(backbone=dict(compile=True)),
        'pretrained with a download URL': dict(backbone=dict(
            pretrained=True, pretrained_cfg_overlay=dict(url=url, file=f'{root}/weights.pth'))),
        'init_cfg loading a URL': dict(init_cfg=dict(type='Pretrained', checkpoint=url),
                                       backbone=dict(init_cfg=dict(type='Pretrained', checkpoint=url))),
        'a timm name fetched from the Hub': dict(backbone=dict(model_name='hf-hub:org/evil')),
        'a size that exhausts memory': dict(neck=dict(hidden_dim=10 ** 9)),
        'sizes that multiply past memory': dict(neck=dict(hidden_dim=1 << 20, out_dim=1 << 20)),
        'data set, hooks and folders': 'top level',
    }


def _planted_config(cfg: Config, kind: str, value, root: str) -> dict:
    data = config_to_data(cfg)
    if value == 'top level':
        data.update(work_dir=f'{root}/WORK_DIR', train_dataloader=dict(
            batch_size=2, dataset=dict(type='FashionMNIST', data_root=f'{root}/DATA', download=True)),
            custom_hooks=[dict(type='CheckpointHook', out_dir=f'{root}/HOOK_OUT')],
            visualizer=dict(type='Visualizer', save_dir=f'{root}/VIS',
                            vis_backends=[dict(type='TensorboardVisBackend')]))
    else:
        for key, part in value.items():
            if isinstance(part, dict) and key in ('backbone', 'neck'):
                data['model'][key].update(part)
            else:
                data['model'][key] = part
    return data


@pytest.fixture
def sealed(monkeypatch, tmp_path):
    """Every way out recorded: network connections, compiles, new files under the watched root."""
    import socket

    events = []

    def no_connect(sock, address, *args):
        events.append(f'connect {address}')
        raise OSError('network use refused by the test')
    monkeypatch.setattr(socket.socket, 'connect', no_connect)
    monkeypatch.setattr(socket, 'create_connection',
                        lambda address, *a, **k: no_connect(None, address))
    monkeypatch.setattr(torch, 'compile', lambda *a, **k: events.append('torch.compile') or a[0])
    monkeypatch.setattr(torch.nn.Module, 'compile',
                        lambda self, *a, **k: events.append('Module.compile'))
    root = tmp_path / 'root'
    root.mkdir()
    for var, folder in (('TORCH_HOME', 'torch'), ('HF_HOME', 'hf'), ('XDG_CACHE_HOME', 'cache')):
        monkeypatch.setenv(var, str(root / folder))
    monkeypatch.setenv('HF_ENDPOINT', 'http://127.0.0.1:9')
    monkeypatch.chdir(root)
    return root, events


KINDS = list(acting_values(Config(), '/x'))


@pytest.mark.parametrize('kind', KINDS)
def test_every_reader_takes_the_architecture_alone(tiny, tmp_path, sealed, kind, monkeypatch):
    from ifnd.models.architecture import checkpoint_architecture
    model, cfg = tiny
    root, events = sealed
    value = acting_values(cfg, str(root))[kind]
    ckpt = tmp_path / 'planted.pth'
    torch.save({'state_dict': model.state_dict(),
                'meta': dict(epoch=1, cfg=_planted_config(cfg, kind, value, str(root)))}, ckpt)
    backbone_file = tmp_path / 'backbone.pth'
    backbone = dict(cfg.model.backbone.to_dict(), **(value.get('backbone', {}) if isinstance(value, dict) else {}))
    torch.save({'state_dict': {k[len('backbone.model.'):]: v for k, v in model.state_dict().items()
                               if k.startswith('backbone.model.')},
                'meta': dict(model=dict(backbone=backbone))}, backbone_file)
    user_config = tmp_path / 'train_config.py'
    cfg.dump(str(user_config))
    before = sorted(p for p in root.rglob('*'))

    # What each reader is told: the allow-listed architecture, or nothing where a value is refused.
    architecture = checkpoint_architecture(torch.load(ckpt, weights_only=True), str(ckpt))
    if kind in ('a timm name fetched from the Hub', 'a size that exhausts memory',
                'sizes that multiply past memory', 'init_cfg loading a URL'):  # mmengine's 'Pretrained' is no type of this project
        assert architecture is None  # refused whole: the architecture is read from the weights
    else:
        assert architecture['backbone'] == TINY_BACKBONE and 'init_cfg' not in architecture
    # Every reader of a checkpoint's config.
    for path in (str(ckpt), str(backbone_file)):
        _same_features(load_encoder(path), model)
        classifier = MODELS.build(dict(type='ImageClassifier', num_classes=10, pretrained=path,
                                       backbone=dict(type='TimmBackbone', model_name='resnet18')))
        torch.testing.assert_close(classifier.backbone(X), model.extract_feat(X), rtol=0, atol=0)
        loaded = load_feature_model(path, 'f', str(user_config))
        _same_features(loaded.model, model)
    if architecture is not None:
        loaded = load_feature_model(str(ckpt), 'z', str(user_config))
        assert type(loaded.model).__name__ == 'SimCLR'
    load_tool('extract_backbone').main([str(ckpt), str(tmp_path / 'extracted.pth')])
    _publish_as_planted(ckpt, tmp_path, monkeypatch)
    _same_features(zoo.get_model('planted', progress=False), model)
    _same_features(torch.hub.load(REPO, 'planted', source='local', progress=False), model)
    if architecture is not None:
        rebuilt = zoo.get_model('planted', algorithm=True, progress=False)
        torch.testing.assert_close(rebuilt.extract_feat(X), model.extract_feat(X), rtol=0, atol=0)

    assert events == [], f'{kind}: a reader acted on the checkpoint: {events}'
    assert sorted(p for p in root.rglob('*')) == before, f'{kind}: a reader wrote files'


def test_the_dropped_keys_are_named_in_one_log_line(tiny, monkeypatch):
    from ifnd.models import architecture
    model, cfg = tiny
    data = _planted_config(cfg, 'data set', 'top level', '/x')
    data['model']['backbone'].update(compile=True, pretrained=True)
    data['model']['init_cfg'] = dict(checkpoint='/x/y.pth')
    lines = []
    monkeypatch.setattr(architecture, 'print_log', lambda msg, **kwargs: lines.append(msg))
    kept = architecture.checkpoint_architecture({'state_dict': model.state_dict(), 'meta': {'cfg': data}},
                                                'ckpt.pth')
    assert len(lines) == 1, lines
    for name in ('model.backbone.compile', 'model.backbone.pretrained', 'model.init_cfg',
                 'train_dataloader', 'custom_hooks', 'work_dir'):
        assert name in lines[0]
    assert kept['backbone'] == TINY_BACKBONE
    assert kept['neck'] == cfg.model.neck.to_dict() and kept['type'] == 'SimCLR'


def test_a_type_name_is_looked_up_never_imported():
    import sys

    from ifnd.models.architecture import architecture_config
    sys.modules.pop('this', None)  # mmengine's Registry.get would import it: it prints a poem
    backbone = dict(type='TimmBackbone', model_name='resnet18')
    assert architecture_config(dict(type='this', backbone=backbone), 'ckpt') is None
    assert architecture_config(dict(type='json', backbone=backbone), 'ckpt') is None
    assert 'this' not in sys.modules
    # None is the builders' own default for a part, not a bad value.
    kept = architecture_config(dict(type='SimCLR', backbone=backbone, data_preprocessor=None,
                                    neck=dict(type='MLPNeck', in_dim=512)), 'ckpt')
    assert kept['data_preprocessor'] is None and kept['backbone'] == backbone


# ------------------------------------------------ a config's claims are checked against its weights

class LargestAllocation(TorchDispatchMode):
    """Records the largest tensor allocated off the ``meta`` device, refusing any over ``limit`` bytes
    before it is made (a reader that builds what a config claims fails here, not the machine)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.largest = limit, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        size = args[0] if args and isinstance(args[0], (list, tuple, torch.Size)) else None
        device = kwargs.get('device')
        # Factory ops (empty, zeros, ones, full...) take the size first and a device keyword.
        if size is not None and all(isinstance(n, int) for n in size) and device is not None \
                and torch.device(device).type != 'meta':
            needed = math.prod(size) * (kwargs.get('dtype') or torch.get_default_dtype()).itemsize
            self.largest = max(self.largest, needed)
            if needed > self.limit:
                raise MemoryError(f'{func} asked for {needed / 1e9:.1f} GB')
        return func(*args, **kwargs)


def test_a_config_claiming_more_than_its_weights_is_never_built(tiny, tmp_path, monkeypatch):
    from ifnd.models import architecture
    model, cfg = tiny
    data = config_to_data(cfg)
    data['model']['backbone']['channels'] = (8, 16, 32, 7000)  # 5.3 GB, under the size cap
    ckpt = tmp_path / 'claims.pth'
    torch.save({'state_dict': model.state_dict(), 'meta': dict(epoch=1, cfg=data)}, ckpt)
    backbone_file = tmp_path / 'claims_backbone.pth'
    torch.save({'state_dict': {k[len('backbone.model.'):]: v for k, v in model.state_dict().items()
                               if k.startswith('backbone.model.')},
                'meta': dict(model=dict(backbone=data['model']['backbone']))}, backbone_file)
    user_config = tmp_path / 'train_config.py'
    cfg.dump(str(user_config))
    lines = []
    monkeypatch.setattr(architecture, 'print_log', lambda msg, **kwargs: lines.append(msg))
    guard = LargestAllocation(limit=256 << 20)
    with guard:
        for path in (str(ckpt), str(backbone_file)):
            # Every reader falls back to the architecture its weights describe.
            _same_features(load_encoder(path), model)
            classifier = MODELS.build(dict(type='ImageClassifier', num_classes=10, pretrained=path,
                                           backbone=dict(type='TimmBackbone', model_name='resnet18')))
            torch.testing.assert_close(classifier.backbone(X), model.extract_feat(X), rtol=0, atol=0)
            _same_features(load_feature_model(path, 'f', str(user_config)).model, model)
            load_tool('extract_backbone').main([path, str(tmp_path / 'extracted.pth')])
        # The whole model: the user's config replaces the checkpoint's.
        loaded = load_feature_model(str(ckpt), 'z', str(user_config))
        _same_features(loaded.model, model)
        _publish_as_planted(str(ckpt), tmp_path, monkeypatch)
        _same_features(zoo.get_model('planted', progress=False), model)
        _same_features(torch.hub.load(REPO, 'planted', source='local', progress=False), model)
        with pytest.raises(ValueError, match='algorithm=True'):
            zoo.get_model('planted', algorithm=True, progress=False)
    assert guard.largest < 16 << 20, f'a reader allocated {guard.largest / 1e6:.1f} MB at once'
    claims = [line for line in lines if 'does not describe the weights' in line]
    said = r'layer4\.0\.bn1\.bias \(64,\) vs \(7000,\).*built, it would need 5\.\d GB'
    assert claims and all(re.search(said, line) for line in claims), lines


def test_the_size_cap_names_memory(monkeypatch):
    from ifnd.models import architecture
    lines = []
    monkeypatch.setattr(architecture, 'print_log', lambda msg, **kwargs: lines.append(msg))
    backbone = dict(type='TimmBackbone', model_name='resnet18')
    model = dict(type='SimCLR', backbone=backbone, neck=dict(type='MLPNeck', in_dim=512,
                                                              hidden_dim=1 << 19, out_dim=1 << 14))
    assert architecture.architecture_config(model, 'ckpt.pth') is None
    assert re.search(r'it would need 3\d\.\d GB for its weights and buffers, more than the 8\.6 GB',
                     lines[-1]), lines


def test_a_head_of_a_million_layers_is_refused_in_seconds(monkeypatch):
    """Each layer is a module object, made even on the meta device: the count is refused, naming
    the field, before anything is built (2**20 layers took minutes and 2.8 GB)."""
    import time

    from ifnd.models import architecture
    lines = []
    monkeypatch.setattr(architecture, 'print_log', lambda msg, **kwargs: lines.append(msg))
    model = dict(type='SimCLR', backbone=dict(type='TimmBackbone', model_name='resnet18'),
                 neck=dict(type='MLPNeck', in_dim=512, hidden_dim=64, out_dim=32, num_layers=2 ** 20))
    tic = time.perf_counter()
    assert architecture.architecture_config(model, 'ckpt.pth') is None
    assert time.perf_counter() - tic < 5
    assert re.search(r'neck\.num_layers=1048576 is not a whole number from 1 to 64', lines[-1]), lines


@pytest.fixture
def margin_detector():
    """A detector registered for one test, with arguments no project class has."""
    from typing import Annotated

    from ifnd.settings import Bound
    from ifnd.models.false_negatives import GloFND

    class MarginGloFND(GloFND):
        def __init__(self, margin: float = 0.5, rounds: Annotated[int, Bound(1, 4)] = 1,
                     cache_dir: str | None = None, **kwargs) -> None:
            super().__init__(**kwargs)
            self.margin, self.rounds, self.cache_dir = margin, rounds, cache_dir

    MODELS.register_module(module=MarginGloFND)
    try:
        yield MarginGloFND
    finally:
        MODELS._module_dict.pop('MarginGloFND', None)


def test_a_new_detector_argument_survives_the_checkpoint(margin_detector, tmp_path, monkeypatch):
    from ifnd.models import architecture
    init_default_scope('ifnd')
    detector = dict(type='MarginGloFND', margin=0.25, rounds=3, alpha=0.2, cache_dir='/x')
    cfg = digits_config(str(tmp_path / 'run'), dict(type='SimCLR', temperature=0.5,
                                                    detector=detector, treatment='elim'))
    model = MODELS.build(cfg.model).eval()
    assert model.detector.margin == 0.25
    data = config_to_data(cfg)  # as the runner stores it
    ckpt = tmp_path / 'margin.pth'
    torch.save({'state_dict': model.state_dict(), 'meta': dict(epoch=1, cfg=data)}, ckpt)
    user_config = tmp_path / 'train_config.py'
    digits_config(str(tmp_path / 'run'), dict(type='SimCLR', temperature=0.5)).dump(str(user_config))
    lines = []
    monkeypatch.setattr(architecture, 'print_log', lambda msg, **kwargs: lines.append(msg))

    kept = architecture.checkpoint_architecture(torch.load(ckpt, weights_only=True), str(ckpt))
    # The constructor's margin is kept with its kind; a folder is never taken from a checkpoint.
    assert kept['detector'] == dict(type='MarginGloFND', margin=0.25, rounds=3, alpha=0.2)
    assert 'model.detector.cache_dir' in lines[-1]
    loaded = load_feature_model(str(ckpt), 'z', str(user_config))
    assert type(loaded.model.detector).__name__ == 'MarginGloFND'
    assert (loaded.model.detector.margin, loaded.model.detector.rounds) == (0.25, 3)
    assert loaded.model.detector.alpha == 0.2
    _same_features(loaded.model, model)

    # A value outside the annotation's kind or bound makes the reader ignore the config.
    for key, value, why in (('margin', 'wide', 'is not a finite number'),
                            ('rounds', 9, 'is not a whole number from 1 to 4')):
        bad = copy.deepcopy(data)
        bad['model']['detector'][key] = value
        refused = {'state_dict': model.state_dict(), 'meta': dict(epoch=1, cfg=bad)}
        assert architecture.checkpoint_architecture(refused, 'refused.pth') is None
        assert f'model.detector.{key}={value!r} {why}' in lines[-1]
