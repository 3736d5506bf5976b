"""Settings of the false-negative parts and the loss, refused where the model is built from a config
(one line naming the part, the key, the value and what it takes), warned about once the run's
length is known, and named when a run diverges."""
import math
import os.path as osp
import re

import pytest
import torch
from helpers import CONFIG_DIR, digits_config, train_error
from mmengine.config import Config
from mmengine.registry import init_default_scope

from ifnd.registry import HOOKS, MODELS, RUNNERS

SEED_RANGE = 'an int in [0, 4294967296), got'


@pytest.fixture(autouse=True)
def scope():
    init_default_scope('ifnd')


def _build(config: str, key: str, value):
    """The model of ``configs/<config>`` with ``model.<key>`` set, built (shapes only)."""
    cfg = Config.fromfile(osp.join(CONFIG_DIR, config))
    cfg.merge_from_dict({f'model.{key}': value})
    with torch.device('meta'):
        return MODELS.build(cfg.model)


GLOFND = 'glofnd/glofnd_r18_8e_digits.py'
ACCEPTANCE = 'ifnd/oracle_elim_linear_r18_8e_digits.py'  # GroundTruth with a LinearAcceptance
LINEAR = 'GroundTruth acceptance LinearAcceptance'
HARD = 'hard_negative/hard_negative_r18_8e_digits.py'
IFND_HARD = 'ifnd/ifnd_hard_r18_8e_digits.py'  # SimCLR with detector, treatment and weighting
FNC = 'fnc/fnc_elim_r18_8e_digits.py'
MOCO = 'mocov2/mocov2_r50_200e_in1k.py'


@pytest.mark.parametrize('config, key, value, error, message', [
    (GLOFND, 'detector.alpha', '0.1', TypeError,
     "GloFND alpha must be a float in (0, 1), got '0.1' (str)"),
    (GLOFND, 'detector.lr', True, TypeError, 'GloFND lr must be a float > 0, got True (bool)'),
    (GLOFND, 'detector.lr', 1e300, ValueError,
     'GloFND lr must be a float > 0, finite in float32, got 1e+300'),
    (GLOFND, 'detector.start_epoch', 2.0, TypeError,
     'GloFND start_epoch must be an int >= 0, got 2.0 (float)'),
    (GLOFND, 'detector.betas', (0.9, '0.98'), TypeError,
     "GloFND betas[1] must be a float in [0, 1), got '0.98' (str)"),
    (GLOFND, 'detector.eps', None, TypeError, 'GloFND eps must be a float > 0, got None'),
    (ACCEPTANCE, 'detector.acceptance.seed', 1.5, TypeError, f'{LINEAR} seed must be {SEED_RANGE} 1.5 (float)'),
    (ACCEPTANCE, 'detector.acceptance.seed', 2 ** 64, ValueError,
     f'{LINEAR} seed must be {SEED_RANGE} 18446744073709551616'),
    (ACCEPTANCE, 'detector.acceptance.seed', -1, ValueError, f'{LINEAR} seed must be {SEED_RANGE} -1'),
    (ACCEPTANCE, 'detector.acceptance.step_epoch', 3, ValueError,
     f'{LINEAR} takes final_rate, interval, seed, not step_epoch'),
    (ACCEPTANCE, 'detector.acceptance.final_rate', None, TypeError,
     f'{LINEAR} final_rate must be a float in [0, 1], got None (NoneType)'),
    (ACCEPTANCE, 'detector.acceptance.interval', 0, ValueError, f'{LINEAR} interval must be an int >= 1, got 0'),
    (ACCEPTANCE, 'detector.acceptance.type', 'CosineAcceptance', ValueError,
     'GroundTruth acceptance type must be one of ConstantAcceptance, StepAcceptance, '
     "LinearAcceptance, ConfidentAcceptance, StableAcceptance, got 'CosineAcceptance'"),
    (ACCEPTANCE, 'detector.acceptance.seeed', 1, ValueError, f'{LINEAR} takes final_rate, interval, seed, not seeed'),
    (HARD, 'tau_plus', '0.1', TypeError,
     "HardNegativeCL tau_plus must be a float in [0, 1), got '0.1' (str)"),
    (HARD, 'beta', True, TypeError, 'HardNegativeCL beta must be a float >= 0, got True (bool)'),
    (HARD, 'beta', 1e300, ValueError,
     'HardNegativeCL beta must be a float >= 0, finite in float32, got 1e+300'),
    (IFND_HARD, 'weighting.tau_plus', math.nan, ValueError,
     'SimCLR weighting tau_plus must be a float in [0, 1), finite in float32, got nan'),
    (IFND_HARD, 'weighting.beta', '1.0', TypeError,
     "SimCLR weighting beta must be a float >= 0, got '1.0' (str)"),
    (FNC, 'top_k', 2.5, TypeError, 'FNC top_k must be an int >= 1, got 2.5 (float)'),
    (FNC, 'num_support_views', '2', TypeError,
     "FNC num_support_views must be an int >= 1, got '2' (str)"),
    (MOCO, 'queue_len', '4096', TypeError, "MoCoV2 queue_len must be an int >= 1, got '4096' (str)"),
    (MOCO, 'momentum', 1.5, ValueError, 'MoCoV2 momentum must be a float in [0, 1), got 1.5'),
    (MOCO, 'bn_splits', False, TypeError, 'MoCoV2 bn_splits must be an int >= 1, got False (bool)'),
    (MOCO, 'momentum', 1.0, ValueError, 'MoCoV2 momentum must be a float in [0, 1), got 1.0'),
    ('ifnd/pcl_r50_1000e_cifar100.py', 'proto_weight', 0.0, ValueError,
     'PCL proto_weight must be a float > 0, got 0.0'),
])
def test_a_part_setting_of_the_wrong_type_or_range_is_named_at_build(config, key, value, error,
                                                                     message):
    with pytest.raises(error) as err:
        _build(config, key, value)
    assert str(err.value).startswith(message) and '\n' not in str(err.value)


