"""Metrics against brute-force computations."""
import numpy as np
import pytest
import torch
from sklearn.metrics import (adjusted_mutual_info_score, adjusted_rand_score,
                             normalized_mutual_info_score)

from ifnd.evaluation import cluster_quality, false_negative_rates, knn_accuracy, knn_classify


def _brute_force_rates(y, g):
    """MTPR / MTNR by counting every pair (anchors with an empty denominator left out)."""
    n = len(y)
    tprs, tnrs = [], []
    for i in range(n):
        pos = [j for j in range(n) if j != i and g[j] == g[i]]
        neg = [j for j in range(n) if g[j] != g[i]]
        if pos:
            tprs.append(sum(y[j] == y[i] for j in pos) / len(pos))
        if neg:
            tnrs.append(sum(y[j] != y[i] for j in neg) / len(neg))
    return 100 * np.mean(tprs), 100 * np.mean(tnrs)


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_false_negative_rates_matches_pair_counts(seed):
    rng = np.random.default_rng(seed)
    n = 150
    g = rng.integers(-3, 6, n)
    g[0] = 100  # a class of one: no TPR denominator for that anchor
    y = rng.integers(0, 8, n)
    rejected = rng.random(n) < 0.4
    y[rejected] = -(np.flatnonzero(rejected) + 1)  # unique labels of rejected samples
    got = false_negative_rates(y, torch.from_numpy(g))
    ref = _brute_force_rates(y.tolist(), g.tolist())
    np.testing.assert_allclose(got, ref, rtol=1e-12)


def test_false_negative_rates_special_cases():
    g = np.array([0, 0, 1, 1, 1, 2])
    assert false_negative_rates(-(np.arange(6) + 1), g) == (0.0, 100.0)  # instance labels
    assert false_negative_rates(g, g) == (100.0, 100.0)
    mtpr, mtnr = false_negative_rates(np.zeros(6, dtype=int), g)  # one cluster
    assert (mtpr, mtnr) == (100.0, 0.0)
    mtpr, mtnr = false_negative_rates(np.array([1, 2]), np.array([0, 0]))
    assert mtpr == 0.0 and np.isnan(mtnr)  # no anchor has a negative
    with pytest.raises(ValueError):
        false_negative_rates(np.zeros(3), np.zeros(4))


def test_cluster_quality_matches_sklearn():
    rng = np.random.default_rng(4)
    g, y = rng.integers(0, 5, 300), rng.integers(0, 7, 300)
    y[:150] = g[:150]
    got = cluster_quality(torch.from_numpy(g), y)
    assert got['nmi'] == pytest.approx(normalized_mutual_info_score(g, y))
    assert got['ami'] == pytest.approx(adjusted_mutual_info_score(g, y))
    assert got['ari'] == pytest.approx(adjusted_rand_score(g, y))
    assert cluster_quality(g, g) == pytest.approx({'nmi': 1.0, 'ami': 1.0, 'ari': 1.0})


def _brute_force_knn(train, labels, test, num_classes, k, temperature):
    train = train / np.linalg.norm(train, axis=1, keepdims=True)
    test = test / np.linalg.norm(test, axis=1, keepdims=True)
    preds = []
    for row in test:
        sims = train @ row
        top = np.argsort(-sims, kind='stable')[:k]
        votes = np.zeros(num_classes)
        for j in top:
            votes[labels[j]] += np.exp(sims[j] / temperature)
        preds.append(int(np.argmax(votes)))
    return np.array(preds)


@pytest.mark.parametrize('k', [1, 5, 20])
def test_knn_classify_matches_brute_force(k):
    rng = np.random.default_rng(5)
    num_classes = 4
    centres = rng.standard_normal((num_classes, 12))
    labels = rng.integers(0, num_classes, 200)
    train = centres[labels] + 1.5 * rng.standard_normal((200, 12))
    test_labels = rng.integers(0, num_classes, 70)
    test = centres[test_labels] + 1.5 * rng.standard_normal((70, 12))
    ref = _brute_force_knn(train, labels, test, num_classes, k, 0.07)
    got = knn_classify(torch.from_numpy(train).float(), torch.from_numpy(labels),
                       torch.from_numpy(test).float(), num_classes, k=k, chunk_size=16)
    assert got.dtype == torch.int64 and got.tolist() == ref.tolist()
    acc = knn_accuracy(train.astype(np.float32), labels, test.astype(np.float32), test_labels,
                       num_classes, k=k, chunk_size=16)
    assert acc == pytest.approx(100.0 * np.mean(ref == test_labels))


def test_knn_errors():
    x = torch.randn(5, 3)
    with pytest.raises(ValueError, match=r'kNN k must be an int in \[1, 5\], got 6: neighbours among the 5'):
        knn_classify(x, torch.zeros(5, dtype=torch.long), x, 2, k=6)
    with pytest.raises(ValueError):
        knn_classify(x, torch.full((5, ), 3), x, 2, k=2)
