"""The named methods, each a preset of the contrastive parts (detector, treatment, weighting).

| preset | base | detector | treatment | weighting |
|---|---|---|---|---|
| IFND | SimCLR | PseudoLabels | elim | - |
| SupCon | SimCLR | GroundTruth | attr | - |
| OracleElim | SimCLR | GroundTruth | elim | - |
| PCL | SimCLR | - (labels for ProtoNCE) | - | - |
| DebiasedCL / HardNegativeCL | SimCLR | - | - | debiased / hard |
| FNC | SimCLR | SupportViews | elim or attr | - |
| IFNDMoCo | MoCoV2 | PseudoLabels | elim | - |
| DebiasedMoCo / HardNegativeMoCo | MoCoV2 | - | - | debiased / hard |
| IFNDMoCoV3 | MoCoV3 | PseudoLabels | elim | - |
| HCSC / HCSCMoCo / HCSCMoCoV3 | SimCLR / MoCoV2 / MoCoV3 | HCSCSelection (+ ProtoNCE with prototype selection) | elim or zero | - |

Any other combination is written with the base's own parts, e.g. IFND with hard negatives:
``dict(type='SimCLR', detector=dict(type='PseudoLabels'), treatment='elim',
weighting=dict(type='hard', tau_plus=0.1, beta=1.0))``.
"""
from typing import Annotated, Literal

import torch

from ifnd.models.contrastive import SimCLR
from ifnd.models.false_negatives.pseudo_labels import AGREEMENT
from ifnd.models.false_negatives.hcsc import HCSCPrototypes
from ifnd.models.false_negatives.support_views import check_fnc_options
from ifnd.settings import check_choice, check_number
from ifnd.models.losses import check_debiasing, proto_nce_loss
from ifnd.models.moco import MoCoV2
from ifnd.models.mocov3 import MoCoV3
from ifnd.registry import MODELS, parameter_types

PARTS = ('detector', 'treatment', 'weighting')


class _PresetDefault:
    """The type of :data:`PRESET`: the preset's own treatment, whatever it is."""

    def __repr__(self) -> str:
        return 'PRESET'


PRESET = _PresetDefault()


def _fixed_parts(name: str, kwargs: dict) -> None:
    # A preset fixes its parts: changing one is another method, written with the base's parts.
    given = [key for key in PARTS if key in kwargs]
    if given:
        base = 'MoCoV3' if 'MoCoV3' in name else 'MoCoV2' if 'MoCo' in name else 'SimCLR'
        raise ValueError(f'{name} is a preset with its own {", ".join(given)}; for another '
                         f"combination use type='{base}' with detector=, treatment= and "
                         'weighting= (docs/methods.md)')


def _weighting(name: str, tau_plus: float, beta: float, kwargs: dict) -> dict:
    """The validated weighting of a debiased / hard-negative preset, which takes no labels."""
    _fixed_parts(name, kwargs)
    check_debiasing(tau_plus, beta, name)
    return dict(type='hard' if beta > 0 else 'debiased', tau_plus=float(tau_plus),
                **({'beta': float(beta)} if beta > 0 else {}))


class _LabelPreset:
    """A preset whose detector is fixed (IFND's pseudo labels, the oracles' classes); its treatment
    is the preset's own unless ``treatment=`` names another (the paper's attraction ablation).

    The detector's own settings are the preset's too: ``IFND(agreement=2)``,
    ``OracleElim(acceptance=dict(type='LinearAcceptance'))`` (the schedule-matched oracle).
    """

    detector_type: str
    treatment_default: str | None

    def __init__(self, backbone: dict, neck: dict, treatment: str | None | _PresetDefault = PRESET,
                 **kwargs) -> None:
        name = type(self).__name__
        _fixed_parts(name, kwargs)
        own = parameter_types(MODELS.get(self.detector_type))
        settings = {key: kwargs.pop(key) for key in list(kwargs) if key in own}
        treatment = self.treatment_default if treatment is PRESET else treatment
        if treatment is None and settings:
            raise ValueError(f'{name} with treatment=None flags nothing, so it has no '
                             f'{self.detector_type} to take {", ".join(settings)}: remove them')
        detector = None if treatment is None else dict(type=self.detector_type, **settings)
        super().__init__(backbone, neck, detector=detector, treatment=treatment, **kwargs)

    @classmethod
    def configured_detector(cls, settings: dict) -> str | None:
        """The preset's detector, unless ``treatment=None`` leaves it out."""
        return None if settings.get('treatment', cls.treatment_default) is None else cls.detector_type


class _PseudoLabelPreset(_LabelPreset):
    """IFND's presets: pseudo labels, eliminated; ``agreement`` as :class:`PseudoLabels` takes it."""

    detector_type, treatment_default = 'PseudoLabels', 'elim'

    def __init__(self, backbone: dict, neck: dict, agreement: Annotated[int, AGREEMENT] = 1,
                 **kwargs) -> None:
        super().__init__(backbone, neck, agreement=agreement, **kwargs)


