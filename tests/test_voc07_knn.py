"""VOC07 linear-SVM transfer and offline kNN: the tools end to end, checked against independent code."""
import contextlib
import importlib.util
import io
import json
import os.path as osp

import numpy as np
import pytest
import torch
from fake_data import fake_vocdevkit
from helpers import TINY_BACKBONE, digits_config
from sklearn.metrics import average_precision_score
from sklearn.model_selection import cross_val_score
from sklearn.neighbors import KNeighborsClassifier
from sklearn.svm import LinearSVC

from ifnd.datasets import VOC07, VOC_CLASSES, Digits, EvalView
from ifnd.engine import extract_features
from ifnd.evaluation import (evaluate_voc07, train_svms, voc07_average_precision,
                             voc07_mean_average_precision)
from ifnd.models.encoder import load_encoder
from ifnd.registry import MODELS, RUNNERS

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
PREPROCESSOR = dict(type='ContrastiveDataPreprocessor', mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
COSTS = [0.1, 1.0, 10.0]
EVAL_16 = dict(type='EvalView', size=16)
NUM_TRAINVAL, NUM_TEST = 36, 24


def _load_tool(name):
    """Import tools/<name>.py as a module (the folder is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f'tool_{name}', osp.join(REPO, 'tools', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- independent references

def devkit_11point_ap(scores, targets):
    """VOC2007 devkit's VOCevalcls, line by line: difficult images are neither TP nor FP."""
    order = np.argsort(-scores, kind='stable')
    gt = targets[order]
    tp, fp = np.cumsum(gt > 0), np.cumsum(gt < 0)
    rec = tp / np.sum(gt > 0)
    with np.errstate(invalid='ignore'):
        prec = tp / (fp + tp)  # 0/0 at a leading difficult image: NaN, skipped by MATLAB's max
    ap = 0.0
    for t in np.arange(11) / 10:  # the devkit's 0:0.1:1
        p = prec[rec >= t]
        p = p[~np.isnan(p)]
        ap += (p.max() if p.size else 0.0) / 11
    return 100 * ap


def fair_ssl_ap(scores, targets):
    """fair-ssl's get_precision_recall + calculate_ap on the non-difficult images."""
    keep = targets != 0
    hits = (targets[keep] > 0)[np.argsort(scores[keep])[::-1]].astype(float)
    prec = np.cumsum(hits) / np.arange(1, len(hits) + 1)
    rec = np.cumsum(hits) / hits.sum()
    mrec, mpre = np.r_[0, rec, 1], np.r_[0, prec, 0]
    for i in range(len(mpre) - 2, -1, -1):
        mpre[i] = max(mpre[i], mpre[i + 1])
    idx = np.flatnonzero(mrec[1:] != mrec[:-1]) + 1
    return 100 * float(np.sum((mrec[idx] - mrec[idx - 1]) * mpre[idx]))


def sklearn_ap(scores, targets):
    """scikit-learn's non-interpolated AP with the difficult images dropped."""
    keep = targets != 0
    return 100 * average_precision_score(targets[keep] == 1, scores[keep])


# ----------------------------------------------------------------------------- fixtures

def _tiny_checkpoint(path):
    """A backbone-only file in the layout ``load_encoder`` reads (weights + model config)."""
    torch.manual_seed(0)
    cfg = dict(TINY_BACKBONE, cifar_stem=False)  # the standard stem: 4x fewer activations
    backbone = MODELS.build(cfg)
    torch.save({'state_dict': {'backbone.model.' + k: v for k, v in backbone.model.state_dict().items()},
                'meta': {'model': {'backbone': cfg, 'data_preprocessor': PREPROCESSOR}}}, path)
    return str(path)


@pytest.fixture(scope='module')
def voc_run(tmp_path_factory):
    """The VOC07 tool run once, from its command line, on a generated VOCdevkit."""
    root = tmp_path_factory.mktemp('voc')
    data_root, splits = fake_vocdevkit(root, np.random.default_rng(0), NUM_TRAINVAL, NUM_TEST)
    ckpt = _tiny_checkpoint(root / 'tiny.pth')
    out = root / 'out' / 'voc07.json'
    argv = [ckpt, '--data-root', data_root, '--costs', *map(str, COSTS), '--size', '32', '--batch-size', '16',
            '--num-workers', '0', '--jobs', '1', '--device', 'cpu', '--per-class', '--out', str(out)]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):  # in-process: the interpreter start would double the cost
        returned = _load_tool('voc07_svm').main(argv)
    with open(out) as f:
        result = json.load(f)
    assert result == json.loads(json.dumps(returned))
    return dict(data_root=data_root, splits=splits, ckpt=ckpt, result=result, stdout=stdout.getvalue())


