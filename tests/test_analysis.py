"""Analysis computations (t-SNE, cluster quality through training, k-means NMI table) and tools."""
import csv
import importlib.util
import json
import math
import os.path as osp
import subprocess

import numpy as np
import pytest
import torch
from sklearn.datasets import make_blobs
from sklearn.metrics import (adjusted_mutual_info_score, adjusted_rand_score,
                             normalized_mutual_info_score)

from helpers import TINY_NECK, digits_config, run_script
from ifnd.datasets import Digits
from ifnd.evaluation import cluster_quality_table, nmi_curve, read_round, tsne_embedding
from ifnd.evaluation.analysis import (analysis_dataset, load_feature_model, match_clusters_to_classes,
                                      member_centroids, round_files, sample_indices)
from ifnd.fileio import checkpoint_config
from ifnd.registry import MODELS

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
TOOLS = osp.join(REPO, 'tools', 'analysis')


def write_round(folder, epoch: int, truth: np.ndarray, ks, rate: float, dim: int,
                seed: int, score_key: str = 'score') -> None:
    """A round file in PseudoLabelHook's format; assignments follow the truth 70% of the time.
    ``score_key='confidence'``: as rounds were saved before the scores had their name."""
    rng = np.random.default_rng(seed)
    num = len(truth)
    saved, labels = {}, []
    for level, k in enumerate(ks):
        assign = np.where(rng.random(num) < 0.7, truth % k, rng.integers(0, k, num))
        conf = rng.random(num).astype(np.float32)
        accepted = -(np.arange(num) + 1)  # unique negative labels for unaccepted samples
        top = np.argsort(-conf)[:math.ceil(rate * num)]
        accepted[top] = assign[top]
        cents = rng.normal(size=(k, dim)).astype(np.float32)
        saved[f'assignments_{level}'] = assign
        saved[f'{score_key}_{level}'] = conf
        saved[f'centroids_{level}'] = cents / np.linalg.norm(cents, axis=1, keepdims=True)
        labels.append(accepted)
    folder.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(folder / f'epoch_{epoch:04d}.npz', labels=np.stack(labels),
                        true_labels=truth, num_clusters=np.array(ks), rate=rate, epoch=epoch,
                        **saved)


