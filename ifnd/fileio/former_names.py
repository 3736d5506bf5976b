"""The false-negative parts' former spelling, read once where configs and checkpoints are loaded.

Configs and checkpoints written before the parts had their names say ``loss_mode`` ('inst',
'elim', 'attr') and ``label_source`` ('none', 'pseudo', 'ground_truth'), and FNC's
``strategy``. :func:`translate_former_names` writes them as ``detector=`` and ``treatment=``
(docs/methods.md) with a one-line notice; nothing else in the package reads them.

Acceptance was once four flat keys of ``PseudoLabelHook`` (``scheme``, ``final_rate``,
``step_epoch``, ``threshold``) and a detector's ``acceptance=dict(scheme=...)``, and the hook's
score kind was ``confidence``: :func:`translate_former_hook` and :func:`translate_former_names`
write them as ``acceptance=dict(type=...)`` and ``score=``, with one notice each.
"""
import inspect
import logging

from mmengine.logging import print_log

from ifnd.registry import ACCEPTANCES

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
    if isinstance(model, dict) and 'detector' in model:
        detector = translate_former_detector(model['detector'], source)
        if detector is not model['detector']:
            model = {**model, 'detector': detector}
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


# The former acceptance schemes and the part each is now.
FORMER_SCHEMES = {'constant': 'ConstantAcceptance', 'step': 'StepAcceptance',
                  'linear': 'LinearAcceptance', 'confidence': 'ConfidentAcceptance',
                  'stability': 'StableAcceptance'}
# The hooks' former keys: acceptance's settings, and the score kind.
FORMER_HOOK_KEYS = {'PseudoLabelHook': ('scheme', 'final_rate', 'step_epoch', 'threshold',
                                        'confidence')}
# Former key -> its name on the acceptance part.
_ACCEPTANCE_RENAMED = {'final_rate': 'final_rate', 'step_epoch': 'step_epoch',
                       'threshold': 'certainty_share', 'interval': 'interval', 'seed': 'seed'}
# A hook's former key -> the key under the hook it stands for now.
FORMER_HOOK_NAMES = {'scheme': 'acceptance.type', 'confidence': 'score',
                     **{key: f'acceptance.{_ACCEPTANCE_RENAMED[key]}'
                        for key in FORMER_HOOK_KEYS['PseudoLabelHook'] if key in _ACCEPTANCE_RENAMED}}


def former_option_clash(options: dict) -> str | None:
    """Where ``--cfg-options`` give a hook's former key beside the key it stands for now (the former
    would silently win), one line naming both and the fix; else None."""
    for key in options:
        hook, _, name = key.rpartition('.')
        current = FORMER_HOOK_NAMES.get(name)
        if current is None or not hook.startswith('custom_hooks.'):
            continue
        clash = [other for other in options
                 if other in (f'{hook}.{current}', f'{hook}.{current.split(".")[0]}')]
        if clash:
            return (f'--cfg-options gives {key} (the former spelling of {hook}.{current}) and '
                    f'{clash[0]}, and the former key would win: give {hook}.{current} alone')
    return None


def _acceptance(current: object, given: dict, source: str) -> tuple[dict, list[str], list[str]]:
    """The acceptance part ``given`` (former keys) makes of ``current`` (a part or None), the
    former settings the new part has no use for (they were ignored then too), and the settings of
    ``current`` it drops."""
    ACCEPTANCES.import_from_location()  # the parts register where they are defined
    current = dict(current) if isinstance(current, dict) else {}
    scheme = given.get('scheme')
    if scheme is None:
        kind = current.get('type', FORMER_SCHEMES['linear'])
    elif isinstance(scheme, str) and scheme in FORMER_SCHEMES:
        kind = FORMER_SCHEMES[scheme]
    else:
        kind = None
    if not isinstance(kind, str) or kind not in ACCEPTANCES.module_dict:
        raise ValueError(f'{source}: scheme={scheme!r} with acceptance type '
                         f'{current.get("type")!r} names no acceptance; write acceptance='
                         f'dict(type=...), one of {", ".join(FORMER_SCHEMES.values())} (the former '
                         f'schemes {", ".join(FORMER_SCHEMES)}; docs/methods.md)')
    cls = ACCEPTANCES.module_dict[kind]
    takes = set(inspect.signature(cls).parameters)
    part = {'type': kind, **{k: v for k, v in current.items() if k in takes}}
    lost = [f'type={current["type"]!r}'] if current.get('type', kind) != kind else []
    lost += [f'{k}={v!r}' for k, v in current.items() if k != 'type' and k not in takes]
    unused = []
    for key, value in given.items():
        if key == 'scheme':
            continue
        name = _ACCEPTANCE_RENAMED[key]
        if name in takes:
            part[name] = value
        elif key == 'threshold':  # refused then too: it meant nothing but for 'confidence'
            raise ValueError(f"{source}: threshold={value!r} is the former 'confidence' scheme's "
                             f'(now ConfidentAcceptance(certainty_share=...)); with {kind} remove it')
        else:
            unused.append(f'{key}={value!r}')
    return part, unused, lost


