"""Contrastive algorithms: SimCLR and MoCo v2, with IFND, SupCon, the elimination oracle and PCL
built on them, and the other false-negative methods IFND is compared with: the debiased
contrastive loss, hard negative sampling and FNC."""
import copy
from typing import Sequence

import torch
import torch.nn.functional as F
from mmengine.dist import broadcast, get_dist_info
from mmengine.model import BaseModel
from torch import nn

from ifnd.dist import gather_no_grad, gather_with_grad
from ifnd.models.losses import (check_debiasing, check_fnc_options, contrastive_loss_from_candidates,
                                contrastive_loss_from_mask, debiased_loss_from_candidates,
                                false_negative_detection_counts, fnc_false_negatives,
                                proto_nce_loss, queue_contrastive_loss, queue_debiased_loss)
from ifnd.models.split_bn import convert_split_batchnorm, split_batchnorm
from ifnd.registry import MODELS

LABEL_SOURCES = ('none', 'pseudo', 'ground_truth')


class PseudoLabelBank(nn.Module):
    """Pseudo labels ``[levels, N]`` indexed by sample index, saved with the model.

    Unaccepted samples carry the unique label ``-(index + 1)``, which never equals a cluster id.
    PCL also keeps each level's centroids and concentrations (padded to the largest k).
    """

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer('labels', torch.empty(0, 0, dtype=torch.long))
        self.register_buffer('num_clusters', torch.empty(0, dtype=torch.long))
        self.register_buffer('centroids', torch.empty(0, 0, 0))
        self.register_buffer('concentration', torch.empty(0, 0))
        # Host-side copies, refreshed whenever the buffers change (once per clustering round), so
        # the training step reads them without a device sync.
        self.any_accepted = False
        self.cluster_counts: list[int] = []
        # Bumped whenever the labels change, so copies of them (MoCo's queue labels) know,
        # host-side, when to refresh.
        self.version = 0

    def _refresh_host_state(self) -> None:
        self.any_accepted = bool((self.labels >= 0).any()) if self.labels.numel() else False
        self.cluster_counts = self.num_clusters.tolist()
        self.version += 1

    @property
    def num_levels(self) -> int:
        """Number of clustering levels held (0 before the first reset)."""
        return self.labels.shape[0]

    @property
    def num_samples(self) -> int:
        """Number of samples the labels are indexed by."""
        return self.labels.shape[1]

    def reset(self, num_levels: int, num_samples: int) -> None:
        """Give every sample its own label at every level (pure instance discrimination)."""
        unique = -(torch.arange(num_samples, device=self.labels.device) + 1)
        self.labels = unique.repeat(num_levels, 1)
        self.num_clusters = torch.zeros(num_levels, dtype=torch.long, device=self.labels.device)
        self.centroids = torch.empty(0, 0, 0, device=self.labels.device)
        self.concentration = torch.empty(0, 0, device=self.labels.device)
        self._refresh_host_state()

    def update(self, labels: torch.Tensor, centroids: Sequence[torch.Tensor] | None = None,
               concentration: Sequence[torch.Tensor] | None = None) -> None:
        """Replace the labels ``[levels, N]`` (and, for PCL, centroids and concentrations)."""
        device = self.labels.device
        self.labels = labels.to(device=device, dtype=torch.long).clone()
        if centroids is not None:
            ks = [c.shape[0] for c in centroids]
            padded = torch.zeros(len(ks), max(ks), centroids[0].shape[1], device=device)
            conc = torch.ones(len(ks), max(ks), device=device)
            for level, c in enumerate(centroids):
                padded[level, :ks[level]] = c.to(device)
                if concentration is not None:
                    conc[level, :ks[level]] = concentration[level].to(device)
            self.centroids, self.concentration = padded, conc
            self.num_clusters = torch.tensor(ks, dtype=torch.long, device=device)
        self._refresh_host_state()

    def lookup(self, index: torch.Tensor) -> torch.Tensor:
        """Labels ``[levels, len(index)]`` of the given samples."""
        if self.num_levels == 0:
            raise RuntimeError('The pseudo-label bank is empty: add PseudoLabelHook to '
                               "custom_hooks (see configs/ifnd/) so it is filled before training")
        # Checked on the device: no host sync in the training step (on a GPU a failure surfaces as
        # a device-side assert carrying this message).
        torch._assert_async(index.max() < self.num_samples,
                            f'a sample index is outside the bank of {self.num_samples} samples; '
                            'the bank was built for another dataset')
        return self.labels[:, index]

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # The bank's size comes from the data set, so adopt the stored shapes before copying.
        for name, buf in self.named_buffers(recurse=False):
            stored = state_dict.get(prefix + name)
            if stored is not None and stored.shape != buf.shape:
                setattr(self, name, torch.empty_like(stored, device=buf.device))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._refresh_host_state()