def brute_force_rates(pseudo: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """MTPR / MTNR (percent) straight from their definitions, with an N x N loop."""
    same_g = truth[:, None] == truth[None, :]
    same_y = pseudo[:, None] == pseudo[None, :]
    off_diag = ~np.eye(len(truth), dtype=bool)
    tpr = (same_g & same_y & off_diag).sum(1) / (same_g & off_diag).sum(1)
    tnr = (~same_g & ~same_y).sum(1) / (~same_g).sum(1)
    return 100 * tpr.mean(), 100 * tnr.mean()


@pytest.fixture
def rounds_dir(tmp_path):
    """A work dir with three rounds (saved out of order), a leftover temp file and rounds.json."""
    truth = np.repeat(np.arange(4), 15)
    folder = tmp_path / 'run' / 'pseudo_labels'
    for epoch, rate in ((4, 1.0), (0, 0.0), (2, 0.5)):
        write_round(folder, epoch, truth, (3, 6), rate, dim=8, seed=epoch)
    (folder / 'epoch_0006.npz.tmp.npz').write_bytes(b'interrupted save')
    (folder / 'rounds.json').write_text(json.dumps([{'epoch': 0, 'levels': []}]))
    return tmp_path / 'run'


def test_nmi_curve_equals_direct_computation(rounds_dir):
    rows = nmi_curve(str(rounds_dir))
    assert [(r.epoch, r.level, r.k) for r in rows] == [(e, lvl, k) for e in (0, 2, 4)
                                                        for lvl, k in enumerate((3, 6))]
    assert nmi_curve(str(rounds_dir / 'pseudo_labels')) == rows  # the folder itself works too
    for row in rows:
        with np.load(rounds_dir / 'pseudo_labels' / f'epoch_{row.epoch:04d}.npz') as data:
            truth, assign = data['true_labels'], data[f'assignments_{row.level}']
            used = data['labels'][row.level]
            assert row.rate == pytest.approx(float(data['rate']))
        assert row.nmi == pytest.approx(normalized_mutual_info_score(truth, assign), abs=1e-12)
        assert row.ami == pytest.approx(adjusted_mutual_info_score(truth, assign), abs=1e-12)
        assert row.ari == pytest.approx(adjusted_rand_score(truth, assign), abs=1e-12)
        mtpr, mtnr = brute_force_rates(used, truth)
        assert (row.mtpr, row.mtnr) == (pytest.approx(mtpr), pytest.approx(mtnr))
    first = [r for r in rows if r.epoch == 0]
    assert all(r.mtpr == 0 and r.mtnr == 100 for r in first)  # nothing accepted: instance labels


def test_round_reading_errors(tmp_path, rounds_dir):
    with pytest.raises(FileNotFoundError, match='no clustering rounds'):
        round_files(str(tmp_path))
    with pytest.raises(FileNotFoundError, match='not a folder'):
        nmi_curve(str(tmp_path / 'missing'))
    bad = tmp_path / 'bad' / 'epoch_0001.npz'
    bad.parent.mkdir()
    np.savez(bad, labels=np.zeros((1, 3)))
    with pytest.raises(ValueError, match='missing true_labels'):
        read_round(str(bad))
    unlabelled = tmp_path / 'unlabelled'
    write_round(unlabelled, 0, np.full(20, -1), (2, ), 0.5, dim=4, seed=0)
    with pytest.raises(ValueError, match='ground-truth'):
        nmi_curve(str(unlabelled))
    rnd = read_round(str(rounds_dir / 'pseudo_labels' / 'epoch_0002.npz'))
    assert rnd['epoch'] == 2 and rnd['num_clusters'] == [3, 6]
    assert rnd['centroids'][1].shape == (6, 8) and rnd['scores'][1].shape == (60,)
    former = tmp_path / 'former'
    write_round(former, 0, np.zeros(20, dtype=int), (2, ), 0.5, dim=4, seed=0, score_key='confidence')
    assert read_round(str(former / 'epoch_0000.npz'))['scores'][0].shape == (20,)


def test_cluster_quality_table_on_separated_blobs():
    feats, labels = make_blobs(n_samples=300, centers=4, n_features=16, cluster_std=0.3,
                               center_box=(-20, 20), random_state=0)
    mean, std = cluster_quality_table(feats, labels, num_classes=4, runs=3, seed=0)
    assert mean == pytest.approx(1.0, abs=1e-6) and std == pytest.approx(0.0, abs=1e-6)
    mean_t, _ = cluster_quality_table(torch.from_numpy(feats), torch.from_numpy(labels), 4, runs=1,
                                      backend='torch', nredo=2)
    assert mean_t == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError, match='labels must be'):
        cluster_quality_table(feats, labels[:10], 4)
    with pytest.raises(ValueError, match='runs'):
        cluster_quality_table(feats, labels, 4, runs=0)


def test_tsne_shapes_and_seed():
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(80, 64)).astype(np.float32)  # D > 50: reduced by PCA first
    extra = rng.normal(size=(3, 64)).astype(np.float32)
    coords, idx = tsne_embedding(feats, num_points=50, seed=1, extra=extra, max_iter=250,
                                 threads=1)
    assert coords.shape == (53, 2) and idx.shape == (50, )
    assert len(np.unique(idx)) == 50 and np.all(np.diff(idx) > 0) and idx.max() < 80
    again, idx_again = tsne_embedding(feats, num_points=50, seed=1, extra=extra, max_iter=250,
                                      threads=1)
    np.testing.assert_array_equal(idx, idx_again)
    np.testing.assert_allclose(coords, again)
    assert not np.array_equal(idx, sample_indices(80, 50, seed=2))  # the sample follows the seed
    small, all_idx = tsne_embedding(torch.from_numpy(feats[:10, :5]), num_points=100, seed=0,
                                    max_iter=250, threads=1)
    assert small.shape == (10, 2) and np.array_equal(all_idx, np.arange(10))
    with pytest.raises(ValueError, match='dimension'):
        tsne_embedding(feats, 20, extra=extra[:, :4])


