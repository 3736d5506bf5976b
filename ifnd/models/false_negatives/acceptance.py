"""Acceptance schedules: the share of the samples whose detections count, growing with training.

IFND accepts the ⌈r·N⌉ most confident pseudo labels, r following a schedule over the epochs
(Sec. 3.2). :class:`AcceptanceSchedule` gives any other detector the same schedule with a random
(seeded) order instead of a confidence: a flag between two samples counts only once both are
accepted. With the ground-truth detector this is the schedule-matched oracle, which tells how
much of IFND's shortfall its schedule alone explains. The schedules' arithmetic
(:func:`acceptance_rate`, :func:`idle_schedule`) lives below the models, in
``ifnd/clustering/acceptance.py``; here are the checks that name the part and key.
"""
import math

import torch

from ifnd.clustering.acceptance import (ACCEPTANCE_SCHEMES, CALENDAR_SCHEMES, EVIDENCE_SCHEMES,
                                        acceptance_rate, idle_schedule)

from ifnd.settings import check_number, check_seed

# An acceptance=dict(...)'s keys and their types (also read by the config checks of tools/train.py).
ACCEPTANCE_OPTIONS = {'scheme': str, 'final_rate': float, 'step_epoch': int, 'interval': int,
                      'seed': int}


def check_acceptance(scheme: str, final_rate: float, step_epoch: int = 0,
                     owner: str = 'acceptance', threshold: float | None = None,
                     schemes: tuple = ACCEPTANCE_SCHEMES) -> None:
    """Refuse an unknown scheme, a rate outside [0, 1], a negative step epoch, or a confidence
    scheme without its threshold, naming the fix."""
    if isinstance(scheme, str) and scheme in EVIDENCE_SCHEMES and scheme not in schemes:
        raise ValueError(f"{owner} scheme {scheme!r} accepts by a clustering round's evidence, and "
                         f'this acceptance has none (it orders the samples at random): use it on '
                         f"PseudoLabelHook (IFND, PCL), or one of {schemes} here")
    if not isinstance(scheme, str) or scheme not in schemes:
        raise ValueError(f'{owner} scheme must be one of {schemes}, got {scheme!r}')
    if scheme == 'confidence':
        check_number(owner, 'threshold', threshold, low=0.0, high=1.0, high_open=True,
                     hint="how far from chance (1/k) to certainty κ must be for a label to be "
                     'accepted; 1 asks for certainty, which κ (a softmax) never reaches, so nothing '
                     'would be')
    elif threshold is not None:
        raise ValueError(f"{owner} threshold={threshold!r} is the 'confidence' scheme's; with "
                         f'scheme={scheme!r} remove it')
    check_number(owner, 'final_rate', final_rate, low=0.0, high=1.0,
                 hint='the share of the samples accepted at the end')
    check_number(owner, 'step_epoch', step_epoch, int, low=0,
                 hint="the epoch the 'step' scheme starts accepting at")


class AcceptanceSchedule:
    """Accepts a growing random share of the samples, evaluated as IFND's rounds are.

    The rate is :func:`acceptance_rate` at the last multiple of ``interval`` epochs done (IFND
    re-clusters every ``interval`` epochs and accepts at that round's rate), and the accepted
    samples are the first ⌈rate·N⌉ of a permutation drawn from ``seed``: the same on every process
    and after a resume, so it is not saved.
    """

    def __init__(self, scheme: str = 'linear', final_rate: float = 1.0, step_epoch: int = 0,
                 interval: int = 1, seed: int = 0, owner: str = 'acceptance') -> None:
        check_acceptance(scheme, final_rate, step_epoch, owner, schemes=CALENDAR_SCHEMES)
        self.interval = check_number(owner, 'interval', interval, int, low=1,
                                     hint="epochs between rate updates, IFND's clustering interval")
        self.seed = check_seed(owner, 'seed', seed)
        self.scheme, self.final_rate, self.step_epoch = scheme, float(final_rate), step_epoch
        self.owner = owner  # names the part in messages
        self.rate = 0.0
        self._rank: torch.Tensor | None = None  # position of each sample in the permutation
        self._count = 0

    def idle_warning(self, max_epochs: int) -> str | None:
        """Why a run of ``max_epochs`` ends before this schedule accepts a sample, or None."""
        return idle_schedule(self.owner, max_epochs, self.scheme, self.final_rate,
                             self.step_epoch, self.interval)

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