@MODELS.register_module()
class IFND(_PseudoLabelPreset, SimCLR):
    """IFND on the SimCLR base: pseudo labels from clustering, false negatives eliminated."""


@MODELS.register_module()
class SupCon(_LabelPreset, SimCLR):
    """SupCon, the oracle: attraction loss with ground-truth labels."""

    detector_type, treatment_default = 'GroundTruth', 'attr'


@MODELS.register_module()
class OracleElim(_LabelPreset, SimCLR):
    """The elimination oracle: Eq. 3 with ground-truth labels, every false negative removed.

    Beside SupCon (attraction with ground truth) it bounds what a perfect detector could give
    IFND's elimination loss, so a small IFND gain can be read as "detection falls short" or
    "elimination does not help here".
    """

    detector_type, treatment_default = 'GroundTruth', 'elim'


@MODELS.register_module()
class PCL(_LabelPreset, SimCLR):
    """PCL on the SimCLR base: instance InfoNCE plus ProtoNCE over the accepted samples."""

    uses_prototypes = True
    detector_type, treatment_default = 'PseudoLabels', None

    def __init__(self, backbone: dict, neck: dict, proto_weight: float = 1.0, **kwargs) -> None:
        super().__init__(backbone, neck, **kwargs)
        self.proto_weight = check_number('PCL', 'proto_weight', proto_weight, low=0, low_open=True,
                                         hint="the prototype term's weight; 0 would drop it (that "
                                         "is type='IFND', or 'SimCLR' without a treatment)")

    def loss(self, inputs: list[torch.Tensor], data_samples: dict) -> dict:
        """Instance term (with its treatment, if any) plus the prototype term of ProtoNCE."""
        z1, z2 = self.embed_views(inputs)
        losses = self._add_detection(self.batch_losses(z1, z2, data_samples))
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
class DebiasedCL(SimCLR):
    """Debiased contrastive learning (Chuang et al., NeurIPS 2020) on the SimCLR base.

    The negatives' sum is corrected for the share ``tau_plus`` (τ⁺, the class prior) of
    same-class samples among them, and clamped at N·e^(−1/τ); ``beta`` > 0 weights harder
    negatives more (hard negative sampling, :class:`HardNegativeCL`). N = 2M − 2 views of the
    batch gathered over the ranks.
    """

    def __init__(self, backbone: dict, neck: dict, temperature: float = 0.5,
                 tau_plus: float = 0.1, beta: float = 0.0, **kwargs) -> None:
        weighting = _weighting(type(self).__name__, tau_plus, beta, kwargs)
        super().__init__(backbone, neck, temperature, weighting=weighting, **kwargs)
        self.tau_plus, self.beta = float(tau_plus), float(beta)


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
class FNC(SimCLR):
    """False negative cancellation (Huynh et al., WACV 2022) on the SimCLR base.

    Each image comes with ``num_support_views`` (S) extra views (``MultiView(num_views=2 + S)``);
    the :class:`~ifnd.models.false_negatives.SupportViews` detector flags each anchor image's
    ``top_k`` best-scored images (or those above ``threshold``), and ``treatment='elim'`` drops
    them from the denominator, ``'attr'`` makes them positives.
    """

    def __init__(self, backbone: dict, neck: dict, temperature: float = 0.5,
                 treatment: str = 'elim', num_support_views: int = 2, top_k: int | None = 5,
                 threshold: float | None = None, aggregation: str = 'mean', **kwargs) -> None:
        _fixed_parts(type(self).__name__, kwargs)
        check_fnc_options(treatment, top_k, threshold, aggregation)
        detector = dict(type='SupportViews', num_support_views=num_support_views, top_k=top_k,
                        threshold=threshold, aggregation=aggregation)
        super().__init__(backbone, neck, temperature, detector=detector, treatment=treatment,
                         **kwargs)
        self.num_support_views = num_support_views
        self.top_k, self.threshold, self.aggregation = top_k, threshold, aggregation

    @classmethod
    def configured_detector(cls, settings: dict) -> str | None:
        """FNC's support views, always."""
        return 'SupportViews'


@MODELS.register_module()
class IFNDMoCo(_PseudoLabelPreset, MoCoV2):
    """IFND on the MoCo v2 base: queue keys sharing the query's pseudo label are eliminated."""


@MODELS.register_module()
class IFNDMoCoV3(_PseudoLabelPreset, MoCoV3):
    """IFND on the MoCo v3 base: keys of the batch sharing the query's pseudo label are eliminated."""


