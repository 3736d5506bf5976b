"""Incremental false negative detection: periodic clustering into the model's label bank."""
import io
import json
import os
import time

import numpy as np
import torch
from mmengine.dist import broadcast, get_world_size, is_main_process
from mmengine.hooks import Hook

from ifnd.clustering import (accept_labels, acceptance_rate, cluster_confidence, confidence,
                             kmeans_options, multi_level_kmeans, pcl_concentration,
                             resolve_backend)
from ifnd.engine.checkpoint import AtomicLocalBackend
from ifnd.engine.cli import json_safe
from ifnd.engine.features import (build_eval_dataset, extract_features, gather_shards, shard_index,
                                  unwrap_model)
from ifnd.evaluation.metrics import cluster_quality, false_negative_rates
from ifnd.registry import HOOKS

CONFIDENCES = ('kappa', 'pcl')
# kmeans() options PseudoLabelHook sets itself: the per-round seed (from its own ``seed``), the
# model's device and each process's shard.
_HOOK_SET_KMEANS_OPTIONS = ('seed', 'device', 'sample_index')


@HOOKS.register_module()
class PseudoLabelHook(Hook):
    """Clusters the training set before training and every ``interval`` epochs.

    Each round: features of all training images under the eval transform (every rank, its
    shard), multi-level k-means and confidence on rank 0 (or sharded over all ranks), acceptance
    of the global top ``ceil(r * N)`` per level, broadcast, and an update of the model's label
    bank.

    ``kmeans``: options of :func:`ifnd.clustering.kmeans` (``backend='auto'`` picks faiss on the
    GPU when faiss has GPU support, else PyTorch k-means on the model's GPU, else faiss on the
    CPU), plus ``sharded``: with several processes, each keeps its shard of the features, the
    k-means steps all-reduce per-centroid sums, κ is computed per shard and only the per-sample
    assignments and confidences are gathered (same labels as one process). Default ``None``:
    sharded when the world size is above 1 and the backend is torch; ``True`` forces the torch
    backend; ``False`` gathers all features on rank 0. The acceptance
    rate r follows ``scheme`` ('constant', 'step', 'linear'), evaluated at the number of epochs
    completed. ``confidence='kappa'`` is IFND's per-sample Eq. (2); ``'pcl'`` is PCL's
    per-cluster concentration. Each round's labels and confidences are saved under
    ``work_dir/pseudo_labels/``.

    Features are extracted in batches of ``batch_size``: by default 2048 where the training set
    is held on the device (``augment_on='device'``: the uint8 images are read there and the eval
    view made there, no DataLoader), else 256 through a DataLoader with ``num_workers``;
    ``autocast``: the encoder runs in bfloat16 autocast where it is on CUDA (float32 on a CPU).
    """

    priority = 'NORMAL'  # before CheckpointHook, so each checkpoint holds the new labels

    # The keys a config may set inside dict-valued arguments, with their types: read by the
    # config checks of tools/train.py (``--cfg-options custom_hooks.0.kmeans.backend=torch``).
    config_dict_options = {'kmeans': {
        **{name: param.annotation for name, param in kmeans_options().items()
           if name not in _HOOK_SET_KMEANS_OPTIONS},
        'sharded': bool | None}}

    def __init__(self, num_clusters: list[int], pipeline: dict | None = None, interval: int = 1,
                 scheme: str = 'linear', final_rate: float = 1.0, step_epoch: int = 0,
                 feature: str = 'z', confidence: str = 'kappa', temperature: float | None = None,
                 kmeans: dict | None = None, seed: int = 0, dataset: dict | None = None,
                 batch_size: int | None = None, num_workers: int = 2, save_labels: bool = True,
                 autocast: bool = True) -> None:
        if isinstance(num_clusters, int) or not num_clusters:
            raise ValueError(f'PseudoLabelHook num_clusters must be a non-empty list of k, one per '
                             f'level, got {num_clusters!r}; e.g. num_clusters=[10, 30, 100]')
        if min(num_clusters) < 2:
            raise ValueError(f'PseudoLabelHook num_clusters={list(num_clusters)} has a level with '
                             f'k={min(num_clusters)}: one cluster holds every sample, so all '
                             'negatives would be eliminated (loss 0, nothing learned); use k >= 2 '
                             'at every level')
        if confidence not in CONFIDENCES:
            raise ValueError(f'confidence must be one of {CONFIDENCES}, got {confidence!r}')
        if interval < 1:
            raise ValueError(f'PseudoLabelHook interval must be >= 1, got {interval}')
        if batch_size is not None and batch_size < 1:
            raise ValueError(f'PseudoLabelHook batch_size must be >= 1 (or None: 2048 for data held '
                             f'on the device, else 256), got {batch_size}')
        acceptance_rate(0, 1, scheme, final_rate, step_epoch)  # validates the schedule now
        self.num_clusters = list(num_clusters)
        self.pipeline = pipeline
        self.interval = interval
        self.scheme = scheme
        self.final_rate = final_rate
        self.step_epoch = step_epoch
        self.feature = feature
        self.confidence = confidence
        self.temperature = temperature
        self.kmeans = dict(kmeans or {})
        self.sharded = self.kmeans.pop('sharded', None)
        if self.sharded not in (None, True, False):
            raise ValueError(f'kmeans.sharded must be None (auto), True or False, got '
                             f'{self.sharded!r}')
        if self.sharded and self.kmeans.get('backend', 'auto') == 'faiss':
            raise ValueError('kmeans.sharded=True runs PyTorch k-means; use backend="torch" or '
                             '"auto", or sharded=False for faiss')
        for key in _HOOK_SET_KMEANS_OPTIONS:
            if key in self.kmeans:
                raise ValueError(f'kmeans.{key} is set by PseudoLabelHook (its own seed, the '
                                 f'model\'s device and each process\'s shard); remove it from the '
                                 'config')
        unknown = sorted(set(self.kmeans) - set(self.config_dict_options['kmeans']))
        if unknown:
            raise TypeError(f'PseudoLabelHook got unknown kmeans options {unknown}; it takes '
                            f'{", ".join(sorted(self.config_dict_options["kmeans"]))}')
        self.seed = seed
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.save_labels = save_labels
        self.autocast = autocast
        self._dataset = None

    def _data(self, runner):
        if self._dataset is None:
            cfg = self.dataset or runner.cfg.train_dataloader.dataset
            self._dataset = build_eval_dataset(cfg, self.pipeline)
        return self._dataset

    def before_train(self, runner) -> None:
        """Start from instance labels and run the first round, unless resumed with labels."""
        model = unwrap_model(runner.model)
        bank = getattr(model, 'label_bank', None)
        if bank is None:
            raise TypeError(f'PseudoLabelHook needs an algorithm with pseudo labels (IFND, '
                            f"IFNDMoCo, PCL); {type(model).__name__} has label_source="
                            f'{getattr(model, "label_source", None)!r}')
        num = len(self._data(runner))
        if bank.num_levels == len(self.num_clusters) and bank.num_samples == num and runner.epoch > 0:
            if bank.cluster_counts == self.num_clusters:
                runner.logger.info(f'Resumed pseudo labels for {num} samples at epoch {runner.epoch}')
                return
        if runner.epoch > 0 and bank.num_levels:
            runner.logger.warning(
                f'The checkpoint\'s pseudo labels (k={bank.cluster_counts}, {bank.num_samples} '
                f'samples) do not match this run (num_clusters={self.num_clusters}, {num} '
                f'samples): clustering again now, at epoch {runner.epoch}')
        bank.reset(len(self.num_clusters), num)
        self.run_round(runner, runner.epoch)

    def after_train_epoch(self, runner) -> None:
        """Re-cluster every ``interval`` epochs."""
        done = runner.epoch + 1
        if done % self.interval == 0:
            self.run_round(runner, done)

    def _plan(self, device: torch.device) -> tuple[str, bool]:
        """The round's k-means backend and whether it runs sharded over the processes."""
        backend = resolve_backend(self.kmeans.get('backend', 'auto'), device)
        sharded = self.sharded
        if sharded is None:
            sharded = get_world_size() > 1 and backend == 'torch'
        return ('torch' if sharded else backend), sharded

    def run_round(self, runner, epochs_done: int) -> dict:
        """One clustering round; returns the per-level statistics (rank 0) or {}."""
        model = unwrap_model(runner.model)
        bank = model.label_bank
        dataset = self._data(runner)
        rate = acceptance_rate(epochs_done, runner.max_epochs, self.scheme, self.final_rate,
                               self.step_epoch)
        device = bank.labels.device
        backend, sharded = self._plan(device)
        tic = time.perf_counter()
        # Sharded, every rank keeps its own features; otherwise all are gathered everywhere.
        feats, true_labels = extract_features(runner.model, dataset, self.feature, self.batch_size,
                                              self.num_workers, desc=f'clustering round '
                                              f'(epoch {epochs_done})', gather=not sharded,
                                              autocast=self.autocast)
        extract_s = time.perf_counter() - tic
        num, levels = len(dataset), len(self.num_clusters)
        labels = torch.empty(levels, num, dtype=torch.long, device=device)
        pcl = model.uses_prototypes or self.confidence == 'pcl'
        centroids = torch.zeros(levels, max(self.num_clusters), feats.shape[1], device=device)
        concentration = torch.ones(levels, max(self.num_clusters), device=device)
        stats: dict = {}
        if sharded or is_main_process():
            stats, round_labels, cents, concs = self._cluster(
                feats.to(device), true_labels, num, backend, sharded, rate, epochs_done,
                float(model.temperature), pcl, runner, extract_s)
        if not is_main_process():
            stats = {}  # other ranks of a sharded round only helped
        else:
            labels.copy_(round_labels.to(device))
            for level, (c, phi) in enumerate(zip(cents, concs)):
                centroids[level, :len(c)] = c.to(device)
                concentration[level, :len(c)] = phi.to(device)
        broadcast(labels, 0)
        broadcast(centroids, 0)
        broadcast(concentration, 0)
        ks = self.num_clusters
        bank.update(labels, [centroids[i, :k] for i, k in enumerate(ks)],
                    [concentration[i, :k] for i, k in enumerate(ks)])
        return stats

    def _cluster(self, feats, true_labels, num, backend, sharded, rate, epochs_done, temperature,
                 pcl, runner, extract_s):
        """k-means, confidence and acceptance of one round: on rank 0 with all the features, or
        on every rank with its shard (``sharded``); logs and saves on rank 0."""
        seed = self.seed + 7919 * epochs_done  # a new seed every round, varied per level inside
        index = shard_index(num).to(feats.device) if sharded else None
        tic = time.perf_counter()
        results = multi_level_kmeans(feats, self.num_clusters, seed=seed,
                                     **{**self.kmeans, 'backend': backend}, sample_index=index)
        kmeans_s = time.perf_counter() - tic

        def gather(x):
            # Only the small per-sample arrays travel: acceptance ranks all N samples together.
            return (gather_shards(x, num) if sharded else x).cpu()

        main = is_main_process()
        true_labels = gather(true_labels)
        has_truth = bool((true_labels >= 0).all())
        round_labels, cents, concs, saved = [], [], [], {}
        first = results[0]
        stats = {'epoch': epochs_done, 'rate': rate, 'seconds_extract': extract_s,
                 'seconds_kmeans': kmeans_s,
                 'kmeans_backend': first.backend, 'kmeans_device': first.device,
                 'kmeans_processes': first.num_shards, 'levels': []}
        conf_s = 0.0
        for level, (k, res) in enumerate(zip(self.num_clusters, results)):
            tic = time.perf_counter()
            phi = pcl_concentration(feats, res.centroids, res.assignments, temperature,
                                    sharded=sharded) if pcl else torch.ones(k)
            if self.confidence == 'kappa':
                kappa = confidence(feats, res.centroids, res.assignments, temperature)
            else:
                kappa = cluster_confidence(phi, res.assignments)
            assignments, kappa = gather(res.assignments), gather(kappa)
            accepted, threshold = accept_labels(assignments, kappa, rate)
            conf_s += time.perf_counter() - tic
            round_labels.append(accepted)
            cents.append(res.centroids)
            concs.append(phi)
            if not main:
                continue
            sizes = torch.bincount(assignments, minlength=k).float()
            kept = accepted[accepted >= 0]
            level_stats = {
                'k': k, 'accept_rate': float((accepted >= 0).float().mean()),
                'kappa_threshold': threshold, 'clusters_used': int(kept.unique().numel()),
                'size_min': float(sizes.min()), 'size_median': float(sizes.median()),
                'size_max': float(sizes.max())}
            if has_truth:
                level_stats.update(cluster_quality(true_labels.numpy(), assignments.numpy()))
                mtpr, mtnr = false_negative_rates(accepted.numpy(), true_labels.numpy())
                level_stats.update(mtpr=mtpr, mtnr=mtnr)
            stats['levels'].append(level_stats)
            saved[f'assignments_{level}'] = assignments.numpy()
            saved[f'confidence_{level}'] = kappa.numpy()
            saved[f'centroids_{level}'] = res.centroids.cpu().numpy()
        stats['seconds_confidence'] = conf_s
        round_labels = torch.stack(round_labels)
        if main:
            self._log(runner, stats)
            if self.save_labels:
                self._save(runner, stats, round_labels, true_labels, saved)
        return stats, round_labels, cents, concs

    def _log(self, runner, stats: dict) -> None:
        scalars = {f'ifnd/seconds_{part}': stats[f'seconds_{part}']
                   for part in ('extract', 'kmeans', 'confidence')}
        scalars['ifnd/rate'] = stats['rate']
        where = f'k-means: {stats["kmeans_backend"]} on {stats["kmeans_device"]}'
        if stats['kmeans_processes'] > 1:
            where += f' (sharded over {stats["kmeans_processes"]} processes)'
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
        folder = os.path.join(runner.work_dir, 'pseudo_labels')
        path = os.path.join(folder, f'epoch_{stats["epoch"]:04d}.npz')
        buffer = io.BytesIO()
        np.savez_compressed(buffer, labels=labels.numpy(), true_labels=true_labels.numpy(),
                            num_clusters=np.array(self.num_clusters), rate=stats['rate'],
                            epoch=stats['epoch'], **saved)
        storage = AtomicLocalBackend()  # temp file, fsync, rename: as the checkpoints
        storage.put(buffer.getvalue(), path)
        summary = os.path.join(folder, 'rounds.json')
        rounds = read_rounds(summary, runner.logger)
        rounds = [r for r in rounds if r['epoch'] < stats['epoch']] + [stats]
        storage.put_text(json.dumps(json_safe(rounds), indent=1, allow_nan=False), summary)


def read_rounds(path: str, logger=None) -> list[dict]:
    """The rounds a ``rounds.json`` summary holds; a corrupt one is reported, kept aside and dropped.

    The summary is a convenience: a damaged file must not stop the run before its checkpoint.
    """
    if not os.path.exists(path):
        return []
    try:
        with open(path) as f:
            rounds = json.load(f)
        if not (isinstance(rounds, list)
                and all(isinstance(r, dict) and isinstance(r.get('epoch'), int) for r in rounds)):
            raise ValueError('not a list of rounds with an epoch each')
        return rounds
    except (ValueError, UnicodeDecodeError) as err:
        kept = path + '.corrupt'
        os.replace(path, kept)
        if logger is not None:
            logger.warning(f'{path} is corrupt ({" ".join(str(err).split())}); moved to {kept} '
                           'and started a new summary from this round (the .npz files hold every '
                           'round)')
        return []
