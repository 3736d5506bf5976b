"""What is done with flagged negatives (treatments), with the negatives that remain (weightings),
and the one step that joins them to a base's layout.

Treatments of the candidates a detector flags (IFND's Eq. ``eq:elimination`` and
``eq:attraction``):

* ``'elim'`` -- flagged candidates leave the denominator;
* ``'attr'`` -- flagged candidates join the positives (the denominator keeps every candidate);
* ``'zero'`` -- flagged candidates' logits are set to 0 (HCSC's code, which multiplies a dropped
  negative's logit by 0: it still adds e^0 to the denominator).

Weightings of the negatives left in the denominator, registered parts built from
``weighting=dict(type=...)``:

* ``None`` -- InfoNCE's plain sum;
* ``dict(type='debiased', tau_plus=τ⁺)`` -- the debiased estimator (Chuang et al., NeurIPS 2020);
* ``dict(type='hard', tau_plus=τ⁺, beta=β)`` -- hard negative sampling (Robinson et al., ICLR 2021).

Both weightings estimate the negatives' term for one positive, so they combine with elimination
(or no detector) and are refused with attraction. :func:`contrast` is the loss of a laid-out
:class:`~.detector.NegativeBatch` with the detector's flags; the equations themselves are in
:mod:`ifnd.models.losses`.
"""
import torch
import torch.nn.functional as F
from torch import Tensor

from ifnd.models.losses import (TREATMENTS, check_debiasing, check_treatment, debiased_nce, masked_nce,
                                queue_logits)
from ifnd.registry import MODELS, parameter_defaults
from ifnd.settings import check_options

from .detector import NegativeBatch


class Weighting:
    """Base of the weightings: how the negatives left in the denominator count (τ⁺, β).

    A weighting estimates, per anchor, the negatives' term of one positive from logits and a mask
    of the negatives (:meth:`per_anchor`); the subclasses check their own settings.
    """

    def __init__(self, tau_plus: float, beta: float) -> None:
        check_debiasing(tau_plus, beta, 'weighting')
        self.tau_plus, self.beta = float(tau_plus), float(beta)

    def per_anchor(self, pos_logits: Tensor, logits: Tensor, temperature: float,
                   negatives: Tensor | None = None) -> Tensor:
        """The loss ``[A]`` of each anchor's positive logit ``[A]`` against the logits ``[A, C]``
        that ``negatives`` ``[A, C]`` marks (all of them when None)."""
        return debiased_nce(pos_logits, logits, temperature, self.tau_plus, self.beta, negatives)

    def flagged(self, logits: Tensor, positive_index: Tensor, excluded: Tensor | None,
                flags: Tensor | None, temperature: float) -> Tensor:
        """The loss ``[A]`` over the negatives left after eliminating ``flags`` ``[L, A, C]``, the
        mean of the levels (an anchor whose every negative is flagged keeps them all: the
        estimators need one)."""
        pos_column = positive_index.unsqueeze(1)
        negatives = torch.ones_like(logits, dtype=torch.bool) if excluded is None else ~excluded
        negatives = negatives.scatter(1, pos_column, False)
        pos_logits = logits.gather(1, pos_column).squeeze(1)
        if flags is None:
            return self.per_anchor(pos_logits, logits, temperature, negatives)
        per_level = []
        for level in flags.unbind(0):
            kept = negatives & ~level
            kept = torch.where(kept.any(dim=1, keepdim=True), kept, negatives)
            per_level.append(self.per_anchor(pos_logits, logits, temperature, kept))
        return torch.stack(per_level).mean(dim=0)

    def __repr__(self) -> str:
        return f'{type(self).__name__}(tau_plus={self.tau_plus:g}, beta={self.beta:g})'


@MODELS.register_module(name='debiased')
class Debiased(Weighting):
    """The debiased estimator: the negatives' sum corrected for the share τ⁺ of the anchor's class."""

    def __init__(self, tau_plus: float = 0.1) -> None:
        super().__init__(tau_plus, 0.0)
        if self.tau_plus == 0:
            # (R − 0·N·pos) / 1 clamped at N·e^(−1/τ) is R, the plain sum: the weighting would do nothing.
            raise ValueError("weighting 'debiased' with tau_plus=0 is InfoNCE's plain sum (it would "
                             'train plain SimCLR or MoCo): set tau_plus > 0 (about 1 / the number of '
                             'classes), or beta > 0 for hard negatives')


@MODELS.register_module(name='hard')
class HardNegatives(Weighting):
    """Hard negative sampling: the debiased estimator with each negative weighted by e^(β·logit)."""

    def __init__(self, tau_plus: float = 0.1, beta: float = 1.0) -> None:
        super().__init__(tau_plus, beta)
        if self.beta <= 0:
            raise ValueError(f"weighting 'hard' needs beta > 0 (the hardness), got {beta}; beta=0 is "
                             "type='debiased'")


# The registered weightings by the name a config's weighting=dict(type=...) gives.
WEIGHTINGS = {'debiased': Debiased, 'hard': HardNegatives}
# A weighting=dict(...)'s keys and their types (also read by the config checks of tools/train.py).
WEIGHTING_OPTIONS = {'type': str, 'tau_plus': float, 'beta': float}


