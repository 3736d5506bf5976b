"""What the benchmark compares and under which budget: the methods, data sets, presets.

Each method is one :class:`Method` record in :data:`METHODS`; every part of the harness reads its
title, labels, configs, kind of detector and own settings from there.
"""
from __future__ import annotations

import os.path as osp
from dataclasses import dataclass, field
from typing import Mapping

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


# --rehearse: a preset's runs at toy size on the CPU (digits, 2 epochs, an eighth-width network,
# float32) to check a command end to end before its GPU slot: the second epoch trains on the
# first round's labels. Start-up is most of its 1-2 minutes on 2 cores.
REHEARSAL = dict(dataset='digits', epochs=2, batch_size=64, channels='8,16,32,64',
                 neck_hidden=64, knn_interval=1, cluster_interval=1, nredo=1, linear_epochs=3,
                 amp=False)
# The ViT protocol's rehearsal: its own data set (the ViT is sized for 28 pixels), a 1% subset,
# a one-block ViT 32 wide.
VIT_REHEARSAL = dict(epochs=2, subset=0.01, batch_size=64, embed_dim=32, depth=1, num_heads=2,
                     neck_hidden=64, knn_interval=1, cluster_interval=1, nredo=1,
                     val_fraction=0.05, num_clusters=[5, 10], linear_epochs=1, amp=False)


@dataclass(frozen=True)
class Dataset:
    """A data set's recipe: the ending of its methods' config names and its linear probe's config.

    ``rehearsal``: the toy-size settings of ``--rehearse`` for this recipe's presets.
    """

    recipe: str
    linear: str
    rehearsal: Mapping[str, object] = field(default_factory=lambda: REHEARSAL)


# One recipe per data set, shared by its methods' configs (configs/<folder>/<method>_<recipe>.py).
DATASETS = {
    'fmnist': Dataset('r18_200e_fmnist', 'configs/benchmarks/linear/linear_r18_100e_fmnist.py'),
    **{name: Dataset(f'r50_1000e_{name}', f'configs/benchmarks/linear/linear_r50_100e_{name}.py')
       for name in ('cifar10', 'cifar100')},
    'digits': Dataset('r18_8e_digits', 'configs/benchmarks/linear/linear_r18_100e_digits.py'),
    # The ViT protocol: Fashion-MNIST with ViT-Tiny cut to 4-pixel patches (its presets shrink it).
    'fmnist_vit': Dataset('vit-tiny-p4_200e_fmnist',
                          'configs/benchmarks/linear/linear_vit-tiny-p4_100e_fmnist.py',
                          rehearsal=VIT_REHEARSAL),
}
ALL_DATASETS = ('fmnist', 'cifar10', 'cifar100', 'digits')  # the ResNet recipes
SMALL_DATASETS = ('fmnist', 'digits')
VIT_DATASETS = ('fmnist_vit',)


@dataclass(frozen=True)
class Method:
    """One method of the benchmark.

    ``title`` and ``labels`` are its name and what it takes as labels in the tables; its config on a
    data set is ``configs/<folder>/<name>_<recipe>.py`` for each of ``datasets``. ``flags``: it flags
    individual negatives as false, so its in-batch detection precision and recall (against the
    ground-truth classes) are logged per epoch by FalseNegativeDetectionHook. ``clusters``: its
    detector is IFND's clustering (PseudoLabelHook), whose rounds' MTPR / MTNR are read.
    ``known_rates``: its MTPR / MTNR by definition (no detector to measure). ``options``: its own
    settings on a preset's budget, by preset (the configs keep the papers' values for their own
    recipes).
    """

    name: str
    title: str
    labels: str
    folder: str
    datasets: tuple[str, ...] = SMALL_DATASETS
    flags: bool = False
    clusters: bool = False
    known_rates: tuple[float, float] | None = None
    options: Mapping[str, Mapping[str, object]] = field(default_factory=dict)

    def config(self, dataset: str) -> str | None:
        """The config of this method on ``dataset`` (None where it has none)."""
        if dataset not in self.datasets:
            return None
        return f'configs/{self.folder}/{self.name}_{DATASETS[dataset].recipe}.py'


