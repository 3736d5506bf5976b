"""The parts' former spelling (loss_mode, label_source, FNC's strategy): read once, on load, with a
notice; written nowhere else."""
import os.path as osp
import re
from pathlib import Path

import pytest
import torch
from helpers import TINY_BACKBONE, TINY_NECK
from mmengine.registry import init_default_scope

from ifnd.engine.cli import runner_config
from ifnd.fileio import former_names
from ifnd.models.architecture import architecture_config
from ifnd.fileio.former_names import translate_former_names
from ifnd.registry import MODELS

ROOT = Path(__file__).resolve().parents[1]

# (former spelling, the same model in the parts' names)
TRANSLATIONS = [
    (dict(type='IFND', loss_mode='elim'), dict(type='IFND', treatment='elim')),
    (dict(type='IFND', loss_mode='attr', label_source='pseudo'), dict(type='IFND', treatment='attr')),
    (dict(type='IFNDMoCo', loss_mode='elim', queue_len=16), dict(type='IFNDMoCo', treatment='elim', queue_len=16)),
    (dict(type='SupCon', loss_mode='attr'), dict(type='SupCon', treatment='attr')),
    (dict(type='OracleElim', loss_mode='elim', label_source='ground_truth'),
     dict(type='OracleElim', treatment='elim')),
    (dict(type='PCL', loss_mode='inst'), dict(type='PCL', treatment=None)),
    (dict(type='PCL', loss_mode='elim'), dict(type='PCL', treatment='elim')),
    (dict(type='FNC', strategy='attr', top_k=2), dict(type='FNC', treatment='attr', top_k=2)),
    (dict(type='SimCLR', loss_mode='elim', label_source='pseudo'),
     dict(type='SimCLR', detector=dict(type='PseudoLabels'), treatment='elim')),
    (dict(type='MoCoV2', loss_mode='attr', label_source='ground_truth', queue_len=16),
     dict(type='MoCoV2', detector=dict(type='GroundTruth'), treatment='attr', queue_len=16)),
    (dict(type='SimCLR', loss_mode='inst', label_source='none'), dict(type='SimCLR')),
    (dict(type='DebiasedCL', loss_mode='inst', label_source='none', tau_plus=0.1),
     dict(type='DebiasedCL', tau_plus=0.1)),
]


@pytest.fixture
def notices(monkeypatch):
    said = []
    monkeypatch.setattr(former_names, 'print_log', lambda msg, **kw: said.append(msg))
    return said


@pytest.mark.parametrize('former, parts', TRANSLATIONS, ids=lambda c: str(c.get('type')))
def test_the_former_spelling_builds_the_same_model(former, parts, notices):
    """Translated with one notice naming what was read; the model equals the parts' own, loss and
    gradients included."""
    translated = translate_former_names(dict(former), 'config x.py')
    assert translated == parts
    assert len(notices) == 1 and notices[0].startswith('config x.py: read the former ')
    assert all(f'{key}=' in notices[0] for key in former_names.FORMER_KEYS if key in former)
    init_default_scope('ifnd')
    models = []
    for cfg in (translated, parts):
        torch.manual_seed(0)
        models.append(MODELS.build(dict(cfg, backbone=TINY_BACKBONE, neck=TINY_NECK)))
    a, b = models
    assert a.state_dict().keys() == b.state_dict().keys()
    assert (a.treatment, a.needs, type(a.detector)) == (b.treatment, b.needs, type(b.detector))


def test_a_config_without_the_former_spelling_is_returned_as_is(notices):
    model = dict(type='IFND', treatment='attr')
    assert translate_former_names(model, 'x') is model and not notices
    assert translate_former_names(None, 'x') is None


