"""Acceptance: which samples' labels count, by the calendar or by the evidence of a round.

One registered part (``ACCEPTANCES``), configured the same way wherever it is used:
``acceptance=dict(type=...)`` on ``PseudoLabelHook`` (IFND, PCL) and on any detector. A part
ranks what its owner gives it: the clustering round's score (κ, Eq. ``eq:certainty``, or PCL's
concentration) per level, or, for the detectors that have no score, a seeded random order (the
schedule-matched oracle). Samples not accepted keep a label of their own, ``-(i + 1)``.

By the calendar (Sec. 3.2: the ⌈r·N⌉ highest scores, r following the epochs):
:class:`ConstantAcceptance`, :class:`StepAcceptance`, :class:`LinearAcceptance`.
By the evidence of a round, whatever the epoch (only a clustering round can feed these):
:class:`ConfidentAcceptance` (κ far enough from chance towards certainty) and
:class:`StableAcceptance` (the cluster a sample's previous cluster became).

A new scheme is one class here, registered, taking its settings as constructor arguments
(their annotations are what configs and checkpoints may give): docs/methods.md shows one.
"""
from __future__ import annotations

import inspect
import math
from typing import Callable, Sequence

import torch
from torch import Tensor

from ifnd.registry import ACCEPTANCES
from ifnd.settings import check_number, check_options, check_seed

__all__ = ['Acceptance', 'CalendarAcceptance', 'ConstantAcceptance', 'StepAcceptance',
           'LinearAcceptance', 'ConfidentAcceptance', 'StableAcceptance', 'build_acceptance',
           'unique_labels', 'accept_count', 'accept_top', 'match_clusters', 'reachable_share']


def unique_labels(num: int, device: torch.device | str | None = None) -> Tensor:
    """Labels ``-(i + 1)``: no two samples share one, none equals a cluster id."""
    return -(torch.arange(num, device=device) + 1)


def _smallest(labels: Tensor, scores: Tensor) -> float:
    """The smallest score among the accepted labels (``>= 0``), ``+inf`` when none is."""
    kept = labels >= 0
    return float(scores[kept].double().min()) if bool(kept.any()) else math.inf


def _check_pair(assignments: Tensor, other: Tensor, name: str) -> None:
    if assignments.ndim != 1 or other.shape != assignments.shape:
        raise ValueError(f'assignments and {name} must both be [N], got {tuple(assignments.shape)} '
                         f'and {tuple(other.shape)}')


def accept_count(rate: float, num: int) -> int:
    """⌈rate·num⌉, rounded first: 0.3 * 10 = 3.0000000000000004 is 3, not 4."""
    return min(num, max(0, math.ceil(round(rate * num, 6))))


def accept_top(assignments: Tensor, scores: Tensor, count: int) -> tuple[Tensor, float]:
    """Keep the cluster ids of the ``count`` highest-scoring samples; the rest get ``-(i + 1)``.

    Ties go to the lower index, NaN ranks last. Returns ``(labels [N] int64, the smallest accepted
    score)``, ``+inf`` when nothing is accepted.
    """
    _check_pair(assignments, scores, 'scores')
    assignments = assignments.long()
    if len(assignments) and int(assignments.min()) < 0:
        raise ValueError('cluster assignments must be >= 0')
    labels = unique_labels(len(assignments), assignments.device)
    if count <= 0:
        return labels, math.inf
    ranked = torch.nan_to_num(scores.detach().to(assignments.device).double(), nan=-math.inf)
    # Stable descending sort: equal scores keep index order, i.e. lower index first.
    order = torch.sort(ranked, descending=True, stable=True).indices[:count]
    labels[order] = assignments[order]
    return labels, float(ranked[order[-1]])


