"""Feature extraction over a whole data set, sharded across ranks, gathered as tensors and
checked: features no evaluation can use (non-finite, zero-length, collapsed) are refused."""
import contextlib
import copy
import logging
import math
import sys
from collections.abc import Iterator

import torch
from mmengine.dataset import default_collate
from mmengine.dist import all_gather, all_reduce, get_dist_info, is_main_process
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.runner import Runner
from mmengine.utils import ProgressBar
from torch.utils.data import DataLoader, Dataset, Subset

from ifnd.dist import gather_shards, shard_index
from ifnd.engine.optim import amp_options
from ifnd.registry import DATASETS


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The algorithm inside a DDP/FSDP wrapper, or the model itself."""
    return model.module if is_model_wrapper(model) else model


def fit_eval_view(pipeline: dict | None, backbone: torch.nn.Module, source: str) -> dict | None:
    """The evaluation view at the backbone's fixed input size (a ViT's), said where it changes."""
    required = getattr(backbone, 'input_size', None)
    if required is None or not isinstance(pipeline, dict) or pipeline.get('type') != 'EvalView' \
            or pipeline.get('size') in (required, [required, required], (required, required)):
        return pipeline
    print_log(f'{source} holds a network that takes {required}-pixel images only (a ViT\'s position '
              f'embedding fixes its input size): the evaluation view resizes to {required} pixels, '
              f'not {pipeline.get("size")}', logger='current', level=logging.WARNING)
    return {key: value for key, value in pipeline.items() if key != 'resize'} | {'size': required}


def build_eval_dataset(dataset_cfg: dict, pipeline: dict | None) -> Dataset:
    """Build a data set from a config, replacing its pipeline (e.g. by the eval transform)."""
    cfg = copy.deepcopy(dict(dataset_cfg))
    if pipeline is not None:
        cfg['pipeline'] = pipeline
    return DATASETS.build(cfg)


# Extraction batch of data sets read as tensors on the device, and of those read by a loader.
DEVICE_BATCH_SIZE = 2048
LOADER_BATCH_SIZE = 256


def _batches(dataset: Dataset, index: torch.Tensor, device: torch.device, batch_size: int | None,
             num_workers: int) -> Iterator[dict]:
    """Collated batches of the samples ``index``: read on ``device`` where the data set holds its
    images there (``evaluates_on_device``), else through a DataLoader."""
    if getattr(dataset, 'evaluates_on_device', False):
        step = batch_size or DEVICE_BATCH_SIZE
        return (dataset.eval_batch(index[i:i + step], device) for i in range(0, len(index), step))
    return iter(DataLoader(Subset(dataset, index.tolist()), batch_size=batch_size or LOADER_BATCH_SIZE,
                           shuffle=False, num_workers=num_workers, collate_fn=default_collate,
                           persistent_workers=False))


def _autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    """Mixed precision on CUDA (bfloat16 where supported, else float16) when ``enabled``."""
    if not enabled or device.type != 'cuda':
        return contextlib.nullcontext()
    return torch.autocast('cuda', dtype=getattr(torch, amp_options()['dtype']))


def pad_batch(inputs: torch.Tensor, size: int) -> torch.Tensor:
    """``inputs`` with its last row repeated up to ``size`` rows (unchanged if it has as many)."""
    # A compiled encoder then sees one batch shape: a smaller last batch would compile it once more
    # (a second graph, on a GPU too) for a single batch, and marking the batch dynamic instead
    # gives up static-shape kernels (and CUDA graphs). In eval mode each row is encoded on its
    # own (BN uses its running statistics), so the repeated rows change nothing; they are dropped.
    if len(inputs) >= size:
        return inputs
    return torch.cat([inputs, inputs[-1:].expand(size - len(inputs), *inputs.shape[1:])])


# What makes features unusable. Every model's ``clustering_features`` L2-normalises its output, so
# a healthy row has unit length: a row shorter than MIN_LENGTH had a norm past float32's range
# (finite weights that overflow: x / inf = 0) or none at all. A collapse is judged on up to
# SPREAD_SAMPLE evenly spaced rows: COLLAPSED_SHARE of them within MIN_SPREAD of their
# coordinate-wise median, relative to their length (quantiles and the median, so a few odd images
# do not hide it). Float32 rounding of identical rows gives about 1e-7; randomly initialised
# networks give 0.05 (a ViT on noise images) to 0.3 (ResNets), trained ones more: 1e-4 lies over
# two orders of magnitude from both.
MIN_LENGTH = 0.5
SPREAD_SAMPLE = 4096
COLLAPSED_SHARE = 0.9
MIN_SPREAD = 1e-4
CHECK_ROWS = 65536  # rows checked at a time: no full-size temporary beside the features
UNUSABLE_FIX = ('the network overflows float32 or outputs zeros (weights that are NaN or infinite, '
                'finite but far too large such as a weight or BatchNorm scale, or zeroed: a diverged '
                'run or an altered file); use an earlier checkpoint of the run, or train again with a '
                'lower learning rate or optim_wrapper.clip_grad')
COLLAPSE_FIX = ('the network maps every image alike (zeroed weights or BatchNorm scales, or a '
                'collapsed run); use an earlier checkpoint of the run')


def _feature_stats(feats: torch.Tensor) -> torch.Tensor:
    """Non-finite values, rows holding any, rows of (nearly) zero length and the rows' relative
    spread, as one float64 tensor on the features' device."""
    counts = torch.zeros(3, dtype=torch.float64, device=feats.device)
    for chunk in feats.split(CHECK_ROWS):
        finite = torch.isfinite(chunk)
        broken = ~finite.all(1)
        length = torch.linalg.vector_norm(chunk.nan_to_num(0.0, 0.0, 0.0), dim=1)
        counts += torch.stack([(~finite).sum(), broken.sum(), ((length < MIN_LENGTH) & ~broken).sum()])
    spread = torch.full((1,), math.inf, dtype=torch.float64, device=feats.device)  # too few to judge
    if len(feats) >= 2:
        pick = torch.linspace(0, len(feats) - 1, min(len(feats), SPREAD_SAMPLE), device=feats.device)
        rows = feats[pick.long()].double()
        centre = rows.median(0).values
        distance = torch.linalg.vector_norm(rows - centre, dim=1).quantile(COLLAPSED_SHARE)
        size = torch.linalg.vector_norm(rows, dim=1).quantile(COLLAPSED_SHARE)
        spread = torch.where(size > 0, distance / size, 0.0).view(1)
    return torch.cat([counts, spread])