def test_colour_matching_and_member_centroids():
    truth = np.array([0, 0, 1, 1, 2, 2])
    clusters = np.array([2, 2, 0, 0, 1, -5])  # cluster 2 = class 0, 0 = class 1, 1 = class 2
    np.testing.assert_array_equal(match_clusters_to_classes(clusters, truth, 3, 3), [1, 2, 0])
    # More clusters than classes: majority class, several clusters may share it.
    np.testing.assert_array_equal(
        match_clusters_to_classes(np.array([0, 1, 2, 3, 3, 3]), truth, 4, 3, one_to_one=False),
        [0, 0, 1, 2])
    feats = np.array([[1.0, 0], [3.0, 0], [0, 2.0]])
    ids, cents = member_centroids(feats, np.array([1, 1, 3]), num_clusters=4)
    np.testing.assert_array_equal(ids, [1, 3])
    np.testing.assert_allclose(cents, [[1, 0], [0, 1]])
    assert np.array_equal(sample_indices(5, 10), np.arange(5))


# ----------------------------------------------------------------------------- tools, end to end


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
    """A random IFND checkpoint (tiny ResNet, digits) with its config, and two fake rounds."""
    root = tmp_path_factory.mktemp('analysis')
    cfg = digits_config(str(root), dict(type='IFND', temperature=0.5),
                        pseudo_labels=dict(num_clusters=[10, 20], interval=1))
    cfg.train_dataloader.dataset.subset_fraction = 0.25  # 337 images: quick to encode
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    ckpt = root / 'epoch_1.pth'
    torch.save({'meta': {'cfg': cfg.pretty_text, 'epoch': 1}, 'state_dict': model.state_dict()},
               ckpt)
    truth = Digits(split='train', subset_fraction=0.25).labels
    for epoch, rate in ((0, 0.0), (1, 0.5)):
        write_round(root / 'pseudo_labels', epoch, truth, (10, 20), rate, TINY_NECK['out_dim'],
                    epoch)
    backbone_only = root / 'backbone.pth'
    torch.save({'state_dict': {f'backbone.model.{k}': v
                               for k, v in model.backbone.model.state_dict().items()}},
               backbone_only)
    cfg.dump(str(root / 'train_config.py'))  # the data come from a config, not the checkpoint
    return root, ckpt, backbone_only


