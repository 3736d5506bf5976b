"""Analyses behind the paper's figures and clustering table, free of any plotting.

* :func:`tsne_embedding` -- 2-D t-SNE map of a sample of features (plus extra points such as
  centroids, fitted jointly so that they land in the same map).
* :func:`nmi_curve` -- cluster quality of every saved clustering round (``pseudo_labels/``).
* :func:`cluster_quality_table` -- NMI of k-means (k = number of classes) over several runs.
* Helpers shared by the analysis tools: reading a round file, loading a checkpoint's feature
  model and its training set, matching clusters to classes for colouring.
"""
from __future__ import annotations

import glob
import inspect
import math
import os
import os.path as osp
from typing import NamedTuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from mmengine.config import Config
from torch import Tensor


from .metrics import cluster_quality, false_negative_rates

__all__ = [
    'RoundQuality', 'sample_indices', 'tsne_embedding', 'read_round', 'round_files', 'nmi_curve',
    'cluster_quality_table', 'member_centroids', 'match_clusters_to_classes',
    'find_hook', 'FeatureModel', 'load_feature_model', 'analysis_dataset', 'format_percent',
    'default_num_workers'
]

ArrayLike = Union[Tensor, np.ndarray]
# Keys every round file written by PseudoLabelHook holds (``assignments_{l}`` too, per level).
ROUND_KEYS = ('labels', 'true_labels', 'num_clusters', 'rate', 'epoch')


class RoundQuality(NamedTuple):
    """Cluster quality of one level of one clustering round."""

    epoch: int  # epochs completed when the round ran
    level: int  # index of the level in the hook's num_clusters
    k: int  # number of clusters of the level
    rate: float  # acceptance rate of the round
    nmi: float  # k-means assignments vs ground truth, fractions in [0, 1]
    ami: float
    ari: float
    mtpr: float  # on the labels actually used (unaccepted = unique labels), percent
    mtnr: float


def _numpy_2d(features: ArrayLike, name: str = 'features') -> np.ndarray:
    if isinstance(features, Tensor):
        features = features.detach().cpu().float().numpy()
    features = np.asarray(features, dtype=np.float32)
    if features.ndim != 2:
        raise ValueError(f'{name} must be [N, D], got shape {features.shape}')
    return features


def sample_indices(num: int, num_points: int, seed: int = 0) -> np.ndarray:
    """Sorted indices of ``min(num_points, num)`` samples drawn without replacement by ``seed``."""
    if num_points < 1:
        raise ValueError(f'num_points must be >= 1, got {num_points}')
    if num_points >= num:
        return np.arange(num)
    return np.sort(np.random.default_rng(seed).choice(num, size=num_points, replace=False))


