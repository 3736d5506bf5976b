"""The clustering round: the function PseudoLabelHook and the clustering benchmark both run."""
import json
import math
import types

import numpy as np
import pytest
import torch
from helpers import TINY_BACKBONE, TINY_NECK, digits_config, train_tool
from mmengine.logging import MMLogger
from mmengine.registry import init_default_scope

import ifnd.hooks.pseudo_label_hook as pseudo_label_hook
from ifnd.clustering import (LinearAcceptance, check_round_options, clustering_round, confidence,
                             plan_round, round_kmeans_options, round_seed)
from ifnd.registry import HOOKS, MODELS, RUNNERS

KMEANS = dict(niter=10, nredo=2, max_points_per_centroid=20, backend='torch')


def _load_benchmark():
    from benchmarks import clustering_cost
    return clustering_cost


def _keep_extracted_features(monkeypatch) -> list:
    """The features of every round the hook runs, as it extracted them."""
    extracted = []
    extract = pseudo_label_hook.extract_features

    def keep(*args, **kwargs):
        feats, true_labels = extract(*args, **kwargs)
        extracted.append(feats.clone())
        return feats, true_labels

    monkeypatch.setattr(pseudo_label_hook, 'extract_features', keep)
    return extracted


def test_hook_and_benchmark_run_the_same_round():
    assert pseudo_label_hook.clustering_round is clustering_round
    assert _load_benchmark().clustering_round is clustering_round


def test_hook_round_in_a_run_equals_the_function_on_its_features(tmp_path, monkeypatch):
    """A real short run: every round's labels, κ, centroids and statistics are those of
    clustering_round on the features the hook extracted."""
    extracted = _keep_extracted_features(monkeypatch)
    hook = dict(num_clusters=[5, 12], interval=1, acceptance=dict(type='LinearAcceptance'), seed=3,
                kmeans=KMEANS)
    cfg = digits_config(str(tmp_path), dict(type='IFND', temperature=0.5), max_epochs=2,
                        pseudo_labels=hook)
    cfg.train_dataloader.dataset.subset_fraction = 0.2
    runner = RUNNERS.build(cfg)
    runner.train()
    rounds = json.load(open(tmp_path / 'pseudo_labels' / 'rounds.json'))
    assert [r['epoch'] for r in rounds] == [0, 1, 2] and len(extracted) == 3
    for feats, stats in zip(extracted, rounds):
        epoch = stats['epoch']
        acceptance = LinearAcceptance()
        acceptance.set_epoch(epoch, 2)
        result = clustering_round(feats, [5, 12], acceptance=acceptance, temperature=0.5,
                                  seed=round_seed(3, epoch),
                                  kmeans=check_round_options('kappa', KMEANS)[0])
        saved = np.load(tmp_path / 'pseudo_labels' / f'epoch_{epoch:04d}.npz')
        np.testing.assert_array_equal(saved['labels'], result.labels.numpy())
        for level in range(2):
            np.testing.assert_array_equal(saved[f'assignments_{level}'],
                                          result.assignments[level].numpy())
            np.testing.assert_array_equal(saved[f'score_{level}'], result.scores[level].numpy())
            np.testing.assert_array_equal(saved[f'centroids_{level}'],
                                          result.centroids[level].numpy())
            # The hook adds the clusters' quality against the classes to the round's statistics
            # (rounds.json writes the +inf smallest score of a round accepting nothing as null).
            expected = {key: value if math.isfinite(value) else None
                        for key, value in result.stats['levels'][level].items()}
            assert stats['levels'][level].items() >= expected.items()
            assert {'nmi', 'mtpr', 'mtnr'} <= stats['levels'][level].keys()
        assert (stats['kmeans_backend'], stats['kmeans_processes']) == ('torch', 1)
    bank = runner.model.label_bank.labels.cpu()
    assert bank.equal(torch.from_numpy(saved['labels']))


def _round_with(tmp_path, **hook_options) -> dict:
    """One hook round on a Digits subset; returns its saved arrays."""
    init_default_scope('ifnd')
    torch.manual_seed(0)
    model = MODELS.build(dict(type='IFND', temperature=0.5, backbone=TINY_BACKBONE, neck=TINY_NECK))
    hook = HOOKS.build(dict(type='PseudoLabelHook', num_clusters=[5],
                            acceptance=dict(type='ConstantAcceptance', final_rate=0.5), num_workers=0, batch_size=64, kmeans=KMEANS,
                            dataset=dict(type='Digits', split='train', subset_fraction=0.2),
                            pipeline=dict(type='EvalView', size=16), **hook_options))
    runner = types.SimpleNamespace(
        model=model, max_epochs=10, work_dir=str(tmp_path), logger=MMLogger.get_instance('ifnd-test'),
        visualizer=types.SimpleNamespace(add_scalars=lambda *args, **kwargs: None))
    model.label_bank.reset(1, 269)
    hook.run_round(runner, 1)
    saved = np.load(tmp_path / 'pseudo_labels' / 'epoch_0001.npz')
    return {key: saved[key] for key in saved.files}


