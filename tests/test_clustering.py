"""k-means backends, confidence, concentration and acceptance against direct computations."""
import importlib
import math
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import HostSyncOps
from sklearn.metrics import adjusted_rand_score

from ifnd.clustering import (KMeansResult, assign_by_cosine, build_acceptance, choose_backend,
                             cluster_confidence, confidence, kmeans, multi_level_kmeans,
                             pcl_concentration, resolve_backend)
from ifnd.clustering.torch_kmeans import torch_kmeans

faiss = pytest.importorskip('faiss')
# The module (ifnd.clustering's attribute `kmeans` is the function of that name).
kmeans_module = importlib.import_module('ifnd.clustering.kmeans')


@pytest.fixture(autouse=True, scope='module')
def _single_thread():
    """Tiny problems: extra OpenMP threads only add barrier waits on a busy 2-core machine."""
    torch_threads, faiss_threads = torch.get_num_threads(), faiss.omp_get_max_threads()
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    yield
    torch.set_num_threads(torch_threads)
    faiss.omp_set_num_threads(faiss_threads)


def _blobs(num_blobs=5, per_blob=80, dim=16, noise=0.05, seed=0):
    """Well-separated Gaussian blobs on the unit sphere, shuffled."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((num_blobs, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    truth = np.repeat(np.arange(num_blobs), per_blob)
    x = centres[truth] + noise * rng.standard_normal((truth.size, dim))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    order = rng.permutation(truth.size)
    return x[order].astype(np.float32), truth[order]


@pytest.mark.parametrize('init', ['random', 'k-means++'])
def test_faiss_and_torch_agree_on_blobs(init):
    x, truth = _blobs()
    res_f = kmeans(x, 5, backend='faiss', init=init, seed=3)
    res_t = kmeans(torch.from_numpy(x), 5, backend='torch', init=init, seed=3)
    for res, name in ((res_f, 'faiss'), (res_t, 'torch')):
        assert isinstance(res, KMeansResult) and res.backend == name
        assert res.centroids.shape == (5, 16) and res.centroids.dtype == torch.float32
        assert res.assignments.shape == (len(x), ) and res.assignments.dtype == torch.int64
        torch.testing.assert_close(res.centroids.norm(dim=1), torch.ones(5))
        assert adjusted_rand_score(truth, res.assignments.numpy()) == 1.0
    assert adjusted_rand_score(res_f.assignments.numpy(), res_t.assignments.numpy()) == 1.0
    assert math.isclose(res_f.objective, res_t.objective, rel_tol=1e-4)
    # The objective is Σ ||x - c_a||² over normalised features and returned centroids.
    direct = ((torch.from_numpy(x) - res_t.centroids[res_t.assignments]) ** 2).sum()
    assert math.isclose(res_t.objective, float(direct), rel_tol=1e-4)
    # Assignments are by cosine similarity with the returned centroids.
    assert res_t.assignments.equal((torch.from_numpy(x) @ res_t.centroids.t()).argmax(1))


def test_torch_kmeans_deterministic_subsampled_and_auto():
    x, _ = _blobs(num_blobs=3, per_blob=120, dim=8, noise=0.3, seed=1)
    # 360 points > 3 * 50: training runs on a seeded sample, assignments cover everything.
    a = kmeans(x, 3, backend='torch', seed=7, max_points_per_centroid=50, min_points_per_centroid=1)
    b = kmeans(x, 3, backend='torch', seed=7, max_points_per_centroid=50, min_points_per_centroid=1)
    assert a.assignments.equal(b.assignments) and a.centroids.equal(b.centroids)
    assert a.assignments.shape == (360, )
    f = kmeans(x, 3, backend='faiss', seed=7, max_points_per_centroid=50,
               min_points_per_centroid=1)
    assert f.assignments.shape == (360, )
    assert kmeans(x, 3, backend='auto', nredo=1, niter=2).backend == 'faiss'
    # Empty clusters are re-seeded: duplicated points with k equal to the distinct count.
    dup = np.repeat(x[:4], 10, axis=0)
    res = kmeans(dup, 4, backend='torch', nredo=1, min_points_per_centroid=1)
    assert adjusted_rand_score(np.repeat(np.arange(4), 10), res.assignments.numpy()) == 1.0


def _lloyd_syncs(points: torch.Tensor, k: int, **options) -> tuple[dict, torch.Tensor]:
    """Host-sync ops of the torch k-means at 2 and at 10 Lloyd iterations, and the centroids."""
    syncs, centroids, max_points = {}, None, options.pop('max_points', 1000)
    for niter in (2, 10):
        with HostSyncOps() as mode:
            centroids = torch_kmeans(points, k, niter, 3, max_points, seed=5, verbose=False,
                                      **options)
        syncs[niter] = len(mode.seen)
    return syncs, centroids


@pytest.mark.parametrize('init', ['random', 'k-means++'])
def test_torch_kmeans_iterations_make_no_host_sync(init):
    x, _ = _blobs(num_blobs=4, per_blob=60, dim=8, noise=0.2)
    # Repeated points with more clusters than distinct points: every step re-seeds empty clusters.
    dup = F.normalize(torch.from_numpy(np.repeat(x[:6], 20, axis=0)), dim=1)
    for points, k in ((torch.from_numpy(x), 4), (dup, 9)):
        syncs, centroids = _lloyd_syncs(points, k, init=init)
        assert syncs == {2: 0, 10: 0}, syncs
        assert torch.isfinite(centroids).all()
    syncs, _ = _lloyd_syncs(torch.from_numpy(x), 4, init=init, max_points=10)  # a training sample
    assert syncs == {2: 0, 10: 0}, syncs
    # The public entry point reads its results on the host a fixed number of times.
    counts = []
    for niter in (2, 10):
        with HostSyncOps() as mode:
            kmeans(x, 4, backend='torch', init=init, niter=niter, nredo=2)
        counts.append(len(mode.seen))
    assert counts[0] == counts[1] <= 2, counts


@pytest.mark.parametrize('device, faiss_gpu, installed, expected', [
    ('cuda:0', True, True, 'faiss'),  # faiss's GPU build on the GPU
    ('cuda:1', False, True, 'torch'),  # faiss-cpu only: PyTorch on the GPU beats faiss on the CPU
    ('cuda', False, False, 'torch'),
    ('mps', False, True, 'torch'),  # other accelerators: faiss has no build for them
    ('cpu', False, True, 'faiss'),
    ('cpu', False, False, 'torch'),  # faiss not installed
])
def test_choose_backend(device, faiss_gpu, installed, expected):
    offers = {'installed': {'faiss': installed}, 'gpu': {'faiss': faiss_gpu}}
    assert choose_backend(torch.device(device), **offers) == expected
    assert choose_backend(device, **offers) == expected
    assert choose_backend(device, shards=True, **offers) == 'torch'  # the one that shards


def test_resolve_backend_and_result_device(monkeypatch):
    monkeypatch.setattr(kmeans_module, 'faiss_gpu_available', lambda: True)
    assert resolve_backend('auto', 'cuda:0') == 'faiss'
    monkeypatch.setattr(kmeans_module, 'faiss_gpu_available', lambda: False)
    assert resolve_backend('auto', 'cuda:0') == 'torch'
    assert resolve_backend('auto', 'cpu') == 'faiss'
    assert resolve_backend('torch', 'cpu') == 'torch'
    with pytest.raises(ValueError, match='unknown k-means backend'):
        resolve_backend('sklearn', 'cpu')
    x, _ = _blobs(num_blobs=2, per_blob=10, dim=4)
    for backend in ('faiss', 'torch'):
        res = kmeans(x, 2, backend=backend, device='cpu', nredo=1, min_points_per_centroid=1)
        assert (res.backend, res.device, res.num_shards) == (backend, 'cpu', 1)
    with pytest.raises(ValueError, match='sharded k-means'):
        kmeans(x, 2, backend='faiss', sample_index=torch.arange(len(x)))
    with pytest.raises(ValueError, match='sample_index must be'):
        kmeans(x, 2, sample_index=torch.arange(3))
    # One process given its "shard" (everything, shuffled): the same as the plain torch run.
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    plain = kmeans(x, 2, backend='torch', nredo=2, min_points_per_centroid=1)
    shard = kmeans(x[perm.numpy()], 2, nredo=2, min_points_per_centroid=1, sample_index=perm)
    assert shard.centroids.equal(plain.centroids) and shard.backend == 'torch'
    assert shard.assignments.equal(plain.assignments[perm])


def test_kmeans_errors_and_warnings(monkeypatch):
    x, _ = _blobs(num_blobs=2, per_blob=5, dim=4)
    with pytest.raises(ValueError, match=r'11 clusters from 10 samples'):
        kmeans(x, 11, backend='torch')
    with pytest.raises(ValueError, match='positive'):
        kmeans(x, 0)
    with pytest.raises(ValueError, match='backend'):
        kmeans(x, 2, backend='sklearn')
    with pytest.warns(UserWarning, match='points per centroid'):
        kmeans(x, 2, backend='torch', nredo=1, niter=2)
    monkeypatch.setitem(sys.modules, 'faiss', None)  # makes `import faiss` fail
    with pytest.raises(ImportError, match='pip install faiss-cpu'):
        kmeans(x, 2, backend='faiss', min_points_per_centroid=1)
    assert kmeans(x, 2, backend='auto', min_points_per_centroid=1, nredo=1).backend == 'torch'


def test_multi_level_kmeans():
    x, _ = _blobs(num_blobs=4, per_blob=30, dim=8, noise=0.2)
    results = multi_level_kmeans(x, [2, 4, 6], seed=5, backend='torch', nredo=2,
                                 min_points_per_centroid=1)
    assert [r.num_clusters for r in results] == [2, 4, 6]
    assert all(int(r.assignments.max()) < r.num_clusters for r in results)
    with pytest.raises(TypeError):
        multi_level_kmeans(x, [2], niters=3)


def test_assign_by_cosine_chunked():
    g = torch.Generator().manual_seed(0)
    x, c = torch.randn(257, 7, generator=g), torch.randn(9, 7, generator=g)
    expected = (F.normalize(x.double(), dim=1) @ F.normalize(c.double(), dim=1).t()).argmax(1)
    assert assign_by_cosine(x, c, chunk_size=20).equal(expected)
    assert assign_by_cosine(x.numpy(), c.numpy()).equal(expected)


def test_confidence_matches_direct_softmax():
    g = torch.Generator().manual_seed(1)
    z, c = torch.randn(301, 10, generator=g), torch.randn(13, 10, generator=g) * 3
    assign = torch.randint(0, 13, (301, ), generator=g)
    tau = 0.2
    cos = F.normalize(z.double(), dim=1) @ F.normalize(c.double(), dim=1).t()
    expected = torch.softmax(cos / tau, dim=1)[torch.arange(301), assign]
    got = confidence(z, c, assign, tau, chunk_size=32)
    assert got.shape == (301, ) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-7)


def test_pcl_concentration_matches_loop_reference():
    rng = np.random.default_rng(2)
    k, tau, alpha = 12, 0.2, 10
    x = rng.standard_normal((200, 6)).astype(np.float32)
    c = rng.standard_normal((k, 6)).astype(np.float32)
    assign = rng.integers(0, k - 2, 200)
    assign[0] = k - 2  # a singleton cluster; cluster k-1 stays empty
    # PCL's official loop.
    density = np.zeros(k)
    for j in range(k):
        dist = [np.linalg.norm(x[i].astype(np.float64) - c[j]) for i in range(200)
                if assign[i] == j]
        if len(dist) > 1:
            density[j] = np.mean(dist) / np.log(len(dist) + alpha)
    dmax = density.max()
    for j in range(k):
        if np.sum(assign == j) <= 1:
            density[j] = dmax
    density = density.clip(np.percentile(density, 10), np.percentile(density, 90))
    density = tau * density / density.mean()
    got = pcl_concentration(torch.from_numpy(x), torch.from_numpy(c), torch.from_numpy(assign),
                            tau, alpha)
    np.testing.assert_allclose(got.numpy(), density, rtol=1e-5)
    conf = cluster_confidence(got, torch.from_numpy(assign))
    np.testing.assert_allclose(conf.numpy(), -density[assign], rtol=1e-5)


def _reference_accept(assign, conf, rate):
    n = len(assign)
    take = math.ceil(round(rate * n, 6))
    order = sorted(range(n), key=lambda i: (-conf[i], i))[:take]
    labels = [-(i + 1) for i in range(n)]
    for i in order:
        labels[i] = int(assign[i])
    return labels, (min(conf[i] for i in order) if order else math.inf)


def accept_labels(assignments, scores, rate):
    """The calendar's acceptance at ``rate``, as a round asks it."""
    acceptance = build_acceptance(dict(type='ConstantAcceptance', final_rate=rate), 'test')
    acceptance.set_epoch(0, 1)
    return acceptance.accept(0, assignments, scores, int(assignments.max()) + 1)


