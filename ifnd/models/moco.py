"""The queue form, MoCo v2: a momentum key encoder, a queue of negatives and shuffled BN.

:class:`KeyEncoder` (the momentum copy of the query encoder) is shared with MoCo v3
(``mocov3.py``).

The queue keeps each key's sample index and, where the data has them, its class, so detectors with
per-sample state (IFND's pseudo labels, GloFND's thresholds) flag queued keys as they flag the
batch's views, and the flags are counted against the classes as SimCLR's are.
"""
import copy
from typing import Literal

import torch
import torch.nn.functional as F
from mmengine.dist import broadcast, get_dist_info
from torch import nn

from ifnd.dist import gather_no_grad
from ifnd.models.contrastive import ContrastiveAlgorithm
from ifnd.models.false_negatives import NegativeBatch
from ifnd.models.split_bn import convert_split_batchnorm, split_batchnorm
from ifnd.registry import MODELS
from ifnd.settings import check_choice, check_number


@torch.no_grad()
def ring_enqueue(ptr: torch.Tensor, buffers: tuple[torch.Tensor, ...],
                 rows: tuple[torch.Tensor | int, ...]) -> None:
    """Write ``rows`` (one per buffer, the same number of rows each, or a fill value) into the
    ring ``buffers`` at ``ptr`` and advance it, on the device (no host sync); the oldest rows go."""
    num = next(r for r in rows if isinstance(r, torch.Tensor)).shape[0]
    length = buffers[0].shape[0]
    slots = ring_slots(ptr, num, length)
    for buffer, values in zip(buffers, rows):
        buffer[slots] = values
    ptr.copy_((ptr + num) % length)


def ring_slots(ptr: torch.Tensor, num: int, length: int) -> torch.Tensor:
    """The rows of a ring of ``length`` that the next ``num`` rows written at ``ptr`` overwrite."""
    return (ptr + torch.arange(num, device=ptr.device)) % length


class KeyEncoder:
    """A momentum copy of the query encoder (``momentum_backbone``, ``momentum_neck``), shared by
    MoCo v2 and v3: built from the query's, initialised as it, updated by
    ``key ← m·key + (1 − m)·query`` and read for clustering (PCL's and HCSC's choice;
    ``cluster_encoder='query'`` clusters the query encoder's features instead)."""

    def _build_key_encoder(self, convert=None, cluster_encoder: str = 'momentum') -> None:
        """The key encoder as copies of ``backbone`` and ``neck`` (through ``convert``), frozen;
        ``cluster_encoder``: which encoder the clustering rounds read."""
        self.cluster_encoder = check_choice(type(self).__name__, 'cluster_encoder', cluster_encoder,
                                            ('momentum', 'query'), hint='the encoder whose features are clustered')
        convert = convert or (lambda module: module)
        self.momentum_backbone = convert(copy.deepcopy(self.backbone))
        self.momentum_neck = convert(copy.deepcopy(self.neck))
        for param in self._key_params():
            param.requires_grad_(False)

    def _key_params(self) -> list[nn.Parameter]:
        return list(self.momentum_backbone.parameters()) + list(self.momentum_neck.parameters())

    def _query_params(self) -> list[nn.Parameter]:
        return list(self.backbone.parameters()) + list(self.neck.parameters())

    def init_weights(self) -> None:
        """Initialise the query encoder, then copy it into the key encoder."""
        super().init_weights()
        with torch.no_grad():
            torch._foreach_copy_(self._key_params(), self._query_params())

    @torch.no_grad()
    def clustering_features(self, inputs: torch.Tensor, feature: str = 'z') -> torch.Tensor:
        """Features of the momentum encoder (as PCL), or of the query encoder with
        ``cluster_encoder='query'``: embeddings z or backbone features f."""
        if self.cluster_encoder == 'query':
            return super().clustering_features(inputs, feature)
        feats = self.momentum_backbone(inputs)
        if feature == 'f':
            return F.normalize(feats.float(), dim=1)
        if feature == 'z':
            return F.normalize(self.momentum_neck(feats).float(), dim=1)
        raise ValueError(f"feature must be 'z' or 'f', got {feature!r}")

    def _key_embed(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.momentum_neck(self.momentum_backbone(x)).float(), dim=1)

    @torch.no_grad()
    def _momentum_update(self) -> None:
        # self.momentum: MoCo v2's constant, MoCo v3's value for the current iteration.
        torch._foreach_lerp_(self._key_params(), self._query_params(), 1.0 - self.momentum)