class Acceptance:
    """Base of the schemes: per level, which samples' cluster ids count.

    The owner calls :meth:`set_epoch` before it asks, :meth:`accept` once per level with every
    sample's cluster and score, and :meth:`end_round` with the round's assignments. A scheme that
    keeps state across rounds returns it from :meth:`state_dict` (saved in the checkpoints).
    """

    needs_round = False  # True: decides by a clustering round's evidence (no random order)
    score_kinds: tuple[str, ...] | None = None  # the scores it reads; None: any ranking

    def __init__(self) -> None:
        self.owner = type(self).__name__  # the owner's name in messages, set by build_acceptance

    def check(self) -> None:
        """Refuse settings out of range, naming the owner and key (none here)."""

    def set_epoch(self, epochs_done: int, max_epochs: int) -> None:
        """The epochs done when the owner next asks."""

    @property
    def rate(self) -> float | None:
        """The share the calendar accepts now; None where the evidence decides."""
        return None

    def accept(self, level: int, assignments: Tensor, scores: Tensor,
               num_clusters: int) -> tuple[Tensor, float]:
        """``(labels [N] int64, the smallest accepted score)`` of one level of ``num_clusters``."""
        raise NotImplementedError

    def end_round(self, assignments: Sequence[Tensor]) -> None:
        """The round's assignments per level, after every level was accepted."""

    def reset(self) -> None:
        """Forget every round before (a fresh start)."""

    def check_samples(self, num_samples: int) -> str | None:
        """Set aside state of another data set's size; why, or None."""
        return None

    def idle_reason(self, max_epochs: int, interval: int) -> str | None:
        """Why a run of ``max_epochs``, asking every ``interval`` epochs, accepts no sample; or None."""
        return None

    def check_round(self, num_clusters: Sequence[int], temperature: float) -> str | None:
        """Refuse settings that accept nothing at any level of a round of ``num_clusters`` with κ at
        ``temperature``; a warning where some levels cannot or seldom will, else None."""
        return None

    def state_dict(self) -> dict:
        """What the next rounds need (saved in the checkpoints)."""
        return {}

    def load_state_dict(self, state: dict, num_clusters: Sequence[int]) -> str | None:
        """Restore :meth:`state_dict`'s state; a reason it was set aside, or None."""
        return None


class CalendarAcceptance(Acceptance):
    """The ⌈r·N⌉ highest scores per level, r a function of the epochs done (:meth:`rate_at`).

    ``final_rate``: the share accepted at the end; ``interval``: epochs between rate updates
    (IFND's clustering interval, for detectors that ask every epoch); ``seed``: the random order
    of the samples for a detector with no score of its own (None: 0; a clustering round ranks by
    its score and takes none).
    """

    def __init__(self, final_rate: float = 1.0, interval: int = 1, seed: int | None = None) -> None:
        super().__init__()
        self.final_rate = final_rate
        self.interval = interval
        self.seed = seed
        self._rate = 0.0

    def check(self) -> None:
        """Refuse settings out of range, naming the owner and key."""
        check_number(self.owner, 'final_rate', self.final_rate, low=0.0, high=1.0,
                     hint='the share of the samples accepted at the end')
        check_number(self.owner, 'interval', self.interval, int, low=1,
                     hint="epochs between rate updates, IFND's clustering interval")
        if self.seed is not None:
            check_seed(self.owner, 'seed', self.seed)

    def rate_at(self, epochs_done: int, max_epochs: int) -> float:
        """The share accepted after ``epochs_done`` of ``max_epochs`` epochs."""
        raise NotImplementedError

    @property
    def rate(self) -> float:
        return self._rate

    def set_epoch(self, epochs_done: int, max_epochs: int) -> None:
        self._rate = self.rate_at(epochs_done - epochs_done % self.interval, max_epochs)

    def accept(self, level: int, assignments: Tensor, scores: Tensor,
               num_clusters: int) -> tuple[Tensor, float]:
        return accept_top(assignments, scores, accept_count(self._rate, len(assignments)))

    def settings(self) -> str:
        """The settings that decide the calendar, for messages."""
        return f'final_rate={self.final_rate:g}'

    def idle_reason(self, max_epochs: int, interval: int) -> str | None:
        # Epoch e trains with the rate of the owner's last update, after e - e % interval epochs,
        # which this scheme floors to its own interval.
        def asked(epoch: int) -> int:
            done = epoch - epoch % interval
            return done - done % self.interval

        if any(self.rate_at(asked(e), max_epochs) for e in range(max_epochs)):
            return None
        return (f'{self.owner} ({self.settings()}, interval={max(interval, self.interval)}) accepts no sample before the run ends '
                f'(train_cfg.max_epochs={max_epochs})')