def check_features(feats: torch.Tensor, num: int, source: str, desc: str,
                   on_collapse: str = 'raise') -> None:
    """Raise ``ValueError`` naming ``source`` for features no evaluation can use: non-finite, of
    zero length, or (nearly) one point (with ``on_collapse='warn'``, a warning for the last).

    ``feats``: this rank's rows of the ``num`` samples; every rank calls it and gets one verdict.
    """
    stats = _feature_stats(feats)
    if get_dist_info()[1] > 1:
        counts, spread = stats[:3], stats[3:]
        all_reduce(counts)
        all_reduce(spread, 'max')
        stats = torch.cat([counts, spread])
    values, broken, empty, spread = stats.tolist()  # the one host read of the check
    found = ([f'{int(broken)} give NaN or infinite values ({int(values)} values)'] if broken else []) + \
        ([f'{int(empty)} give all-zero features (a zero output, or a norm past float32\'s range '
          'that L2 normalisation turns into 0)'] if empty else [])
    if found:
        raise ValueError(f'{source}: its features are unusable: of the {num} images ({desc}), '
                         f'{" and ".join(found)}, so any accuracy or clustering on them is chance: '
                         f'{UNUSABLE_FIX}')
    if spread < MIN_SPREAD:
        message = (f'{source}: its features are (nearly) one point: {COLLAPSED_SHARE:.0%} of the {num} '
                   f'images ({desc}) lie within {spread:.1e} of one point, relative to the features\' '
                   f'length (under {MIN_SPREAD:.0e}; trained and randomly initialised networks spread '
                   f'them by over 1e-2), so any accuracy or clustering on them is chance: {COLLAPSE_FIX}')
        if on_collapse != 'warn':
            raise ValueError(message)
        print_log(message, logger='current', level=logging.WARNING)