class _SelectionPreset(_LabelPreset):
    """HCSC (Guo et al., CVPR 2022): instance selection (:class:`HCSCSelection`: negatives dropped
    at random by their prototype similarity) and ProtoNCE over each clustering level's prototypes
    with prototype selection (:class:`HCSCPrototypes`), on PseudoLabelHook's levels (nested:
    HCSC's hierarchy). The settings of :class:`HCSCSelection` (``selection_temperature``,
    ``concentration``, ``floor``, ``seed``) are the preset's too.

    Where the authors' code and our reading differ, an option (their values in
    ``configs/hcsc/hcsc_mocov2_r50_200e_in1k.py``): ``dropped`` (``'removed'``: a dropped negative
    or prototype leaves the denominator; ``'zeroed'``: it keeps a logit of 0 there, the authors'
    multiplication by 0), ``level_loss`` (``'mean'`` of the levels' instance losses; ``'sum'``, the
    authors'). ``prototypes=False``: instance selection alone; ``prototype_selection=False``: every
    negative prototype kept; ``proto_weight``: the prototype term's weight (the authors': 1).
    """

    detector_type, treatment_default = 'HCSCSelection', 'elim'

    # Named here, not only through **kwargs, so a checkpoint's config gives them back (the keys a
    # reader takes come from the signatures).
    def __init__(self, backbone: dict, neck: dict, selection_temperature: float = 0.2,
                 concentration: bool = True, floor: float = 0.001, seed: int = 0,
                 prototypes: bool = True, prototype_selection: bool = True, proto_weight: float = 1.0,
                 dropped: Literal['removed', 'zeroed'] = 'removed',
                 level_loss: Literal['mean', 'sum'] = 'mean', **kwargs) -> None:
        name = type(self).__name__
        check_choice(name, 'dropped', dropped, ('removed', 'zeroed'),
                     hint="'removed': out of the denominator; 'zeroed': logit 0, the authors' code")
        check_choice(name, 'level_loss', level_loss, ('mean', 'sum'),
                     hint="of the levels' instance losses; 'sum': the authors' code")
        if 'treatment' in kwargs:
            raise ValueError(f"{name}'s dropped= sets its treatment ('removed': elim, 'zeroed': zero); "
                             'remove treatment=')
        treatment = 'zero' if dropped == 'zeroed' else 'elim'
        super().__init__(backbone, neck, selection_temperature=selection_temperature,
                         concentration=concentration, floor=floor, seed=seed, treatment=treatment,
                         **kwargs)
        self.uses_prototypes = bool(prototypes)
        self.proto_weight = check_number(name, 'proto_weight', proto_weight, low=0, low_open=True,
                                         hint="the prototype term's weight; prototypes=False drops it")
        self.level_loss = level_loss
        self.prototype_term = HCSCPrototypes(prototype_selection, dropped == 'zeroed',
                                             selection_temperature, seed) if prototypes else None

    def negatives_loss(self, batch) -> dict:
        """The base's step with instance selection, and HCSC's prototype term of its anchors."""
        losses = super().negatives_loss(batch)
        if self.level_loss == 'sum' and self.label_bank.any_accepted:  # host-side: no sync
            losses['loss'] = losses['loss'] * self.label_bank.num_levels
        if self.prototype_term is not None:
            losses['loss_proto'] = self.proto_weight * self.prototype_term(
                self.label_bank, batch.anchors, batch.anchor_index, batch.views, self.detector.epoch)
        return losses


@MODELS.register_module()
class HCSC(_SelectionPreset, SimCLR):
    """HCSC on the SimCLR base (the authors' is MoCo v2: :class:`HCSCMoCo`)."""


@MODELS.register_module()
class HCSCMoCo(_SelectionPreset, MoCoV2):
    """HCSC on the MoCo v2 base, the authors': queue keys dropped at random, queries' ProtoNCE."""


@MODELS.register_module()
class HCSCMoCoV3(_SelectionPreset, MoCoV3):
    """HCSC on the MoCo v3 base: the batch's keys dropped at random, the queries' ProtoNCE."""


@MODELS.register_module()
class DebiasedMoCo(MoCoV2):
    """The debiased contrastive loss on the MoCo v2 base: the queue's K keys are the negatives."""

    def __init__(self, backbone: dict, neck: dict, tau_plus: float = 0.01, beta: float = 0.0,
                 **kwargs) -> None:
        weighting = _weighting(type(self).__name__, tau_plus, beta, kwargs)
        super().__init__(backbone, neck, weighting=weighting, **kwargs)
        self.tau_plus, self.beta = float(tau_plus), float(beta)


@MODELS.register_module()
class HardNegativeMoCo(DebiasedMoCo):
    """Hard negative sampling (Robinson et al., ICLR 2021) on the MoCo v2 base."""

    def __init__(self, backbone: dict, neck: dict, tau_plus: float = 0.01, beta: float = 1.0,
                 **kwargs) -> None:
        super().__init__(backbone, neck, tau_plus=tau_plus, beta=beta, **kwargs)
