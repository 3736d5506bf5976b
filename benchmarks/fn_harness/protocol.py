"""What the benchmark compares and under which budget: data sets, methods, presets, options."""
from __future__ import annotations

import os.path as osp

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

# Configs sharing one recipe per data set: instance baseline, IFND, the two oracles and the other
# false-negative methods.
DATASETS = {
    'fmnist': {
        'simclr': 'configs/simclr/simclr_r18_200e_fmnist.py',
        'ifnd': 'configs/ifnd/ifnd_r18_200e_fmnist.py',
        'supcon': 'configs/ifnd/supcon_r18_200e_fmnist.py',
        'oracle_elim': 'configs/ifnd/oracle_elim_r18_200e_fmnist.py',
        'debiased': 'configs/debiased/debiased_r18_200e_fmnist.py',
        'hard_negative': 'configs/hard_negative/hard_negative_r18_200e_fmnist.py',
        'fnc_elim': 'configs/fnc/fnc_elim_r18_200e_fmnist.py',
        'fnc_attr': 'configs/fnc/fnc_attr_r18_200e_fmnist.py',
        'ifnd_hard': 'configs/ifnd/ifnd_hard_r18_200e_fmnist.py',
        'glofnd': 'configs/glofnd/glofnd_r18_200e_fmnist.py',
        'glofnd_hard': 'configs/glofnd/glofnd_hard_r18_200e_fmnist.py',
        'oracle_elim_linear': 'configs/ifnd/oracle_elim_linear_r18_200e_fmnist.py',
        'ifnd_confident': 'configs/ifnd/ifnd_confident_r18_200e_fmnist.py',
        'ifnd_confident_hard': 'configs/ifnd/ifnd_confident_hard_r18_200e_fmnist.py',
        'linear': 'configs/benchmarks/linear/linear_r18_100e_fmnist.py',
    },
    **{name: {
        'simclr': f'configs/simclr/simclr_r50_1000e_{name}.py',
        'ifnd': f'configs/ifnd/ifnd_r50_1000e_{name}.py',
        'supcon': f'configs/ifnd/supcon_r50_1000e_{name}.py',
        'oracle_elim': f'configs/ifnd/oracle_elim_r50_1000e_{name}.py',
        'debiased': f'configs/debiased/debiased_r50_1000e_{name}.py',
        'hard_negative': f'configs/hard_negative/hard_negative_r50_1000e_{name}.py',
        'fnc_elim': f'configs/fnc/fnc_elim_r50_1000e_{name}.py',
        'fnc_attr': f'configs/fnc/fnc_attr_r50_1000e_{name}.py',
        'linear': f'configs/benchmarks/linear/linear_r50_100e_{name}.py',
    } for name in ('cifar10', 'cifar100')},
    'digits': {
        'simclr': 'configs/simclr/simclr_r18_8e_digits.py',
        'ifnd': 'configs/ifnd/ifnd_r18_8e_digits.py',
        'supcon': 'configs/ifnd/supcon_r18_8e_digits.py',
        'oracle_elim': 'configs/ifnd/oracle_elim_r18_8e_digits.py',
        'debiased': 'configs/debiased/debiased_r18_8e_digits.py',
        'hard_negative': 'configs/hard_negative/hard_negative_r18_8e_digits.py',
        'fnc_elim': 'configs/fnc/fnc_elim_r18_8e_digits.py',
        'fnc_attr': 'configs/fnc/fnc_attr_r18_8e_digits.py',
        'ifnd_hard': 'configs/ifnd/ifnd_hard_r18_8e_digits.py',
        'glofnd': 'configs/glofnd/glofnd_r18_8e_digits.py',
        'glofnd_hard': 'configs/glofnd/glofnd_hard_r18_8e_digits.py',
        'oracle_elim_linear': 'configs/ifnd/oracle_elim_linear_r18_8e_digits.py',
        'ifnd_confident': 'configs/ifnd/ifnd_confident_r18_8e_digits.py',
        'ifnd_confident_hard': 'configs/ifnd/ifnd_confident_hard_r18_8e_digits.py',
        'linear': 'configs/benchmarks/linear/linear_r18_100e_digits.py',
    },
}
METHODS = ('simclr', 'ifnd', 'supcon', 'oracle_elim', 'debiased', 'hard_negative', 'fnc_elim',
           'fnc_attr', 'ifnd_hard', 'glofnd', 'glofnd_hard', 'oracle_elim_linear', 'ifnd_confident',
           'ifnd_confident_hard')