@ACCEPTANCES.register_module()
class ConstantAcceptance(CalendarAcceptance):
    """``final_rate`` from the first round on."""

    def rate_at(self, epochs_done: int, max_epochs: int) -> float:
        return float(self.final_rate)


@ACCEPTANCES.register_module()
class StepAcceptance(CalendarAcceptance):
    """Nothing before ``step_epoch`` epochs, then ``final_rate`` (PCL, DeepCluster)."""

    def __init__(self, step_epoch: int = 0, final_rate: float = 1.0, interval: int = 1,
                 seed: int | None = None) -> None:
        super().__init__(final_rate, interval, seed)
        self.step_epoch = step_epoch

    def check(self) -> None:
        super().check()
        check_number(self.owner, 'step_epoch', self.step_epoch, int, low=0,
                     hint='the epoch acceptance starts at')

    def settings(self) -> str:
        return f'step_epoch={self.step_epoch}, {super().settings()}'

    def rate_at(self, epochs_done: int, max_epochs: int) -> float:
        return 0.0 if epochs_done < self.step_epoch else float(self.final_rate)


@ACCEPTANCES.register_module()
class LinearAcceptance(CalendarAcceptance):
    """``final_rate · epoch / max_epochs``: the paper's IFND."""

    def rate_at(self, epochs_done: int, max_epochs: int) -> float:
        if max_epochs <= 0:
            raise ValueError(f'max_epochs must be positive for {type(self).__name__}, got '
                             f'{max_epochs}')
        return float(min(max(self.final_rate * epochs_done / max_epochs, 0.0), self.final_rate))


def reachable_share(k: int, temperature: float, gap: float) -> float:
    """The share of the way from chance (1/k) to certainty that κ of a sample reaches at ``k``
    clusters and ``temperature`` when its own centroid's cosine is ``gap`` above each other's."""
    kappa = 1.0 / (1.0 + (k - 1) * math.exp(-gap / temperature))
    return (kappa - 1.0 / k) / (1.0 - 1.0 / k)


def _opposite_gap(k: int) -> float:
    """The largest cosine gap: the sample on its centroid, every other centroid opposite it."""
    return 2.0


def _simplex_gap(k: int) -> float:
    """The gap of k evenly spread centroids (a regular simplex), the sample on its centroid."""
    return k / (k - 1)


def _shares(ks: Sequence[int], temperature: float, gap: Callable[[int], float]) -> str:
    """The shares κ reaches at the levels ``ks`` with each level's ``gap``, for messages."""
    return ', '.join(f'{reachable_share(k, temperature, gap(k)):.2g}' for k in ks)


