"""HCSC's instance selection (Guo et al., CVPR 2022) as a detector: negatives dropped at random.

At each clustering level l, a candidate j is dropped from anchor i's negatives with the probability
that it belongs to the anchor's cluster y_i^l, read from its similarity to the level's prototypes:

    p_ij^l = softmax_c(z_j · μ_c^l / φ_c^l) at c = y_i^l,

μ^l the level's centroids and φ^l their concentrations (PCL's, rescaled to mean
``selection_temperature``, HCSC's T = 0.2; uniform T where the round computed none). HCSC keeps j
with probability min(1 − p, 0.999), so ``floor`` = 0.001 is the least drop probability. Each pair
is flagged by one Bernoulli draw, u_ij^l < p_ij^l, with u from a counter-based hash of (seed,
epoch, level, the anchor's sample index and view, the candidate's sample index): no generator
state, so every process and a resumed run draw what one uninterrupted process draws. A sample is
an anchor once an epoch, so the epoch and its index stand for the step. A candidate image's views
share their u (each is still flagged with its own p); a candidate of unknown index (MoCo's initial
queue) is keyed by its column.

The levels are PseudoLabelHook's: independent (IFND's) or nested (``hierarchy='nested'``, HCSC's
hierarchical k-means: each level's centroids clustered into the next). HCSC's other half,
:class:`HCSCPrototypes`, is ProtoNCE over each level's prototypes with prototype selection: a
negative prototype c of level l is kept for an anchor with the probability that it does not
belong to the parent P of the anchor's own prototype, 1 − softmax_c'(μ_c^l · μ_c'^{l+1} / φ_c'^{l+1})
at c' = P, clamped to [0.0001, 0.999] (the authors' clamps), drawn the same counter-based way
(docs/methods.md).
"""
from dataclasses import replace

import torch

from ifnd.models.losses import proto_nce_loss
from ifnd.registry import MODELS
from ifnd.settings import check_number, check_seed

from .detector import NegativeBatch
from .label_bank import LabelBankDetector



def _signed(constant: int) -> int:
    """A 64-bit constant as the signed int64 holding its bits."""
    return constant - (1 << 64) if constant >= 1 << 63 else constant


_GOLDEN = _signed(0x9E3779B97F4A7C15)  # splitmix64's constants
_MUL1 = _signed(0xBF58476D1CE4E5B9)
_MUL2 = _signed(0x94D049BB133111EB)
_SALT_CANDIDATE = _signed(0x5851F42D4C957F2D)  # keeps the candidates' hashes apart from anchors'
# Keeps the prototype draws apart from the instance draws of the same level.
_SALT_PROTOTYPES = 1 << 20
# HCSC's clamps of a negative prototype's keep probability (its sample_neg_protos).
PROTOTYPE_KEEP_RANGE = (0.0001, 0.999)