def test_hook_temperature_is_the_kappa_temperature(tmp_path, monkeypatch):
    extracted = _keep_extracted_features(monkeypatch)
    default = _round_with(tmp_path / 'default')  # None: the model's loss temperature, 0.5
    same = _round_with(tmp_path / 'same', temperature=0.5)
    sharp = _round_with(tmp_path / 'sharp', temperature=0.05)
    for key in default:
        np.testing.assert_array_equal(same[key], default[key])
    assert all(feats.equal(extracted[0]) for feats in extracted)
    np.testing.assert_array_equal(sharp['assignments_0'], default['assignments_0'])
    for saved, tau in ((default, 0.5), (sharp, 0.05)):
        kappa = confidence(extracted[0], torch.from_numpy(saved['centroids_0']),
                           torch.from_numpy(saved['assignments_0']), tau)
        np.testing.assert_array_equal(saved['score_0'], kappa.numpy())
    assert not np.array_equal(sharp['score_0'], default['score_0'])


def test_hook_refuses_bad_temperature_and_unknown_keys(tmp_path):
    init_default_scope('ifnd')
    with pytest.raises(ValueError, match=r'PseudoLabelHook temperature must be a float >= 0\.001, got 0\.0'):
        HOOKS.build(dict(type='PseudoLabelHook', num_clusters=[5], temperature=0.0))
    with pytest.raises(TypeError, match='temprature'):
        HOOKS.build(dict(type='PseudoLabelHook', num_clusters=[5], temprature=0.1))
    cfg = digits_config(str(tmp_path / 'run'), dict(type='IFND', temperature=0.5),
                        pseudo_labels=dict(num_clusters=[5]))
    cfg.dump(str(tmp_path / 'cfg.py'))
    with pytest.raises(SystemExit) as exit_info:
        train_tool.main([str(tmp_path / 'cfg.py'), '--cfg-options',
                         'custom_hooks.0.temprature=0.1'])
    assert "custom_hooks.0 has no 'temprature'" in str(exit_info.value.code)
    with pytest.raises(SystemExit) as exit_info:
        train_tool.main([str(tmp_path / 'cfg.py'), '--cfg-options',
                         'custom_hooks.0.temperature=cold'])
    assert "'custom_hooks.0.temperature' must be" in str(exit_info.value.code)


def test_round_options_are_checked_once_up_front(capsys):
    """A bad k-means option stops the hook's construction and the benchmark's start, not a
    round."""
    init_default_scope('ifnd')
    for kmeans, error, match in [(dict(backend='fais'), ValueError, 'unknown k-means backend'),
                                 (dict(niter=0), ValueError, 'niter and nredo must be >= 1'),
                                 (dict(init='kmeans++'), ValueError, 'unknown k-means init'),
                                 (dict(nredos=2), TypeError, 'unknown kmeans options'),
                                 (dict(seed=1), ValueError, 'kmeans.seed is set by')]:
        with pytest.raises(error, match=match):
            HOOKS.build(dict(type='PseudoLabelHook', num_clusters=[5], kmeans=kmeans))
    with pytest.raises(ValueError, match='score must be one of'):
        HOOKS.build(dict(type='PseudoLabelHook', num_clusters=[5], score='entropy'))
    bench = _load_benchmark()
    with pytest.raises(SystemExit):
        bench.parse_args(['--num-samples', '50', '--ks', '5', '--max-points-per-centroid', '0'])
    assert 'max_points_per_centroid must be >= 1' in capsys.readouterr().err
    options, sharded = check_round_options('pcl', dict(nredo=2, sharded=False))
    assert options['nredo'] == 2 and options['niter'] == 20 and sharded is False
    assert set(options) | {'sharded'} == set(round_kmeans_options())


def test_plan_round():
    assert plan_round('faiss', None, 'cpu', 2) == ('faiss', False)
    assert plan_round('torch', None, 'cpu', 2) == ('torch', True)
    assert plan_round('torch', None, 'cpu', 1) == ('torch', False)
    assert plan_round('auto', True, 'cuda:0', 2) == ('torch', True)
