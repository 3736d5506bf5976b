"""IFND's pseudo-label bank: per-sample cluster ids at every level, saved with the model."""
from typing import Sequence

import torch

from .detector import DetectorNeeds, FalseNegativeDetector
from .sample_state import PerSampleState


class PseudoLabelBank(PerSampleState):
    """Pseudo labels ``[levels, N]`` indexed by sample index, saved with the model.

    Unaccepted samples carry the unique label ``-(index + 1)``, which never equals a cluster id.
    PCL also keeps each level's centroids and concentrations, padded to the largest k by the
    clustering round.
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

    def _refresh_host_state(self) -> None:
        self.any_accepted = bool((self.labels >= 0).any()) if self.labels.numel() else False
        self.cluster_counts = self.num_clusters.tolist()

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

    def update(self, labels: torch.Tensor, centroids: torch.Tensor | None = None,
               concentration: torch.Tensor | None = None,
               num_clusters: Sequence[int] | None = None) -> None:
        """Replace the labels ``[levels, N]`` (and, for PCL, the centroids and concentrations).

        ``centroids`` ``[levels, k_max, D]`` and ``concentration`` ``[levels, k_max]`` come padded
        to the largest k, as the clustering round hands them out (``ifnd.clustering.pad_levels``);
        ``num_clusters``: each level's k.
        """
        device = self.labels.device
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
