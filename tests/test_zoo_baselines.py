"""The zoo's ViT and HCSC baselines evaluated from their names, with no flag about their layouts.

Each entry of the repository's index is served from a loopback HTTP server (its URL replaced, a
Hub file at a commit of the test's, the rest as published: no checksum or the Hub's SHA-256, now
the tiny file's, and a size bound) with a tiny file written the way its authors save theirs; then
``tools/knn_eval.py --zoo NAME`` and a linear evaluation with ``model.pretrained=zoo:NAME`` run on
digits.
"""
import hashlib
import os.path as osp

import pytest
import torch
import yaml
from test_checkpoint_layouts import VIT_LAYOUTS, _tool, hcsc, source_network, vit_source
from test_zoo import _serve

from ifnd import zoo
from ifnd.zoo.index import HF_SOURCE, INDEX_PATH, read_index

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
# Entry -> the layout its tiny stand-in is written in, and its feature width.
CASES = {'moco_v3_vits16_300e_in1k': ('moco_v3', 48), 'dino_vits16_in1k': ('dino', 96),
         'dino_vits16_in1k_hf': ('dino_hub', 96), 'hcsc_r50_200e_in1k': ('hcsc', 512)}
REVISION = 'b' * 40
KNN_DATA = ['--dataset', 'digits', '--k', '5', '--num-workers', '0', '--device', 'cpu', '--cfg-options',
            'train_dataset.test_fraction=0.5', 'val_dataset.test_fraction=0.5',
            'val_dataset.subset_fraction=0.3']


def _stand_in(kind: str) -> tuple[dict, dict]:
    """A tiny network's backbone weights and the checkpoint its authors' code would save."""
    if kind == 'hcsc':
        net = source_network('resnet18')
        body = {k: v for k, v in net.state_dict().items() if not k.startswith('fc.')}
        return body, hcsc(body, 'resnet18')
    body = vit_source(kind).state_dict()
    return body, VIT_LAYOUTS[kind](body)


@pytest.fixture
def served(tmp_path, monkeypatch):
    """The repository's entries of CASES, served from 127.0.0.1, in an index of their own."""
    server, url = _serve({})
    entries, bodies = [], {}
    for name, (kind, _) in CASES.items():
        entry = dict(read_index(INDEX_PATH)[name])
        body, checkpoint = _stand_in(kind)
        path = tmp_path / entry['file']
        torch.save(checkpoint, path)
        data = path.read_bytes()
        source = HF_SOURCE.fullmatch(entry['urls'][0])
        if source:  # the same repository and file, at the test's commit
            server.hub[source['repo'], REVISION, source['file']] = data
            entry.update(urls=[f'hf://{source["repo"]}/{source["file"]}@{REVISION}'],
                         sha256=hashlib.sha256(data).hexdigest())
        else:
            server.files[entry['file']] = data
            entry.update(urls=[f'{url}/{entry["file"]}'])
        entries.append(entry)
        bodies[name] = body
    index = tmp_path / 'models.yaml'
    index.write_text(yaml.safe_dump({'models': entries}))
    monkeypatch.setenv('IFND_ZOO_INDEX', str(index))
    monkeypatch.setenv('IFND_HOME', str(tmp_path / 'home'))
    monkeypatch.setenv('HF_ENDPOINT', url)
    monkeypatch.setenv('HF_HOME', str(tmp_path / 'hf_home'))  # no user token or cache is read
    monkeypatch.delenv('IFND_ZOO_URL', raising=False)
    yield bodies
    server.shutdown()


@pytest.mark.parametrize('name', list(CASES))
def test_knn_eval_from_the_zoo_name(served, name):
    entry = zoo.info(name)
    assert entry['max_size'] and entry['published_in']['commit']
    knn_eval = _tool('knn_eval')
    trust = []
    if not entry.get('sha256'):  # the authors publish no checksum: trusted once, on request
        assert entry['checksum'] == 'none'
        with pytest.raises(SystemExit, match=f'{name}: its authors publish no checksum.*--trust-remote'):
            knn_eval.main(['--zoo', name, *KNN_DATA])
        trust = ['--trust-remote']
    result = knn_eval.main(['--zoo', name, *trust, *KNN_DATA])
    assert result['zoo'] == name and result['checkpoint'] == osp.join(zoo.cache_dir(), entry['file'])
    assert result['feature_dim'] == CASES[name][1]
    assert result['top1']['5'] > 20  # ten classes: far above chance even with random weights
    # Verified from now on (a recorded SHA-256 where none is published): no flag needed.
    assert knn_eval.main(['--zoo', name, *KNN_DATA])['top1'] == result['top1']
    with pytest.raises(SystemExit, match='a checkpoint file or --zoo NAME'):
        knn_eval.main([result['checkpoint'], '--zoo', name, *KNN_DATA])


def test_linear_evaluation_from_the_zoo_name(served, tmp_path):
    name = 'moco_v3_vits16_300e_in1k'
    linear = osp.join(REPO, 'configs', 'benchmarks', 'linear', 'linear_r18_100e_digits.py')
    run = tmp_path / 'linear'
    with pytest.raises(SystemExit, match=f'^error: model.pretrained=zoo:{name}: {name}: its authors publish '
                       'no checksum.*--trust-remote[^\n]*$'):
        _tool('train').main([linear, '--work-dir', str(run), '--cfg-options', f'model.pretrained=zoo:{name}'])
    zoo.download(name, trust=True, progress=False)  # once, as ifnd-zoo download --trust-remote
    _tool('train').main([linear, '--work-dir', str(run), '--cfg-options', f'model.pretrained=zoo:{name}',
                         'train_cfg.max_epochs=1', 'train_cfg.val_interval=1'])
    state = torch.load(run / 'epoch_1.pth', weights_only=False)['state_dict']
    body = served[name]
    assert all(torch.equal(state[f'backbone.model.{k}'], v) for k, v in body.items()), 'frozen, as loaded'
    assert state['head.0.weight'].shape == (10, CASES[name][1])