@pytest.fixture(scope='module')
def voc_features(voc_run):
    """Features of both splits, computed apart from the tool."""
    encoder = load_encoder(voc_run['ckpt'])
    feats = {}
    for split in ('trainval', 'test'):
        data = VOC07(voc_run['data_root'], split, pipeline=EvalView(32))
        f, _ = extract_features(encoder, data, feature='f', batch_size=16, num_workers=0)
        f = f.double().numpy()
        feats[split] = f / np.linalg.norm(f, axis=1, keepdims=True)  # as the SVM code does
    return feats


# ----------------------------------------------------------------------------- AP definitions

@pytest.mark.parametrize('interpolation', ['all-point', '11-point', 'none'])
def test_average_precision_hand_made_cases(interpolation):
    def ap(scores, targets):
        return voc07_average_precision(np.array(scores, float), np.array(targets), interpolation)

    assert ap([4, 3, 2, 1], [1, 1, -1, -1]) == pytest.approx(100)  # perfect ranking
    assert ap([9, 4, 3], [0, 1, -1]) == pytest.approx(100)  # a difficult image on top is ignored
    assert ap([1, 1], [1, -1]) == pytest.approx(50)  # a tie counts as one threshold
    worst = {'all-point': 50, '11-point': 50, 'none': 100 * (0.5 / 3 + 0.5 / 2)}
    assert ap([4, 3, 2, 1], [-1, -1, 1, 1]) == pytest.approx(worst[interpolation])
    # precision 1, 1/2, 1/3, 1/2 at recall 1/2, 1/2, 1/2, 1
    middle = {'all-point': 75, '11-point': 100 * (6 + 5 * 0.5) / 11, 'none': 75}
    assert ap([4, 3, 2, 1], [1, -1, -1, 1]) == pytest.approx(middle[interpolation])
    with pytest.raises(ValueError, match='positive'):
        ap([1, 2], [-1, 0])


def test_11point_counts_a_recall_of_exactly_three_tenths():
    # 10 positives; precision 1 up to recall 0.3, then 3 negatives: the envelope at t = 0.3 is 1.
    targets = np.array([1] * 3 + [-1] * 3 + [1] * 7)
    scores = -np.arange(len(targets), dtype=float)
    ap = voc07_average_precision(scores, targets, '11-point')
    assert ap == pytest.approx(devkit_11point_ap(scores, targets))
    assert ap == pytest.approx(100 * (4 + 7 * 10 / 13) / 11)


def test_average_precision_matches_references_on_random_cases():
    rng = np.random.default_rng(1)
    for _ in range(50):
        num = int(rng.integers(3, 80))
        targets = rng.choice([1, -1, 0], size=num, p=[0.3, 0.55, 0.15])
        targets[0] = 1
        scores = rng.normal(size=num)
        assert voc07_average_precision(scores, targets, 'none') == pytest.approx(sklearn_ap(scores, targets))
        assert voc07_average_precision(scores, targets, '11-point') == pytest.approx(
            devkit_11point_ap(scores, targets))
        assert voc07_average_precision(scores, targets, 'all-point') == pytest.approx(
            fair_ssl_ap(scores, targets))
        rounded = np.round(scores, 1)  # ties: still scikit-learn's value
        assert voc07_average_precision(rounded, targets, 'none') == pytest.approx(
            sklearn_ap(rounded, targets))


# ----------------------------------------------------------------------------- data set

def test_voc07_dataset_reads_the_devkit(voc_run):
    ids, targets = voc_run['splits']['test']
    data = VOC07(voc_run['data_root'], 'test', pipeline=EvalView(32))
    assert len(data) == NUM_TEST and data.image_ids == ids and data.classes == list(VOC_CLASSES)
    np.testing.assert_array_equal(data.targets, targets)
    assert set(np.unique(data.targets)) == {1, -1, 0}
    item = data[3]
    assert item['index'] == 3 and item['label'] == -1 and item['inputs'][0].shape == (3, 32, 32)
    # The VOC2007 folder itself is accepted too.
    assert len(VOC07(osp.join(voc_run['data_root'], 'VOC2007'), 'trainval')) == NUM_TRAINVAL


def test_voc07_dataset_errors_name_path_and_layout(tmp_path):
    with pytest.raises(FileNotFoundError, match=r'nope.*VOC2007/ImageSets/Main.*JPEGImages'):
        VOC07(str(tmp_path / 'nope'), 'test')
    main = tmp_path / 'VOC2007' / 'ImageSets' / 'Main'
    main.mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r'aeroplane_test\.txt.*expected the VOCdevkit layout'):
        VOC07(str(tmp_path), 'test')


# ----------------------------------------------------------------------------- VOC07 SVM tool