@pytest.mark.parametrize('value', [math.nan, math.inf, 0.0, -0.5, 1e-30, '0.5', None])
def test_a_temperature_out_of_range_is_refused(value):
    """The loss uses log-sum-exp, but its logits and gradients scale as 1/τ: τ below 1e-3 is refused
    (a τ of 1e-20 makes the second step's loss NaN on digits), as is any non-number."""
    error = TypeError if isinstance(value, str) or value is None else ValueError
    with pytest.raises(error, match=r'^SimCLR temperature must be a float >= 0\.001'):
        _build('simclr/simclr_r18_8e_digits.py', 'temperature', value)
    assert _build('simclr/simclr_r18_8e_digits.py', 'temperature', 1e-3).temperature == 1e-3


def test_a_hardness_whose_weighted_logits_overflow_float32_is_refused():
    """(β + 1)·cos/τ is computed in float32: β = 1e37 is fine at τ = 0.5, not at τ = 0.01."""
    assert _build(IFND_HARD, 'weighting.beta', 1e37).weighting.beta == 1e37
    cfg = Config.fromfile(osp.join(CONFIG_DIR, IFND_HARD))
    cfg.merge_from_dict({'model.weighting.beta': 1e37, 'model.temperature': 0.01})
    with pytest.raises(ValueError, match=r"SimCLR weighting beta=1e\+37 with temperature=0.01 "
                                         r"weights the logits by \(beta \+ 1\) / temperature = "
                                         r"1e\+39, beyond float32's 3.4e\+38"):
        MODELS.build(cfg.model)


@pytest.mark.parametrize('key, value, message', [
    ('seed', 2 ** 32, f'PseudoLabelHook seed must be {SEED_RANGE} 4294967296'),
    ('acceptance', dict(type='StepAcceptance', step_epoch='x'),
     "PseudoLabelHook acceptance StepAcceptance step_epoch must be an int >= 0, got 'x' (str)"),
    ('acceptance', dict(type='LinearAcceptance', final_rate=None),
     'PseudoLabelHook acceptance LinearAcceptance final_rate must be a float in [0, 1], got None'),
    ('interval', 1.5, 'PseudoLabelHook interval must be an int >= 1, got 1.5 (float)'),
    ('num_clusters', ['10', 30], "PseudoLabelHook num_clusters[0] must be an int, got '10' (str)"),
    ('temperature', '0.1', "PseudoLabelHook temperature must be a float >= 0.001, got '0.1' (str)"),
    ('temperature', 1e-300, 'PseudoLabelHook temperature must be a float >= 0.001, got 1e-300'),
])
def test_pseudo_label_hook_settings_are_named(key, value, message):
    cfg = Config.fromfile(osp.join(CONFIG_DIR, 'ifnd', 'ifnd_r18_8e_digits.py'))
    hook = dict(cfg.custom_hooks[0], **{key: value})
    assert hook['type'] == 'PseudoLabelHook'
    with pytest.raises((TypeError, ValueError), match='^' + re.escape(message)):
        HOOKS.build(hook)