class ContrastiveAlgorithm(BaseModel):
    """Backbone f, projection head g and the label source shared by every algorithm."""

    uses_prototypes = False  # whether the loss needs cluster centroids and concentrations
    records_detection = False  # whether the loss step counts its flagged false negatives

    def __init__(self, backbone: dict, neck: dict, temperature: float, loss_mode: str = 'inst',
                 label_source: str = 'none', data_preprocessor: dict | None = None,
                 init_cfg: dict | None = None) -> None:
        # Built here, in this scope, so the model also builds without init_default_scope('ifnd').
        data_preprocessor = MODELS.build(data_preprocessor or dict(type='ContrastiveDataPreprocessor'))
        super().__init__(data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        if label_source not in LABEL_SOURCES:
            raise ValueError(f'label_source must be one of {LABEL_SOURCES}, got {label_source!r}')
        if label_source == 'none' and loss_mode != 'inst':
            raise ValueError(f"loss_mode={loss_mode!r} needs labels: set label_source='pseudo' "
                             "(IFND) or 'ground_truth' (SupCon)")
        self.backbone = MODELS.build(backbone)
        neck = dict(neck)
        neck.setdefault('in_dim', self.backbone.out_dim)
        self.neck = MODELS.build(neck)
        self.temperature = temperature
        self.loss_mode = loss_mode
        self.label_source = label_source
        self._labels_checked = False
        if label_source == 'pseudo':
            self.label_bank = PseudoLabelBank()
        # Counts [levels, 3] of the negatives the loss flags, summed on the device while
        # FalseNegativeDetectionHook sets ``track_detection``. A plain attribute, not a buffer:
        # DDP would overwrite every rank's counts with rank 0's at each forward.
        self.track_detection = False
        self.detection_counts: torch.Tensor | None = None

    def extract_feat(self, inputs: torch.Tensor) -> torch.Tensor:
        """Backbone features f(x)."""
        return self.backbone(inputs)

    def embed(self, inputs: torch.Tensor) -> torch.Tensor:
        """L2-normalised embeddings z = g(f(x)), in float32 also under autocast."""
        return F.normalize(self.neck(self.backbone(inputs)).float(), dim=1)

    @torch.no_grad()
    def clustering_features(self, inputs: torch.Tensor, feature: str = 'z') -> torch.Tensor:
        """Features used for clustering: normalised embeddings z or backbone features f."""
        if feature == 'z':
            return self.embed(inputs)
        if feature == 'f':
            return F.normalize(self.extract_feat(inputs).float(), dim=1)
        raise ValueError(f"feature must be 'z' or 'f', got {feature!r}")

    def labels_can_match(self) -> bool:
        """Whether any label can be shared (host-side: no sync); if not, the loss is 'inst'."""
        if self.label_source == 'pseudo':
            return self.label_bank.any_accepted
        return self.label_source == 'ground_truth'

    def batch_labels(self, data_samples: dict) -> torch.Tensor | None:
        """Labels ``[levels, M]`` of the batch under this algorithm's label source."""
        if self.label_source == 'pseudo':
            return self.label_bank.lookup(data_samples['index'])
        if self.label_source == 'ground_truth':
            labels = data_samples['label']
            if not self._labels_checked:  # one host sync on the first batch, none afterwards
                if bool((labels < 0).any()):
                    raise ValueError("label_source='ground_truth' needs a data set with labels")
                self._labels_checked = True
            return labels.view(1, -1)
        return None

    def forward(self, inputs, data_samples: dict | None = None, mode: str = 'tensor'):
        """mmengine entry point: 'loss' for training, 'tensor'/'predict' for features."""
        if mode == 'loss':
            return self.loss(inputs, data_samples or {})
        views = inputs[0] if isinstance(inputs, (list, tuple)) else inputs
        if mode == 'tensor':
            return self.extract_feat(views)
        if mode == 'predict':
            return self.clustering_features(views, 'f')
        raise ValueError(f"mode must be 'loss', 'tensor' or 'predict', got {mode!r}")

    def loss(self, inputs: list[torch.Tensor], data_samples: dict) -> dict:
        """Loss dict for a batch of views."""
        raise NotImplementedError

    def _check_two_views(self, inputs: list[torch.Tensor]) -> None:
        if len(inputs) < 2:
            raise ValueError(f'{type(self).__name__} needs two views per image; the pipeline gave '
                             f'{len(inputs)}: use MultiView(num_views=2)')

    def _record_detection(self, flagged: torch.Tensor | None, positive_index: torch.Tensor,
                          self_index: torch.Tensor, num_candidates: int, data_samples: dict,
                          levels: int = 1) -> None:
        """Add the batch's detection counts (ground truth: ``data_samples['label']``) when tracked.

        ``flagged`` [L, A, C] are the candidates the loss treats as false negatives of the local
        anchors ``cat([z1, z2])`` among the gathered ``cat([z1s, z2s])``; ``None``: none.
        """
        classes = data_samples.get('label')
        if not self.track_detection or classes is None:
            return
        columns = torch.arange(num_candidates, device=positive_index.device).unsqueeze(0)
        negatives = (columns != positive_index.unsqueeze(1)) & (columns != self_index.unsqueeze(1))
        counts = false_negative_detection_counts(flagged, negatives, classes.repeat(2),
                                                 gather_no_grad(classes).repeat(2), levels)
        held = self.detection_counts
        if held is None or held.shape != counts.shape or held.device != counts.device:
            self.detection_counts = counts
        else:
            held += counts

    @staticmethod
    def _diagnostics(labels: torch.Tensor | None) -> dict:
        # Logged (not optimised): the share of the batch that carries an accepted pseudo label.
        if labels is None:
            return {}
        return {'accepted': (labels >= 0).float().mean().detach()}


@MODELS.register_module()
class SimCLR(ContrastiveAlgorithm):
    """SimCLR: 2M views per batch, every other view a negative; views gathered across ranks."""

    records_detection = True  # label-masked modes flag the candidates sharing the anchor's label

    def __init__(self, backbone: dict, neck: dict, temperature: float = 0.1, **kwargs) -> None:
        super().__init__(backbone, neck, temperature, **kwargs)

    def embed_views(self, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings of the two views, encoded as one batch of 2M (BN sees both views)."""
        self._check_two_views(inputs)
        z1, z2 = self.embed(torch.cat(inputs[:2])).chunk(2)
        return z1, z2

    def gathered_views(self, z1: torch.Tensor, z2: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Local anchors ``cat([z1, z2])``, the views of all ranks ``cat([z1s, z2s])`` (with
        gradients), and each anchor's positive and own row among them."""
        num = z1.shape[0]
        rank, world_size = get_dist_info()
        total = num * world_size
        candidates = torch.cat([gather_with_grad(z1), gather_with_grad(z2)])
        own = torch.arange(num, device=z1.device) + rank * num
        return (torch.cat([z1, z2]), candidates, torch.cat([own + total, own]),
                torch.cat([own, own + total]))

    def instance_losses(self, z1: torch.Tensor, z2: torch.Tensor, data_samples: dict) -> dict:
        """Masked InfoNCE over the 2M local views against the views of all ranks."""
        anchors, candidates, positive_index, self_index = self.gathered_views(z1, z2)
        labels = self.batch_labels(data_samples)
        anchor_labels = candidate_labels = None
        # Unaccepted samples carry unique labels, so before any label is accepted the loss is
        # exactly instance discrimination: no masks are built. Afterwards a batch without any
        # accepted label still gets the bit-identical 'inst' loss, selected on the device.
        if labels is not None and self.labels_can_match():
            candidate_labels = gather_no_grad(labels.t()).t().repeat(1, 2)
            anchor_labels = labels.repeat(1, 2)
        with torch.autocast(z1.device.type, enabled=False):  # logits / tau need float32
            per_anchor = contrastive_loss_from_candidates(
                anchors, candidates, positive_index, self_index, anchor_labels,
                candidate_labels, self.temperature, self.loss_mode, instance_if_unaccepted=True)
        if self.track_detection:
            # Flagged: the candidates sharing the anchor's label, per level, when the loss uses
            # them ('elim' / 'attr'); the own positive is left out by the counting.
            flagged = None
            if anchor_labels is not None and self.loss_mode != 'inst':
                flagged = anchor_labels.unsqueeze(2) == candidate_labels.unsqueeze(1)
            self._record_detection(flagged, positive_index, self_index, candidates.shape[0],
                                   data_samples, 1 if labels is None else labels.shape[0])
        return {'loss': per_anchor.mean(), **self._diagnostics(labels)}

    def loss(self, inputs: list[torch.Tensor], data_samples: dict) -> dict:
        """The instance-level (or label-masked) contrastive loss of a batch."""
        return self.instance_losses(*self.embed_views(inputs), data_samples)


@MODELS.register_module()
class IFND(SimCLR):
    """IFND on the SimCLR base: pseudo labels from clustering, false negatives eliminated."""

    def __init__(self, backbone: dict, neck: dict, temperature: float = 0.5,
                 loss_mode: str = 'elim', **kwargs) -> None:
        kwargs.setdefault('label_source', 'pseudo')
        super().__init__(backbone, neck, temperature, loss_mode=loss_mode, **kwargs)


@MODELS.register_module()
class SupCon(SimCLR):
    """SupCon, the oracle: attraction loss with ground-truth labels."""

    def __init__(self, backbone: dict, neck: dict, temperature: float = 0.5,
                 loss_mode: str = 'attr', **kwargs) -> None:
        kwargs.setdefault('label_source', 'ground_truth')
        super().__init__(backbone, neck, temperature, loss_mode=loss_mode, **kwargs)


@MODELS.register_module()
class OracleElim(SimCLR):
    """The elimination oracle: Eq. 3 with ground-truth labels, every false negative removed.

    Beside SupCon (attraction with ground truth) it bounds what a perfect detector could give
    IFND's elimination loss, so a small IFND gain can be read as "detection falls short" or
    "elimination does not help here".
    """

    def __init__(self, backbone: dict, neck: dict, temperature: float = 0.5,
                 loss_mode: str = 'elim', **kwargs) -> None:
        kwargs.setdefault('label_source', 'ground_truth')
        super().__init__(backbone, neck, temperature, loss_mode=loss_mode, **kwargs)


@MODELS.register_module()
class PCL(SimCLR):
    """PCL on the SimCLR base: instance InfoNCE plus ProtoNCE over the accepted samples."""

    uses_prototypes = True

    def __init__(self, backbone: dict, neck: dict, temperature: float = 0.5,
                 loss_mode: str = 'inst', proto_weight: float = 1.0, **kwargs) -> None:
        kwargs.setdefault('label_source', 'pseudo')
        super().__init__(backbone, neck, temperature, loss_mode=loss_mode, **kwargs)
        self.proto_weight = proto_weight

    def loss(self, inputs: list[torch.Tensor], data_samples: dict) -> dict:
        """Instance term (of ``loss_mode``) plus the prototype term of ProtoNCE."""
        z1, z2 = self.embed_views(inputs)
        losses = self.instance_losses(z1, z2, data_samples)
        bank = self.label_bank
        ks = bank.cluster_counts  # host-side: no sync
        if not ks or min(ks) == 0:
            # Before the first clustering there are no prototypes: the instance term alone.
            losses['loss_proto'] = losses['loss'].new_zeros(())
            return losses
        assignments = bank.lookup(data_samples['index'])
        assignments = torch.where(assignments >= 0, assignments, -1)
        centroids = [bank.centroids[level, :k] for level, k in enumerate(ks)]
        concentration = [bank.concentration[level, :k] for level, k in enumerate(ks)]
        with torch.autocast(z1.device.type, enabled=False):
            proto = proto_nce_loss(torch.cat([z1, z2]), centroids, assignments.repeat(1, 2),
                                   concentration)
        losses['loss_proto'] = self.proto_weight * proto
        return losses


@MODELS.register_module()
class MoCoV2(ContrastiveAlgorithm):
    """MoCo v2: momentum key encoder, a queue of negatives, and batch shuffling for BN.

    Across ranks keys are shuffled between processes as in MoCo. In one process the shuffled
    key batch is encoded with ``bn_splits`` groups of BN statistics (the key encoder's BN layers
    are :class:`SplitBatchNorm`, one forward pass), so each group sees a different sub-batch and
    the query cannot cheat through batch statistics, as with several GPUs.
    """

    def __init__(self, backbone: dict, neck: dict, queue_len: int = 65536, momentum: float = 0.999,
                 temperature: float = 0.2, bn_splits: int = 8, **kwargs) -> None:
        super().__init__(backbone, neck, temperature, **kwargs)
        if self.label_source == 'ground_truth':
            raise ValueError("MoCoV2 supports label_source 'none' or 'pseudo'; use SupCon for "
                             'ground-truth labels')
        self.momentum = momentum
        self.bn_splits = bn_splits
        # Split BN only in the key encoder: same parameters and state-dict keys, plain BN unless
        # _shuffled_keys asks for groups.
        self.momentum_backbone = convert_split_batchnorm(copy.deepcopy(self.backbone))
        self.momentum_neck = convert_split_batchnorm(copy.deepcopy(self.neck))
        for param in self._key_params():
            param.requires_grad_(False)
        dim = self.neck.out_dim
        self.register_buffer('queue', F.normalize(torch.randn(queue_len, dim), dim=1))
        # Sample index of each key; -1 for the initial random rows.
        self.register_buffer('queue_index', torch.full((queue_len,), -1, dtype=torch.long))
        self.register_buffer('queue_ptr', torch.zeros((), dtype=torch.long))
        # Labels [levels, K] of the queued keys, kept beside the queue (written at enqueue,
        # rebuilt from the bank in one gather when the bank's version, the device or the loaded
        # state changes), so the loss does not gather K labels every step. Not a buffer: it is
        # derived from queue_index and the bank, so checkpoints and their keys stay as they were.
        self._queue_labels: torch.Tensor | None = None
        self._queue_labels_key: tuple | None = None

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
        """Features of the momentum encoder (as PCL): embeddings z or backbone features f."""
        feats = self.momentum_backbone(inputs)
        if feature == 'f':
            return F.normalize(feats.float(), dim=1)
        if feature == 'z':
            return F.normalize(self.momentum_neck(feats).float(), dim=1)
        raise ValueError(f"feature must be 'z' or 'f', got {feature!r}")

    @torch.no_grad()
    def _momentum_update(self) -> None:
        torch._foreach_lerp_(self._key_params(), self._query_params(), 1.0 - self.momentum)

    def _key_embed(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.momentum_neck(self.momentum_backbone(x)).float(), dim=1)

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

    def _next_slots(self, num: int) -> torch.Tensor:
        # Queue rows the next enqueue of ``num`` keys (all ranks together) overwrites.
        return (self.queue_ptr + torch.arange(num, device=self.queue.device)) % len(self.queue)

    @torch.no_grad()
    def _enqueue(self, keys: torch.Tensor, index: torch.Tensor) -> None:
        keys, index = gather_no_grad(keys), gather_no_grad(index)
        slots = self._next_slots(keys.shape[0])
        self.queue[slots] = keys
        self.queue_index[slots] = index
        self.queue_ptr.copy_((self.queue_ptr + keys.shape[0]) % len(self.queue))
        if self._queue_labels is not None and self._queue_labels_key == self._label_state():
            self._queue_labels[:, slots] = self._labels_of(index, slots)

    def _label_state(self) -> tuple:
        return self.label_bank.version, self.queue_index.device

    def _labels_of(self, index: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        # Bank labels of queue entries; entries without a sample (-1) get -(N + 1 + slot), which
        # matches no label of the bank and no other entry.
        bank = self.label_bank
        valid = index >= 0
        labels = bank.lookup(torch.where(valid, index, 0))
        return torch.where(valid, labels, -(bank.num_samples + 1 + slots))

    def queue_labels(self) -> torch.Tensor | None:
        """Labels ``[levels, K]`` of the queued keys; initial rows get labels matching nothing."""
        if self.label_source != 'pseudo':
            return None
        return self._labels_of(self.queue_index,
                               torch.arange(len(self.queue), device=self.queue_index.device))

    def cached_queue_labels(self) -> torch.Tensor | None:
        """``queue_labels()`` kept beside the queue; re-gathered only after the bank changed."""
        if self.label_source != 'pseudo':
            return None
        state = self._label_state()
        if self._queue_labels is None or self._queue_labels_key != state:
            self._queue_labels, self._queue_labels_key = self.queue_labels(), state
        return self._queue_labels

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._queue_labels = self._queue_labels_key = None  # a loaded queue_index: rebuild

    def queue_loss(self, q: torch.Tensor, k: torch.Tensor, labels: torch.Tensor | None,
                   overwritten: torch.Tensor) -> torch.Tensor:
        """InfoNCE of the queries against their keys and the queue, masked by labels for IFND."""
        # Before any label is accepted the loss is plain MoCo: no queue label lookup, no masks.
        masked = labels is not None and self.labels_can_match()
        return queue_contrastive_loss(q, k, self.queue, labels if masked else None,
                                      self.cached_queue_labels() if masked else None,
                                      self.temperature, self.loss_mode, overwritten=overwritten)

    def loss(self, inputs: list[torch.Tensor], data_samples: dict) -> dict:
        """InfoNCE of queries against their keys and the queue (masked by labels for IFND)."""
        self._check_two_views(inputs)
        q = self.embed(inputs[0])
        self._momentum_update()
        k = self._shuffled_keys(inputs[1])
        labels = self.batch_labels(data_samples)
        _, world_size = get_dist_info()
        with torch.autocast(q.device.type, enabled=False):  # logits / tau need float32
            # The queue itself, no copy: the loss keeps the rows the enqueue below overwrites,
            # so the backward stays exact after the in-place update.
            loss = self.queue_loss(q, k, labels, self._next_slots(k.shape[0] * world_size))
        index = data_samples.get('index')
        if index is None:
            index = torch.full((k.shape[0],), -1, dtype=torch.long, device=k.device)
        self._enqueue(k, index)
        return {'loss': loss, **self._diagnostics(labels)}


@MODELS.register_module()
class IFNDMoCo(MoCoV2):
    """IFND on the MoCo v2 base: queue keys sharing the query's pseudo label are eliminated."""

    def __init__(self, backbone: dict, neck: dict, loss_mode: str = 'elim', **kwargs) -> None:
        kwargs.setdefault('label_source', 'pseudo')
        super().__init__(backbone, neck, loss_mode=loss_mode, **kwargs)


def _debiasing_settings(name: str, tau_plus: float, beta: float, kwargs: dict) -> tuple[float, float]:
    """Validated (τ⁺, β) of a debiased / hard-negative algorithm, which takes no labels."""
    _refuse_labels(name, kwargs)
    check_debiasing(tau_plus, beta)
    return float(tau_plus), float(beta)


def _refuse_labels(name: str, kwargs: dict) -> None:
    # These methods handle false negatives themselves: a label-masked loss mode would be ignored.
    mode, source = kwargs.get('loss_mode', 'inst'), kwargs.get('label_source', 'none')
    if mode != 'inst' or source != 'none':
        raise ValueError(f'{name} handles false negatives itself and takes no labels; remove '
                         f'loss_mode={mode!r} / label_source={source!r} from its config (IFND, '
                         'SupCon and OracleElim are the label-based methods)')


@MODELS.register_module()
class DebiasedCL(SimCLR):
    """Debiased contrastive learning (Chuang et al., NeurIPS 2020) on the SimCLR base.

    The negatives' sum is corrected for the share ``tau_plus`` (τ⁺, the class prior) of
    same-class samples among them, and clamped at N·e^(−1/τ); ``beta`` > 0 weights harder
    negatives more (hard negative sampling, :class:`HardNegativeCL`). N = 2M − 2 views of the
    batch gathered over the ranks.
    """

    records_detection = False  # nothing is flagged: the correction is in expectation

    def __init__(self, backbone: dict, neck: dict, temperature: float = 0.5,
                 tau_plus: float = 0.1, beta: float = 0.0, **kwargs) -> None:
        tau_plus, beta = _debiasing_settings(type(self).__name__, tau_plus, beta, kwargs)
        super().__init__(backbone, neck, temperature, **kwargs)
        self.tau_plus, self.beta = tau_plus, beta

    def instance_losses(self, z1: torch.Tensor, z2: torch.Tensor, data_samples: dict) -> dict:
        """The debiased (or hard-negative) loss of the 2M local views against all ranks' views."""
        anchors, candidates, positive_index, self_index = self.gathered_views(z1, z2)
        if candidates.shape[0] < 3:
            raise ValueError(f'{type(self).__name__} needs at least 2 images per batch (over all '
                             'processes) to have a negative; raise train_dataloader.batch_size')
        with torch.autocast(z1.device.type, enabled=False):  # logits / tau need float32
            per_anchor = debiased_loss_from_candidates(anchors, candidates, positive_index,
                                                       self_index, self.temperature,
                                                       self.tau_plus, self.beta)
        return {'loss': per_anchor.mean()}


@MODELS.register_module()
class HardNegativeCL(DebiasedCL):
    """Hard negative sampling (Robinson et al., ICLR 2021) on the SimCLR base.

    Negatives are weighted by neg^β (``beta``) before the debiasing with ``tau_plus``;
    ``tau_plus=0`` gives the plain hard-negative objective, ``beta=0`` the debiased one.
    """

    def __init__(self, backbone: dict, neck: dict, temperature: float = 0.5,
                 tau_plus: float = 0.1, beta: float = 1.0, **kwargs) -> None:
        super().__init__(backbone, neck, temperature, tau_plus=tau_plus, beta=beta, **kwargs)


@MODELS.register_module()
class DebiasedMoCo(MoCoV2):
    """The debiased contrastive loss on the MoCo v2 base: the queue's K keys are the negatives."""

    def __init__(self, backbone: dict, neck: dict, tau_plus: float = 0.01, beta: float = 0.0,
                 **kwargs) -> None:
        tau_plus, beta = _debiasing_settings(type(self).__name__, tau_plus, beta, kwargs)
        super().__init__(backbone, neck, **kwargs)
        self.tau_plus, self.beta = tau_plus, beta

    def queue_loss(self, q: torch.Tensor, k: torch.Tensor, labels: torch.Tensor | None,
                   overwritten: torch.Tensor) -> torch.Tensor:
        """The debiased (or hard-negative) loss against the own key and the queue."""
        return queue_debiased_loss(q, k, self.queue, self.temperature, self.tau_plus, self.beta,
                                   overwritten)


@MODELS.register_module()
class HardNegativeMoCo(DebiasedMoCo):
    """Hard negative sampling (Robinson et al., ICLR 2021) on the MoCo v2 base."""

    def __init__(self, backbone: dict, neck: dict, tau_plus: float = 0.01, beta: float = 1.0,
                 **kwargs) -> None:
        super().__init__(backbone, neck, tau_plus=tau_plus, beta=beta, **kwargs)


@MODELS.register_module()
class FNC(SimCLR):
    """False negative cancellation (Huynh et al., WACV 2022) on the SimCLR base.

    Each image comes with ``num_support_views`` (S) extra views (``MultiView(num_views=2 + S)``),
    embedded without gradient. For each anchor image, the other images of the batch (over all
    ranks) are scored by the cosine of its support views with their two views, aggregated
    (``'mean'`` or ``'max'``); the ``top_k`` best-scored images, or those scoring above
    ``threshold``, are its false negatives, both views alike. ``strategy='elim'`` drops them from
    the denominator, ``'attr'`` makes them positives (the masked InfoNCE of IFND's losses).
    """

    def __init__(self, backbone: dict, neck: dict, temperature: float = 0.5,
                 strategy: str = 'elim', num_support_views: int = 2, top_k: int | None = 5,
                 threshold: float | None = None, aggregation: str = 'mean', **kwargs) -> None:
        _refuse_labels(type(self).__name__, kwargs)
        check_fnc_options(strategy, top_k, threshold, aggregation)
        if not isinstance(num_support_views, int) or num_support_views < 1:
            raise ValueError(f'FNC needs num_support_views S >= 1 (it finds false negatives with '
                             f'them), got {num_support_views!r}; give the training pipeline '
                             'MultiView(num_views=2 + S)')
        super().__init__(backbone, neck, temperature, **kwargs)
        self.strategy = strategy
        self.num_support_views = num_support_views
        self.top_k, self.threshold, self.aggregation = top_k, threshold, aggregation

    def loss(self, inputs: list[torch.Tensor], data_samples: dict) -> dict:
        """The masked InfoNCE with the false negatives found through the support views."""
        views = 2 + self.num_support_views
        if len(inputs) != views:
            raise ValueError(f'FNC with num_support_views={self.num_support_views} needs {views} '
                             f'views per image (2 + S), the pipeline gave {len(inputs)}: set '
                             f'num_views={views} in the MultiView of '
                             'train_dataloader.dataset.pipeline (or num_support_views to match)')
        z1, z2 = self.embed_views(inputs)
        num = z1.shape[0]
        with torch.no_grad():
            # Support views only score candidates: no gradient, and one forward of their own
            # (their BN statistics are their own batch's, as a separate crop group).
            support = self.embed(torch.cat(inputs[2:])).view(self.num_support_views, num, -1)
        anchors, candidates, positive_index, self_index = self.gathered_views(z1, z2)
        rank, _ = get_dist_info()
        flags = fnc_false_negatives(support.transpose(0, 1),
                                    candidates.detach().view(2, -1, z1.shape[1]),
                                    torch.arange(num, device=z1.device) + rank * num, self.top_k,
                                    self.threshold, self.aggregation)
        flagged = flags.repeat(2, 2)  # image-wise: both views of anchors and candidates
        with torch.autocast(z1.device.type, enabled=False):  # logits / tau need float32
            per_anchor = contrastive_loss_from_mask(anchors, candidates, positive_index,
                                                    self_index, flagged, self.temperature,
                                                    self.strategy)
        self._record_detection(flagged.unsqueeze(0), positive_index, self_index,
                               candidates.shape[0], data_samples)
        losses = {'loss': per_anchor.mean()}
        if self.threshold is not None:  # logged: how many images the threshold flags
            losses['flagged'] = flags.sum(dim=1).float().mean()
        return losses