def _shift(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` keeps the sign)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 (wrapping multiplication): one counter, one hash."""
    x = (x ^ _shift(x, 30)) * _MUL1
    x = (x ^ _shift(x, 27)) * _MUL2
    return x ^ _shift(x, 31)


def hash_keys(*keys: torch.Tensor | int) -> torch.Tensor:
    """A hash of the broadcast integer keys, in order."""
    state = torch.as_tensor(0, dtype=torch.long)
    for key in keys:
        key = torch.as_tensor(key, dtype=torch.long, device=state.device) \
            if not isinstance(key, torch.Tensor) else key.long()
        state = mix64(state.to(key.device) + _GOLDEN + key)
    return state


def pair_uniforms(seed: int, epoch: int, level: int, anchor_index: torch.Tensor,
                  anchor_view: torch.Tensor, candidate_key: torch.Tensor) -> torch.Tensor:
    """Uniforms ``[A, C]`` in [0, 1), a function of the keys alone (24 bits, exact in float32)."""
    anchor = hash_keys(seed, epoch, level, anchor_index, anchor_view)
    candidate = hash_keys(_SALT_CANDIDATE, candidate_key)
    pair = mix64(anchor.unsqueeze(1) ^ candidate.unsqueeze(0))
    return _shift(pair, 40).float() / float(1 << 24)


def selection_probability(candidates: torch.Tensor, centroids: torch.Tensor,
                          concentration: torch.Tensor, anchor_labels: torch.Tensor,
                          floor: float = 0.0) -> torch.Tensor:
    """HCSC's drop probability ``[A, C]`` at one level: softmax_c(z_j·μ_c/φ_c) at the anchor's
    cluster, at least ``floor``; 0 for anchors with no label (< 0)."""
    logits = candidates.float() @ centroids.float().t() / concentration.float().clamp(min=1e-3)
    member = logits.softmax(dim=1)  # [C, k]
    known = anchor_labels >= 0
    prob = member[:, anchor_labels.clamp(min=0)].t().clamp(min=floor)
    return torch.where(known.unsqueeze(1), prob, torch.zeros_like(prob))


@MODELS.register_module()
class HCSCSelection(LabelBankDetector):
    """Flags each negative with the probability it shares the anchor's cluster, per level."""


    def __init__(self, selection_temperature: float = 0.2, concentration: bool = True,
                 floor: float = 0.001, seed: int = 0, acceptance: dict | None = None) -> None:
        """``selection_temperature``: HCSC's T, the mean of φ (not the loss's τ, which the presets
        also take); ``concentration``: PCL's per-cluster φ where the
        round computed it (False: φ = T everywhere); ``floor``: the least drop probability (HCSC's
        1 − 0.999); ``seed``: of the draws."""
        super().__init__(acceptance)
        name = 'HCSCSelection'
        self.selection_temperature = check_number(
            name, 'selection_temperature', selection_temperature, low=0, low_open=True,
            hint="HCSC's T, the prototypes' mean concentration")
        if not isinstance(concentration, bool):
            raise TypeError('HCSCSelection concentration must be True or False, got '
                            f'{concentration!r}')
        self.concentration = concentration
        # Its prototypes: the centroids, and PCL's concentrations φ unless φ = T everywhere.
        self.needs = replace(self.needs, round_outputs=self.needs.round_outputs | {'centroids'} | (
            {'concentrations'} if concentration else set()))
        self.floor = check_number(name, 'floor', floor, low=0, high=1, high_open=True,
                                  hint='the least drop probability (the authors: 0.001)')
        self.seed = check_seed(name, 'seed', seed)

    def level_concentration(self, level: int, k: int) -> torch.Tensor:
        """φ ``[k]`` of a level, rescaled to mean ``selection_temperature`` (uniform where the
        round computed none)."""
        bank = self.bank
        if not self.concentration or bank.concentration.numel() == 0:
            return bank.centroids.new_full((k, ), self.selection_temperature)
        phi = bank.concentration[level, :k].float()
        return self.selection_temperature * phi / phi.mean().clamp(min=1e-12)

    def probabilities(self, batch: NegativeBatch) -> torch.Tensor | None:
        """Drop probabilities ``[L, A, C]``; None before a round gave centroids."""
        bank = self.bank
        counts = bank.cluster_counts  # host-side: no sync
        if not bank.any_accepted or not counts or min(counts) == 0 or bank.centroids.numel() == 0:
            return None
        if bank.centroids.shape[-1] != batch.candidates.shape[1]:
            raise ValueError(f'HCSCSelection compares {batch.candidates.shape[1]}-d embeddings '
                             f'with {bank.centroids.shape[-1]}-d centroids: cluster the embedding '
                             "the loss contrasts (PseudoLabelHook feature='z')")
        index = batch.anchor_index
        labels = bank.lookup(index.clamp(min=0))
        labels = torch.where(index >= 0, labels, -1)
        with torch.no_grad(), torch.autocast(batch.candidates.device.type, enabled=False):
            candidates = batch.candidates.detach()
            return torch.stack([
                selection_probability(candidates, bank.centroids[level, :k],
                                      self.level_concentration(level, k), labels[level], self.floor)
                for level, k in enumerate(counts)])

    def uniforms(self, batch: NegativeBatch) -> torch.Tensor:
        """The draws ``[L, A, C]``: keyed by the pair's sample indices, not by batch positions."""
        anchors, columns = len(batch.anchor_index), len(batch.candidate_index)
        device = batch.anchor_index.device
        view = torch.arange(anchors, device=device) // max(anchors // max(batch.views, 1), 1)
        column = torch.arange(columns, device=device)
        key = torch.where(batch.candidate_index >= 0, batch.candidate_index, -(1 + column))
        return torch.stack([pair_uniforms(self.seed, self.epoch, level, batch.anchor_index, view,
                                          key) for level in range(self.levels)])

    def flags(self, batch: NegativeBatch) -> torch.Tensor | None:
        """One Bernoulli draw per pair and level ``[L, A, C]``; None before the first round."""
        prob = self.probabilities(batch)
        if prob is None:
            return None
        batch.derived['hcsc_probability'] = prob
        return self.uniforms(batch) < prob

    def log_vars(self, batch: NegativeBatch) -> dict:
        """The mean drop probability over the batch's negatives."""
        logged = super().log_vars(batch)
        prob = batch.derived.get('hcsc_probability')
        if prob is not None:
            negatives = batch.negatives.to(prob.dtype)
            total = (negatives.sum() * len(prob)).clamp(min=1)
            logged['hcsc_drop_prob'] = (prob * negatives).sum() / total
        return logged


def prototype_keep_probability(centroids: torch.Tensor, parent_centroids: torch.Tensor,
                               parent_concentration: torch.Tensor,
                               positive_parents: torch.Tensor) -> torch.Tensor:
    """HCSC's prototype selection at one level: the probability ``[A, K]`` of keeping each of the
    level's K prototypes as a negative of an anchor whose own prototype's parent is
    ``positive_parents[a]``: 1 − softmax_c'(μ_c · μ'_c' / φ'_c') at that parent, clamped to
    ``PROTOTYPE_KEEP_RANGE``."""
    logits = centroids.float() @ parent_centroids.float().t() / parent_concentration.float().clamp(min=1e-3)
    member = logits.softmax(dim=1)  # [K, K_parent]
    return (1 - member[:, positive_parents.clamp(min=0)].t()).clamp(*PROTOTYPE_KEEP_RANGE)


class HCSCPrototypes(torch.nn.Module):
    """HCSC's prototype term: ProtoNCE over each clustering level's prototypes (each logit divided
    by its prototype's φ), its negative prototypes selected at random by the parent level where the
    levels are nested.

    ``selection``: prototype selection on (HCSC's) or every negative prototype kept;
    ``zeroed``: a dropped prototype keeps a logit of 0 in the denominator (HCSC's code) instead of
    leaving it; ``selection_temperature``: the mean the parent level's φ is rescaled to (HCSC's T);
    ``seed``: of the draws.
    """

    def __init__(self, selection: bool = True, zeroed: bool = False, selection_temperature: float = 0.2,
                 seed: int = 0) -> None:
        super().__init__()
        self.selection, self.zeroed = selection, zeroed
        self.selection_temperature = selection_temperature
        self.seed = seed

    def kept(self, bank, anchors: torch.Tensor, labels: torch.Tensor, anchor_index: torch.Tensor,
             views: int, epoch: int) -> list[torch.Tensor | None]:
        """Per level, the negative prototypes each anchor keeps ``[A, K_l]`` (None: all of them,
        at the coarsest level and where a level has no parent)."""
        counts, parents = bank.cluster_counts, bank.parents
        has_parents = bank.has_parents  # host-side: no sync
        kept: list[torch.Tensor | None] = []
        anchors_num = len(anchor_index)
        view = torch.arange(anchors_num, device=anchors.device) // max(anchors_num // max(views, 1), 1)
        for level, k in enumerate(counts):
            upper = level + 1
            if not self.selection or upper >= len(counts) or not has_parents[level]:
                kept.append(None)
                continue
            k_up = counts[upper]
            phi = bank.concentration[upper, :k_up].float()
            phi = self.selection_temperature * phi / phi.mean().clamp(min=1e-12)
            positive_parents = parents[level, labels[level].clamp(min=0)]
            probability = prototype_keep_probability(bank.centroids[level, :k], bank.centroids[upper, :k_up],
                                                     phi, positive_parents)
            uniforms = pair_uniforms(self.seed, epoch, _SALT_PROTOTYPES + level, anchor_index, view,
                                     torch.arange(k, device=anchors.device))
            kept.append(uniforms < probability)
        return kept

    def forward(self, bank, anchors: torch.Tensor, anchor_index: torch.Tensor, views: int,
                epoch: int) -> torch.Tensor:
        """The term for ``anchors`` ``[A, D]`` (samples ``anchor_index``); 0 before the first round."""
        counts = bank.cluster_counts  # host-side: no sync
        if not counts or min(counts) == 0 or bank.centroids.numel() == 0:
            return anchors.new_zeros(())
        labels = bank.lookup(anchor_index.clamp(min=0))
        labels = torch.where(anchor_index >= 0, labels, -1)
        with torch.no_grad():
            kept = self.kept(bank, anchors.detach(), labels, anchor_index, views, epoch)
        centroids = [bank.centroids[level, :k] for level, k in enumerate(counts)]
        concentration = [bank.concentration[level, :k] for level, k in enumerate(counts)]
        with torch.autocast(anchors.device.type, enabled=False):
            return proto_nce_loss(anchors.float(), centroids, labels, concentration, kept, self.zeroed)