def test_train_names_the_config_key_or_the_part(tmp_path):
    """Through tools/train.py: a dict-valued setting's key is checked with the config's other keys
    (its path in the config), a value of the right type out of range by the part, one line each."""
    path = osp.join(CONFIG_DIR, ACCEPTANCE)
    message = train_error(path, '--work-dir', str(tmp_path), '--cfg-options',
                          'model.detector.acceptance.final_rate=all')
    assert message.startswith("error: config key 'model.detector.acceptance.final_rate' must be "
                              "float, got 'all' (str)"), message
    message = train_error(path, '--work-dir', str(tmp_path), '--cfg-options',
                          f'model.detector.acceptance.seed={2 ** 64}')
    assert message.startswith(f'error: {LINEAR} seed must be {SEED_RANGE} 18446744073709551616')
    message = train_error(osp.join(CONFIG_DIR, IFND_HARD), '--work-dir', str(tmp_path),
                          '--cfg-options', 'model.weighting.beta=True')
    assert message.startswith("error: config key 'model.weighting.beta' must be float, got True")


def _log(work_dir) -> str:
    return ''.join(p.read_text() for p in work_dir.glob('*/*.log'))


def _short_run(work_dir, model: dict, max_epochs: int = 1, **kwargs) -> None:
    cfg = digits_config(str(work_dir), model, max_epochs=max_epochs, **kwargs)
    cfg.train_dataloader.dataset.subset_fraction = 0.1  # 2 iterations an epoch
    # Its own logger: mmengine names one by the start's second, so two runs started in the same
    # second would log into the first one's file.
    cfg.experiment_name = f'setting_errors_{work_dir.name}'
    RUNNERS.build(cfg).train()


def test_a_start_past_the_runs_end_is_warned(tmp_path):
    """GloFND's start_epoch, an acceptance schedule's step and IFND's step at or past
    train_cfg.max_epochs would silently train without detection: each is logged once."""
    model = dict(type='SimCLR', temperature=0.5, treatment='elim', detector=dict(
        type='GloFND', start_epoch=2, acceptance=dict(type='StepAcceptance', step_epoch=3)))
    _short_run(tmp_path / 'glofnd', model, max_epochs=2)
    log = _log(tmp_path / 'glofnd')
    assert ('GloFND acceptance StepAcceptance (step_epoch=3, final_rate=1, interval=1) accepts no '
            'sample before the run ends (train_cfg.max_epochs=2): GloFND flags no false negative '
            'in this run, which trains as if it had no detector; lower the setting or raise '
            'train_cfg.max_epochs') in log
    assert "GloFND start_epoch=2 is not before the run's end (train_cfg.max_epochs=2)" in log
    _short_run(tmp_path / 'ifnd', dict(type='IFND', temperature=0.5), pseudo_labels=dict(
        num_clusters=[10], acceptance=dict(type='StepAcceptance', step_epoch=1),
        kmeans=dict(nredo=1, niter=5)))
    assert ('PseudoLabelHook acceptance StepAcceptance (step_epoch=1, final_rate=1, interval=1) '
            'accepts no sample before the run ends (train_cfg.max_epochs=1): every sample keeps a label of '
            'its own') in _log(tmp_path / 'ifnd')
    _short_run(tmp_path / 'in_time', dict(model, detector=dict(type='GloFND', start_epoch=1)),
               max_epochs=2)
    assert 'before the run' not in _log(tmp_path / 'in_time')


def test_a_diverged_run_names_the_settings_that_scale_the_loss(tmp_path):
    """A NaN loss names lr, the temperature and the weighting's τ⁺ and β with their values, and
    marks those outside the recipes' range, not the learning rate alone."""
    cfg = digits_config(str(tmp_path / 'run'), dict(type='HardNegativeCL', temperature=0.01,
                                                   beta=1.0), max_epochs=1)
    cfg.train_dataloader.dataset.subset_fraction = 0.1
    cfg.optim_wrapper.optimizer.lr = 1e30
    path = str(tmp_path / 'cfg.py')
    cfg.dump(path)
    message = train_error(path)
    assert message.startswith('error: the loss became nan at iteration 2 (epoch 1); the last '
                              'finite loss was ')
    assert ('The settings that scale the loss and its gradients: lr=1e+30, temperature=0.01 (the '
            'recipes use 0.05 to 1), weighting tau_plus=0.1, weighting beta=1. Lower the learning '
            'rate or clip gradients (optim_wrapper.clip_grad=dict(max_norm=...)), bring the '
            'marked settings to their usual range, then continue from the last checkpoint with '
            '--resume') in message