@pytest.mark.parametrize('rate', [0.0, 0.05, 0.25, 0.3, 0.5, 0.999, 1.0])
def test_accept_labels_matches_sort(rate):
    g = torch.Generator().manual_seed(3)
    n = 40
    assign = torch.randint(0, 5, (n, ), generator=g)
    conf = torch.round(torch.rand(n, generator=g) * 8) / 8  # many ties
    labels, threshold = accept_labels(assign, conf, rate)
    ref_labels, ref_threshold = _reference_accept(assign.tolist(), conf.tolist(), rate)
    assert labels.tolist() == ref_labels and threshold == ref_threshold
    accepted = labels >= 0
    assert int(accepted.sum()) == math.ceil(round(rate * n, 6))
    rejected = labels[~accepted]
    assert rejected.unique().numel() == rejected.numel()
    assert not torch.isin(rejected, assign).any()
    if rate == 0.0:
        assert threshold == math.inf and labels.equal(-(torch.arange(n) + 1))
    if rate == 1.0:
        assert labels.equal(assign)


def test_accept_labels_ceil_rule_and_errors():
    assign = torch.zeros(10, dtype=torch.long)
    conf = torch.linspace(0, 1, 10)
    assert int((accept_labels(assign, conf, 0.3)[0] >= 0).sum()) == 3  # not 4 by float error
    assert int((accept_labels(assign, conf, 0.25)[0] >= 0).sum()) == 3  # ceil(2.5)
    assert int((accept_labels(assign, conf, 0.01)[0] >= 0).sum()) == 1
    with pytest.raises(ValueError, match=r'test ConstantAcceptance final_rate must be a float in \[0, 1\]'):
        accept_labels(assign, conf, 1.5)
    with pytest.raises(ValueError, match='cluster assignments must be >= 0'):
        accept_labels(assign - 1, conf, 0.5)