@ACCEPTANCES.register_module()
class ConfidentAcceptance(Acceptance):
    """The labels whose κ is at least ``certainty_share`` of the way from chance to certainty.

    Chance is κ = 1/k at a level of k clusters, certainty κ = 1, so one setting means the same at
    every level; the accepted share grows as the embedding sharpens. NaN is never accepted.
    """

    needs_round = True
    score_kinds = ('kappa',)

    def __init__(self, certainty_share: float = 0.5) -> None:
        super().__init__()
        self.certainty_share = certainty_share

    def check(self) -> None:
        """Refuse a share outside [0, 1), naming the owner."""
        check_number(self.owner, 'certainty_share', self.certainty_share, low=0.0, high=1.0,
                     high_open=True,
                     hint="how far from chance (1/k) to certainty κ must be for a label to be "
                     'accepted; 1 asks for certainty, which κ (a softmax) never reaches, so nothing '
                     'would be')

    def check_round(self, num_clusters: Sequence[int], temperature: float) -> str | None:
        share = self.certainty_share
        # κ = 1 / (1 + Σ_{j≠a} e^{(cos_j − cos_a)/τ}) with cosines in [−1, 1], so κ is at most its
        # value at gap = cos_a − cos_j = 2: the sample on its centroid, every other centroid opposite
        # it. Beyond that share no label of the level is ever accepted. The k centroids' mean
        # pairwise cosine is at least −1/(k − 1) (|Σ c|² ≥ 0), so by Jensen's inequality no
        # arrangement gives the clusters a higher mean log-odds of κ than the regular simplex, every
        # sample on its centroid: gap = k/(k − 1). Beyond that share few labels are accepted, if any
        # (on Fashion-MNIST, k = 100 at τ = 0.2 accepted none at 0.5, below its 0.61).
        never = [k for k in num_clusters if share > reachable_share(k, temperature, _opposite_gap(k))]
        seldom = [k for k in num_clusters if k not in never
                  and share > reachable_share(k, temperature, _simplex_gap(k))]
        at = f'{self.owner} certainty_share={share:g} with κ at temperature={temperature:g}'
        if len(never) == len(num_clusters):
            best = max(reachable_share(k, temperature, _opposite_gap(k)) for k in num_clusters)
            raise ValueError(f'{at} is out of κ\'s reach at every level (num_clusters='
                             f'{list(num_clusters)}: κ gets at most {best:.6g} of the way from chance '
                             'to certainty, with every other centroid opposite the sample), so no '
                             f'label would ever be accepted: lower certainty_share to at most '
                             f'{best:.6g}, or the temperature')
        if not never and not seldom:
            return None
        parts = [f'can never accept a label at k={", ".join(map(str, never))} (κ gets at most '
                 f'{_shares(never, temperature, _opposite_gap)} of the way to certainty there)'
                 ] if never else []
        parts += [f'will seldom accept one at k={", ".join(map(str, seldom))} (evenly spread '
                  f'centroids give {_shares(seldom, temperature, _simplex_gap)})'] if seldom else []
        return (f'{at} {" and ".join(parts)}: lower certainty_share or the temperature, or drop '
                'those levels from num_clusters')

    def accept(self, level: int, assignments: Tensor, scores: Tensor,
               num_clusters: int) -> tuple[Tensor, float]:
        _check_pair(assignments, scores, 'scores')
        chance = 1.0 / num_clusters
        bound = chance + self.certainty_share * (1.0 - chance)
        ranked = scores.detach().to(assignments.device).double()
        labels = torch.where(ranked >= bound, assignments.long(),  # NaN compares False
                             unique_labels(len(assignments), assignments.device))
        return labels, _smallest(labels, ranked)


def match_clusters(assignments: Tensor, previous: Tensor) -> Tensor:
    """For each cluster of ``assignments``, the cluster of ``previous`` sharing the most members.

    Ties go to the lower previous id; a cluster with no member maps to -1. Returns ``[k]`` int64
    with k = ``assignments.max() + 1``.
    """
    _check_pair(assignments, previous, 'previous')
    assignments, previous = assignments.long().cpu(), previous.long().cpu()
    if assignments.numel() == 0:
        return torch.empty(0, dtype=torch.long)
    k, k_prev = int(assignments.max()) + 1, int(previous.max()) + 1
    overlap = torch.bincount(assignments * k_prev + previous, minlength=k * k_prev).view(k, k_prev)
    best = overlap.argmax(dim=1)  # the first maximum: the lower id on ties
    return torch.where(overlap.sum(dim=1) > 0, best, -1)