def tsne_embedding(features: ArrayLike, num_points: int = 2000, seed: int = 0,
                   extra: ArrayLike | None = None, perplexity: float = 30.0,
                   max_iter: int = 1000, pca_dims: int = 50,
                   threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """t-SNE coordinates of a seeded sample of ``features`` and the sample's indices.

    Returns ``coords`` ``[n + E, 2]`` and ``indices`` ``[n]`` with ``n = min(num_points, N)``:
    the first ``n`` rows map ``features[indices]``, the last ``E`` rows the ``extra`` points
    (e.g. centroids), which are embedded together with the sample. Features with more than
    ``pca_dims`` dimensions are first reduced by PCA (the usual t-SNE preprocessing).
    ``threads`` caps the OpenMP/BLAS threads (``None``: the libraries' default).
    """
    from threadpoolctl import threadpool_limits
    feats = _numpy_2d(features)
    indices = sample_indices(len(feats), num_points, seed)
    points = feats[indices]
    if extra is not None:
        extra = _numpy_2d(extra, 'extra')
        if extra.shape[1] != feats.shape[1]:
            raise ValueError(f'extra points have dimension {extra.shape[1]}, features '
                             f'{feats.shape[1]}')
        points = np.concatenate([points, extra])
    if len(points) < 4:
        raise ValueError(f't-SNE needs at least 4 points, got {len(points)}')
    # Barnes-Hut t-SNE synchronises its threads every iteration: on a busy machine one thread
    # can be several times faster than all of them, hence the option.
    with threadpool_limits(limits=threads):
        coords = _tsne(points, seed, perplexity, max_iter, pca_dims)
    return coords, indices


def _tsne(points: np.ndarray, seed: int, perplexity: float, max_iter: int,
          pca_dims: int) -> np.ndarray:
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE
    total = len(points)
    dims = min(pca_dims, total)
    if points.shape[1] > dims:
        points = PCA(dims, random_state=seed).fit_transform(points)
    # sklearn needs perplexity < n; at most (n - 1) / 3 also keeps the 3 * perplexity + 1
    # neighbours it looks at within the other points.
    perplexity = min(perplexity, (total - 1) / 3.0)
    tsne = TSNE(n_components=2, perplexity=perplexity, init='pca', learning_rate='auto',
                max_iter=max_iter, random_state=seed)
    return tsne.fit_transform(points).astype(np.float32)


def read_round(path: str) -> dict:
    """One clustering round saved by ``PseudoLabelHook`` (``epoch_NNNN.npz``) as a dict.

    Keys: ``labels`` [L, N], ``true_labels`` [N], ``num_clusters`` (list), ``rate``, ``epoch``,
    ``assignments`` / ``scores`` / ``centroids`` (lists over the levels; the latter two
    ``None`` where missing; rounds saved before the scores had their name call them
    ``confidence_N``) and ``path``.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except FileNotFoundError:
        raise FileNotFoundError(f'round file not found: {path}') from None
    except (ValueError, OSError) as err:
        raise ValueError(f'{path} is not a readable .npz file ({err})') from err
    missing = [key for key in ROUND_KEYS if key not in arrays]
    levels = len(arrays['num_clusters']) if 'num_clusters' in arrays else 0
    missing += [f'assignments_{lvl}' for lvl in range(levels) if f'assignments_{lvl}' not in arrays]
    if missing:
        raise ValueError(f'{path} is not a clustering round saved by PseudoLabelHook: missing '
                         f'{", ".join(missing)}')
    labels = np.asarray(arrays['labels'])
    true_labels = np.asarray(arrays['true_labels'])
    if labels.ndim != 2 or labels.shape != (levels, len(true_labels)):
        raise ValueError(f'{path}: labels have shape {labels.shape}, expected '
                         f'({levels}, {len(true_labels)})')
    return dict(
        path=path, labels=labels, true_labels=true_labels,
        num_clusters=[int(k) for k in arrays['num_clusters']], rate=float(arrays['rate']),
        epoch=int(arrays['epoch']),
        assignments=[np.asarray(arrays[f'assignments_{lvl}']) for lvl in range(levels)],
        scores=[arrays.get(f'score_{lvl}', arrays.get(f'confidence_{lvl}')) for lvl in range(levels)],
        centroids=[arrays.get(f'centroids_{lvl}') for lvl in range(levels)])


def round_files(pseudo_label_dir: str) -> list[str]:
    """The round files of a run, in epoch order; takes the work dir or its ``pseudo_labels/``."""
    folder = pseudo_label_dir
    if osp.isdir(osp.join(folder, 'pseudo_labels')):
        folder = osp.join(folder, 'pseudo_labels')
    if not osp.isdir(folder):
        raise FileNotFoundError(f'{pseudo_label_dir} is not a folder')
    # A save interrupted by a crash leaves 'epoch_NNNN.npz.tmp.npz': not a finished round.
    files = [f for f in glob.glob(osp.join(folder, 'epoch_*.npz')) if not f.endswith('.tmp.npz')]
    if not files:
        raise FileNotFoundError(f'no clustering rounds (epoch_NNNN.npz) in {folder}: the run needs '
                                'PseudoLabelHook with save_labels=True')
    return sorted(files, key=lambda f: osp.basename(f))


def nmi_curve(pseudo_label_dir: str) -> list[RoundQuality]:
    """Cluster quality of every level of every saved round, recomputed from the label files.

    NMI / AMI / ARI compare each level's k-means assignments with the ground truth; MTPR / MTNR
    (percent) evaluate the labels the loss used in that round (accepted or unique).
    """
    rows = []
    for path in round_files(pseudo_label_dir):
        rnd = read_round(path)
        truth = rnd['true_labels']
        if len(truth) == 0 or truth.min() < 0:
            raise ValueError(f'{path} has no ground-truth labels for every sample; cluster quality '
                             'needs a labelled training set')
        for level, k in enumerate(rnd['num_clusters']):
            quality = cluster_quality(truth, rnd['assignments'][level])
            mtpr, mtnr = false_negative_rates(rnd['labels'][level], truth)
            rows.append(RoundQuality(rnd['epoch'], level, k, rnd['rate'], quality['nmi'],
                                     quality['ami'], quality['ari'], mtpr, mtnr))
    return sorted(rows, key=lambda r: (r.epoch, r.level))


def cluster_quality_table(features: ArrayLike, labels: ArrayLike, num_classes: int,
                          runs: int = 5, seed: int = 0,
                          **kmeans_options) -> tuple[float, float]:
    """Mean and standard deviation of NMI over ``runs`` k-means runs with k = ``num_classes``.

    Run ``i`` uses seed ``seed + i``; other options go to :func:`ifnd.clustering.kmeans` (PCL's
    settings by default). NMI is a fraction in [0, 1]; the std is the sample std (0 for one run).
    """
    from ifnd.clustering import kmeans
    if runs < 1:
        raise ValueError(f'runs must be >= 1, got {runs}')
    if num_classes < 1:
        raise ValueError(f'num_classes must be >= 1, got {num_classes}')
    truth = labels.detach().cpu().numpy() if isinstance(labels, Tensor) else np.asarray(labels)
    feats = features if isinstance(features, Tensor) else torch.from_numpy(_numpy_2d(features))
    if truth.shape != (feats.shape[0], ):
        raise ValueError(f'labels must be [{feats.shape[0]}], got shape {truth.shape}')
    if len(truth) and truth.min() < 0:
        raise ValueError('cluster_quality_table needs a ground-truth label for every sample')
    scores = []
    for run in range(runs):
        result = kmeans(feats, num_clusters=num_classes, seed=seed + run, **kmeans_options)
        scores.append(cluster_quality(truth, result.assignments.cpu().numpy())['nmi'])
    scores = np.asarray(scores, dtype=np.float64)
    return float(scores.mean()), float(scores.std(ddof=1)) if runs > 1 else 0.0


def member_centroids(features: ArrayLike, assignments: ArrayLike,
                     num_clusters: int) -> tuple[np.ndarray, np.ndarray]:
    """Normalised mean feature of each non-empty cluster: ``(cluster ids, centroids [K', D])``."""
    feats = _numpy_2d(features)
    assign = np.asarray(assignments, dtype=np.int64)
    if assign.shape != (len(feats), ):
        raise ValueError(f'assignments must be [{len(feats)}], got shape {assign.shape}')
    valid = (assign >= 0) & (assign < num_clusters)
    sums = np.zeros((num_clusters, feats.shape[1]), dtype=np.float64)
    np.add.at(sums, assign[valid], feats[valid])
    ids = np.flatnonzero(np.bincount(assign[valid], minlength=num_clusters) > 0)
    cents = F.normalize(torch.from_numpy(sums[ids]).float(), dim=1).numpy()
    return ids, cents


def match_clusters_to_classes(cluster_labels: ArrayLike, true_labels: ArrayLike, num_clusters: int,
                              num_classes: int, one_to_one: bool = True) -> np.ndarray:
    """Colour slot ``[num_clusters]`` of each cluster: the class it overlaps most, by cluster id.

    ``one_to_one``: a Hungarian matching on the cluster × class overlap, so distinct clusters get
    distinct slots (clusters beyond the classes get slots ``num_classes, num_classes + 1, ...``);
    otherwise each cluster takes its majority class. Negative cluster labels (unaccepted) and
    samples without ground truth are ignored.
    """
    from scipy.optimize import linear_sum_assignment
    y = np.asarray(cluster_labels, dtype=np.int64).reshape(-1)
    g = np.asarray(true_labels, dtype=np.int64).reshape(-1)
    keep = (y >= 0) & (y < num_clusters) & (g >= 0) & (g < num_classes)
    overlap = np.zeros((num_clusters, num_classes), dtype=np.int64)
    np.add.at(overlap, (y[keep], g[keep]), 1)
    if not one_to_one:
        return overlap.argmax(axis=1)
    slots = max(num_clusters, num_classes)
    cost = np.zeros((num_clusters, slots), dtype=np.int64)
    cost[:, :num_classes] = -overlap
    rows, cols = linear_sum_assignment(cost)
    matched = np.empty(num_clusters, dtype=np.int64)
    matched[rows] = cols
    return matched


# ----------------------------------------------------------------------------- checkpoints, data


def find_hook(cfg: Config, type_name: str) -> dict | None:
    """The first custom hook of the given type in a config, or ``None``."""
    for hook in cfg.get('custom_hooks', None) or []:
        hook_type = str(hook.get('type', ''))
        if hook_type == type_name or hook_type.endswith('.' + type_name):
            return dict(hook)
    return None


class FeatureModel(NamedTuple):
    """A checkpoint's model for feature extraction, with its config and what it gives."""

    model: torch.nn.Module  # has ``clustering_features(inputs, feature)``
    cfg: Config  # the training config (for the data set)
    meta: dict  # the checkpoint's ``meta`` (``epoch`` etc.), empty when it has none
    feature: str  # 'f' (backbone) or 'z' (projection)


def load_feature_model(path: str, feature: str | None = 'z', config: str | None = None,
                       model_name: str | None = None, **backbone_kwargs) -> FeatureModel:
    """The model giving ``feature`` features of a checkpoint, with the data's config and its meta.

    ``'f'`` loads the backbone with :func:`ifnd.models.load_encoder` (any supported checkpoint;
    ``model_name`` and ``backbone_kwargs`` as there); ``'z'`` rebuilds the whole algorithm from
    the architecture the checkpoint's config describes (or ``config``'s model) and loads all its
    weights; ``None`` picks what the config's PseudoLabelHook clustered ('z' without one). The
    data set comes from ``config`` alone: a checkpoint's config decides the architecture only.
    """
    from ifnd.fileio.checkpoint import check_weights
    from ifnd.models.architecture import checkpoint_architecture
    from ifnd.models.encoder import load_checkpoint_file, load_encoder
    from ifnd.fileio.former_names import translate_former_names
    from ifnd.registry import MODELS
    if feature not in (None, 'f', 'z'):
        raise ValueError(f"feature must be 'f' (backbone) or 'z' (projection), got {feature!r}")
    if config is None:
        raise ValueError(f'{path}: pass the training config that describes its data set '
                         '(--config FILE); a checkpoint\'s own config decides its architecture only')
    checkpoint = load_checkpoint_file(path)
    meta = dict(checkpoint.get('meta') or {})
    cfg = Config.fromfile(config)
    if feature is None:
        feature = (find_hook(cfg, 'PseudoLabelHook') or {}).get('feature', 'z')
    if feature == 'f':
        return FeatureModel(load_encoder(path, model_name, **backbone_kwargs), cfg, meta, 'f')
    model_cfg = checkpoint_architecture(checkpoint, path) or translate_former_names(
        cfg.get('model', None), f'config {config}')
    if model_cfg is None:
        raise ValueError(f'no model config for {path}: feature z needs the config it was trained '
                         'with')
    model = MODELS.build(model_cfg)
    state = checkpoint.get('state_dict', checkpoint)
    check_weights(state, model.state_dict(), path)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f'{path}: weights do not match the model its config describes '
                         f'({type(model).__name__}); for a backbone-only or foreign checkpoint use '
                         f'feature f.\n{err}') from None
    return FeatureModel(model, cfg, meta, 'z')


def analysis_dataset(cfg: Config, data_root: str | None = None):
    """The training set under the eval transform that the clustering rounds of ``cfg`` used.

    Data set: the PseudoLabelHook's ``dataset`` or ``train_dataloader.dataset``; transform: the
    PseudoLabelHook's ``pipeline``, else the KNNEvalHook's, else ``eval_pipeline``.
    ``data_root`` replaces the data set's ``data_root``.
    """
    from ifnd.engine.features import build_eval_dataset
    hook = find_hook(cfg, 'PseudoLabelHook') or {}
    dataset_cfg = hook.get('dataset')
    if dataset_cfg is None:
        if 'train_dataloader' not in cfg or 'dataset' not in cfg.train_dataloader:
            raise ValueError('the config has no train_dataloader.dataset to take the data set from')
        dataset_cfg = cfg.train_dataloader.dataset
    dataset_cfg = _plain(dataset_cfg)
    pipeline = hook.get('pipeline') or (find_hook(cfg, 'KNNEvalHook') or {}).get('pipeline') \
        or cfg.get('eval_pipeline', None)
    if pipeline is None:
        raise ValueError('the config names no eval transform (PseudoLabelHook or KNNEvalHook '
                         '`pipeline`, or `eval_pipeline`); features need a deterministic view')
    if data_root is not None:
        from ifnd.registry import DATASETS
        dataset_cls = DATASETS.get(dataset_cfg.get('type'))
        if dataset_cls is not None and 'data_root' not in inspect.signature(dataset_cls).parameters:
            raise ValueError(f'{dataset_cls.__name__} takes no data_root to override')
        dataset_cfg['data_root'] = data_root
    return build_eval_dataset(dataset_cfg, _plain(pipeline))


def _plain(cfg):
    # ConfigDicts become plain dicts, so the builders may modify their copies freely.
    return cfg.to_dict() if hasattr(cfg, 'to_dict') else cfg


def format_percent(mean: float, std: float) -> str:
    """``'67.5 ± 1.7'`` for fractions 0.675 and 0.017 (the paper's table format)."""
    if not (math.isfinite(mean) and math.isfinite(std)):
        return 'n/a'
    return f'{100 * mean:.1f} ± {100 * std:.1f}'


def default_num_workers() -> int:
    """Loader workers for the analysis tools: none on small machines."""
    return min(4, max(0, (os.cpu_count() or 1) // 2 - 1))