@pytest.mark.parametrize('value', ['nan', '1e-300', '0', '-1'])
def test_training_and_evaluation_refuse_a_knn_temperature_alike(tmp_path, value):
    """The kNN hook of a training config and tools/knn_eval.py share the check, and its message: a
    temperature the loss would refuse is refused, never evaluated (a NaN gave a quarter of the
    accuracy, exit 0)."""
    from helpers import load_tool
    config = osp.join(CONFIG_DIR, 'ifnd', 'ifnd_r18_8e_digits.py')
    hooks = Config.fromfile(config).custom_hooks
    index = next(i for i, hook in enumerate(hooks) if hook['type'] == 'KNNEvalHook')
    trained = train_error(config, '--work-dir', str(tmp_path / 'run'), '--cfg-options',
                          f'custom_hooks.{index}.temperature={value}')
    checkpoint = tmp_path / 'weights.pth'
    torch.save({'state_dict': {}}, checkpoint)
    with pytest.raises(SystemExit) as err:
        load_tool('knn_eval').main([str(checkpoint), '--dataset', 'digits', '--temperature', value])
    evaluated = str(err.value)
    if value == 'nan':  # a NaN anywhere in a config is refused before any part is built, by its key
        assert trained.startswith(f"error: config key 'custom_hooks.{index}.temperature' is NaN"), trained
        trained = evaluated
    for message in (trained, evaluated):  # the same rule and reason; the value as each parser read it
        rule, _, rest = message.partition(', got ')
        assert rule.startswith('error: kNN temperature must be a float >= 0.001'), message
        assert float(rest.split(':')[0]) == float(value) or math.isnan(float(value)), message
        assert rest.endswith('the logits are cos/τ; recipes use 0.05 to 1')
    assert trained.partition(', got ')[0] == evaluated.partition(', got ')[0]


def test_knn_votes_stay_finite_at_the_smallest_temperature():
    """Weights relative to each row's nearest neighbour: at T = 1e-3 (cos / T up to 1000, beyond
    float32's exp) the vote is the nearest neighbour's, never NaN or a tie of infinities."""
    from ifnd.evaluation import knn_classify
    g = torch.Generator().manual_seed(0)
    bank, query = torch.randn(50, 8, generator=g), torch.randn(20, 8, generator=g)
    labels = torch.randint(0, 4, (50,), generator=g)
    nearest = labels[(torch.nn.functional.normalize(query, dim=1)
                      @ torch.nn.functional.normalize(bank, dim=1).t()).argmax(1)]
    assert torch.equal(knn_classify(bank, labels, query, 4, k=10, temperature=1e-3), nearest)
    usual = knn_classify(bank, labels, query, 4, k=10, temperature=0.07)
    votes = torch.zeros(20, 4)  # the unshifted weights, as the protocol writes them
    sim, index = (torch.nn.functional.normalize(query, dim=1) @ torch.nn.functional.normalize(bank, dim=1).t()).topk(10)
    votes.scatter_add_(1, labels[index], (sim / 0.07).exp())
    assert torch.equal(usual, votes.argmax(1))


IFND_DIGITS = 'ifnd/ifnd_r18_8e_digits.py'
CONFIDENT_DIGITS = 'ifnd/ifnd_confident_r18_8e_digits.py'
VIEW = 'train_dataloader.dataset.pipeline.transforms'


def _drop_label_hook(cfg: Config) -> None:
    cfg.custom_hooks = [hook for hook in cfg.custom_hooks if hook['type'] != 'PseudoLabelHook']


def _hcsc_on_simclr(cfg: Config) -> None:
    cfg.model.update(detector=dict(type='HCSCSelection'), treatment='elim')


def _set(path: str, value) -> callable:
    """A change of the config's dict: ``value`` at the dotted ``path`` (list items by index)."""
    def change(cfg: Config) -> None:
        *parents, last = path.split('.')
        node = cfg
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        if value is None:
            node.pop(last)
        else:
            node[last] = value
    return change