def _tool(name: str, *args: str) -> subprocess.CompletedProcess:
    done = run_script(osp.join(TOOLS, f'{name}.py'), *args)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def _load_tool(name: str):
    spec = importlib.util.spec_from_file_location(f'analysis_{name}', osp.join(TOOLS, f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_feature_model_and_dataset_from_checkpoint(tiny_run):
    root, ckpt, backbone_only = tiny_run
    config = str(root / 'train_config.py')
    with pytest.raises(ValueError, match='pass the training config'):
        load_feature_model(str(ckpt), feature=None)
    loaded = load_feature_model(str(ckpt), feature=None, config=config)
    assert loaded.feature == 'z' and loaded.meta['epoch'] == 1  # the hook's feature
    assert type(loaded.model).__name__ == 'IFND'
    dataset = analysis_dataset(loaded.cfg)
    assert len(dataset) == len(Digits(split='train', subset_fraction=0.25)) == 337
    assert dataset[0]['inputs'][0].shape == (3, 16, 16)  # eval view, one per image
    with pytest.raises(ValueError, match='takes no data_root'):
        analysis_dataset(loaded.cfg, data_root='/nowhere')
    assert checkpoint_config(torch.load(ckpt, weights_only=True)).model.type == 'IFND'
    with pytest.raises(ValueError, match='weights do not match'):
        load_feature_model(str(backbone_only), 'z', config)


def test_plot_embeddings_tool(tiny_run, tmp_path):
    root, ckpt, _ = tiny_run
    out = tmp_path / 'emb.png'
    rounds = [root / 'pseudo_labels' / f'epoch_000{e}.npz' for e in (0, 1)]
    done = _tool('plot_embeddings', ckpt, '--config', root / 'train_config.py', '--rounds', *rounds, '--out', out, '--num-points', 100,
                 '--tsne-iter', 250, '--num-workers', 0, '--level', 1, '--threads', 1)
    assert out.stat().st_size > 10_000 and out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    # Round 1 ran on the checkpoint's own model: its saved centroids; round 0: member means.
    assert 'round after epoch 1: k=20, rate 0.50, 20 centroids (saved by the round)' in done.stdout
    assert 'round after epoch 0: k=20' in done.stdout and 'mean of sampled members' in done.stdout
    # Backbone features, no rounds: one panel (in-process, same code path).
    result = _load_tool('plot_embeddings').main(
        [str(ckpt), '--config', str(root / 'train_config.py'), '--feature', 'f', '--out', str(tmp_path / 'f.png'), '--num-points', '60',
         '--tsne-iter', '250', '--num-workers', '0', '--threads', '1'])
    assert result['coords'].shape == (60, 2) and (tmp_path / 'f.png').stat().st_size > 5_000


def test_plot_embeddings_rejects_rounds_of_another_data_set(tiny_run, tmp_path):
    root, ckpt, _ = tiny_run
    config = str(root / 'train_config.py')
    write_round(tmp_path / 'other', 0, np.arange(50) % 10, (10, ), 0.5, 32, 0)
    tool = _load_tool('plot_embeddings')
    with pytest.raises(SystemExit, match='another run or data set'):
        tool.main([str(ckpt), '--config', config, '--rounds', str(tmp_path / 'other' / 'epoch_0000.npz'), '--out',
                   str(tmp_path / 'x.png')])
    with pytest.raises(SystemExit, match='levels'):
        tool.main([str(ckpt), '--config', config, '--rounds', str(root / 'pseudo_labels' / 'epoch_0000.npz'),
                   '--level', '5', '--out', str(tmp_path / 'x.png')])


def test_cluster_quality_curve_tool(tiny_run, tmp_path):
    root = tiny_run[0]
    out, table = tmp_path / 'curve.png', tmp_path / 'curve.csv'
    done = _tool('cluster_quality_curve', root, '--out', out, '--csv', table)
    assert out.stat().st_size > 10_000 and 'figure written' in done.stdout
    with open(table) as f:
        rows = list(csv.DictReader(f))
    expected = nmi_curve(str(root))
    assert len(rows) == len(expected) == 4
    for row, ref in zip(rows, expected):
        assert int(row['epoch']) == ref.epoch and int(row['k']) == ref.k
        assert float(row['nmi']) == pytest.approx(ref.nmi, rel=1e-5)
    # Several runs, one level: in-process.
    runs = _load_tool('cluster_quality_curve').main(
        [str(root), str(root / 'pseudo_labels'), '--labels', 'a', 'b', '--k', '20', '--out',
         str(tmp_path / 'two.png')])
    assert list(runs) == ['a', 'b'] and all(r.k == 20 for r in runs['a'])


def test_cluster_table_tool(tiny_run, tmp_path):
    root, ckpt, _ = tiny_run
    out = tmp_path / 'table.md'
    done = _tool('cluster_table', ckpt, '--config', root / 'train_config.py', '--out', out, '--runs', 2, '--num-workers', 0,
                 '--kmeans-backend', 'faiss', '--names', 'random IFND')
    text = out.read_text()
    assert '| random IFND | 1 | f (64-d) | Digits train, 337 images | 10 |' in text, text
    assert ' ± ' in text and text.strip() in done.stdout


def test_tools_help():
    for name in ('plot_embeddings', 'cluster_quality_curve', 'cluster_table'):
        with pytest.raises(SystemExit) as exit_info:
            _load_tool(name).parse_args(['--help'])
        assert exit_info.value.code == 0