def trained_model_source(runner: Runner, epochs_done: int) -> str:
    """The model a training run holds, as a feature check names it: before any epoch, the
    ``load_from`` checkpoint it started from (if any)."""
    load_from = runner.cfg.get('load_from') if epochs_done == 0 else None
    if load_from:
        return f'{load_from} (load_from)'
    return f'the model of {runner.work_dir} after {epochs_done} epochs'


def _encode(algorithm: torch.nn.Module, batches: Iterator[dict], feature: str, autocast: bool,
            bar: ProgressBar | None, num: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Features and labels of each batch, the model in eval mode meanwhile."""
    world_size = get_dist_info()[1]
    model_device = next(algorithm.parameters()).device
    was_training = algorithm.training
    algorithm.eval()
    feats, labels = [], []
    full = 0  # the first batch's size: every batch but the last has it
    # Padding serves a compiled encoder only (one batch shape); others encode the last batch as is.
    compiled = any(getattr(m, 'compile_cfg', None) is not None for m in algorithm.modules())
    try:
        for batch in batches:
            data = algorithm.data_preprocessor(batch, False)
            inputs = data['inputs'][0]
            full = full or len(inputs)
            with _autocast(model_device, autocast):
                out = algorithm.clustering_features(pad_batch(inputs, full) if compiled else inputs,
                                                    feature)
            feats.append(out[:len(inputs)].float())
            labels.append(data['data_samples']['label'])
            if bar is not None:
                step = min(len(labels[-1]) * world_size, num - bar.completed)
                if step > 0:
                    bar.update(step)
    finally:
        algorithm.train(was_training)
    if bar is not None:
        sys.stdout.write('\n')
    return feats, labels


@torch.no_grad()
def extract_features(model: torch.nn.Module, dataset: Dataset, feature: str = 'z',
                     batch_size: int | None = None, num_workers: int = 2,
                     desc: str = 'extracting features', gather: bool = True,
                     autocast: bool = False, source: str = 'the model',
                     on_collapse: str = 'raise') -> tuple[torch.Tensor, torch.Tensor]:
    """Features ``[N, D]`` (float32, CPU) and labels ``[N]`` of every sample, on every rank.

    Each rank encodes the samples ``shard_index(N)``; the shards are all-gathered as tensors
    and put back in sample order. With ``gather=False`` each rank gets only its shard's features
    (on the model's device) and labels. The model is in eval mode meanwhile. A data set that
    holds its images on the device (``augment_on='device'`` with an ``EvalView``) is read there
    in batches of ``batch_size`` (default 2048), without a DataLoader; others through one
    (default 256). ``autocast``: run the model in mixed precision where it is on CUDA.
    Features no evaluation can use raise ``ValueError`` naming ``source`` (the checkpoint):
    :func:`check_features`, with ``on_collapse``.
    """
    if batch_size is not None and batch_size < 1:
        raise ValueError(f'feature extraction batch_size must be >= 1, got {batch_size}')
    algorithm = unwrap_model(model)
    world_size = get_dist_info()[1]
    num = len(dataset)
    model_device = next(algorithm.parameters()).device
    batches = _batches(dataset, shard_index(num), model_device, batch_size, num_workers)
    bar = None
    if is_main_process():
        print(f'{desc}: {num} images', flush=True)
        bar = ProgressBar(num, file=sys.stdout)
    feats, labels = _encode(algorithm, batches, feature, autocast, bar, num)
    device = feats[0].device if feats else model_device
    local_feats = torch.cat(feats) if feats else torch.empty(0, 0, device=device)
    local_labels = torch.cat(labels) if labels else torch.empty(0, dtype=torch.long, device=device)
    if world_size > 1:
        # A rank without samples does not know the feature dimension: take the largest.
        dim = local_feats.shape[1] if local_feats.numel() else 0
        dim = int(max(all_gather(torch.tensor([dim], device=local_feats.device)))[0])
        local_feats = local_feats.reshape(len(local_labels), dim)
    check_features(local_feats, num, source, desc, on_collapse)
    if not gather:
        return local_feats, local_labels.cpu()
    return gather_shards(local_feats, num).cpu(), gather_shards(local_labels, num).cpu()