# Settings that would leave their part idle or unread, each as tools/train.py reads it: (config,
# --cfg-options, a change of its dict, the refusal's or the one warning's text, the fix it names).
IDLE_SETTINGS = {
    'layer_decay_rate without its constructor': (
        'benchmarks/semi/semi_vit-tiny-p4_20e_fmnist_10pct.py', [],
        _set('optim_wrapper.constructor', None),
        "config key 'optim_wrapper.paramwise_cfg.layer_decay_rate' is read only by "
        'LayerDecayOptimWrapperConstructor', "set optim_wrapper.constructor="
        "'LayerDecayOptimWrapperConstructor'"),
    'a custom_keys entry mmengine ignores': (
        'benchmarks/semi/semi_r18_20e_fmnist_10pct.py', [],
        _set('optim_wrapper.paramwise_cfg.custom_keys', {'backbone': dict(lr_multi=0.1)}),
        "config key 'optim_wrapper.paramwise_cfg.custom_keys.backbone.lr_multi' is not read",
        'fix its name'),
    'solarize_p NaN, views on the CPU': (
        IFND_DIGITS, ['train_dataloader.dataset.augment_on=cpu', f'{VIEW}.solarize_p=nan'], None,
        f"config key '{VIEW}.solarize_p' is NaN", f'--cfg-options {VIEW}.solarize_p=...'),
    'solarize_p NaN, views on the device': (
        IFND_DIGITS, [f'{VIEW}.solarize_p=nan'], None, f"config key '{VIEW}.solarize_p' is NaN",
        f'--cfg-options {VIEW}.solarize_p=...'),
    'solarize_p out of [0, 1]': (
        IFND_DIGITS, [f'{VIEW}.solarize_p=-0.5'], None,
        'ContrastiveView solarize_p must be a float in [0, 1], got -0.5', 'the share of views'),
    'HCSCSelection without PseudoLabelHook': (
        'hcsc/hcsc_r18_8e_digits.py', [], _drop_label_hook,
        "config key 'custom_hooks' has no PseudoLabelHook, and model HCSC's detector HCSCSelection",
        "add dict(type='PseudoLabelHook'"),
    'a label-bank detector of the base without PseudoLabelHook': (
        'simclr/simclr_r18_8e_digits.py', [], _hcsc_on_simclr,
        "config key 'custom_hooks' has no PseudoLabelHook, and model SimCLR's detector "
        'HCSCSelection', "add dict(type='PseudoLabelHook'"),
    "PCL's prototypes without PseudoLabelHook": (
        'ifnd/pcl_r50_1000e_cifar100.py', [], _drop_label_hook,
        "config key 'custom_hooks' has no PseudoLabelHook, and model PCL's prototypes",
        "add dict(type='PseudoLabelHook'"),
    'a former scheme= beside acceptance= in one command': (
        IFND_DIGITS, ['custom_hooks.0.scheme=step', 'custom_hooks.0.acceptance.type=StepAcceptance'],
        None, '--cfg-options gives custom_hooks.0.scheme (the former spelling of '
        'custom_hooks.0.acceptance.type) and custom_hooks.0.acceptance.type',
        'give custom_hooks.0.acceptance.type alone'),
    'a certainty share κ cannot reach': (
        CONFIDENT_DIGITS, ['custom_hooks.0.acceptance.certainty_share=0.999999'], None,
        'PseudoLabelHook acceptance ConfidentAcceptance certainty_share=0.999999 with κ at '
        "temperature=0.2 is out of κ's reach at every level", 'lower certainty_share to at most 0.9995'),
    'a setting StableAcceptance does not take': (
        IFND_DIGITS, [], _set('custom_hooks.0.acceptance', dict(type='StableAcceptance', seed=3)),
        'PseudoLabelHook acceptance StableAcceptance takes no settings, not seed', 'remove it'),
    'gradients clipped to 0': (
        'mocov3/mocov3_vit-tiny-p4_8e_digits.py', ['optim_wrapper.clip_grad.max_norm=0'], None,
        "config key 'optim_wrapper.clip_grad.max_norm' is 0", 'or remove clip_grad'),
    'a key encoder that never moves': (
        'mocov3/mocov3_vit-tiny-p4_8e_digits.py', ['model.momentum=1.0'], None,
        'MoCoV3 momentum must be a float in [0, 1), got 1.0', 'keep it at its initial weights'),
    'a debiased weighting that corrects nothing': (
        'debiased/debiased_r18_8e_digits.py', ['model.tau_plus=0.0'], None,
        "DebiasedCL weighting 'debiased' with tau_plus=0 is InfoNCE's plain sum",
        'set tau_plus > 0'),
    'a kNN batch of no images': (
        IFND_DIGITS, ['custom_hooks.1.batch_size=0'], None,
        'KNNEvalHook batch_size must be an int >= 1, got 0', ''),
    # Warned: the run is still what it says, less the setting.
    'a former scheme= beside acceptance= in a config': (
        CONFIDENT_DIGITS, [], _set('custom_hooks.0.scheme', 'step'),
        "read the former custom_hooks.0.scheme='step' of PseudoLabelHook as acceptance={'type': "
        "'StepAcceptance'}, in place of its custom_hooks.0.acceptance={'type': "
        "'ConfidentAcceptance', 'certainty_share': 0.3}", 'to keep that part remove the former keys'),
    "κ's temperature under PCL's score": (
        IFND_DIGITS, ['custom_hooks.0.score=pcl', 'custom_hooks.0.temperature=0.3'], None,
        "config key 'custom_hooks.0.temperature' is read only when score is 'kappa'",
        'set score or remove temperature'),
    'a solarisation threshold without solarisation': (
        IFND_DIGITS, [f'{VIEW}.solarize_threshold=0.3'], None,
        f"config key '{VIEW}.solarize_threshold' is read only when solarize_p > 0",
        'set solarize_p or remove solarize_threshold'),
    'a subset seed without a subset': (
        IFND_DIGITS, ['train_dataloader.dataset.subset_seed=3'], None,
        "config key 'train_dataloader.dataset.subset_seed' is read only when subset_fraction is set",
        'set subset_fraction or remove subset_seed'),
    'a scheduler that begins after the run': (
        IFND_DIGITS, ['train_cfg.max_epochs=1'], None,
        "config key 'param_scheduler.1.begin' is 1, not before the run's end "
        '(train_cfg.max_epochs=1): CosineAnnealingLR never acts', 'raise train_cfg.max_epochs'),
    'milestones after the run': (
        MOCO, ['train_cfg.max_epochs=100'], None,
        "config key 'param_scheduler.0.milestones' has [120, 160], past the run's end",
        'raise train_cfg.max_epochs'),
    'no checkpoint in the run': (
        IFND_DIGITS, ['default_hooks.checkpoint.save_last=False'], None,
        "config key 'default_hooks.checkpoint.interval' is 10, past the run's end",
        'default_hooks.checkpoint.save_last=True'),
    'a learning rate of 0': (
        IFND_DIGITS, ['optim_wrapper.optimizer.lr=0'], None,
        "config key 'optim_wrapper.optimizer.lr' is 0", 'give a learning rate'),
}
WARNED = list(IDLE_SETTINGS)[list(IDLE_SETTINGS).index('a former scheme= beside acceptance= in a config'):]


