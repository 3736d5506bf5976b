"""Feature extraction over a whole data set, sharded across ranks and gathered as tensors."""
import contextlib
import copy
import logging
import sys
from collections.abc import Iterator

import torch
from mmengine.dataset import default_collate
from mmengine.dist import all_gather, get_dist_info, is_main_process
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
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


@torch.no_grad()
def extract_features(model: torch.nn.Module, dataset: Dataset, feature: str = 'z',
                     batch_size: int | None = None, num_workers: int = 2,
                     desc: str = 'extracting features', gather: bool = True,
                     autocast: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Features ``[N, D]`` (float32, CPU) and labels ``[N]`` of every sample, on every rank.

    Each rank encodes the samples ``shard_index(N)``; the shards are all-gathered as tensors
    and put back in sample order. With ``gather=False`` each rank gets only its shard's features
    (on the model's device) and labels. The model is in eval mode meanwhile. A data set that
    holds its images on the device (``augment_on='device'`` with an ``EvalView``) is read there
    in batches of ``batch_size`` (default 2048), without a DataLoader; others through one
    (default 256). ``autocast``: run the model in mixed precision where it is on CUDA.
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
    device = feats[0].device if feats else model_device
    local_feats = torch.cat(feats) if feats else torch.empty(0, 0, device=device)
    local_labels = torch.cat(labels) if labels else torch.empty(0, dtype=torch.long, device=device)
    if world_size > 1:
        # A rank without samples does not know the feature dimension: take the largest.
        dim = local_feats.shape[1] if local_feats.numel() else 0
        dim = int(max(all_gather(torch.tensor([dim], device=local_feats.device)))[0])
        local_feats = local_feats.reshape(len(local_labels), dim)
    if not gather:
        return local_feats, local_labels.cpu()
    return gather_shards(local_feats, num).cpu(), gather_shards(local_labels, num).cpu()
