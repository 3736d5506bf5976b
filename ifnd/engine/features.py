"""Feature extraction over a whole data set, sharded across ranks and gathered as tensors."""
import copy
import sys

import torch
from mmengine.dataset import default_collate
from mmengine.dist import all_gather, get_dist_info, is_main_process
from mmengine.model import is_model_wrapper
from mmengine.utils import ProgressBar
from torch.utils.data import DataLoader, Dataset, Subset

from ifnd.registry import DATASETS


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The algorithm inside a DDP/FSDP wrapper, or the model itself."""
    return model.module if is_model_wrapper(model) else model


def build_eval_dataset(dataset_cfg: dict, pipeline: dict | None) -> Dataset:
    """Build a data set from a config, replacing its pipeline (e.g. by the eval transform)."""
    cfg = copy.deepcopy(dict(dataset_cfg))
    if pipeline is not None:
        cfg['pipeline'] = pipeline
    return DATASETS.build(cfg)


@torch.no_grad()
def extract_features(model: torch.nn.Module, dataset: Dataset, feature: str = 'z',
                     batch_size: int = 256, num_workers: int = 2,
                     desc: str = 'extracting features') -> tuple[torch.Tensor, torch.Tensor]:
    """Features ``[N, D]`` (float32, CPU) and labels ``[N]`` of every sample, on every rank.

    Each rank encodes the samples ``rank::world_size``; the shards are all-gathered as tensors
    and put back in sample order. The model is in eval mode meanwhile.
    """
    algorithm = unwrap_model(model)
    rank, world_size = get_dist_info()
    num = len(dataset)
    shard = list(range(rank, num, world_size))
    loader = DataLoader(Subset(dataset, shard), batch_size=batch_size, shuffle=False,
                        num_workers=num_workers, collate_fn=default_collate,
                        persistent_workers=False)
    bar = None
    if is_main_process():
        print(f'{desc}: {num} images', flush=True)
        bar = ProgressBar(num, file=sys.stdout)
    was_training = algorithm.training
    algorithm.eval()
    feats, labels = [], []
    try:
        for batch in loader:
            data = algorithm.data_preprocessor(batch, False)
            feats.append(algorithm.clustering_features(data['inputs'][0], feature).float())
            labels.append(data['data_samples']['label'])
            if bar is not None:
                step = min(len(labels[-1]) * world_size, num - bar.completed)
                if step > 0:
                    bar.update(step)
    finally:
        algorithm.train(was_training)
    if bar is not None:
        sys.stdout.write('\n')
    device = feats[0].device if feats else next(algorithm.parameters()).device
    local_feats = torch.cat(feats) if feats else torch.empty(0, 0, device=device)
    local_labels = torch.cat(labels) if labels else torch.empty(0, dtype=torch.long, device=device)
    if world_size == 1:
        return local_feats.cpu(), local_labels.cpu()
    return _gather_shards(local_feats, local_labels, num, world_size)


def _gather_shards(feats: torch.Tensor, labels: torch.Tensor, num: int,
                   world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Shards differ in length by at most one: pad to equal size, gather, then interleave back.
    per_rank = -(-num // world_size)
    dim = feats.shape[1] if feats.numel() else 0
    dim = int(max(all_gather(torch.tensor([dim], device=feats.device)))[0])
    padded = feats.new_zeros(per_rank, dim)
    padded[:len(feats)] = feats
    padded_labels = labels.new_full((per_rank,), -1)
    padded_labels[:len(labels)] = labels
    all_feats = torch.stack(all_gather(padded), dim=1).reshape(-1, dim)[:num]
    all_labels = torch.stack(all_gather(padded_labels), dim=1).reshape(-1)[:num]
    return all_feats.cpu(), all_labels.cpu()