def translate_former_hook(hook: object, source: str, key: str = '') -> object:
    """``hook`` (a hook config, at config ``key`` where known) with its former keys written as
    ``acceptance=`` and ``score=``.

    The former keys win over the part's own: the base configs say ``acceptance=`` and ``score=``,
    so a former key comes from a user's command or config written over them. Returns ``hook``
    itself when it has none, else a translated copy and one log line, which names the acceptance
    part they replace where it was of another type or had settings the new one drops.
    """
    if not isinstance(hook, dict) or hook.get('type') not in FORMER_HOOK_KEYS:
        return hook
    given = {name: hook[name] for name in FORMER_HOOK_KEYS[hook['type']] if name in hook}
    if not given:
        return hook
    prefix = f'{key}.' if key else ''
    said = ', '.join(f'{prefix}{k}={v!r}' for k, v in given.items())
    said_keys = set(given)
    translated = {k: v for k, v in hook.items() if k not in given}
    if 'confidence' in given:
        translated['score'] = given.pop('confidence')
    unused: list[str] = []
    lost: list[str] = []
    if given:
        translated['acceptance'], unused, lost = _acceptance(hook.get('acceptance'), given, source)
    written = ', '.join(f'{k}={translated[k]!r}' for k, new in
                        (('acceptance', bool(given)), ('score', 'confidence' in said_keys)) if new)
    dropped = f' ({", ".join(unused)}: no setting of it, dropped)' if unused else ''
    replaced = '; write it so'
    if lost:  # the hook's own part, of another type or with settings the new one drops
        own = {'type': hook['acceptance'].get('type'), **hook['acceptance']}  # its type first
        replaced = (f", in place of its {prefix}acceptance={own!r} ({', '.join(lost)} lost); to "
                    'keep that part remove the former keys, else write '
                    f"{prefix}acceptance={translated['acceptance']!r} alone")
    print_log(f'{source}: read the former {said} of {hook["type"]} as {written}{dropped}{replaced} '
              '(docs/methods.md)', logger='current', level=logging.WARNING)
    return translated


def translate_former_detector(detector: object, source: str) -> object:
    """A detector config whose ``acceptance=dict(scheme=...)`` is written as the part it is now."""
    if not isinstance(detector, dict) or not isinstance(detector.get('acceptance'), dict) \
            or 'type' in detector['acceptance']:
        return detector
    former = detector['acceptance']
    unknown = sorted(set(former) - set(_ACCEPTANCE_RENAMED) - {'scheme'}, key=str)
    if unknown:
        return detector  # not the former spelling: the part's own check names what is wrong
    part, unused, _ = _acceptance(None, former, source)
    dropped = f' ({", ".join(unused)}: no setting of it, dropped)' if unused else ''
    print_log(f'{source}: read the detector\'s former acceptance={former!r} as acceptance={part!r}'
              f'{dropped}; write it so (docs/methods.md)', logger='current', level=logging.WARNING)
    return {**detector, 'acceptance': part}


def translate_former_config(config: dict, source: str) -> dict:
    """A whole config (as a dict) with the model's and the hooks' former names translated."""
    translated = dict(config)
    if isinstance(config.get('model'), dict):
        translated['model'] = translate_former_names(config['model'], source)
    hooks = config.get('custom_hooks')
    if isinstance(hooks, (list, tuple)):
        translated['custom_hooks'] = [translate_former_hook(hook, source, f'custom_hooks.{i}')
                                      for i, hook in enumerate(hooks)]
    return translated