TITLES = {'simclr': 'SimCLR', 'ifnd': 'IFND', 'supcon': 'SupCon', 'oracle_elim': 'Oracle-elim',
          'debiased': 'Debiased', 'hard_negative': 'Hard negatives', 'fnc_elim': 'FNC-elim',
          'fnc_attr': 'FNC-attr', 'ifnd_hard': 'IFND + hard negatives', 'glofnd': 'GloFND',
          'glofnd_hard': 'GloFND + hard negatives', 'oracle_elim_linear': 'Oracle-elim, linear',
          'ifnd_confident': 'IFND, confident labels',
          'ifnd_confident_hard': 'IFND, confident labels + hard negatives'}
LABELS = {'simclr': 'instance labels', 'ifnd': 'pseudo labels (k-means)',
          'supcon': 'ground truth, attraction', 'oracle_elim': 'ground truth, elimination',
          'debiased': 'instance labels, negatives debiased by a class prior',
          'hard_negative': 'instance labels, negatives reweighted by hardness',
          'fnc_elim': 'support views flag negatives, elimination',
          'fnc_attr': 'support views flag negatives, attraction',
          'ifnd_hard': 'pseudo labels, elimination; the rest reweighted by hardness',
          'glofnd': 'learned per-image thresholds flag negatives, elimination',
          'glofnd_hard': 'learned thresholds, elimination; the rest reweighted by hardness',
          'oracle_elim_linear': "ground truth accepted on IFND's linear schedule, elimination",
          'ifnd_confident': 'pseudo labels accepted by confidence, flagged where two levels agree',
          'ifnd_confident_hard': 'confident pseudo labels, elimination; the rest reweighted by hardness'}
# Every method but the two ends of the gap: their share of the SimCLR -> SupCon gap is reported.
CLOSERS = tuple(m for m in METHODS if m not in ('simclr', 'supcon'))
# Methods that flag individual negatives as false: their in-batch detection precision and recall
# (against the ground-truth classes) are logged per epoch by FalseNegativeDetectionHook.
FLAGGERS = ('ifnd', 'fnc_elim', 'fnc_attr', 'ifnd_hard', 'glofnd', 'glofnd_hard',
            'oracle_elim_linear', 'ifnd_confident', 'ifnd_confident_hard')
DETECTION_KEYS = ('train/fn_precision', 'train/fn_recall')
# Methods whose detector is IFND's clustering (PseudoLabelHook): their rounds' MTPR/MTNR are read.
CLUSTERERS = ('ifnd', 'ifnd_hard', 'ifnd_confident', 'ifnd_confident_hard')
# Paired contrasts between methods (a − b on the seeds both ran, 95% t-interval): acceptance by
# evidence against IFND's calendar and the schedule-matched oracle, the schedule's cost, and the
# combinations against their parts.
CONTRASTS = (('ifnd_confident', 'ifnd'), ('ifnd_confident', 'oracle_elim_linear'),
             ('ifnd_confident_hard', 'ifnd_hard'), ('ifnd_confident_hard', 'hard_negative'),
             ('oracle_elim', 'oracle_elim_linear'), ('oracle_elim_linear', 'ifnd'),
             ('ifnd_hard', 'hard_negative'), ('glofnd', 'ifnd'))

# The methods' own settings on the cpu budget, chosen on the val split (README); the configs keep
# the papers' values for their own recipes.
# The combinations take their parts' settings: hard negatives' beta, and GloFND's alpha; GloFND
# starts a third of the way in with lambda's step 0.1 (its configs' quarter of 200 epochs and the
# authors' 0.05 would leave 30 epochs little time to learn).
CPU_METHOD_OPTIONS = {'debiased': {'model.tau_plus': 0.01}, 'hard_negative': {'model.beta': 2.0},
                      'fnc_elim': {'model.top_k': 3}, 'fnc_attr': {'model.top_k': 3},
                      'ifnd_hard': {'model.weighting.beta': 2.0},
                      'ifnd_confident_hard': {'model.weighting.beta': 2.0},
                      'glofnd': {'model.detector.start_epoch': 10, 'model.detector.lr': 0.1,
                                 'model.detector.alpha': 0.05},
                      'glofnd_hard': {'model.detector.start_epoch': 10, 'model.detector.lr': 0.1,
                                      'model.weighting.beta': 2.0, 'model.detector.alpha': 0.05}}
# The methods' own settings on the digits budget, chosen on its own val split
# (docs/false_negatives.md, "Digits protocol"); the combinations take their parts' values, and
# GloFND starts about a third of the way in, as on the cpu budget.
DIGITS_METHOD_OPTIONS = {'debiased': {'model.tau_plus': 0.1}, 'hard_negative': {'model.beta': 1.0},
                         'fnc_elim': {'model.top_k': 3}, 'fnc_attr': {'model.top_k': 3},
                         'ifnd_hard': {'model.weighting.beta': 1.0},
                         'ifnd_confident_hard': {'model.weighting.beta': 1.0},
                         'glofnd': {'model.detector.alpha': 0.1, 'model.detector.start_epoch': 3,
                                    'model.detector.lr': 0.1},
                         'glofnd_hard': {'model.detector.alpha': 0.1,
                                         'model.detector.start_epoch': 3,
                                         'model.detector.lr': 0.1, 'model.weighting.beta': 1.0}}
