"""Incremental false negative detection: periodic clustering into the model's label bank."""
import io
import os
import time

import numpy as np
import torch
from mmengine.dist import get_world_size, is_main_process
from mmengine.hooks import Hook

from ifnd.clustering import (ClusteringRound, broadcast_round, build_acceptance,
                             check_hierarchy, check_round_options, clustering_round, plan_round,
                             round_kmeans_options, round_seed)
from ifnd.dist import gather_shards
from ifnd.engine.features import (build_eval_dataset, extract_features, trained_model_source,
                                  unwrap_model)
from ifnd.engine.work_dir import LABELS_FOLDER
from ifnd.evaluation.metrics import cluster_quality, false_negative_rates, pair_precision_recall
from ifnd.fileio import AtomicLocalBackend, check_own_path, write_json
from ifnd.fileio.json_files import read_json
from ifnd.settings import ReadWhen, check_number, check_optional, check_seed, check_temperature
from ifnd.registry import HOOKS


# Where a checkpoint keeps the acceptance's state; checkpoints written before acceptance was a part
# kept StableAcceptance's previous round under the second name.
ACCEPTANCE_STATE = 'pseudo_label_acceptance'
FORMER_ACCEPTANCE_STATE = 'pseudo_label_previous'


@HOOKS.register_module()
class PseudoLabelHook(Hook):
    """Clusters the training set before training and every ``interval`` epochs.

    Each round: features of all training images under the eval transform (every rank, its
    shard), multi-level k-means and scores on rank 0 (or sharded over all ranks), acceptance per
    level (the paper's: the global top ``ceil(r * N)``), broadcast, and an update of the model's
    label bank.

    ``kmeans``: options of :func:`ifnd.clustering.kmeans` (``backend='auto'`` picks faiss on the
    GPU when faiss has GPU support, else PyTorch k-means on the model's GPU, else faiss on the
    CPU), plus ``sharded``: with several processes, each keeps its shard of the features, the
    k-means steps all-reduce per-centroid sums, κ is computed per shard and only the per-sample
    assignments and confidences are gathered (same labels as one process). Default ``None``:
    sharded when the world size is above 1 and the backend is torch; ``True`` forces the torch
    backend; ``False`` gathers all features on rank 0. ``acceptance``: a scheme of
    ``ifnd/clustering/acceptance.py`` (default ``dict(type='LinearAcceptance')``, the paper's),
    asked at the number of epochs completed; its state (``StableAcceptance``'s previous round)
    travels in the checkpoints, so a resumed run decides as the uninterrupted one.
    ``score='kappa'`` ranks by IFND's per-sample Eq. (2); ``'pcl'`` by PCL's per-cluster
    concentration. ``temperature``: τ of κ; None (default) takes the model's loss temperature,
    the paper's choice. ``hierarchy='independent'`` (the paper's) clusters every level from the
    samples; ``'nested'`` (HCSC's hierarchical k-means, ``num_clusters`` fine to coarse, e.g.
    ``[100, 30, 10]``) clusters each level's centroids into the next and gives every sample its
    finer cluster's parent; the model's label bank then holds the parent maps (``parents``).
    ``warmup_epochs``: no round before that many epochs are done (every sample keeps a label of its
    own, and a prototype loss has no prototypes): the first round follows epoch ``warmup_epochs``,
    the next ones every ``interval`` epochs after it (HCSC's warm-up: 20 epochs). Each
    round's labels, scores and parent maps are saved under ``work_dir/pseudo_labels/``; the round
    itself is :func:`ifnd.clustering.clustering_round`.

    Features are extracted in batches of ``batch_size``: by default 2048 where the training set
    is held on the device (``augment_on='device'``: the uint8 images are read there and the eval
    view made there, no DataLoader), else 256 through a DataLoader with ``num_workers``;
    ``autocast``: the encoder runs in bfloat16 autocast where it is on CUDA (float32 on a CPU).
    """

    priority = 'NORMAL'  # before CheckpointHook, so each checkpoint holds the new labels
    # Folders it writes in the work dir, checked when the run starts (ifnd/engine/run_paths.py).
    work_dir_folders = (LABELS_FOLDER,)

    # The keys a config may set inside dict-valued arguments, with their types: read by the
    # config checks of tools/train.py (``--cfg-options custom_hooks.0.kmeans.backend=torch``).
    config_dict_options = {'kmeans': round_kmeans_options()}
    # What it gives the model (config checks: a model that reads pseudo labels needs this hook).
    provides = ('label_bank',)
    # τ of κ: PCL's score ranks by the concentrations, made at the model's temperature.
    read_when = {'temperature': ReadWhen('score', "is 'kappa'", lambda score: score == 'kappa')}

    def __init__(self, num_clusters: list[int], pipeline: dict | None = None, interval: int = 1,
                 acceptance: dict | None = None, feature: str = 'z', score: str = 'kappa',
                 temperature: float | None = None, kmeans: dict | None = None, seed: int = 0,
                 dataset: dict | None = None, batch_size: int | None = None, num_workers: int = 2,
                 save_labels: bool = True, autocast: bool = True,
                 hierarchy: str = 'independent', warmup_epochs: int = 0) -> None:
        if not isinstance(num_clusters, (list, tuple)) or not num_clusters:
            raise ValueError(f'PseudoLabelHook num_clusters must be a non-empty list of k, one per '
                             f'level, got {num_clusters!r}; e.g. num_clusters=[10, 30, 100]')
        for level, k in enumerate(num_clusters):
            check_number('PseudoLabelHook', f'num_clusters[{level}]', k, int)
        if min(num_clusters) < 2:
            raise ValueError(f'PseudoLabelHook num_clusters={list(num_clusters)} has a level with '
                             f'k={min(num_clusters)}: one cluster holds every sample, so all '
                             'negatives would be eliminated (loss 0, nothing learned); use k >= 2 '
                             'at every level')
        owner = 'PseudoLabelHook'
        check_hierarchy(hierarchy, num_clusters, owner)
        check_number(owner, 'interval', interval, int, low=1, hint='epochs between rounds')
        check_number(owner, 'warmup_epochs', warmup_epochs, int, low=0,
                     hint='epochs of instance labels before the first round')
        check_optional(owner, 'batch_size', batch_size, int, low=1,
                       hint='or None: 2048 for data held on the device, else 256')
        check_number(owner, 'num_workers', num_workers, int, low=0)
        if temperature is not None:  # τ of κ, the loss's by default: the loss's range
            check_temperature(owner, temperature)
        self.acceptance = self._build_acceptance(acceptance, score)
        check_seed(owner, 'seed', seed)
        # The k-means backend, its options and the sharding are checked here, once.
        self.kmeans, self.sharded = check_round_options(score, kmeans, 'PseudoLabelHook')
        self.num_clusters = list(num_clusters)
        self.pipeline = pipeline
        self.interval = interval
        self.feature = feature
        self.score = score
        self.temperature = temperature
        self.seed = seed
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.save_labels = save_labels
        self.autocast = autocast
        self.hierarchy = hierarchy
        self.warmup_epochs = warmup_epochs
        self._dataset = None

    @staticmethod
    def _build_acceptance(config: dict | None, score: str):
        """The round's acceptance scheme, refused where it cannot read ``score`` or takes a seed."""
        owner = 'PseudoLabelHook acceptance'
        acceptance = build_acceptance(dict(type='LinearAcceptance') if config is None else config,
                                      owner)
        if acceptance.score_kinds is not None and score not in acceptance.score_kinds:
            raise ValueError(f'{owner} {type(acceptance).__name__} reads the score '
                             f'{" or ".join(acceptance.score_kinds)}; score={score!r} is another: use '
                             f'score={acceptance.score_kinds[0]!r} or a calendar scheme')
        if getattr(acceptance, 'seed', None) is not None:
            raise ValueError(f'{owner} seed={acceptance.seed!r} orders the samples of a detector '
                             'with no score; the clustering round ranks by its score: remove it')
        return acceptance

    def round_outputs(self, model) -> frozenset[str]:
        """What each round computes: what the model's parts read of it (``model.round_outputs``)
        and what the acceptance ranks by (κ, or PCL's concentrations)."""
        ranked = 'kappa' if self.score == 'kappa' else 'concentrations'
        return frozenset({'labels', 'centroids', ranked}) | model.round_outputs

    def _kappa_temperature(self, model) -> float:
        """τ of κ: the hook's, else the model's loss temperature."""
        return float(model.temperature if self.temperature is None else self.temperature)

    def _data(self, runner):
        if self._dataset is None:
            cfg = self.dataset or runner.cfg.train_dataloader.dataset
            self._dataset = build_eval_dataset(cfg, self.pipeline)
        return self._dataset

    def check_run(self, model: torch.nn.Module, max_epochs: int) -> list[str]:
        """Refuse settings with which ``model``'s run of ``max_epochs`` would get no pseudo label,
        known only once the model and the run's length are (its temperature, its detector), and
        return warnings for those that leave part of it idle."""
        if getattr(model, 'label_bank', None) is None:
            raise TypeError(f'PseudoLabelHook needs an algorithm with pseudo labels (IFND, '
                            f"IFNDMoCo, PCL, or detector=dict(type='PseudoLabels')); "
                            f'{type(model).__name__} keeps none: remove the hook from custom_hooks')
        if model.detector is not None:  # the detector checks its own settings against the levels
            model.detector.check_levels(self.num_clusters, 'PseudoLabelHook')
        warnings = []
        unlikely = self.acceptance.check_round(self.num_clusters, self._kappa_temperature(model))
        if unlikely:
            warnings.append(unlikely)
        if self.warmup_epochs >= max_epochs:
            warnings.append(f'PseudoLabelHook warmup_epochs={self.warmup_epochs} ends with the run '
                            f'(train_cfg.max_epochs={max_epochs}): no clustering round, so every sample '
                            'keeps a label of its own; lower warmup_epochs or raise train_cfg.max_epochs')
        idle = self.acceptance.idle_reason(max_epochs, self.interval)
        if idle:
            warnings.append(f'{idle}: every sample keeps a label of its own, so the pseudo labels '
                            'change nothing in this run; lower the setting or raise '
                            'train_cfg.max_epochs')
        return warnings

    def before_train(self, runner) -> None:
        """Start from instance labels and run the first round, unless resumed with labels."""
        model = unwrap_model(runner.model)
        for warning in self.check_run(model, runner.max_epochs):  # before the first round
            runner.logger.warning(warning)
        bank = model.label_bank
        num = len(self._data(runner))
        nested = self.hierarchy == 'nested' and len(self.num_clusters) > 1
        if runner.epoch > 0 and runner.epoch < self.warmup_epochs and bank.num_levels == len(self.num_clusters) \
                and bank.num_samples == num and not bank.any_accepted:
            runner.logger.info(f'Resumed in the warm-up at epoch {runner.epoch}: instance labels until '
                               f'epoch {self.warmup_epochs}')
            return
        if bank.num_levels == len(self.num_clusters) and bank.num_samples == num and runner.epoch > 0:
            if bank.cluster_counts == self.num_clusters and any(bank.has_parents) == nested:
                runner.logger.info(f'Resumed pseudo labels for {num} samples at epoch {runner.epoch}')
                return
        if runner.epoch > 0 and bank.num_levels:
            held = 'nested' if any(bank.has_parents) else 'independent'
            runner.logger.warning(
                f'The checkpoint\'s pseudo labels (k={bank.cluster_counts}, {held}, '
                f'{bank.num_samples} samples) do not match this run (num_clusters='
                f'{self.num_clusters}, hierarchy={self.hierarchy!r}, {num} samples): clustering '
                f'again now, at epoch {runner.epoch}')
        bank.reset(len(self.num_clusters), num)
        self.acceptance.reset()  # a fresh start: no round before this one
        if self._round_due(runner.epoch):
            self.run_round(runner, runner.epoch)

    def after_train_epoch(self, runner) -> None:
        """Re-cluster every ``interval`` epochs (from ``warmup_epochs`` on)."""
        done = runner.epoch + 1
        if self._round_due(done):
            self.run_round(runner, done)

    def _round_due(self, epochs_done: int) -> bool:
        """Whether a round follows ``epochs_done`` epochs: the warm-up's end, then every interval."""
        return epochs_done >= self.warmup_epochs and \
            (epochs_done - self.warmup_epochs) % self.interval == 0

    def _plan(self, device: torch.device) -> tuple[str, bool]:
        """The round's k-means backend and whether it runs sharded over the processes."""
        return plan_round(self.kmeans['backend'], self.sharded, device, get_world_size())

    def run_round(self, runner, epochs_done: int) -> dict:
        """One clustering round; returns the per-level statistics (rank 0) or {}."""
        model = unwrap_model(runner.model)
        bank = model.label_bank
        dataset = self._data(runner)
        self.acceptance.set_epoch(epochs_done, runner.max_epochs)
        rate = self.acceptance.rate
        device = bank.labels.device
        backend, sharded = self._plan(device)
        tic = time.perf_counter()
        # Sharded, every rank keeps its own features; otherwise all are gathered everywhere. Labels
        # from non-finite or collapsed features would be chance and steer the loss: the run stops.
        feats, true_labels = extract_features(
            runner.model, dataset, self.feature, self.batch_size, self.num_workers,
            desc=f'clustering round (epoch {epochs_done})', gather=not sharded, autocast=self.autocast,
            source=trained_model_source(runner, epochs_done))
        extract_s = time.perf_counter() - tic
        num = len(dataset)
        pcl = 'concentrations' in self.round_outputs(model)
        stats: dict = {}
        result = None  # the round, on the processes that ran it
        set_aside = self.acceptance.check_samples(num)
        if set_aside:
            runner.logger.warning(set_aside)
        if sharded or is_main_process():
            result = clustering_round(
                feats.to(device), self.num_clusters, acceptance=self.acceptance,
                temperature=self._kappa_temperature(model),
                seed=round_seed(self.seed, epochs_done), kmeans={**self.kmeans, 'backend': backend},
                score=self.score, concentration_temperature=float(model.temperature) if pcl else None,
                num_samples=num if sharded else None, hierarchy=self.hierarchy)
            true_labels = (gather_shards(true_labels, num) if sharded else true_labels).cpu()
        if is_main_process():
            stats = self._report(runner, epochs_done, rate, extract_s, result, true_labels)
        labels, centroids, concentration, parents = broadcast_round(
            result, self.num_clusters, num, feats.shape[1], device)
        bank.update(labels, centroids, concentration, self.num_clusters, parents)
        return stats

    def _report(self, runner, epochs_done: int, rate: float | None, extract_s: float,
                result: ClusteringRound, true_labels: torch.Tensor) -> dict:
        """The round's statistics, with the clusters' quality where every sample has a class;
        logged and saved."""
        if rate is None:  # accepted by the evidence: the share it accepted, over the levels
            rate = float(np.mean([level['accept_rate'] for level in result.stats['levels']]))
        stats = {'epoch': epochs_done, 'rate': rate, 'seconds_extract': extract_s, **result.stats}
        if bool((true_labels >= 0).all()):
            truth = true_labels.numpy()
            for level_stats, assigned, accepted in zip(stats['levels'], result.assignments,
                                                        result.labels):
                level_stats.update(cluster_quality(truth, assigned.numpy()))
                mtpr, mtnr = false_negative_rates(accepted.numpy(), truth)
                precision, recall = pair_precision_recall(accepted.numpy(), truth)
                level_stats.update(mtpr=mtpr, mtnr=mtnr, flag_precision=precision,
                                   flag_recall=recall)
        self._log(runner, stats)
        if self.save_labels:
            saved = {}
            for level, (assigned, scores, cents, parents) in enumerate(
                    zip(result.assignments, result.scores, result.centroids, result.parents)):
                saved[f'assignments_{level}'] = assigned.numpy()
                saved[f'score_{level}'] = scores.numpy()
                saved[f'centroids_{level}'] = cents.cpu().numpy()
                if parents is not None:  # each cluster's cluster at level + 1
                    saved[f'parents_{level}'] = parents.cpu().numpy()
            self._save(runner, stats, result.labels, true_labels, saved)
        return stats

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """The acceptance's state (``StableAcceptance``'s last round) travels with the checkpoint."""
        state = self.acceptance.state_dict()
        if state:
            checkpoint[ACCEPTANCE_STATE] = state

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """Restore the acceptance's state, checked against this run's levels (damaged: set aside)."""
        state = checkpoint.get(ACCEPTANCE_STATE)
        if state is None and FORMER_ACCEPTANCE_STATE in checkpoint:
            state = {'previous': checkpoint[FORMER_ACCEPTANCE_STATE]}
        if state is not None:
            set_aside = self.acceptance.load_state_dict(state, self.num_clusters)
            if set_aside:
                runner.logger.warning(set_aside)

    def _log(self, runner, stats: dict) -> None:
        scalars = {f'ifnd/seconds_{part}': stats[f'seconds_{part}']
                   for part in ('extract', 'kmeans', 'confidence')}
        scalars['ifnd/rate'] = stats['rate']
        where = f'k-means: {stats["kmeans_backend"]} on {stats["kmeans_device"]}'
        if stats['kmeans_processes'] > 1:
            where += f' (sharded over {stats["kmeans_processes"]} processes)'
        where += f', {stats["hierarchy"]} levels'
        lines = [f'Clustering round after {stats["epoch"]} epochs: acceptance rate '
                 f'{stats["rate"]:.3f}, {where}, features {stats["seconds_extract"]:.1f}s, '
                 f'k-means {stats["seconds_kmeans"]:.1f}s, confidence '
                 f'{stats["seconds_confidence"]:.1f}s']
        for level in stats['levels']:
            tag = f'ifnd/k{level["k"]}'
            scalars.update({f'{tag}/{key}': value for key, value in level.items()
                            if key != 'k' and np.isfinite(value)})
            lines.append('  ' + ', '.join(f'{key} {value:.4g}' for key, value in level.items()))
        runner.logger.info('\n'.join(lines))
        runner.visualizer.add_scalars(scalars, step=stats['epoch'])

    def _save(self, runner, stats, labels, true_labels, saved) -> None:
        folder = os.path.join(runner.work_dir, LABELS_FOLDER)
        check_own_path(folder, f'{LABELS_FOLDER} folder', folder=True)  # never written through a link
        path = os.path.join(folder, f'epoch_{stats["epoch"]:04d}.npz')
        buffer = io.BytesIO()
        np.savez_compressed(buffer, labels=labels.numpy(), true_labels=true_labels.numpy(),
                            num_clusters=np.array(self.num_clusters), rate=stats['rate'],
                            epoch=stats['epoch'], **saved)
        AtomicLocalBackend().put(buffer.getvalue(), path)  # temp file, fsync, rename: as the checkpoints
        summary = os.path.join(folder, 'rounds.json')
        rounds = read_rounds(summary, runner.logger)
        rounds = [r for r in rounds if r['epoch'] < stats['epoch']] + [stats]
        try:
            write_json(rounds, summary, indent=1, strict=True)
        except OSError as err:  # e.g. a folder in its place that could not be moved aside
            cause = err.__cause__ or err
            reason = getattr(cause, 'strerror', None) or cause
            runner.logger.warning(f'could not write {summary} ({reason}); the round is in {path}, '
                                  'the run goes on')


