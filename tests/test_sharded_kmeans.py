"""k-means sharded over two gloo processes gives the one-process centroids and labels."""
import os
import types

import numpy as np
import pytest
import torch
import torch.distributed as dist
from helpers import TINY_BACKBONE, TINY_NECK, HostSyncOps, end_gloo_worker, free_port, run_ranks
from mmengine.logging import MMLogger
from mmengine.registry import init_default_scope

from ifnd.clustering import accept_count, accept_top, confidence, multi_level_kmeans, pcl_concentration
from ifnd.dist import gather_shards, shard_index
from ifnd.registry import HOOKS, MODELS

WORLD_SIZE = 2
KS = [4, 6, 15]
# 40 points per centroid: the levels with k 6 and 15 train on a seeded sample of the points.
OPTIONS = dict(niter=8, nredo=2, max_points_per_centroid=40, min_points_per_centroid=1,
               backend='torch')
NUM_DIGITS = 269  # Digits train split at subset_fraction 0.2


def _features() -> dict[str, torch.Tensor]:
    """Six well-separated blobs plus 10% uniform noise (odd N: shards of unequal length), and
    a set of six points repeated many times (random init draws duplicates: empty clusters)."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((6, 16)) * 3
    blobs = centres[rng.integers(0, 6, 901)] + rng.standard_normal((901, 16))
    noise = rng.uniform(-4, 4, (100, 16))
    x = np.concatenate([blobs, noise])[rng.permutation(1001)]
    dup = np.repeat(rng.standard_normal((6, 16)), 40, axis=0)[rng.permutation(240)]
    return {'blobs': torch.from_numpy(x).float(), 'duplicates': torch.from_numpy(dup).float()}


def _cluster(x: torch.Tensor, init: str, sharded: bool) -> list[tuple]:
    """Per level: centroids, all assignments, objective, and the labels accepted at rate 0.4."""
    index = shard_index(len(x)) if sharded else None
    part = x[index] if sharded else x
    ks = KS if len(x) > 300 else [6]
    out = []
    for res in multi_level_kmeans(part, ks, seed=11, init=init, sample_index=index, **OPTIONS):
        kappa = confidence(part, res.centroids, res.assignments, 0.2)
        phi = pcl_concentration(part, res.centroids, res.assignments, 0.2, sharded=sharded)
        assignments, kappa = gather_shards(res.assignments, len(x)), gather_shards(kappa, len(x))
        labels = accept_top(assignments, kappa, accept_count(0.4, len(x)))[0]
        out.append((res.centroids, assignments, res.objective, labels, phi, res.num_shards))
    return out


def _all_cases(sharded: bool) -> dict:
    return {f'{name}-{init}': _cluster(x, init, sharded)
            for name, x in _features().items() for init in ('random', 'k-means++')}


def _hook_round(work_dir: str) -> tuple[torch.Tensor, dict]:
    init_default_scope('ifnd')
    torch.manual_seed(0)
    model = MODELS.build(dict(type='IFND', temperature=0.5, backbone=TINY_BACKBONE, neck=TINY_NECK))
    hook = HOOKS.build(dict(type='PseudoLabelHook', num_clusters=[5, 10],
                            acceptance=dict(type='ConstantAcceptance', final_rate=0.6),
                            dataset=dict(type='Digits', split='train', subset_fraction=0.2),
                            pipeline=dict(type='EvalView', size=16), batch_size=64,
                            num_workers=0, save_labels=False,
                            kmeans=dict(niter=10, nredo=2, max_points_per_centroid=20,
                                        backend='torch')))
    runner = types.SimpleNamespace(
        model=model, max_epochs=10, work_dir=work_dir, logger=MMLogger.get_instance('ifnd-test'),
        visualizer=types.SimpleNamespace(add_scalars=lambda *args, **kwargs: None))
    model.label_bank.reset(2, NUM_DIGITS)
    stats = hook.run_round(runner, 1)
    return model.label_bank.labels.clone(), stats


def _sharded_lloyd_syncs() -> dict:
    """Host-sync ops of this rank's sharded torch k-means at 2 and 10 Lloyd iterations, on all
    the points and on a training sample of them (k-means++ on repeated points: empty clusters)."""
    from ifnd.clustering.torch_kmeans import torch_kmeans
    x = _features()['duplicates']
    index = shard_index(len(x))
    points = torch.nn.functional.normalize(x[index], dim=1)
    counts = {}
    for max_points in (1000, 20):
        for niter in (2, 10):
            with HostSyncOps() as mode:
                torch_kmeans(points, 9, niter, 2, max_points, seed=3, init='k-means++',
                             verbose=False, sample_index=index, num=len(x))
            counts[max_points, niter] = len(mode.seen)
    return counts


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group('gloo', rank=rank, world_size=WORLD_SIZE)
    result = {'cases': _all_cases(sharded=True),
              'hook': _hook_round(out_dir),
              'syncs': _sharded_lloyd_syncs()}
    if rank == 0:
        torch.save(result, os.path.join(out_dir, 'sharded.pt'))
    end_gloo_worker()


@pytest.fixture(scope='module')
def two_processes(tmp_path_factory):
    """The results of the two-process run (one spawn for all the comparisons)."""
    out_dir = tmp_path_factory.mktemp('sharded')
    run_ranks(_worker, (free_port(), str(out_dir)), WORLD_SIZE)
    return torch.load(out_dir / 'sharded.pt', weights_only=False)


def test_sharded_kmeans_matches_one_process(two_processes):
    torch.set_num_threads(1)
    one = _all_cases(sharded=False)
    assert one.keys() == two_processes['cases'].keys()
    for case, levels in one.items():
        for level, (single, sharded) in enumerate(zip(levels, two_processes['cases'][case])):
            where = f'{case} level {level}'
            cents, assign, objective, labels, phi, shards = single
            assert shards == 1 and sharded[5] == WORLD_SIZE
            # float64 sums make the centroids bitwise equal; the similarity matrix products
            # may round a row differently depending on how many rows one BLAS call gets, hence
            # the objective's tolerance.
            assert sharded[0].equal(cents), where
            assert sharded[1].equal(assign), where
            assert sharded[2] == pytest.approx(objective, rel=1e-6), where
            assert sharded[3].equal(labels), where
            torch.testing.assert_close(sharded[4], phi, rtol=1e-6, atol=0, msg=where)
    # The blobs are found: the 6-cluster level puts each blob in one cluster.
    assert len(torch.unique(one['blobs-random'][1][1])) == 6


def test_sharded_lloyd_iterations_make_no_host_sync(two_processes):
    syncs = two_processes['syncs']
    assert syncs[1000, 2] == syncs[1000, 10] == 0, syncs
    # Picking this rank's points of the training sample (and their positions) reads how many
    # there are, once before the steps.
    assert syncs[20, 2] == syncs[20, 10] <= 2, syncs


def test_sharded_hook_round_matches_one_process(two_processes, tmp_path):
    torch.set_num_threads(1)
    labels, stats = _hook_round(str(tmp_path))
    sharded_labels, sharded_stats = two_processes['hook']
    assert sharded_labels.equal(labels)
    assert (labels >= 0).float().mean().item() == pytest.approx(0.6, abs=0.01)
    assert (stats['kmeans_backend'], stats['kmeans_device'], stats['kmeans_processes']) == \
        ('torch', 'cpu', 1)
    assert sharded_stats['kmeans_processes'] == WORLD_SIZE
    # Sizes, κ thresholds, NMI and MTPR/MTNR of rank 0 cover all the samples.
    assert sharded_stats['levels'] == stats['levels']


def test_hook_plans_backend_and_sharding(monkeypatch):
    import importlib
    hook_module = importlib.import_module('ifnd.hooks.pseudo_label_hook')
    monkeypatch.setattr(importlib.import_module('ifnd.clustering.kmeans'), 'faiss_gpu_available',
                        lambda: False)

    def plan(world_size, device, **kmeans):
        monkeypatch.setattr(hook_module, 'get_world_size', lambda: world_size)
        hook = HOOKS.build(dict(type='PseudoLabelHook', num_clusters=[2], kmeans=kmeans))
        return hook._plan(torch.device(device))

    assert plan(1, 'cpu') == ('faiss', False)
    assert plan(2, 'cpu') == ('faiss', False)  # CPU processes: faiss, features gathered on rank 0
    assert plan(2, 'cuda:0') == ('torch', True)  # no faiss GPU build: sharded over the GPUs
    assert plan(1, 'cuda:0') == ('torch', False)
    assert plan(2, 'cuda:0', sharded=False) == ('torch', False)
    assert plan(2, 'cpu', sharded=True) == ('torch', True)
    assert plan(2, 'cpu', backend='torch') == ('torch', True)
    with pytest.raises(ValueError, match='sharded=True runs PyTorch k-means'):
        plan(2, 'cpu', backend='faiss', sharded=True)
    with pytest.raises(ValueError, match='kmeans.sample_index is set by PseudoLabelHook'):
        plan(2, 'cpu', sample_index=[0])
    with pytest.raises(ValueError, match='kmeans.sharded must be'):
        plan(2, 'cpu', sharded='yes')