# None means: keep the config's value. The cpu values were chosen on the val split (README); the
# digits budget (all of digits' 1,347 training images, an eighth-width ResNet-18, 8 epochs) was set
# by the time of one run, pre-training and linear probe together, on one thread: about 40 s.
PRESETS = {
    'cpu': dict(dataset='fmnist', epochs=30, subset=0.1, batch_size=128, backbone='resnet18',
                cifar_stem=False, channels='32,64,128,256', neck_hidden=256, cluster_interval=3,
                knn_interval=5, val_fraction=1.0, lr=0.25, warmup_epochs=2, num_workers=2,
                temperature=0.2, num_clusters=None, final_rate=None, nredo=2, linear_epochs=10,
                seeds=[0, 1, 2], method_options=CPU_METHOD_OPTIONS),
    'digits': dict(dataset='digits', epochs=8, subset=1.0, batch_size=64, backbone='resnet18',
                   cifar_stem=True, channels='8,16,32,64', neck_hidden=256, cluster_interval=1,
                   knn_interval=2, val_fraction=1.0, lr=0.25, warmup_epochs=1, num_workers=0,
                   temperature=0.2, num_clusters=None, final_rate=None, nredo=None,
                   linear_epochs=10, seeds=[0, 1, 2, 3, 4], method_options=DIGITS_METHOD_OPTIONS),
    'gpu': dict(dataset='fmnist', epochs=None, subset=None, batch_size=None, backbone=None,
                cifar_stem=None, channels=None, neck_hidden=None, cluster_interval=None,
                knn_interval=None, val_fraction=None, lr=None, warmup_epochs=None,
                num_workers=None, temperature=None, num_clusters=None, final_rate=None,
                nredo=None, linear_epochs=None, seeds=[0, 1, 2], method_options={}),
    # One seed of the gap's two ends, IFND and the schedule-matched oracle on all 60,000 images
    # in one 8-minute GPU run; seeds=None: the first seed no --previous result has. The configs'
    # GPU network (full-width ResNet-18, CIFAR stem, 28 px) in bfloat16, channels_last, views made
    # on the GPU, not compiled (a minute of compilation a process would not pay back in 8
    # epochs); the cpu protocol's tau 0.2 and lr per image (0.25 at 128 -> 0.5 at 256).
    # Time on one H100, estimated, not measured: at 20k views/s forward and backward in bfloat16,
    # shared by the four runs, an epoch is 60,000 x 2 views, 6 s a method, so 8 epochs of four
    # take 192 s; start-up 30 s; kNN after epochs 4 and 8 (70,000 images forward, ~2 s a run)
    # 16 s; IFND's 9 clustering rounds (~3 s) 27 s; the probes 55 s (15 s start-up, ~1 s a
    # method-epoch); the report 5 s: ~325 s, 5.4 of 8 minutes (6.5 at 15k views/s). Four runs at
    # once, not one after another: the GPU work is the same, but their start-ups (about a minute
    # more in a row) and CPU phases overlap. --time-limit stops them at 8 minutes, keeping what
    # finished.
    'gpu-slot': dict(dataset='fmnist', methods=['simclr', 'ifnd', 'supcon', 'oracle_elim_linear'],
                     epochs=8, subset=1.0, batch_size=256, backbone='resnet18', cifar_stem=True,
                     channels='64,128,256,512', neck_hidden=512, cluster_interval=1,
                     knn_interval=4, val_fraction=1.0, lr=0.5, warmup_epochs=1, num_workers=0,
                     temperature=0.2, num_clusters=None, final_rate=None, nredo=2,
                     linear_epochs=10, seeds=None, method_options={}, amp=True,
                     augment_on='device', channels_last=True, jobs=4, time_limit=480.0),
}
# --rehearse: a preset's runs at toy size on the CPU (digits, 2 epochs, an eighth-width network,
# float32) to check a command end to end before its GPU slot: the second epoch trains on the
# first round's labels. Start-up is most of its 1-2 minutes on 2 cores.
REHEARSAL = dict(dataset='digits', epochs=2, batch_size=64, channels='8,16,32,64',
                 neck_hidden=64, knn_interval=1, cluster_interval=1, nredo=1, linear_epochs=3,
                 amp=False)
# Defaults of the options a preset may leave unset.
DEFAULTS = dict(amp=False, jobs=1)


def method_option_texts(method_options: dict) -> list[str]:
    """``METHOD:KEY=VALUE`` texts of per-method config overrides."""
    return [f'{method}:{key}={value}' for method, options in method_options.items()
            for key, value in options.items()]