def rate_at(epoch: int, max_epochs: int, kind: str = 'LinearAcceptance', **settings) -> float:
    """The share a calendar scheme accepts after ``epoch`` of ``max_epochs`` epochs."""
    acceptance = build_acceptance(dict(type=kind, **settings), 'test')
    acceptance.set_epoch(epoch, max_epochs)
    return acceptance.rate


def test_acceptance_rate_schedules():
    assert rate_at(0, 100) == 0.0
    assert rate_at(50, 100) == 0.5
    assert rate_at(150, 100) == 1.0
    assert rate_at(50, 100, final_rate=0.6) == pytest.approx(0.3)
    assert rate_at(-5, 100) == 0.0
    assert rate_at(3, 100, 'ConstantAcceptance', final_rate=0.7) == 0.7
    assert rate_at(19, 100, 'StepAcceptance', step_epoch=20) == 0.0
    assert rate_at(20, 100, 'StepAcceptance', final_rate=0.9, step_epoch=20) == 0.9
    assert rate_at(5, 100, interval=3) == 0.03  # the rate of the last update, after 3 epochs
    with pytest.raises(ValueError, match='type must be one of'):
        rate_at(1, 10, 'CosineAcceptance')
    with pytest.raises(ValueError, match='final_rate'):
        rate_at(1, 10, final_rate=1.2)