# A summary's largest size: a round takes about 1 KB a clustering level, so this holds tens of
# thousands of rounds; a larger file is not one this hook wrote.
MAX_ROUNDS_BYTES = 64 << 20


def read_rounds(path: str, logger=None) -> list[dict]:
    """The rounds a ``rounds.json`` summary holds; a damaged one is reported, set aside and dropped.

    The summary is a convenience (the ``.npz`` files hold every round): a damaged file (cut short,
    not UTF-8, too large, nested too deep, not a list of rounds) or a folder in its place must not
    stop the run before its checkpoint.
    """
    if not os.path.lexists(path):
        return []
    try:
        rounds = read_json(path, MAX_ROUNDS_BYTES, own=True)
        if not (isinstance(rounds, list) and all(
                isinstance(r, dict) and isinstance(r.get('epoch'), int)
                and not isinstance(r['epoch'], bool) for r in rounds)):
            raise ValueError(f'a JSON {type(rounds).__name__}, not a list of rounds with an epoch '
                             'each')
        return rounds
    except (OSError, ValueError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        where = _set_aside(path)
        if logger is not None:
            logger.warning(f'{path} is corrupt ({" ".join(reason.split())}); {where} and started a '
                           'new summary from this round (the .npz files hold every round)')
        return []


def _set_aside(path: str) -> str:
    """Move a damaged ``path`` to a free ``path.corrupt[.N]`` name; what was done, for the log."""
    kept = path + '.corrupt'
    number = 0
    while os.path.lexists(kept):  # earlier damaged copies are kept too
        number += 1
        kept = f'{path}.corrupt.{number}'
    try:
        os.replace(path, kept)
    except OSError as err:
        return f'could not move it aside ({err.strerror or err}), so it stays'
    return f'moved to {kept}'
