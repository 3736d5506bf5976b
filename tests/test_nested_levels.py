"""Nested clustering levels (HCSC's hierarchical k-means) as an option of the clustering round:
labels against a brute-force composition, κ and φ per level against a direct computation, two
processes against one, every acceptance scheme, the label bank's parent maps and a resumed run."""
import json
import math
import os
import shutil
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist
from helpers import TINY_BACKBONE, TINY_NECK, digits_config, end_gloo_worker, free_port, run_ranks, train_error
from mmengine.registry import init_default_scope

from ifnd.clustering import (ConstantAcceptance, broadcast_round, build_acceptance,
                             clustering_round, kmeans, nested_kmeans, pad_levels, pad_parents)
from ifnd.clustering.kmeans import _LEVEL_SEED_STRIDE
from ifnd.dist import shard_index
from ifnd.fileio import check_state_fits
from ifnd.registry import MODELS, RUNNERS

KS = [24, 9, 3]
KMEANS = dict(niter=6, nredo=2, max_points_per_centroid=40, backend='torch')
TAU = 0.2


def _features(num: int = 401) -> torch.Tensor:
    """Unit features around eight centres (odd N: shards of unequal length)."""
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(8, 16, generator=g) * 2
    x = centres[torch.randint(0, 8, (num,), generator=g)] + torch.randn(num, 16, generator=g)
    return torch.nn.functional.normalize(x, dim=1)


def _round(x: torch.Tensor, acceptance=None, num_samples: int | None = None, **options):
    if acceptance is None:
        acceptance = ConstantAcceptance(final_rate=0.5)
        acceptance.set_epoch(0, 1)
    return clustering_round(x, KS, acceptance=acceptance, temperature=TAU, seed=5, kmeans=KMEANS,
                            concentration_temperature=TAU, num_samples=num_samples,
                            hierarchy='nested', **options)


