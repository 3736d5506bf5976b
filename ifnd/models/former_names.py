"""The false-negative parts' former spelling, read once where configs and checkpoints are loaded.

Configs and checkpoints written before the parts had their names say ``loss_mode`` ('inst',
'elim', 'attr') and ``label_source`` ('none', 'pseudo', 'ground_truth'), and FNC's
``strategy``. :func:`translate_former_names` writes them as ``detector=`` and ``treatment=``
(docs/methods.md) with a one-line notice; nothing else in the package reads them.
"""
import logging

from mmengine.logging import print_log

FORMER_KEYS = ('loss_mode', 'label_source', 'strategy')
FORMER_TREATMENTS = {'inst': None, 'elim': 'elim', 'attr': 'attr'}
FORMER_DETECTORS = {'none': None, 'pseudo': 'PseudoLabels', 'ground_truth': 'GroundTruth'}
# The presets whose labels are fixed, by their former label source.
LABEL_PRESETS = {'IFND': 'pseudo', 'IFNDMoCo': 'pseudo', 'PCL': 'pseudo', 'SupCon': 'ground_truth',
                 'OracleElim': 'ground_truth'}
# The bases that take the parts themselves.
BASES = ('SimCLR', 'MoCoV2')


def _treatment(mode: object) -> str | None:
    if not isinstance(mode, str) or mode not in FORMER_TREATMENTS:
        raise ValueError(f'loss_mode must be one of {tuple(FORMER_TREATMENTS)} (the former name of '
                         f"treatment: None, 'elim' or 'attr'), got {mode!r}")
    return FORMER_TREATMENTS[mode]


def _parts(kind: object, mode: object, labels: object) -> dict:
    """The parts ``loss_mode=mode, label_source=labels`` stand for on a model of type ``kind``."""
    treatment = _treatment('inst' if mode is None else mode)
    if kind in LABEL_PRESETS:
        if labels not in (None, LABEL_PRESETS[kind]):
            raise ValueError(f'{kind} reads {LABEL_PRESETS[kind]!r} labels; label_source={labels!r} is '
                             f"another method: write type='SimCLR' (or 'MoCoV2') with detector=dict("
                             f"type={FORMER_DETECTORS.get(labels, '...')!r}) and treatment=")
        return {'treatment': treatment}
    if kind not in BASES:  # the other presets handle false negatives themselves
        if treatment is not None or labels not in (None, 'none'):
            raise ValueError(f'{kind} handles false negatives itself and takes no labels; remove '
                             f'loss_mode={mode!r} / label_source={labels!r} from its config (IFND, '
                             'SupCon and OracleElim are the label-based methods)')
        return {}
    labels = 'none' if labels is None else labels
    if labels not in FORMER_DETECTORS:
        raise ValueError(f'label_source must be one of {tuple(FORMER_DETECTORS)} (the former name of '
                         f'detector=), got {labels!r}')
    if treatment is not None and labels == 'none':
        raise ValueError(f"loss_mode={mode!r} needs labels: write detector=dict(type='PseudoLabels') "
                         "(IFND) or dict(type='GroundTruth') (SupCon), or drop it")
    if treatment is None and labels == 'pseudo':
        raise ValueError("label_source='pseudo' without a treatment keeps labels no loss reads: "
                         "write type='PCL' for prototypes, or detector=dict(type='PseudoLabels') with "
                         "treatment='elim'")
    if treatment is None:
        return {}
    return {'detector': dict(type=FORMER_DETECTORS[labels]), 'treatment': treatment}


def translate_former_names(model: dict | None, source: str) -> dict | None:
    """``model`` with ``loss_mode``/``label_source``/``strategy`` written as detector and treatment.

    Returns ``model`` itself when it has none of them, else a translated copy and one log line
    naming what ``source`` said and how to write it; a combination with no meaning is refused.
    """
    if not isinstance(model, dict) or not any(key in model for key in FORMER_KEYS):
        return model
    translated = {k: v for k, v in model.items() if k not in FORMER_KEYS}
    given = {key: model[key] for key in FORMER_KEYS if key in model}
    clash = [key for key in ('detector', 'treatment') if key in model]
    if clash:
        raise ValueError(f'{source}: the model gives {", ".join(clash)} and the former '
                         f'{", ".join(given)}: keep {" and ".join(clash)} alone (docs/methods.md)')
    kind = model.get('type')
    if 'strategy' in given:
        if kind != 'FNC':
            raise ValueError(f"{source}: strategy= is FNC's former treatment=, and the model is {kind}")
        parts = {'treatment': given['strategy']}
        if 'loss_mode' in given or 'label_source' in given:
            parts.update(_parts(kind, given.get('loss_mode'), given.get('label_source')))
    else:
        parts = _parts(kind, given.get('loss_mode'), given.get('label_source'))
    translated.update(parts)
    written = ', '.join(f'{k}={v!r}' for k, v in parts.items()) or 'nothing (their defaults)'
    print_log(f'{source}: read the former {", ".join(f"{k}={v!r}" for k, v in given.items())} of '
              f'{kind} as {written}; write it so (docs/methods.md)', logger='current',
              level=logging.WARNING)
    return translated