# The own settings on the cpu budget were chosen on its val split (README), on the digits budget on
# its own val split (docs/false_negatives.md, "Digits protocol"). The combinations take their
# parts' settings: hard negatives' beta, and GloFND's alpha; GloFND starts about a third of the way
# in, with lambda's step 0.1 (its configs' quarter of 200 epochs and the authors' 0.05 would leave
# 30 epochs little time to learn).
_GLOFND_CPU = {'model.detector.start_epoch': 10, 'model.detector.lr': 0.1, 'model.detector.alpha': 0.05}
_GLOFND_DIGITS = {'model.detector.alpha': 0.1, 'model.detector.start_epoch': 3, 'model.detector.lr': 0.1}

# HCSC's warm-up is a tenth of the run (20 of 200 epochs): 3 of the cpu budget's 30, 1 of the vit
# budget's 12 (its config's 1 of 8 on digits already is).
_HCSC_CPU = {'custom_hooks.0.warmup_epochs': 3}
_HCSC_VIT = {'custom_hooks.0.warmup_epochs': 1}
# MoCo v3's momentum on the vit budget's 276 steps: 0.9 (val kNN 67.05% against 57.25% at the
# recipe's 0.99, whose key encoder would lag a third of the run).
_MOCOV3_VIT = {'model.momentum': 0.9}


def _hard(beta_cpu: float, beta_digits: float) -> dict:
    """Own settings of a detector combined with hard negatives: the weighting's beta."""
    return {'cpu': {'model.weighting.beta': beta_cpu}, 'digits': {'model.weighting.beta': beta_digits}}