def test_voc07_tool_prints_and_saves(voc_run):
    out, result = voc_run['stdout'], voc_run['result']
    assert 'VOC07 trainval features' in out and 'mAP' in out and 'best single cost' in out
    assert all(name in out for name in VOC_CLASSES)  # --per-class
    assert result['num_trainval'] == NUM_TRAINVAL and result['num_test'] == NUM_TEST
    assert result['costs'] == COSTS and result['feature_dim'] == 64
    assert set(result['chosen_costs'].values()) <= set(COSTS)


def test_voc07_tool_matches_an_independent_svm_evaluation(voc_run, voc_features):
    """Cost by 3-fold CV (the benchmark's cross_val_score call), then AP three ways."""
    result = voc_run['result']
    test_targets = voc_run['splits']['test'][1]
    train_targets = voc_run['splits']['trainval'][1]
    x_train, x_test = voc_features['trainval'], voc_features['test']
    aps = {'none': [], '11-point': [], 'all-point': []}
    per_cost = {cost: [] for cost in COSTS}
    for c, name in enumerate(VOC_CLASSES):
        y = np.where(train_targets[:, c] == 1, 1, -1)
        cv, scores = [], {}
        for cost in COSTS:
            clf = LinearSVC(C=cost, class_weight={1: 2, -1: 1}, loss='squared_hinge', dual=True,
                            max_iter=2000, random_state=0)
            cv.append(cross_val_score(clf, x_train, y, cv=3, scoring='average_precision').mean())
            scores[cost] = clf.fit(x_train, y).decision_function(x_test)
            per_cost[cost].append(fair_ssl_ap(scores[cost], test_targets[:, c]))
        chosen = COSTS[int(np.argmax(cv))]
        assert result['chosen_costs'][name] == chosen
        assert result['cv_ap'][name][str(chosen)] == pytest.approx(100 * max(cv))
        s, t = scores[chosen], test_targets[:, c]
        aps['none'].append(sklearn_ap(s, t))
        aps['11-point'].append(devkit_11point_ap(s, t))
        aps['all-point'].append(fair_ssl_ap(s, t))
    for definition, values in aps.items():
        assert result['map_cv'][definition] == pytest.approx(np.mean(values), abs=1e-6)
        assert list(result['per_class_ap'][definition].values()) == pytest.approx(values, abs=1e-6)
    best = max(np.mean(v) for v in per_cost.values())
    assert result['map_best_over_costs']['all-point'] == pytest.approx(best, abs=1e-6)
    for definition in aps:
        assert result['map_best_over_costs'][definition] == pytest.approx(
            max(result['map_per_cost'][definition].values()))


def test_best_over_costs_and_cv_against_their_bounds(voc_run, voc_features):
    train_targets, test_targets = voc_run['splits']['trainval'][1], voc_run['splits']['test'][1]
    x_train, x_test = voc_features['trainval'], voc_features['test']
    # With a one-cost grid, CV has nothing to choose: both figures are the same number.
    one = evaluate_voc07(x_train, train_targets, x_test, test_targets, costs=[1.0])
    assert one['map_cv'] == pytest.approx(one['map_best_over_costs'])
    # On a grid, CV may mix costs across classes and so beat every single cost; both figures are
    # bounded by the mean of each class's best test AP, and the best single cost is the best row.
    grid = voc_run['result']
    svms = train_svms(x_train, train_targets, COSTS)
    class_aps = np.array([voc07_mean_average_precision(svms.decision_function(x_test, k), test_targets)[1]
                          for k in range(len(COSTS))])
    oracle = class_aps.max(axis=0).mean()
    assert grid['map_cv']['all-point'] <= oracle + 1e-9
    assert grid['map_best_over_costs']['all-point'] <= oracle + 1e-9
    assert class_aps.mean(axis=1).max() == pytest.approx(grid['map_best_over_costs']['all-point'])


def test_train_svms_choose_a_listed_cost_and_check_their_input():
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(30, 8))
    targets = np.where(feats[:, :2] > 0, 1, -1)
    targets[0, 0] = 0
    svms = train_svms(feats, targets, costs=[0.01, 1.0], cv_folds=3, train_difficult='ignore')
    assert svms.cv_ap.shape == (2, 2) and set(svms.chosen_costs) <= {0.01, 1.0}
    assert svms.decision_function(feats).shape == (30, 2)
    with pytest.raises(ValueError, match='positive'):
        train_svms(feats, np.full((30, 1), -1), costs=[1.0])


# ----------------------------------------------------------------------------- offline kNN