@ACCEPTANCES.register_module()
class StableAcceptance(Acceptance):
    """The labels whose cluster is the one their cluster of the previous round became.

    Clusters are matched across rounds by their members' overlap (:func:`match_clusters`): a
    label-free estimate of precision. The first round accepts nothing. The previous round's
    assignments travel in the checkpoints, so a resumed run decides as the uninterrupted one.
    """

    needs_round = True

    def __init__(self) -> None:
        super().__init__()
        self._previous: list[Tensor] | None = None

    def accept(self, level: int, assignments: Tensor, scores: Tensor,
               num_clusters: int) -> tuple[Tensor, float]:
        num = len(assignments)
        previous = None if self._previous is None else self._previous[level]
        if previous is not None and len(previous) != num:
            raise ValueError(f'the previous round holds {len(previous)} samples, this one {num}')
        unique = unique_labels(num, assignments.device)
        if previous is None:
            return unique, math.inf
        match = match_clusters(assignments, previous).to(assignments.device)
        stable = match[assignments.long()] == previous.to(assignments.device).long()
        labels = torch.where(stable, assignments.long(), unique)
        return labels, _smallest(labels, scores.detach().to(assignments.device).double())

    def end_round(self, assignments: Sequence[Tensor]) -> None:
        self._previous = [assigned.detach().cpu().long().clone() for assigned in assignments]

    def idle_reason(self, max_epochs: int, interval: int) -> str | None:
        # The owner's rounds come before training and after every `interval` epochs; the first has no
        # previous round to compare with, so the second must come before the last epoch.
        if interval < max_epochs:
            return None
        return (f'{self.owner} accepts from the second clustering round on, which comes after '
                f'interval={interval} epochs, not before the run ends (train_cfg.max_epochs='
                f'{max_epochs})')

    def reset(self) -> None:
        self._previous = None

    def check_samples(self, num_samples: int) -> str | None:
        if self._previous is None or all(len(a) == num_samples for a in self._previous):
            return None
        sizes = [len(a) for a in self._previous]
        self._previous = None
        return (f"the previous round's assignments hold {sizes} samples, not the {num_samples} of "
                'this data set: set aside, this round accepts nothing (as a first round)')

    def state_dict(self) -> dict:
        return {} if self._previous is None else {'previous': list(self._previous)}

    def load_state_dict(self, state: dict, num_clusters: Sequence[int]) -> str | None:
        # Cluster ids of each level's k: damaged state (negative or huge ids, which would size the
        # rounds' tables) is set aside, never used; the sizes are checked against the data later.
        previous = state.get('previous') if isinstance(state, dict) else None
        if previous is None:
            return None
        fits = isinstance(previous, list) and len(previous) == len(num_clusters) and all(
            isinstance(a, torch.Tensor) and a.ndim == 1 and a.dtype == torch.long
            and (a.numel() == 0 or (int(a.min()) >= 0 and int(a.max()) < k))
            for a, k in zip(previous, num_clusters))
        if not fits:
            return ("the checkpoint's previous-round assignments do not fit this run's "
                    f'{len(num_clusters)} levels (cluster ids in [0, k) for num_clusters='
                    f'{list(num_clusters)}): set aside, the next round accepts nothing (as a first '
                    'round)')
        self._previous = previous
        return None


def build_acceptance(config: object, owner: str, by_round: bool = True) -> Acceptance:
    """The scheme ``config`` (``dict(type=..., **settings)``) names, its settings checked.

    ``owner`` names the part in messages; ``by_round``: the owner runs clustering rounds (else
    it has no score, and the evidence schemes are refused).
    """
    if not isinstance(config, dict) or 'type' not in config:
        raise TypeError(f'{owner} must be a dict(type=..., ...) naming one of '
                        f'{", ".join(ACCEPTANCES.module_dict)}, got {config!r}')
    kind = config['type']
    cls = ACCEPTANCES.module_dict.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f'{owner} type must be one of {", ".join(ACCEPTANCES.module_dict)}, got '
                         f'{kind!r}')
    if cls.needs_round and not by_round:
        calendar = [name for name, c in ACCEPTANCES.module_dict.items() if not c.needs_round]
        raise ValueError(f"{owner} {kind} accepts by a clustering round's evidence, and this "
                         'owner has none (it orders the samples at random): use it on '
                         f"PseudoLabelHook (IFND, PCL), or one of {', '.join(calendar)} here")
    settings = {key: value for key, value in config.items() if key != 'type'}
    check_options(f'{owner} {kind}', settings, dict.fromkeys(inspect.signature(cls).parameters))
    scheme = cls(**settings)
    scheme.owner = f'{owner} {kind}'
    scheme.check()
    return scheme