@pytest.mark.parametrize('backend', ['torch', 'faiss'])
def test_labels_equal_a_brute_force_composition(backend):
    """Each upper level is k-means on the finer level's centroids; every sample's label is composed
    through the parent maps by explicit loops; no level warns about points per centroid."""
    x = _features()
    options = dict(KMEANS, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # the upper levels have few points per centroid
        nested = nested_kmeans(x, KS, seed=7, **options)
    labels = kmeans(x, KS[0], seed=7, **options).assignments.tolist()
    points = nested[0].centroids
    for level, k in enumerate(KS[1:], start=1):
        upper = kmeans(points, k, seed=7 + level * _LEVEL_SEED_STRIDE, min_points_per_centroid=0,
                       **options)
        parent = upper.assignments.tolist()
        labels = [parent[label] for label in labels]
        assert nested[level].centroids.equal(upper.centroids)
        assert nested[level].parents.tolist() == parent
        assert nested[level].assignments.tolist() == labels
        points = upper.centroids
    assert nested[0].parents is None and [r.num_clusters for r in nested] == KS


def test_kappa_and_phi_per_level_from_the_composed_clusters():
    """κ: the softmax over the level's centroids at the composed cluster; φ: PCL's estimate from the
    samples composed into each cluster; the round's parents are the k-means' parent maps."""
    x = _features()
    result = _round(x)
    assert result.stats['hierarchy'] == 'nested' and result.parents[-1] is None
    for level, k in enumerate(KS):
        cents, assigned = result.centroids[level].double(), result.assignments[level]
        if level + 1 < len(KS):
            assert result.assignments[level + 1].equal(result.parents[level][assigned])
        logits = x.double() @ cents.t() / TAU
        kappa = (logits.gather(1, assigned[:, None]) - logits.logsumexp(1, keepdim=True)).exp()
        torch.testing.assert_close(result.scores[level].double(), kappa[:, 0], rtol=1e-5, atol=1e-6)
        phi = np.zeros(k)
        counts = np.bincount(assigned.numpy(), minlength=k)
        for c in range(k):
            members = x.double()[assigned == c]
            if len(members) > 1:
                distance = (members - cents[c]).norm(dim=1).sum().item()
                phi[c] = distance / (len(members) * math.log(len(members) + 10))
        phi[counts <= 1] = phi[counts > 1].max()
        phi = phi.clip(np.percentile(phi, 10), np.percentile(phi, 90))
        np.testing.assert_allclose(result.concentrations[level].numpy(), TAU * phi / phi.mean(),
                                   rtol=1e-5)


WORLD_SIZE = 2


def _one_round(sharded: bool) -> dict:
    """The round's labels and what the label bank gets (broadcast from rank 0)."""
    x = _features()
    index = shard_index(len(x)) if sharded else None
    result = _round(x[index] if sharded else x, num_samples=len(x) if sharded else None)
    labels, centroids, concentration, parents = broadcast_round(result, KS, len(x), x.shape[1],
                                                                'cpu')
    return dict(labels=labels, centroids=centroids, concentration=concentration, parents=parents,
                processes=result.stats['kmeans_processes'])


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group('gloo', rank=rank, world_size=WORLD_SIZE)
    for sharded in (True, False):  # sharded k-means, and features gathered on rank 0
        torch.save(_one_round(sharded), os.path.join(out_dir, f'sharded_{sharded}_{rank}.pt'))
    end_gloo_worker()


def test_two_processes_give_the_labels_centroids_concentrations_and_parents_of_one(tmp_path):
    run_ranks(_worker, (free_port(), str(tmp_path)), WORLD_SIZE)
    torch.set_num_threads(1)
    one = _one_round(sharded=False)
    assert one['processes'] == 1 and (one['parents'][:2, :KS[0]] >= 0).any()
    for sharded in (True, False):
        for rank in range(WORLD_SIZE):  # what each process's label bank gets
            two = torch.load(tmp_path / f'sharded_{sharded}_{rank}.pt')
            assert two['processes'] == (WORLD_SIZE if sharded else 1)
            for key in ('labels', 'centroids', 'parents'):
                assert two[key].equal(one[key]), (sharded, rank, key)
            torch.testing.assert_close(two['concentration'], one['concentration'], rtol=1e-6,
                                       atol=0)


@pytest.mark.parametrize('scheme', [dict(type='LinearAcceptance'),
                                    dict(type='StepAcceptance', step_epoch=1, final_rate=0.6),
                                    dict(type='ConstantAcceptance', final_rate=0.4),
                                    dict(type='ConfidentAcceptance', certainty_share=0.3),
                                    dict(type='StableAcceptance')])
def test_every_acceptance_scheme_accepts_nested_labels(scheme):
    """Each scheme accepts composed clusters at every level (StableAcceptance from the second
    round on, matching each level's clusters with the previous round's)."""
    x = _features()
    acceptance = build_acceptance(scheme, 'PseudoLabelHook acceptance')
    for round_number in range(2):
        acceptance.set_epoch(round_number + 1, 2)
        result = clustering_round(x, KS, acceptance=acceptance, temperature=TAU,
                                  seed=round_number, kmeans=KMEANS, hierarchy='nested')
    for level, (labels, assigned) in enumerate(zip(result.labels, result.assignments)):
        kept = labels >= 0
        assert kept.any(), (scheme, level)
        assert labels[kept].equal(assigned[kept])
        assert labels[~kept].equal(-(torch.nonzero(~kept)[:, 0] + 1))


def _bank_model(hierarchy: str):
    """An IFND model whose label bank holds a nested (or independent) round's output."""
    init_default_scope('ifnd')
    model = MODELS.build(dict(type='IFND', temperature=0.5, backbone=TINY_BACKBONE, neck=TINY_NECK))
    x = _features(90)
    acceptance = ConstantAcceptance(final_rate=0.5)
    acceptance.set_epoch(0, 1)
    result = clustering_round(x, KS, acceptance=acceptance, temperature=TAU, seed=0, kmeans=KMEANS,
                              hierarchy=hierarchy)
    model.label_bank.update(result.labels, *pad_levels(result.centroids, result.concentrations),
                            KS, pad_parents(result.parents, KS, 'cpu'))
    return model, result


def test_the_bank_holds_padded_parents_and_loads_checkpoints_without_them():
    """bank.parents [levels, k_max]: a nested level's map, -1 beyond k, at the coarsest level and
    at every independent level; a checkpoint from before the parents (or before MoCo's queued
    classes) passes the checkpoint checks and loads them as -1."""
    model, result = _bank_model('nested')
    bank = model.label_bank
    assert bank.parents.dtype == torch.long and bank.parents.shape == (3, KS[0])
    assert bank.has_parents == [True, True, False]
    for level, k in enumerate(KS[:-1]):
        assert bank.parents[level, :k].equal(result.parents[level])
        assert (bank.parents[level, k:] == -1).all()
    assert (bank.parents[-1] == -1).all()
    independent = _bank_model('independent')[0].label_bank
    assert (independent.parents == -1).all() and independent.has_parents == [False] * 3

    state = model.state_dict()
    del state['label_bank.parents']
    fresh = _bank_model('independent')[0]
    fresh.label_bank.reset(1, 5)  # other shapes: the checkpoint's are adopted
    check_state_fits(fresh, state, 'old.pth')
    fresh.load_state_dict(state)
    assert fresh.label_bank.labels.equal(bank.labels)
    assert fresh.label_bank.parents.equal(torch.full((3, KS[0]), -1))
    assert fresh.label_bank.has_parents == [False] * 3

    moco = MODELS.build(dict(type='IFNDMoCo', temperature=0.2, queue_len=32, backbone=TINY_BACKBONE,
                             neck=TINY_NECK))
    state = moco.state_dict()
    del state['queue_label']
    check_state_fits(moco, state, 'old_moco.pth')
    moco.load_state_dict(state)
    assert (moco.queue_label == -1).all()


def _nested_config(work_dir, **overrides):
    hook = dict(num_clusters=[20, 8, 3], hierarchy='nested', interval=1, seed=1,
                acceptance=dict(type='StableAcceptance'), kmeans=dict(KMEANS))
    cfg = digits_config(str(work_dir), dict(type='IFND', temperature=0.5), max_epochs=2,
                        pseudo_labels=hook, **overrides)
    cfg.train_dataloader.dataset.subset_fraction = 0.2
    return cfg


def test_a_nested_run_resumes_to_the_bit(tmp_path):
    """A short run on digits with nested levels, and the same run resumed from its first epoch's
    checkpoint: the same weights, labels, parent maps and saved rounds."""
    first = RUNNERS.build(_nested_config(tmp_path / 'first'))
    first.train()
    bank = first.model.label_bank
    assert bank.has_parents == [True, True, False] and bank.any_accepted
    saved = np.load(tmp_path / 'first' / 'pseudo_labels' / 'epoch_0002.npz')
    assert {'parents_0', 'parents_1'} <= set(saved.files) and 'parents_2' not in saved.files
    for level in range(2):
        np.testing.assert_array_equal(saved[f'parents_{level}'][saved[f'assignments_{level}']],
                                      saved[f'assignments_{level + 1}'])
        np.testing.assert_array_equal(saved[f'parents_{level}'],
                                      bank.parents[level, :len(saved[f'parents_{level}'])].numpy())
    rounds = json.load(open(tmp_path / 'first' / 'pseudo_labels' / 'rounds.json'))
    assert [r['hierarchy'] for r in rounds] == ['nested'] * 3

    (tmp_path / 'second').mkdir()
    checkpoint = tmp_path / 'second' / 'from_epoch_1.pth'
    shutil.copy(tmp_path / 'first' / 'epoch_1.pth', checkpoint)
    second = RUNNERS.build(_nested_config(tmp_path / 'second', load_from=str(checkpoint),
                                          resume=True))
    second.train()
    # The checkpoint's nested labels were taken up, not clustered again at the resume.
    assert sorted(os.listdir(tmp_path / 'second' / 'pseudo_labels')) == ['epoch_0002.npz',
                                                                         'rounds.json']
    ends = [torch.load(tmp_path / run / 'epoch_2.pth', weights_only=False)['state_dict']
            for run in ('first', 'second')]
    assert ends[0].keys() == ends[1].keys() and 'label_bank.parents' in ends[0]
    for key in ends[0]:
        assert ends[0][key].equal(ends[1][key]), key
    resumed = np.load(tmp_path / 'second' / 'pseudo_labels' / 'epoch_0002.npz')
    assert set(resumed.files) == set(saved.files)
    for key in saved.files:
        np.testing.assert_array_equal(resumed[key], saved[key], err_msg=key)


def test_nested_levels_that_do_not_decrease_are_refused_in_one_line(tmp_path):
    cfg = _nested_config(tmp_path / 'run')
    cfg.dump(str(tmp_path / 'cfg.py'))
    message = train_error(str(tmp_path / 'cfg.py'), '--cfg-options',
                          'custom_hooks.0.num_clusters=[5, 10]')
    assert message == ("error: PseudoLabelHook hierarchy='nested' clusters each level's centroids "
                       'into the next level, so num_clusters must decrease strictly (fine to '
                       'coarse), got [5, 10]: write it e.g. as [100, 30, 10]')
    message = train_error(str(tmp_path / 'cfg.py'), '--cfg-options', 'custom_hooks.0.hierarchy=tree')
    assert message == ("error: PseudoLabelHook hierarchy must be one of 'independent', 'nested', "
                       "got 'tree'")