@pytest.fixture(scope='module')
def digits_checkpoint(tmp_path_factory):
    """A real SimCLR checkpoint (it embeds its config), trained one step on 5% of digits."""
    work_dir = tmp_path_factory.mktemp('knn')
    torch.manual_seed(0)
    # Top-level val_dataset and eval_pipeline, as configs/_base_/datasets/*.py define them.
    cfg = digits_config(str(work_dir), dict(type='SimCLR', temperature=0.5), max_epochs=1,
                        val_dataset=dict(type='Digits', split='test', pipeline=EVAL_16),
                        eval_pipeline=EVAL_16)
    cfg.model.backbone.cifar_stem = False  # 4x fewer activations: the test is about the tool
    cfg.train_dataloader.dataset.subset_fraction = 0.05
    RUNNERS.build(cfg).train()
    cfg.dump(str(work_dir / 'train_config.py'))  # the data come from a config, not the checkpoint
    return str(work_dir / 'epoch_1.pth')


def _numpy_weighted_knn(bank, bank_labels, query, k, temperature, num_classes=10):
    sim = query @ bank.T
    top = np.argsort(-sim, axis=1, kind='stable')[:, :k]
    votes = np.zeros((len(query), num_classes))
    for row, (idx, s) in enumerate(zip(top, np.take_along_axis(sim, top, axis=1))):
        np.add.at(votes[row], bank_labels[idx], np.exp(s / temperature))
    return votes.argmax(axis=1)


def test_knn_tool_matches_sklearn_and_numpy(tmp_path, digits_checkpoint):
    ckpt = digits_checkpoint
    knn_eval = _load_tool('knn_eval')
    out = tmp_path / 'knn.json'
    # The bank is the whole training split, not the 5% the checkpoint was trained on, unless asked:
    # a quarter here, to keep the test short.
    config = osp.join(osp.dirname(ckpt), 'train_config.py')
    result = knn_eval.main([ckpt, '--config', config, '--k', '5', '20', '--temperature', '0.07',
                            '--num-workers', '0', '--device', 'cpu', '--out', str(out),
                            '--cfg-options', 'train_dataset.subset_fraction=0.25',
                            'val_dataset.subset_fraction=0.5'])
    assert json.loads(out.read_text())['top1'] == result['top1']
    assert result['data_config'] == config and result['pipeline']['type'] == 'EvalView'
    assert result['train_dataset']['subset_fraction'] == 0.25 and result['num_bank'] == 337

    encoder = load_encoder(ckpt)
    bank_set, query_set = (Digits(split, pipeline=EvalView(16), subset_fraction=fraction)
                           for split, fraction in (('train', 0.25), ('test', 0.5)))
    bank, bank_labels = (t.numpy() for t in extract_features(encoder, bank_set, 'f', num_workers=0))
    query, query_labels = (t.numpy() for t in extract_features(encoder, query_set, 'f', num_workers=0))
    bank, query = bank.astype(np.float64), query.astype(np.float64)
    for k in (5, 20):
        sk = KNeighborsClassifier(n_neighbors=k, metric='cosine', algorithm='brute',
                                  weights=lambda d: np.exp((1 - d) / 0.07)).fit(bank, bank_labels)
        sk_top1 = 100 * np.mean(sk.predict(query) == query_labels)
        np_top1 = 100 * np.mean(_numpy_weighted_knn(bank, bank_labels, query, k, 0.07) == query_labels)
        one_query = 100 / len(query) + 1e-9  # float ties at the k-th neighbour may flip one vote
        assert result['top1'][str(k)] == pytest.approx(np_top1, abs=one_query)
        assert result['top1'][str(k)] == pytest.approx(sk_top1, abs=one_query)


def test_knn_tool_reads_a_named_dataset(tmp_path, capsys):
    ckpt = _tiny_checkpoint(tmp_path / 'tiny.pth')  # carries no training config
    knn_eval = _load_tool('knn_eval')
    with pytest.raises(SystemExit, match='--dataset'):
        knn_eval.main([ckpt])
    overrides = ['train_dataset.test_fraction=0.5', 'val_dataset.test_fraction=0.5',
                 'train_dataset.subset_fraction=0.2', 'val_dataset.subset_fraction=0.2']
    result = knn_eval.main([ckpt, '--dataset', 'digits', '--k', '10', '--num-workers', '0',
                            '--device', 'cpu', '--cfg-options', *overrides])
    queries = Digits('test', test_fraction=0.5, subset_fraction=0.2)
    assert result['data_config'].endswith('digits.py') and result['num_queries'] == len(queries)
    assert set(result['top1']) == {'10'}
    assert '| 10 |' in capsys.readouterr().out
    with pytest.raises(SystemExit, match='takes no data_root'):
        knn_eval.main([ckpt, '--dataset', 'digits', '--data-root', 'x'])
