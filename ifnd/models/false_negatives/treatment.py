"""What is done with flagged negatives (treatments) and with the negatives that remain (weightings).

Treatments of the candidates a detector flags (IFND's Eq. ``eq:elimination`` and
``eq:attraction``):

* ``'elim'`` -- flagged candidates leave the denominator;
* ``'attr'`` -- flagged candidates join the positives (the denominator keeps every candidate).

Weightings of the negatives left in the denominator:

* ``None`` -- InfoNCE's plain sum;
* ``dict(type='debiased', tau_plus=τ⁺)`` -- the debiased estimator (Chuang et al., NeurIPS 2020);
* ``dict(type='hard', tau_plus=τ⁺, beta=β)`` -- hard negative sampling (Robinson et al., ICLR 2021).

Both weightings estimate the negatives' term for one positive, so they combine with elimination
(or no detector) and are refused with attraction. The equations themselves are in
:mod:`ifnd.models.losses`; this module joins them per label level.
"""
import torch
from torch import Tensor

from ifnd.models.losses import TREATMENTS, check_debiasing, check_treatment, debiased_nce, masked_nce
from ifnd.settings import check_options

WEIGHTINGS = {'debiased': dict(tau_plus=0.1), 'hard': dict(tau_plus=0.1, beta=1.0)}
# A weighting=dict(...)'s keys and their types (also read by the config checks of tools/train.py).
WEIGHTING_OPTIONS = {'type': str, 'tau_plus': float, 'beta': float}


def build_weighting(weighting: dict | None, owner: str = 'the model') -> dict | None:
    """The weighting's checked settings ``{'tau_plus', 'beta'}``, or None for the plain sum."""
    if weighting is None:
        return None
    if not isinstance(weighting, dict) or weighting.get('type') not in WEIGHTINGS:
        raise ValueError(f"{owner} weighting must be None or dict(type=...) with type one of "
                         f"{sorted(WEIGHTINGS)}, got {weighting!r}")
    kind = weighting['type']
    given = check_options(f'{owner} weighting {kind!r}',
                          {k: v for k, v in weighting.items() if k != 'type'}, WEIGHTINGS[kind])
    settings = {**WEIGHTINGS[kind], **given}
    settings.setdefault('beta', 0.0)
    check_debiasing(settings['tau_plus'], settings['beta'], f'{owner} weighting')
    if kind == 'hard' and settings['beta'] <= 0:
        raise ValueError(f"{owner} weighting 'hard' needs beta > 0 (the hardness), got "
                         f"{settings['beta']}; beta=0 is type='debiased'")
    if kind == 'debiased' and settings['tau_plus'] == 0:
        # (R − 0·N·pos) / 1 clamped at N·e^(−1/τ) is R, the plain sum: the weighting would do nothing.
        raise ValueError(f"{owner} weighting 'debiased' with tau_plus=0 is InfoNCE's plain sum (it "
                         'would train plain SimCLR or MoCo): set tau_plus > 0 (about 1 / the number '
                         'of classes), or beta > 0 for hard negatives')
    return {'tau_plus': float(settings['tau_plus']), 'beta': float(settings['beta'])}


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


def flagged_loss(logits: Tensor, positive_index: Tensor, excluded: Tensor | None,
                 flags: Tensor | None, treatment: str | None, weighting: dict | None,
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
        return _weighted(logits, positive_index, excluded, None, weighting, temperature)
    if weighting is None:
        # A copy: the masked core edits its mask in place.
        return masked_nce(logits, positive_index, excluded, flags.clone(), treatment, flags.any())
    return _weighted(logits, positive_index, excluded, flags, weighting, temperature)


def _weighted(logits: Tensor, positive_index: Tensor, excluded: Tensor | None,
              flags: Tensor | None, weighting: dict, temperature: float) -> Tensor:
    """Debiased / hard-negative loss over the negatives left after elimination, per level."""
    pos_column = positive_index.unsqueeze(1)
    negatives = torch.ones_like(logits, dtype=torch.bool) if excluded is None else ~excluded
    negatives = negatives.scatter(1, pos_column, False)
    pos_logits = logits.gather(1, pos_column).squeeze(1)
    if flags is None:
        return debiased_nce(pos_logits, logits, temperature, weighting['tau_plus'],
                            weighting['beta'], negatives)
    per_level = []
    for level in flags.unbind(0):
        kept = negatives & ~level
        # An anchor whose every negative is flagged keeps them all: the estimators need one.
        kept = torch.where(kept.any(dim=1, keepdim=True), kept, negatives)
        per_level.append(debiased_nce(pos_logits, logits, temperature, weighting['tau_plus'],
                                      weighting['beta'], kept))
    return torch.stack(per_level).mean(dim=0)