def build_weighting(weighting: dict | None, owner: str = 'the model') -> Weighting | None:
    """The weighting a config's ``weighting=dict(type=...)`` names, or None for the plain sum; its
    settings checked by the part itself (the messages name ``owner``)."""
    if weighting is None:
        return None
    if not isinstance(weighting, dict) or weighting.get('type') not in WEIGHTINGS:
        raise ValueError(f"{owner} weighting must be None or dict(type=...) with type one of "
                         f"{sorted(WEIGHTINGS)}, got {weighting!r}")
    kind = weighting['type']
    settings = {k: v for k, v in weighting.items() if k != 'type'}
    check_options(f'{owner} weighting {kind!r}', settings, parameter_defaults(WEIGHTINGS[kind]))
    try:
        return WEIGHTINGS[kind](**settings)
    except (TypeError, ValueError) as err:
        raise type(err)(f'{owner} {err}') from None


def check_parts(detector: dict | None, treatment: str | None, weighting: dict | None) -> None:
    """Refuse combinations of detector, treatment and weighting that have no meaning."""
    check_treatment(treatment)
    if treatment is not None and detector is None:
        raise ValueError(f'treatment={treatment!r} acts on flagged negatives, and nothing flags '
                         "them: add a detector (dict(type='PseudoLabels') for IFND, 'GloFND', "
                         "'SupportViews' for FNC, 'GroundTruth' for the oracles) or drop the "
                         'treatment')
    if detector is not None and treatment is None:
        raise ValueError(f"detector {detector.get('type')!r} flags false negatives but nothing "
                         "treats them: add treatment='elim' (elimination) or 'attr' (attraction)")
    if treatment == 'attr' and weighting is not None:
        raise ValueError(f"weighting {weighting.get('type')!r} estimates the negatives' term for "
                         "one positive; attraction gives an anchor several: use treatment='elim' "
                         'with it, or drop the weighting')
    if treatment == 'zero' and weighting is not None:
        raise ValueError(f"weighting {weighting.get('type')!r} weighs the negatives left after "
                         "elimination; treatment='zero' leaves the flagged ones in with logit 0: use "
                         "treatment='elim' with it, or drop the weighting")


def flagged_loss(logits: Tensor, positive_index: Tensor, excluded: Tensor | None,
                 flags: Tensor | None, treatment: str | None, weighting: Weighting | None,
                 temperature: float) -> Tensor:
    """Per-anchor loss ``[A]`` of logits ``[A, C]`` (similarities / τ), averaged over flag levels.

    ``positive_index[a]``: anchor a's positive column; ``excluded`` [A, C]: columns that are no
    candidate of the anchor (itself); ``flags`` [L, A, C]: the detector's flags (None: none).
    When no candidate is flagged anywhere, level 0 alone is returned (chosen on the device): the
    plain loss, bit for bit.
    """
    if flags is None or treatment is None:
        if weighting is None:
            return masked_nce(logits, positive_index, excluded, None, None)
        return weighting.flagged(logits, positive_index, excluded, None, temperature)
    if weighting is None:
        # A copy: the masked core edits its mask in place.
        return masked_nce(logits, positive_index, excluded, flags.clone(), treatment, flags.any())
    return weighting.flagged(logits, positive_index, excluded, flags, temperature)


def contrast(batch: NegativeBatch, flags: Tensor | None, treatment: str | None,
             weighting: Weighting | None, temperature: float, detecting: bool) -> Tensor:
    """The mean loss of a laid-out batch whose flags ``[L, A, C]`` (None: none) are treated.

    With the positives among the candidates (``batch.positive_index``) the logits are
    ``anchors @ candidates.T / τ``; with a positive of each anchor's own (``batch.positives``,
    MoCo's key) it is column 0 before the candidates' (``queue_logits``, which keeps the queue
    uncopied through the enqueue that follows). Without a detector (``detecting`` False) such a
    base keeps its published loss: the cross entropy, or the weighting over the candidates alone.
    """
    if batch.positives is None:
        logits = batch.anchors @ batch.candidates.t() / temperature
        return flagged_loss(logits, batch.positive_index, batch.excluded, flags, treatment, weighting,
                            temperature).mean()
    l_pos, l_neg = queue_logits(batch.anchors, batch.positives, batch.candidates, temperature,
                                batch.overwritten)
    if not detecting and weighting is not None:  # the queue's K keys are all negatives: N is K
        return weighting.per_anchor(l_pos, l_neg, temperature).mean()
    logits = torch.cat([l_pos.unsqueeze(1), l_neg], dim=1)
    positive = logits.new_zeros(logits.shape[0], dtype=torch.long)
    if not detecting:
        return F.cross_entropy(logits, positive)
    if flags is not None:  # column 0, the own positive, is never flagged
        flags = torch.cat([flags.new_zeros(flags.shape[0], flags.shape[1], 1), flags], dim=2)
    return flagged_loss(logits, positive, None, flags, treatment, weighting, temperature).mean()
