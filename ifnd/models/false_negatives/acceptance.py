"""Acceptance schedules: the share of the samples whose detections count, growing with training.

IFND accepts the ⌈r·N⌉ most confident pseudo labels, r following a schedule over the epochs
(Sec. 3.2). :class:`AcceptanceSchedule` gives any other detector the same schedule with a random
(seeded) order instead of a confidence: a flag between two samples counts only once both are
accepted. With the ground-truth detector this is the schedule-matched oracle, which tells how
much of IFND's shortfall its schedule alone explains.
"""
import math

import torch

ACCEPTANCE_SCHEMES = ('constant', 'step', 'linear')


def acceptance_rate(epoch: int, max_epochs: int, scheme: str = 'linear', final_rate: float = 1.0,
                    step_epoch: int = 0) -> float:
    """Fraction of the samples to accept at ``epoch``.

    ``'constant'``: ``final_rate``; ``'step'``: 0 before ``step_epoch``, then ``final_rate``;
    ``'linear'``: ``final_rate * epoch / max_epochs`` clamped to ``[0, final_rate]``.
    """
    check_acceptance(scheme, final_rate)
    if scheme == 'constant':
        return float(final_rate)
    if scheme == 'step':
        return 0.0 if epoch < step_epoch else float(final_rate)
    if max_epochs <= 0:
        raise ValueError(f'max_epochs must be positive for the linear scheme, got {max_epochs}')
    return float(min(max(final_rate * epoch / max_epochs, 0.0), final_rate))


def check_acceptance(scheme: str, final_rate: float) -> None:
    """Refuse an unknown scheme or a rate outside [0, 1], naming the valid values."""
    if scheme not in ACCEPTANCE_SCHEMES:
        raise ValueError(f'unknown acceptance scheme {scheme!r}; valid: {ACCEPTANCE_SCHEMES}')
    if not 0.0 <= final_rate <= 1.0:
        raise ValueError(f'final_rate must be in [0, 1], got {final_rate}')


class AcceptanceSchedule:
    """Accepts a growing random share of the samples, evaluated as IFND's rounds are.

    The rate is :func:`acceptance_rate` at the last multiple of ``interval`` epochs done (IFND
    re-clusters every ``interval`` epochs and accepts at that round's rate), and the accepted
    samples are the first ⌈rate·N⌉ of a permutation drawn from ``seed``: the same on every process
    and after a resume, so it is not saved.
    """

    def __init__(self, scheme: str = 'linear', final_rate: float = 1.0, step_epoch: int = 0,
                 interval: int = 1, seed: int = 0) -> None:
        check_acceptance(scheme, final_rate)
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f'acceptance interval must be an int >= 1 (epochs between rate '
                             f'updates, IFND\'s clustering interval), got {interval!r}')
        self.scheme, self.final_rate, self.step_epoch = scheme, float(final_rate), step_epoch
        self.interval, self.seed = interval, seed
        self.rate = 0.0
        self._rank: torch.Tensor | None = None  # position of each sample in the permutation
        self._count = 0

    def setup(self, num_samples: int, device: torch.device) -> None:
        """Draw the order of the ``num_samples`` training samples."""
        order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(self.seed))
        rank = torch.empty_like(order)
        rank[order] = torch.arange(num_samples)
        self._rank = rank.to(device)

    def set_epoch(self, epoch: int, max_epochs: int) -> None:
        """Rate of the epoch about to start (``epoch`` epochs done)."""
        done = epoch - epoch % self.interval
        self.rate = acceptance_rate(done, max_epochs, self.scheme, self.final_rate, self.step_epoch)
        if self._rank is not None:
            # Rounded first, as IFND's rounds count: 0.09 * 100 = 9.000000000000002 is 9, not 10.
            self._count = math.ceil(round(self.rate * len(self._rank), 6))

    @property
    def ready(self) -> bool:
        """Whether the sample order was drawn (``setup`` called)."""
        return self._rank is not None

    @property
    def any_accepted(self) -> bool:
        """Whether any sample is accepted this epoch (host-side)."""
        return self._count > 0

    def accepted(self, index: torch.Tensor) -> torch.Tensor:
        """Whether each sample of ``index`` is accepted; unknown samples (-1) are not."""
        rank = self._rank.to(index.device)
        return (index >= 0) & (rank[index.clamp(min=0)] < self._count)