@pytest.mark.parametrize('case', list(IDLE_SETTINGS))
def test_a_setting_that_would_do_nothing_is_named_with_its_fix(case, tmp_path, monkeypatch):
    """Each is refused before training in one line, or warned in one line while the config is
    read, naming its config key (or its part and key) and the fix."""
    from helpers import train_tool
    from ifnd.engine import config_checks
    from ifnd.fileio import former_names
    config, options, change, said, fix = IDLE_SETTINGS[case]
    path = osp.join(CONFIG_DIR, config)
    if change is not None:  # a config written with the change, as a user would
        cfg = Config.fromfile(path)
        change(cfg)
        path = str(tmp_path / 'cfg.py')
        cfg.dump(path)
    argv = [path, '--work-dir', str(tmp_path / 'run')] + (['--cfg-options', *options] if options else [])
    if case not in WARNED:
        message = train_error(*argv)
        assert said in message and fix in message, message
        return
    warnings = []
    for module in (config_checks, former_names):
        monkeypatch.setattr(module, 'print_log', lambda msg, **kw: warnings.append(msg))
    train_tool.build_config(train_tool.parse_args(argv))
    assert len(warnings) == 1 and said in warnings[0] and fix in warnings[0], warnings
    assert '\n' not in warnings[0]


@pytest.mark.parametrize('k', [2, 10, 100])
@pytest.mark.parametrize('temperature', [0.05, 0.2, 0.5])
def test_kappas_bounds_are_reached_by_their_arrangements(k, temperature):
    """κ's bound (every other centroid opposite the sample) and its evenly spread value (a regular
    simplex, every sample on its centroid) are what κ gives those arrangements."""
    from ifnd.clustering import confidence
    from ifnd.clustering.acceptance import reachable_share
    opposite = torch.zeros(k, k)
    opposite[0, 0], opposite[1:, 0] = 1.0, -1.0
    simplex = torch.nn.functional.normalize(torch.eye(k) - 1.0 / k, dim=1)
    for centroids, samples, gap in ((opposite, opposite[:1], 2.0), (simplex, simplex, k / (k - 1))):
        kappa = confidence(samples, centroids, torch.arange(len(samples)), temperature).double()
        shares = (kappa - 1.0 / k) / (1.0 - 1.0 / k)
        assert shares.numpy() == pytest.approx(reachable_share(k, temperature, gap), rel=1e-5)