@MODELS.register_module()
class MoCoV2(KeyEncoder, ContrastiveAlgorithm):
    """MoCo v2: momentum key encoder, a queue of negatives, and batch shuffling for BN.

    Across ranks keys are shuffled between processes as in MoCo. In one process the shuffled
    key batch is encoded with ``bn_splits`` groups of BN statistics (the key encoder's BN layers
    are :class:`SplitBatchNorm`, one forward pass), so each group sees a different sub-batch and
    the query cannot cheat through batch statistics, as with several GPUs.
    """

    # Buffers that older checkpoints lack, filled in by _load_from_state_dict (the checkpoint
    # checks, ifnd.fileio's state_differences, accept their absence).
    filled_when_missing = ('queue_label',)

    def __init__(self, backbone: dict, neck: dict, queue_len: int = 65536, momentum: float = 0.999,
                 temperature: float = 0.2, bn_splits: int = 8,
                 cluster_encoder: Literal['momentum', 'query'] = 'momentum', **kwargs) -> None:
        name = type(self).__name__
        queue_len = check_number(name, 'queue_len', queue_len, int, low=1,
                                 hint='the number of queued keys, the negatives')
        momentum = check_number(name, 'momentum', momentum, low=0, high=1, high_open=True,
                                hint="the key encoder's share of its own weights at each step; 1 "
                                'would keep it at its initial weights')
        bn_splits = check_number(name, 'bn_splits', bn_splits, int, low=1,
                                 hint="groups of the key encoder's BN statistics")
        super().__init__(backbone, neck, temperature, **kwargs)
        if self.needs.batch_only:
            raise ValueError(f'the {type(self.detector).__name__} detector scores both views of '
                             "each candidate image, and MoCo's queue keeps one: use it on the "
                             "SimCLR base (type='SimCLR'), or detector=dict(type='PseudoLabels'), "
                             "'GloFND' or 'GroundTruth' here")
        self.momentum = momentum
        self.bn_splits = bn_splits
        # Split BN only in the key encoder: same parameters and state-dict keys, plain BN unless
        # _shuffled_keys asks for groups.
        self._build_key_encoder(convert_split_batchnorm, cluster_encoder)
        dim = self.neck.out_dim
        self.register_buffer('queue', F.normalize(torch.randn(queue_len, dim), dim=1))
        # Sample index and class of each key; -1 for the initial random rows (and unknown classes).
        self.register_buffer('queue_index', torch.full((queue_len,), -1, dtype=torch.long))
        self.register_buffer('queue_label', torch.full((queue_len,), -1, dtype=torch.long))
        self.register_buffer('queue_ptr', torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def _shuffled_keys(self, x: torch.Tensor) -> torch.Tensor:
        rank, world_size = get_dist_info()
        if world_size > 1:
            gathered = gather_no_grad(x)
            perm = torch.randperm(gathered.shape[0], device=x.device)
            broadcast(perm, 0)
            own = perm.view(world_size, -1)[rank]
            keys = gather_no_grad(self._key_embed(gathered[own]))
            return keys[torch.argsort(perm)].view(world_size, -1, keys.shape[1])[rank]
        perm = torch.randperm(x.shape[0], device=x.device)
        # BN needs at least two samples per sub-batch.
        splits = min(self.bn_splits, max(1, x.shape[0] // 2))
        if x.shape[0] % splits:  # unequal sub-batches: one forward per chunk of x[perm]
            keys = torch.cat([self._key_embed(chunk) for chunk in x[perm].chunk(splits)])
            return keys[torch.argsort(perm)]
        # One forward: row i goes to BN group i % splits, so ordering x[perm] column-wise puts
        # chunk g of x[perm] into group g, in order: the same keys and running statistics as the
        # chunked forwards.
        order = perm.view(splits, -1).t().reshape(-1)
        with split_batchnorm(self.momentum_backbone, splits), \
                split_batchnorm(self.momentum_neck, splits):
            keys = self._key_embed(x[order])
        return keys[torch.argsort(order)]

    @torch.no_grad()
    def _enqueue(self, keys: torch.Tensor, index: torch.Tensor, labels: torch.Tensor | None = None) -> None:
        """Queue the keys of all ranks with their sample indices and classes (-1: unknown)."""
        rows = (gather_no_grad(keys), gather_no_grad(index),
                -1 if labels is None else gather_no_grad(labels.to(index.device)))
        ring_enqueue(self.queue_ptr, (self.queue, self.queue_index, self.queue_label), rows)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs) -> None:
        # Checkpoints from before the queue kept classes: their keys' classes are unknown (-1).
        state_dict.setdefault(prefix + 'queue_label', torch.full_like(self.queue_label, -1))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def loss(self, inputs: list[torch.Tensor], data_samples: dict) -> dict:
        """InfoNCE of queries against their keys and the queue, with its detector's flags treated."""
        self._check_views(inputs)
        features = self.backbone(inputs[0])
        self._momentum_update()  # the key encoder's weights only: the queries' are read, not changed
        k = self._shuffled_keys(inputs[1])
        index = self._sample_index(data_samples, k.shape[0], k.device)
        _, world_size = get_dist_info()
        if self.compiles(k.device):
            # A compiled graph may read its inputs again in its backward (recomputing rather than
            # saving): it gets copies of the queue, which the enqueue below overwrites.
            queue = (self.queue.clone(), self.queue_index.clone(), self.queue_label.clone(), None)
        else:  # the queue itself, no copy: the loss keeps the rows the enqueue overwrites
            queue = (self.queue, self.queue_index, self.queue_label,
                     ring_slots(self.queue_ptr, k.shape[0] * world_size, len(self.queue)))
        losses = self.compiled('head_losses', k.device)(features, k, index, data_samples, *queue)
        if index is None:
            index = torch.full((k.shape[0],), -1, dtype=torch.long, device=k.device)
        self._enqueue(k, index, data_samples.get('label'))
        return self._add_detection(losses)

    def head_losses(self, features: torch.Tensor, k: torch.Tensor, index: torch.Tensor | None,
                    data_samples: dict, queue: torch.Tensor, queue_index: torch.Tensor,
                    queue_label: torch.Tensor, overwritten: torch.Tensor | None) -> dict:
        """The loss of the queries' backbone features (projected and normalised) against their keys
        and the queue (:meth:`queue_loss`), and its logs."""
        q = self.project(features)
        return self.queue_loss(q, k, index, data_samples, queue, queue_index, queue_label, overwritten)

    def queue_loss(self, q: torch.Tensor, k: torch.Tensor, index: torch.Tensor | None,
                   data_samples: dict, queue: torch.Tensor, queue_index: torch.Tensor,
                   queue_label: torch.Tensor, overwritten: torch.Tensor | None) -> dict:
        """The layout: the queries against their own key (column 0 of the logits) and the queue
        ``[K, D]`` (its sample indices and classes ``[K]``; ``overwritten``: the rows the step's
        enqueue overwrites in place before the backward, None if it does not), every queued key a
        negative."""
        classes = self._classes(data_samples)
        batch = NegativeBatch(anchors=q, candidates=queue,
                              negatives=torch.ones((), dtype=torch.bool, device=q.device).expand(
                                  q.shape[0], queue.shape[0]),  # a view: no [M, K] mask is made
                              anchor_index=index, candidate_index=queue_index, anchor_classes=classes,
                              candidate_classes=None if classes is None else queue_label,
                              positives=k, overwritten=overwritten, negatives_per_anchor=queue.shape[0])
        return self.negatives_loss(batch)