@pytest.mark.parametrize('former, match', [
    (dict(type='SimCLR', loss_mode='elim'), 'needs labels'),
    (dict(type='SimCLR', label_source='pseudo'), "type='PCL'"),
    (dict(type='SimCLR', loss_mode='supcon', label_source='pseudo'), 'loss_mode must be one of'),
    (dict(type='SimCLR', loss_mode='elim', label_source='teacher'), 'label_source must be one of'),
    (dict(type='IFND', label_source='ground_truth'), "write type='SimCLR'"),
    (dict(type='DebiasedCL', loss_mode='elim', label_source='pseudo'), 'takes no labels'),
    (dict(type='IFND', loss_mode='attr', treatment='elim'), 'keep treatment alone'),
    (dict(type='SimCLR', loss_mode='elim', label_source='pseudo', detector=dict(type='GroundTruth')),
     'keep detector alone'),
    (dict(type='IFND', strategy='elim'), "FNC's former treatment="),
])
def test_former_spellings_with_no_meaning_are_refused(former, match, notices):
    with pytest.raises(ValueError, match=match):
        translate_former_names(former, 'config x.py')


def test_a_user_config_in_the_former_spelling_trains_as_the_new_one(tmp_path, notices):
    """tools/train.py's config reading: the file's and --cfg-options' former keys, translated once."""
    config = tmp_path / 'attraction.py'
    config.write_text(f"_base_ = ['{ROOT}/configs/ifnd/ifnd_r18_8e_digits.py']\n"
                      "model = dict(loss_mode='attr')\n")
    cfg = runner_config(str(config), work_dir=str(tmp_path / 'w'))
    assert cfg.model.type == 'IFND' and cfg.model.treatment == 'attr' and 'loss_mode' not in cfg.model
    assert len(notices) == 1 and f'config {config}' in notices[0]
    notices.clear()
    ifnd = runner_config(str(ROOT / 'configs/ifnd/ifnd_r18_8e_digits.py'), work_dir=str(tmp_path / 'f'),
                         cfg_options={'model.loss_mode': 'attr'})
    assert ifnd.model.treatment == 'attr' and 'loss_mode' not in ifnd.model and len(notices) == 1
    bad = tmp_path / 'bad.py'
    bad.write_text(f"_base_ = ['{ROOT}/configs/ifnd/ifnd_r18_8e_digits.py']\n"
                   "model = dict(loss_mode='attr', treatment='elim')\n")
    with pytest.raises(SystemExit, match=f'config {bad}: .*keep treatment alone'):
        runner_config(str(bad), work_dir=str(tmp_path / 'b'))


def test_a_checkpoint_in_the_former_spelling_reads_back(notices):
    """A checkpoint's config written with loss_mode / strategy gives the same architecture."""
    model = dict(type='IFND', loss_mode='attr', backbone=TINY_BACKBONE, neck=TINY_NECK, temperature=0.5)
    kept = architecture_config(model, 'old.pth')
    assert kept['treatment'] == 'attr' and 'loss_mode' not in kept and 'old.pth' in notices[0]
    fnc = architecture_config(dict(type='FNC', strategy='elim', top_k=2, backbone=TINY_BACKBONE,
                                   neck=TINY_NECK), 'fnc.pth')
    assert fnc['treatment'] == 'elim' and fnc['top_k'] == 2
    # A spelling with no meaning makes the config unusable (the weights decide), never an error.
    assert architecture_config(dict(model, treatment='elim'), 'clash.pth') is None


def test_the_former_spelling_is_read_in_one_place_only():
    """Outside former_names.py no module, config, tool or benchmark names loss_mode, label_source or
    FNC's strategy."""
    former = re.compile(r"\b(loss_mode|label_source|LOSS_MODES|FNC_STRATEGIES|check_mode)\b|\bstrategy\s*=")
    found = []
    for folder in ('ifnd', 'configs', 'tools', 'benchmarks'):
        for path in (ROOT / folder).rglob('*.py'):
            if path.name == 'former_names.py':
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if former.search(line):
                    found.append(f'{osp.relpath(path, ROOT)}:{number}: {line.strip()}')
    assert not found, '\n'.join(found)