def test_a_certainty_share_is_refused_where_no_level_can_reach_it():
    """Past κ's bound at every level: refused; at some levels: one warning naming them."""
    from ifnd.clustering import build_acceptance
    from ifnd.clustering.acceptance import reachable_share
    levels, temperature = [10, 30, 100], 0.5

    def check(share):
        acceptance = build_acceptance(dict(type='ConfidentAcceptance', certainty_share=share), 'x')
        return acceptance.check_round(levels, temperature)

    bound = reachable_share(10, temperature, 2.0)  # the easiest level's
    with pytest.raises(ValueError, match=f"out of κ's reach at every level .* to at most {bound:.6g}"):
        check(bound + 1e-6)
    assert 'can never accept a label at k=30, 100' in check(bound)
    assert 'can never accept a label at k=100' in check(0.5) and 'seldom accept one at k=10, 30' in check(0.5)
    assert check(min(reachable_share(k, temperature, k / (k - 1)) for k in levels)) is None


@pytest.mark.parametrize('config, options, said', [
    (IFND_DIGITS, {'custom_hooks.0.acceptance': dict(_delete_=True, type='StableAcceptance'),
                   'custom_hooks.0.interval': 8},
     'StableAcceptance accepts from the second clustering round on, which comes after interval=8 '
     'epochs, not before the run ends (train_cfg.max_epochs=8)'),
    (CONFIDENT_DIGITS, {'model.temperature': 0.5, 'custom_hooks.0.acceptance.certainty_share': 0.5},
     'certainty_share=0.5 with κ at temperature=0.5 can never accept a label at k=100'),
    ('hcsc/hcsc_r18_8e_digits.py', {'custom_hooks.0.warmup_epochs': 8},
     'PseudoLabelHook warmup_epochs=8 ends with the run (train_cfg.max_epochs=8): no clustering round'),
], ids=['stability after the run', 'κ out of reach at some levels', 'warm-up to the end'])
def test_a_round_that_would_accept_little_is_warned_when_training_starts(config, options, said):
    """What depends on the model (its temperature, its detector) and the run's length, checked by
    PseudoLabelHook before its first round: one warning each."""
    cfg = Config.fromfile(osp.join(CONFIG_DIR, config))
    cfg.merge_from_dict(options)
    with torch.device('meta'):
        model = MODELS.build(cfg.model)
    warnings = HOOKS.build(cfg.custom_hooks[0]).check_run(model, cfg.train_cfg.max_epochs)
    assert len(warnings) == 1 and said in warnings[0], warnings


def test_the_named_fix_for_layer_decay_is_taken_on_the_command_line(tmp_path):
    """optim_wrapper.constructor and paramwise_cfg are read by mmengine's builder, not by the
    wrapper's class: --cfg-options takes them, so the refusal's fix can be given as it says."""
    from helpers import train_tool
    argv = [osp.join(CONFIG_DIR, 'mocov3', 'mocov3_vit-tiny-p4_8e_digits.py'), '--work-dir',
            str(tmp_path), '--cfg-options', 'optim_wrapper.paramwise_cfg.layer_decay_rate=0.75']
    assert "set optim_wrapper.constructor='LayerDecayOptimWrapperConstructor'" in train_error(*argv)
    cfg = train_tool.build_config(train_tool.parse_args(
        argv + ['optim_wrapper.constructor=LayerDecayOptimWrapperConstructor']))
    assert cfg.optim_wrapper.paramwise_cfg.layer_decay_rate == 0.75