# The methods, in the tables' order.
METHODS: dict[str, Method] = {m.name: m for m in (
    Method('simclr', 'SimCLR', 'instance labels', 'simclr', ALL_DATASETS + VIT_DATASETS,
           known_rates=(0.0, 100.0)),
    Method('mocov3', 'MoCo v3', 'instance labels, momentum keys', 'mocov3', VIT_DATASETS,
           known_rates=(0.0, 100.0), options={'vit': _MOCOV3_VIT}),
    Method('nnclr', 'NNCLR', 'instance labels, nearest neighbours in a support set as positives',
           'nnclr', SMALL_DATASETS, known_rates=(0.0, 100.0)),
    Method('ifnd', 'IFND', 'pseudo labels (k-means)', 'ifnd', ALL_DATASETS + VIT_DATASETS,
           flags=True, clusters=True),
    Method('ifnd_nested', 'IFND, nested levels',
           "pseudo labels of HCSC's hierarchical k-means (each level clusters the finer one's centroids)",
           'ifnd', SMALL_DATASETS + VIT_DATASETS, flags=True, clusters=True),
    Method('ifnd_mocov3', 'IFND on MoCo v3', 'pseudo labels (k-means), momentum keys', 'ifnd',
           VIT_DATASETS, flags=True, clusters=True, options={'vit': _MOCOV3_VIT}),
    Method('supcon', 'SupCon', 'ground truth, attraction', 'ifnd', ALL_DATASETS + VIT_DATASETS,
           known_rates=(100.0, 100.0)),
    Method('oracle_elim', 'Oracle-elim', 'ground truth, elimination', 'ifnd', ALL_DATASETS,
           known_rates=(100.0, 100.0)),
    Method('debiased', 'Debiased', 'instance labels, negatives debiased by a class prior',
           'debiased', ALL_DATASETS,
           options={'cpu': {'model.tau_plus': 0.01}, 'digits': {'model.tau_plus': 0.1}}),
    Method('hard_negative', 'Hard negatives', 'instance labels, negatives reweighted by hardness',
           'hard_negative', ALL_DATASETS,
           options={'cpu': {'model.beta': 2.0}, 'digits': {'model.beta': 1.0}}),
    Method('fnc_elim', 'FNC-elim', 'support views flag negatives, elimination', 'fnc',
           ALL_DATASETS, flags=True, options={'cpu': {'model.top_k': 3}, 'digits': {'model.top_k': 3}}),
    Method('fnc_attr', 'FNC-attr', 'support views flag negatives, attraction', 'fnc',
           ALL_DATASETS, flags=True, options={'cpu': {'model.top_k': 3}, 'digits': {'model.top_k': 3}}),
    Method('ifnd_hard', 'IFND + hard negatives',
           'pseudo labels, elimination; the rest reweighted by hardness', 'ifnd', flags=True,
           clusters=True, options=_hard(2.0, 1.0)),
    Method('glofnd', 'GloFND', 'learned per-image thresholds flag negatives, elimination', 'glofnd',
           flags=True, options={'cpu': _GLOFND_CPU, 'digits': _GLOFND_DIGITS}),
    Method('glofnd_hard', 'GloFND + hard negatives',
           'learned thresholds, elimination; the rest reweighted by hardness', 'glofnd', flags=True,
           options={'cpu': {'model.detector.start_epoch': 10, 'model.detector.lr': 0.1,
                            'model.weighting.beta': 2.0, 'model.detector.alpha': 0.05},
                    'digits': {'model.detector.alpha': 0.1, 'model.detector.start_epoch': 3,
                               'model.detector.lr': 0.1, 'model.weighting.beta': 1.0}}),
    Method('oracle_elim_linear', 'Oracle-elim, linear',
           "ground truth accepted on IFND's linear schedule, elimination", 'ifnd',
           SMALL_DATASETS + VIT_DATASETS, flags=True),
    Method('ifnd_confident', 'IFND, confident labels',
           'pseudo labels accepted by confidence, flagged where two levels agree', 'ifnd',
           flags=True, clusters=True),
    Method('ifnd_confident_hard', 'IFND, confident labels + hard negatives',
           'confident pseudo labels, elimination; the rest reweighted by hardness', 'ifnd',
           flags=True, clusters=True, options=_hard(2.0, 1.0)),
    Method('hcsc', 'HCSC', "hierarchical k-means prototypes: ProtoNCE with prototype selection, "
           'negatives dropped at random by cluster probability (the authors\' code\'s choices)', 'hcsc',
           SMALL_DATASETS + VIT_DATASETS, flags=True, clusters=True,
           options={'cpu': _HCSC_CPU, 'vit': _HCSC_VIT}),
)}
# The two ends of the gap, instance labels and the supervised oracle: every other method's share of
# the SimCLR -> SupCon gap is reported.
GAP = ('simclr', 'supcon')
# The logged scalars of the flagging methods' detection.
DETECTION_KEYS = ('train/fn_precision', 'train/fn_recall')
# Paired contrasts between methods (a − b on the seeds both ran, 95% t-interval): acceptance by
# evidence against IFND's calendar and the schedule-matched oracle, the schedule's cost, and the
# combinations against their parts.
CONTRASTS = (('ifnd_confident', 'ifnd'), ('ifnd_confident', 'oracle_elim_linear'),
             ('ifnd_confident_hard', 'ifnd_hard'), ('ifnd_confident_hard', 'hard_negative'),
             ('oracle_elim', 'oracle_elim_linear'), ('oracle_elim_linear', 'ifnd'),
             ('ifnd_hard', 'hard_negative'), ('glofnd', 'ifnd'), ('hcsc', 'ifnd'), ('nnclr', 'simclr'),
             ('ifnd_nested', 'ifnd'), ('ifnd_nested', 'oracle_elim_linear'), ('hcsc', 'ifnd_nested'),
             ('ifnd_mocov3', 'mocov3'))


def own_options(preset: str) -> dict[str, dict]:
    """The methods' own settings on a preset's budget, by method (those that have any)."""
    return {name: dict(m.options[preset]) for name, m in METHODS.items() if preset in m.options}


def method_option_texts(method_options: dict) -> list[str]:
    """``METHOD:KEY=VALUE`` texts of per-method config overrides."""
    return [f'{method}:{key}={value}' for method, options in method_options.items()
            for key, value in options.items()]