HOOK = dict(type='PseudoLabelHook', num_clusters=[10])
LINEAR = dict(type='LinearAcceptance', final_rate=1.0)
# (a PseudoLabelHook in its former flat keys, the same hook with its acceptance part and score)
HOOK_TRANSLATIONS = [
    (dict(HOOK, scheme='step', step_epoch=100), dict(HOOK, acceptance=dict(type='StepAcceptance', step_epoch=100))),
    (dict(HOOK, acceptance=LINEAR, final_rate=0.25), dict(HOOK, acceptance=dict(LINEAR, final_rate=0.25))),
    (dict(HOOK, acceptance=LINEAR, scheme='constant'), dict(HOOK, acceptance=dict(LINEAR, type='ConstantAcceptance'))),
    (dict(HOOK, acceptance=LINEAR, scheme='confidence', threshold=0.5),
     dict(HOOK, acceptance=dict(type='ConfidentAcceptance', certainty_share=0.5))),
    (dict(HOOK, acceptance=LINEAR, scheme='stability'), dict(HOOK, acceptance=dict(type='StableAcceptance'))),
    (dict(HOOK, scheme='linear', final_rate=1.0, confidence='pcl'),
     dict(HOOK, acceptance=LINEAR, score='pcl')),
    (dict(HOOK, confidence='kappa'), dict(HOOK, score='kappa')),
    (dict(HOOK, score='kappa', confidence='pcl'), dict(HOOK, score='pcl')),  # written over the base's
]


@pytest.mark.parametrize('former, parts', HOOK_TRANSLATIONS,
                         ids=[str(f.get('scheme', 'keys')) for f, _ in HOOK_TRANSLATIONS])
def test_the_hooks_former_acceptance_keys_are_read_as_the_part(former, parts, notices):
    """Flat scheme / final_rate / step_epoch / threshold and confidence=, with one notice; the hook
    built from them equals the hook built from the parts."""
    from ifnd.fileio.former_names import translate_former_hook
    from ifnd.registry import HOOKS
    assert translate_former_hook(dict(former), 'config x.py') == parts
    assert len(notices) == 1 and notices[0].startswith('config x.py: read the former ')
    init_default_scope('ifnd')
    a, b = HOOKS.build(translate_former_hook(former, 'x')), HOOKS.build(parts)
    assert type(a.acceptance) is type(b.acceptance) and vars(a.acceptance) == vars(b.acceptance)
    assert a.score == b.score


@pytest.mark.parametrize('former, match', [
    (dict(HOOK, scheme='linear', threshold=0.5), "threshold=0.5 is the former 'confidence' scheme's"),
    (dict(HOOK, scheme='cosine'), "scheme='cosine' with acceptance type None names no acceptance"),
])
def test_the_hooks_former_keys_with_no_meaning_are_refused(former, match, notices):
    from ifnd.fileio.former_names import translate_former_hook
    with pytest.raises(ValueError, match=match):
        translate_former_hook(former, 'config x.py')


def test_published_acceptance_commands_keep_working(tmp_path, notices):
    """docs/configs.md's former ablation commands and a detector's former acceptance, through
    tools/train.py's config reading and a checkpoint's config."""
    cfg = runner_config(str(ROOT / 'configs/ifnd/pcl_r50_1000e_cifar100.py'), work_dir=str(tmp_path),
                        cfg_options={'custom_hooks.0.scheme': 'linear', 'custom_hooks.0.confidence': 'kappa'})
    hook = cfg.custom_hooks[0]
    assert hook['acceptance'] == dict(type='LinearAcceptance')  # PCL's step_epoch: not Linear's
    assert hook['score'] == 'kappa' and 'scheme' not in hook and 'confidence' not in hook
    model = dict(type='SimCLR', treatment='elim', backbone=TINY_BACKBONE, neck=TINY_NECK,
                 detector=dict(type='GroundTruth', acceptance=dict(scheme='linear', interval=3, seed=1)))
    kept = architecture_config(model, 'old.pth')
    assert kept['detector']['acceptance'] == dict(type='LinearAcceptance', interval=3, seed=1)
    assert any('old.pth' in notice and "acceptance={'type': 'LinearAcceptance'" in notice
               for notice in notices)
