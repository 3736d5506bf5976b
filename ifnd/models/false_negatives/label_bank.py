"""IFND's pseudo-label bank: per-sample cluster ids at every level, saved with the model."""
from typing import Sequence

import torch

from .detector import DetectorNeeds, FalseNegativeDetector
from .sample_state import PerSampleState


class PseudoLabelBank(PerSampleState):
    """Pseudo labels ``[levels, N]`` indexed by sample index, saved with the model.

    Unaccepted samples carry the unique label ``-(index + 1)``, which never equals a cluster id.
    PCL also keeps each level's centroids and concentrations, padded to the largest k by the
    clustering round, and ``parents`` ``[levels, k_max]``: each cluster's cluster at the next level
    where the levels are nested (HCSC's hierarchy), -1 where a level has none (the coarsest nested
    level, every independent one) and in the padding.
    """

    # Buffers that older checkpoints lack, filled in by _load_from_state_dict (the checkpoint
    # checks, ifnd.fileio's state_differences, accept their absence).
    filled_when_missing = ('parents',)

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer('labels', torch.empty(0, 0, dtype=torch.long))
        self.register_buffer('num_clusters', torch.empty(0, dtype=torch.long))
        self.register_buffer('centroids', torch.empty(0, 0, 0))
        self.register_buffer('concentration', torch.empty(0, 0))
        self.register_buffer('parents', torch.empty(0, 0, dtype=torch.long))
        # Host-side copies, refreshed whenever the buffers change (once per clustering round), so
        # the training step reads them without a device sync.
        self.any_accepted = False
        self.cluster_counts: list[int] = []
        self.has_parents: list[bool] = []  # per level: whether its clusters have parents

    def _refresh_host_state(self) -> None:
        self.any_accepted = bool((self.labels >= 0).any()) if self.labels.numel() else False
        self.cluster_counts = self.num_clusters.tolist()
        self.has_parents = (self.parents >= 0).any(dim=1).tolist() if self.parents.numel() \
            else [False] * self.num_levels

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Checkpoints from before the parent maps: no level has parents, one row per level of the
        # concentrations' width.
        if prefix + 'parents' not in state_dict:
            stored = state_dict.get(prefix + 'concentration', self.concentration)
            state_dict[prefix + 'parents'] = torch.full(stored.shape, -1, dtype=torch.long)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

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
        self.parents = torch.empty(0, 0, dtype=torch.long, device=self.labels.device)
        self._refresh_host_state()

    def update(self, labels: torch.Tensor, centroids: torch.Tensor | None = None,
               concentration: torch.Tensor | None = None,
               num_clusters: Sequence[int] | None = None,
               parents: torch.Tensor | None = None) -> None:
        """Replace the labels ``[levels, N]`` (and, for PCL, the centroids and concentrations).

        ``centroids`` ``[levels, k_max, D]``, ``concentration`` and ``parents`` ``[levels, k_max]``
        come padded to the largest k, as the clustering round hands them out
        (``ifnd.clustering.pad_levels``, ``pad_parents``); ``num_clusters``: each level's k;
        ``parents`` None: no level has parents.
        """
        device = self.labels.device
        if centroids is None and parents is not None:
            raise ValueError('PseudoLabelBank.update needs the centroids with the parents')
        if parents is not None and parents.shape != centroids.shape[:2]:
            raise ValueError(f'PseudoLabelBank.update: parents must be [levels, k_max] = '
                             f'{list(centroids.shape[:2])} as the centroids, got '
                             f'{list(parents.shape)}')
        self.labels = labels.to(device=device, dtype=torch.long).clone()
        if centroids is not None:
            if num_clusters is None:
                raise ValueError('PseudoLabelBank.update needs num_clusters with the centroids')
            # Copies, in the default dtype as reset() makes them: the caller keeps its tensors.
            dtype = torch.get_default_dtype()
            self.centroids = centroids.to(device=device, dtype=dtype, copy=True)
            self.concentration = torch.ones(centroids.shape[:2], device=device) \
                if concentration is None else concentration.to(device, dtype, copy=True)
            self.num_clusters = torch.tensor(list(num_clusters), dtype=torch.long, device=device)
            self.parents = torch.full(centroids.shape[:2], -1, dtype=torch.long, device=device) \
                if parents is None else parents.to(device, torch.long, copy=True)
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

    def after_load(self) -> None:
        """Refresh the host-side copies from the loaded labels."""
        self._refresh_host_state()


class LabelBankDetector(FalseNegativeDetector):
    """Base of the detectors that read the algorithm's :class:`PseudoLabelBank` (IFND's, HCSC's),
    handed over by ``attach``; their flags have one level per clustering level."""

    needs = DetectorNeeds(label_bank=True, sample_index=True, round_outputs=frozenset({'labels'}))

    def __init__(self, acceptance: dict | None = None) -> None:
        super().__init__(acceptance)
        self._bank: tuple[PseudoLabelBank, ...] = ()  # the algorithm's; a tuple: not a child

    def attach(self, bank: PseudoLabelBank) -> None:
        """Read from ``bank`` (owned, saved and filled through the algorithm)."""
        self._bank = (bank,)

    @property
    def bank(self) -> PseudoLabelBank:
        """The label bank this detector reads."""
        return self._bank[0]

    @property
    def levels(self) -> int:
        return max(self.bank.num_levels, 1)