# None means: keep the config's value. The cpu values were chosen on the val split (README); the
# digits budget (all of digits' 1,347 training images, an eighth-width ResNet-18, 8 epochs) was set
# by the time of one run, pre-training and linear probe together, on one thread: about 40 s.
PRESETS = {
    'cpu': dict(dataset='fmnist', epochs=30, subset=0.1, batch_size=128, backbone='resnet18',
                cifar_stem=False, channels='32,64,128,256', neck_hidden=256, cluster_interval=3,
                knn_interval=5, val_fraction=1.0, lr=0.25, warmup_epochs=2, num_workers=2,
                temperature=0.2, num_clusters=None, final_rate=None, nredo=2, linear_epochs=10,
                seeds=[0, 1, 2], method_options=own_options('cpu')),
    'digits': dict(dataset='digits', epochs=8, subset=1.0, batch_size=64, backbone='resnet18',
                   cifar_stem=True, channels='8,16,32,64', neck_hidden=256, cluster_interval=1,
                   knn_interval=2, val_fraction=1.0, lr=0.25, warmup_epochs=1, num_workers=0,
                   temperature=0.2, num_clusters=None, final_rate=None, nredo=None,
                   linear_epochs=10, seeds=[0, 1, 2, 3, 4], method_options=own_options('digits')),
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
    # The ViT protocol on 2 cores: 3,000 images (5% of Fashion-MNIST's training split), 12 epochs of
    # a ViT cut to 4 blocks 96 wide (3 heads, 4-pixel patches: 49 tokens and the class token),
    # views made in batches on the CPU, two runs at a time. AdamW lr 1e-3 at batch 128, chosen on
    # the val split over 5e-4, 1e-3 and 2e-3 by SimCLR's and MoCo v3's kNN top-1 together
    # (docs/false_negatives.md, "ViT protocol").
    'vit': dict(dataset='fmnist_vit', epochs=12, subset=0.05, batch_size=128, embed_dim=96,
                depth=4, num_heads=3, neck_hidden=256, cluster_interval=2, knn_interval=6,
                val_fraction=1.0, lr=1e-3, warmup_epochs=1, num_workers=0, augment_on='device',
                temperature=0.2, num_clusters=None, final_rate=None, nredo=2, linear_epochs=10,
                seeds=[0, 1, 2], method_options=own_options('vit'), jobs=2),
    # One seed of SimCLR and MoCo v3, each with and without IFND, with the configs' ViT-Tiny
    # (12 blocks, 192 wide, 4-pixel patches) on all 60,000 images in one 8-minute GPU run, bfloat16,
    # views on the GPU, not compiled; the configs' lr 5e-4 at batch 256. Time on one H100,
    # estimated, not measured: ~35k views/s forward and backward at 50 tokens, so an epoch is
    # ~3.5 s (SimCLR) to ~4.5 s (MoCo v3's extra key forward) a method: 10 epochs of four ~160 s,
    # start-up 30 s, kNN twice ~20 s, IFND's 20 clustering rounds ~60 s, the probes ~60 s: ~5.5
    # of 8 minutes.
    'vit-gpu-slot': dict(dataset='fmnist_vit', methods=['simclr', 'ifnd', 'mocov3', 'ifnd_mocov3'],
                         epochs=10, subset=1.0, batch_size=256, neck_hidden=None,
                         cluster_interval=1, knn_interval=5, val_fraction=1.0, lr=5e-4,
                         warmup_epochs=1, num_workers=0, temperature=0.2, num_clusters=None,
                         final_rate=None, nredo=2, linear_epochs=10, seeds=None,
                         method_options={}, amp=True, augment_on='device', jobs=4,
                         time_limit=480.0),
}
# The presets sized for one GPU run within their time limit (refused without CUDA unless rehearsed
# or dry).
SLOT_PRESETS = tuple(name for name, preset in PRESETS.items() if preset.get('time_limit'))
# Defaults of the options a preset may leave unset.
DEFAULTS = dict(amp=False, jobs=1)
