"""The step-cost and clustering-cost benchmarks run end to end with tiny settings."""
import importlib
import json
import math
import os
import os.path as osp
import re
import shlex
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import torch

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
BENCHMARKS = osp.join(REPO, 'benchmarks')


def _load(name):
    """The benchmark module ``benchmarks.<name>``."""
    return importlib.import_module(f'benchmarks.{name}')


@pytest.fixture(autouse=True)
def _restore_threads():
    """The benchmarks run with --threads 1 (tiny problems); give other tests their threads back."""
    threads = torch.get_num_threads()
    faiss = sys.modules.get('faiss')
    faiss_threads = faiss.omp_get_max_threads() if faiss is not None else None
    yield
    torch.set_num_threads(threads)
    if faiss_threads is not None:
        faiss.omp_set_num_threads(faiss_threads)


def _table_rows(text):
    """Cells of the Markdown table rows (header and separator rows excluded)."""
    rows = []
    for line in text.splitlines():
        if line.startswith('|') and not line.startswith('|---'):
            rows.append([cell.strip() for cell in line.strip('|').split('|')])
    return rows


STEP_ARGS = ['--batch-size', '4', '--image-size', '8', '--neck-hidden', '16', '--out-dim', '8',
             '--queue-len', '64', '--num-samples', '256', '--warmup', '1', '--repeats', '2',
             '--threads', '1', '--device', 'cpu']


def test_step_cost_table_and_json(tmp_path, capsys):
    out = tmp_path / 'step.json'
    result = _load('step_cost').main(STEP_ARGS + ['--out', str(out)])
    text = capsys.readouterr().out
    rows = {r[0]: r[1:] for r in _table_rows(text)}
    for name in ('SimCLR', 'IFND', 'MoCoV2', 'IFNDMoCo', 'IFND/SimCLR', 'IFNDMoCo/MoCoV2'):
        assert name in rows, text
        assert all(float(cell) > 0 for cell in rows[name]), rows[name]
    assert 'CPU' in text
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(result))
    assert set(saved['variants']) == {'SimCLR', 'IFND', 'MoCoV2', 'IFNDMoCo'}
    for v in saved['variants'].values():
        assert v['median_ms'] > 0 and v['steps_timed'] == 2 and v['warmup_s'] > 0
    for r in saved['ratios'].values():
        assert r['ratio_of_medians'] > 0 and r['median_paired_ratio'] > 0


def test_step_cost_label_bank_is_realistic():
    bench = _load('step_cost')
    labels = bench.realistic_labels([3, 7], 1000, 0.5, torch.Generator().manual_seed(0))
    assert labels.shape == (2, 1000)
    accepted = labels >= 0
    assert 0.4 < float(accepted.float().mean()) < 0.6
    assert int(labels[0][accepted[0]].max()) < 3 and int(labels[1][accepted[1]].max()) < 7
    unique = -(torch.arange(1000) + 1)
    assert torch.equal(labels[~accepted], unique.expand(2, -1)[~accepted])


def test_step_cost_counts_ifnd_detections_as_its_configs_do():
    bench = _load('step_cost')
    labels = bench.realistic_labels([3], 256, 0.5, torch.Generator().manual_seed(0))
    for argv, tracked in (([], True), (['--no-detection'], False)):
        args = bench.parse_args(STEP_ARGS + argv)
        ifnd = bench.build_variant('IFND', args, labels, torch.device('cpu'))
        simclr = bench.build_variant('SimCLR', args, labels, torch.device('cpu'))
        assert ifnd.track_detection is tracked and simclr.track_detection is False
        batch = bench.make_batches(args, torch.device('cpu'), count=1)[0]
        ifnd.train_step(batch, bench.OptimWrapper(torch.optim.SGD(ifnd.parameters(), lr=0.0)))
        assert (ifnd.detection_counts is not None) is tracked


def test_step_cost_one_pair():
    result = _load('step_cost').main(STEP_ARGS + ['--pairs', 'moco'])
    assert set(result['variants']) == {'MoCoV2', 'IFNDMoCo'}
    assert set(result['ratios']) == {'IFNDMoCo/MoCoV2'}


def test_step_cost_follows_the_recipes_and_times_gpu_steps_by_cuda_events(monkeypatch):
    bench = _load('step_cost')
    r50 = bench.parse_args(['--model', 'resnet50'])
    assert (r50.neck_hidden, r50.neck_layers, r50.out_dim, r50.queue_len) == (2048, 3, 128, 65536)
    r18 = bench.parse_args([])
    assert (r18.neck_hidden, r18.queue_len) == (512, 16384)
    assert bench.parse_args(['--model', 'resnet50', '--queue-len', '4096']).queue_len == 4096
    assert r50.warmup is None  # resolved by device and --compile when the run starts

    class FakeEvent:  # a CUDA event whose elapsed time is the wall time between the records
        def __init__(self, enable_timing):
            assert enable_timing

        def record(self):
            self.at = time.perf_counter()

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return 1000.0 * (end.at - self.at)

    common = _load('common')  # the helpers the script imported
    monkeypatch.setattr(torch.cuda, 'Event', FakeEvent)
    read = common.time_call(lambda: time.sleep(0.01), torch.device('cuda'))
    assert 0.01 <= read() < 1.0


VIT_ARGS = ['--model', 'vit_small_patch16_224', '--pairs', 'mocov3']


def test_step_cost_mocov3_pair_follows_the_vit_recipe_config():
    """--model vit_small_patch16_224: both models are the recipe files' (the IFND recipe's model is the
    MoCo v3 recipe's but for its type), at --image-size, eager unless --compile, with AdamW."""
    from mmengine.config import Config
    bench = _load('step_cost')
    args = bench.parse_args([*VIT_ARGS, '--image-size', '224', '--batch-size', '256'])
    assert (args.neck_hidden, args.neck_layers, args.out_dim, args.cifar_stem) == (4096, 3, 256, False)
    for name, path in (('MoCoV3', 'configs/mocov3/mocov3_vit-small-p16_300e_in1k.py'),
                       ('IFNDMoCoV3', 'configs/ifnd/ifnd_mocov3_vit-small-p16_300e_in1k.py')):
        recipe = Config.fromfile(osp.join(REPO, path)).model.to_dict()
        assert recipe['backbone'].pop('compile') == 'auto'
        built = bench.variant_config(name, args)
        assert built['backbone'].pop('compile') is False  # eager without --compile
        assert built == dict(recipe, backbone=dict(recipe['backbone'], img_size=224, channels_last=False))
    assert bench.optimizer_settings(args.model) == dict(type='AdamW', lr=1.5e-4, betas=(0.9, 0.95),
                                                        weight_decay=0.1)
    compiled = bench.parse_args([*VIT_ARGS, '--compile', '--backbone-options', 'depth=2'])
    backbone = bench.variant_config('IFNDMoCoV3', compiled)['backbone']
    assert backbone['compile'] == dict(backend='inductor') and backbone['depth'] == 2
    # Another algorithm on the ViT recipe keeps its own defaults, with the recipe's backbone and head.
    simclr = bench.variant_config('SimCLR', args)
    assert 'predictor' not in simclr and 'momentum' not in simclr and simclr['neck']['hidden_dim'] == 4096
    with pytest.raises(SystemExit):
        bench.parse_args([*VIT_ARGS, '--cifar-stem'])


def test_step_cost_times_mocov3_and_ifnd_on_it(tmp_path, capsys):
    """The ViT recipe's pair at toy size: both models train (AdamW, compiled by the 'eager' backend),
    IFNDMoCoV3 counting its flagged negatives as its config's FalseNegativeDetectionHook does."""
    from benchmarks.gpu_parts import TOY_COMPILE, TOY_VIT_ARGS  # the report's rehearsal of the pair
    bench = _load('step_cost')
    result = bench.main(TOY_VIT_ARGS)
    assert set(result['variants']) == {'MoCoV3', 'IFNDMoCoV3'} and set(result['ratios']) == {'IFNDMoCoV3/MoCoV3'}
    assert all(v['steps_timed'] == 2 and v['images_per_s'] > 0 for v in result['variants'].values())
    assert result['ratios']['IFNDMoCoV3/MoCoV3']['ratio_of_medians'] > 0
    header = capsys.readouterr().out.splitlines()[0]
    assert 'depth=1' in header and 'fused AdamW' in header and 'queue' not in header
    args = bench.parse_args([arg for arg in TOY_VIT_ARGS if arg not in TOY_COMPILE])
    labels = bench.realistic_labels([3], 256, 0.5, torch.Generator().manual_seed(0))
    batch = bench.make_batches(args, torch.device('cpu'), count=1)[0]
    for name, counted in (('MoCoV3', False), ('IFNDMoCoV3', True)):
        model = bench.build_variant(name, args, labels, torch.device('cpu'))
        assert model.backbone.model.patch_embed.proj.weight.requires_grad is False  # the recipe's frozen patches
        optimizer = bench.make_optimizer(model, args)
        assert isinstance(optimizer, torch.optim.AdamW)
        model.train_step(batch, bench.OptimWrapper(optimizer))
        assert (model.detection_counts is not None) is counted


COUNT_ARGS = ['--count-ops', '--recipe', 'fmnist-device', '--count-batch-size', '32', '--count-steps', '2',
              '--channels', '8', '16', '32', '64', '--threads', '1']


def test_step_cost_counts_a_recipe_steps_operators_by_part(tmp_path, capsys):
    """The Fashion-MNIST device-view recipe through the Runner (scikit-learn's digits written as its
    files): every part dispatches, the JSON and the table hold the median step's counts."""
    out = tmp_path / 'ops.json'
    result = _load('step_cost').main(COUNT_ARGS + ['--fmnist-root', str(tmp_path / 'absent'), '--json', str(out)])
    with open(out) as f:
        assert json.load(f)['ops_per_step'] == result['ops_per_step']
    parts = ('data', 'augmentation', 'forward', 'loss', 'backward', 'optimizer', 'hooks')
    assert tuple(result['by_part']) == parts and sum(result['by_part'].values()) == result['ops_per_step']
    assert result['labels_accepted'] and result['steps_counted'] >= 2 and result['profile'] is None
    assert all(result['by_part'][p] > 0 for p in parts if p != 'hooks'), result['by_part']
    assert all(0 < result['kernels_by_part'][p] <= result['by_part'][p] for p in parts if p != 'hooks')
    rows = {r[0]: r[1:] for r in _table_rows(capsys.readouterr().out)}
    assert rows['**step**'][0] == f"**{result['ops_per_step']}**"
    # Eager on a CPU, the views are the step's largest part (grey images: no hue, one channel).
    assert result['by_part']['augmentation'] == max(result['by_part'].values())


def test_the_fmnist_recipe_compiled_dispatches_few_operators_a_step(tmp_path):
    """With the GPU recipe's compile settings forced (inductor, bfloat16 autocast), a step of the
    Fashion-MNIST device-view recipe dispatches at most 300 operators (1,516 before the views, the
    projection head and the loss were compiled and the data stayed on the device)."""
    # One block a stage, so inductor compiles in a quarter of the time; the parts other than the
    # encoder's forward and backward do not depend on it (docs/speed.md: 153 a step at ResNet-18's depth).
    result = _load('step_cost').main(COUNT_ARGS + ['--compile', '--fmnist-root', str(tmp_path / 'absent'),
                                                   '--count-cfg-options', 'model.backbone.layers=(1,1,1,1)'])
    assert result['ops_per_step'] <= 300, result['by_part']
    assert result['by_part']['augmentation'] <= 8  # one draw, one compiled region and its roi_aligns
    assert result['by_part']['loss'] <= 10  # the head, the masks and the loss: one compiled region
    assert result['by_part']['data'] <= 4  # the batch gathered on the device from its indices


def test_gpu_profile_attributes_kernels_to_parts_and_finds_the_idle_share():
    bench = _load('op_count')
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def event(name, parent=None, kernels=(), span=None, device=cpu):
        start, end = span or (0, 0)
        return types.SimpleNamespace(name=name, cpu_parent=parent, device_type=device,
                                     kernels=[types.SimpleNamespace(duration=d) for d in kernels],
                                     time_range=types.SimpleNamespace(start=start, end=end))

    views = event('part:augmentation')
    loss = event('part:loss')
    events = [views, loss, event('aten::roi_align', views, kernels=[300]), event('cudaLaunchKernel', views),
              event('aten::mm', event('aten::linear', loss), kernels=[500, 200]), event('cudaLaunchKernel', loss),
              event('cudaLaunchKernel', loss), event('aten::convolution_backward', kernels=[1000]),
              event('cudaLaunchKernel'),
              # the device's timeline: 0-300, 250-950 (overlapping), then idle, then 1500-2500
              event('roi_align', span=(0, 300), device=cuda), event('mm', span=(250, 950), device=cuda),
              event('conv_bwd', span=(1500, 2500), device=cuda)]
    got = bench.gpu_profile(events, steps=2)
    assert got['gpu_ms_per_step_by_part']['augmentation'] == 0.15
    assert got['gpu_ms_per_step_by_part']['loss'] == 0.35
    assert got['gpu_ms_per_step_by_part']['backward'] == 0.5  # launched outside every part's range
    assert got['launches_per_step'] == 2.0
    assert got['timeline_ms_per_step'] == 1.25 and got['gpu_ms_per_step'] == 0.975
    assert got['gpu_idle_share'] == round(1 - 1950 / 2500, 4)


def test_throughput_fmnist_preset_commands_and_results(tmp_path, capsys):
    bench = _load('throughput')
    argv = ['--preset', 'fmnist-full', '--dry-run', '--work-dir', str(tmp_path), '--epochs', '3',
            '--fmnist-root', '/data/fmnist', '--cfg-options', 'model.backbone.compile=False']
    assert bench.main(argv)['rows'] == []
    device, cpu = capsys.readouterr().out.splitlines()[:2]
    assert 'configs/ifnd/ifnd_r18_200e_fmnist_device_aug.py' in device
    assert 'configs/ifnd/ifnd_r18_200e_fmnist.py' in cpu
    for option in ('train_cfg.max_epochs=3', 'custom_hooks.0.interval=1',
                   'train_dataloader.dataset.data_root=/data/fmnist', 'model.backbone.compile=False'):
        assert option in device.split() and option in cpu.split()
    # Every option names a key of the configs (tools/train.py's checks pass).
    from helpers import train_tool
    args = bench.parse_args(argv)
    for views in ('device', 'cpu'):
        command, work_dir = bench.preset_command(views, args)
        cfg = train_tool.build_config(train_tool.parse_args(command[2:]))
        assert cfg.train_cfg.max_epochs == 3 and cfg.custom_hooks[0].interval == 1
        assert cfg.train_dataloader.dataset.augment_on == views
    # A finished run's files give the last epoch's speed and the last clustering round.
    run = tmp_path / 'run'
    (run / '20250101_000000' / 'vis_data').mkdir(parents=True)
    rows = [dict(epoch=e, iter=i, time=t, memory=m) for e, i, t, m in
            ((2, 50, 0.5, 900), (3, 50, 0.1, 1000), (3, 100, 0.3, 1100), (3, 150, 0.2, 1000))]
    rows.append({'ifnd/rate': 1.0, 'step': 3})
    (run / '20250101_000000' / 'vis_data' / 'scalars.json').write_text(
        '\n'.join(json.dumps(r) for r in rows))
    (run / 'ifnd_r18_200e_fmnist_device_aug.py').write_text('train_dataloader = dict(batch_size=256)')
    (run / 'pseudo_labels').mkdir()
    (run / 'pseudo_labels' / 'rounds.json').write_text(json.dumps([
        dict(epoch=2, seconds_extract=9.0, seconds_kmeans=9.0, seconds_confidence=9.0),
        dict(epoch=3, seconds_extract=1.5, seconds_kmeans=2.25, seconds_confidence=0.5)]))
    result = bench.preset_result('device', str(run), 3, 321.0, bench.FMNIST_RECIPES['device'])
    assert result['ms_per_iter'] == pytest.approx(200.0) and result['images_per_s'] == pytest.approx(1280)
    assert result['peak_memory_mb'] == 1100 and result['clustering_s']['kmeans'] == 2.25
    assert '| device | `ifnd_r18_200e_fmnist_device_aug.py` | 200.0 | 1280 | 1100 | 1.50 / 2.25 / 0.50 | 321 |' \
        in bench.preset_table([result])


def test_clustering_cost_table_and_json(tmp_path, capsys):
    bench = _load('clustering_cost')
    out = tmp_path / 'clustering.json'
    result = bench.main(['--num-samples', '300', '600', '--ks', '3,5', '10', '--niter', '3',
                         '--dim', '16', '--threads', '1', '--device', 'cpu', '--out', str(out)])
    text = capsys.readouterr().out
    rows = _table_rows(text)[1:]  # minus the header
    backends = bench.available_backends()
    assert len(rows) == 2 * 2 * len(backends), text
    assert {r[0] for r in rows} == set(backends)
    assert {(r[1], r[2]) for r in rows} == {(n, ks) for n in ('300', '600')
                                           for ks in ('3, 5', '10')}
    for r in rows:
        kmeans_s, conf_s, total_s = map(float, r[3:6])
        assert kmeans_s > 0 and conf_s > 0
        assert total_s == pytest.approx(kmeans_s + conf_s, rel=0.02, abs=2e-3)
    saved = json.loads(out.read_text())
    assert len(saved['rows']) == len(result['rows']) == len(rows)
    # Half of the samples accepted per level at the default rate 0.5.
    assert all(r['accepted_per_level'] == r['num_samples'] / 2 for r in saved['rows'])


def test_clustering_cost_rejects_too_many_clusters():
    with pytest.raises(SystemExit):
        _load('clustering_cost').parse_args(['--num-samples', '50', '--ks', '100'])


def test_false_negatives_dry_run_commands(capsys):
    """Only the command lines: every method once per seed, each followed by its linear probe."""
    result = _load('false_negatives').main(['--dry-run', '--epochs', '3', '--subset', '0.1',
                                            '--seeds', '0', '7', '--linear-epochs', '5'])
    assert result == {}
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith('$ ')]
    methods = 17
    assert len(commands) == 2 * methods * 2
    pretrain, linear = commands[0::2], commands[1::2]
    configs = ('simclr/simclr_r18', 'nnclr/nnclr_r18', 'ifnd/ifnd_r18', 'ifnd/ifnd_nested_r18',
               'ifnd/supcon_r18', 'ifnd/oracle_elim_r18',
               'debiased/debiased_r18', 'hard_negative/hard_negative_r18', 'fnc/fnc_elim_r18',
               'fnc/fnc_attr_r18', 'ifnd/ifnd_hard_r18', 'glofnd/glofnd_r18',
               'glofnd/glofnd_hard_r18', 'ifnd/oracle_elim_linear_r18', 'ifnd/ifnd_confident_r18',
               'ifnd/ifnd_confident_hard_r18', 'hcsc/hcsc_r18') * 2
    for line, config, seed in zip(pretrain, configs, [0] * methods + [7] * methods, strict=True):
        assert config in line and 'tools/train.py' in line
        assert f'randomness.seed={seed} ' in line and f'seed_{seed} ' in line
        assert 'train_cfg.max_epochs=3' in line
        assert 'train_dataloader.dataset.subset_fraction=0.1' in line
        assert 'param_scheduler.1.T_max=' in line
    for line, pre in zip(linear, pretrain):
        assert 'linear_r18_100e_fmnist.py' in line and 'train_cfg.max_epochs=5' in line
        work_dir = pre.split('--work-dir ')[1].split()[0]
        assert f'model.pretrained={work_dir}/epoch_3.pth' in line
        # The probe's backbone is the pre-trained one, trained on the same images.
        assert "'model.backbone.channels=(32,64,128,256)'" in line
        assert 'train_dataloader.dataset.subset_fraction=0.1' in line
        assert "'param_scheduler.0.milestones=[3,4]'" in line  # 60/75/90 of 100 epochs, scaled
    # The kNN hook is custom_hooks.1 in the IFND config (after PseudoLabelHook), .0 elsewhere;
    # k-means is seeded by the run seed.
    ifnd = configs.index('ifnd/ifnd_r18')
    assert 'custom_hooks.1.interval=5' in pretrain[ifnd]
    assert 'custom_hooks.0.interval=3' in pretrain[ifnd] and 'custom_hooks.0.seed=0' in pretrain[ifnd]
    assert 'custom_hooks.0.seed=7' in pretrain[methods + ifnd]
    # The schedule-matched oracle accepts on IFND's clustering interval, its order seeded by the run.
    oracle = configs.index('ifnd/oracle_elim_linear_r18')
    assert 'model.detector.acceptance.interval=3' in pretrain[oracle]
    assert 'model.detector.acceptance.seed=7' in pretrain[methods + oracle]
    # IFND accepting by confidence clusters as IFND does, on the same interval and seed.
    confident = configs.index('ifnd/ifnd_confident_r18')
    assert 'custom_hooks.0.interval=3' in pretrain[confident]
    assert 'custom_hooks.0.seed=7' in pretrain[methods + confident]
    assert 'custom_hooks.0.interval=5' in pretrain[0] and 'custom_hooks.0.interval=5' in pretrain[1]
    # The cpu preset's own settings of a method reach that method's runs only.
    bench = _load('false_negatives')
    for line, config in zip(pretrain, configs):
        method = config.split('/')[1][:-len('_r18')]
        for key, value in bench.METHODS[method].options.get('cpu', {}).items():
            assert f' {key}={value}' in line
    assert 'model.tau_plus' not in pretrain[0] and 'model.beta' not in pretrain[0]  # SimCLR


def test_false_negatives_digits_preset_commands(capsys):
    """--preset digits: every method on its digits config, five seeds, the digits method settings."""
    bench = _load('false_negatives')
    assert bench.main(['--preset', 'digits', '--dry-run']) == {}
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith('$ ')]
    methods = [method for method in bench.METHODS.values() if method.config('digits')]
    assert len(commands) == 2 * len(methods) * 5
    pretrain, linear = commands[0::2], commands[1::2]
    for i, line in enumerate(pretrain):
        method, seed = methods[i % len(methods)], i // len(methods)
        assert f' {method.config("digits")} ' in line
        assert f'randomness.seed={seed} ' in line and 'digits_digits_test' in line
        assert 'train_dataloader.batch_size=64' in line and 'train_cfg.max_epochs=8' in line
        for key, value in method.options.get('digits', {}).items():
            assert f' {key}={value}' in line
        assert 'subset_fraction' not in line  # all of the training split
    for line in linear:
        assert 'linear_r18_100e_digits.py' in line and 'train_cfg.max_epochs=10' in line
        assert "'model.backbone.channels=(8,16,32,64)'" in line



def test_false_negatives_method_options(capsys):
    """--method-options replaces one key of one method's preset settings; bad items are refused."""
    bench = _load('false_negatives')
    args = bench.parse_args(['--method-options', 'debiased:model.tau_plus=0.05',
                             'fnc_elim:model.top_k=10'])
    assert args.method_options['debiased'] == {'model.tau_plus': '0.05'}
    assert args.method_options['fnc_elim'] == {'model.top_k': '10'}
    assert args.method_options['hard_negative'] == bench.METHODS['hard_negative'].options['cpu']
    assert bench.PRESETS['cpu']['method_options']['debiased'] == \
        bench.METHODS['debiased'].options['cpu']  # the preset itself is not changed
    assert bench.parse_args(['--preset', 'gpu']).method_options == {}
    for bad in ('tau_plus=0.05', 'nomethod:model.x=1', 'debiased:model.tau_plus'):
        with pytest.raises(SystemExit):
            bench.parse_args(['--method-options', bad])
    assert 'METHOD:KEY=VALUE' in capsys.readouterr().err


def test_false_negatives_val_split_never_touches_the_test_split(capsys):
    _load('false_negatives').main(['--dry-run', '--seeds', '0', '--eval-split', 'val',
                                   '--val-fraction', '0.1', '--methods', 'ifnd'])
    pretrain, linear = [line for line in capsys.readouterr().out.splitlines()
                        if line.startswith('$ ')]
    for line in (pretrain, linear):
        assert 'split=test' not in line
    assert 'custom_hooks.1.val_dataset.split=train' in pretrain
    assert re.search(r'custom_hooks\.1\.val_dataset\.subset_file=\S+/split/val\.txt', pretrain)
    assert re.search(r'train_dataloader\.dataset\.subset_file=\S+/split/train\.txt', pretrain)
    assert 'val_dataloader.dataset.split=train' in linear
    assert re.search(r'val_dataloader\.dataset\.subset_file=\S+/split/val\.txt', linear)


def test_paired_statistics_against_direct_computation():
    from scipy import stats
    bench = _load('false_negatives')
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(2, 7))
        den = rng.normal(5.0, 1.0, n)
        num = 0.4 * den + rng.normal(0.0, 0.5, n)
        # t-interval: scipy's own interval of the mean.
        mean, lo, hi = bench.t_interval(num)
        ref = stats.t.interval(0.95, n - 1, loc=num.mean(), scale=stats.sem(num))
        np.testing.assert_allclose([lo, hi], ref, rtol=1e-10)
        # Fieller: the ends are where the t statistic of num - rho * den reaches the quantile.
        ratio, lo, hi = bench.fieller_interval(num, den)
        assert ratio == pytest.approx(num.mean() / den.mean())
        q = stats.t.ppf(0.975, n - 1)

        def inside(rho):
            d = num - np.atleast_1d(rho)[:, None] * den
            return np.abs(d.mean(1)) <= q * d.std(1, ddof=1) / np.sqrt(n)
        if math.isinf(lo):
            assert inside(np.array([-1e6, 1e6])).all()
            continue
        grid = np.linspace(lo - 1.0, hi + 1.0, 20001)
        members = grid[inside(grid)]
        step = grid[1] - grid[0]
        assert members.min() == pytest.approx(lo, abs=2 * step)
        assert members.max() == pytest.approx(hi, abs=2 * step)
        assert lo <= ratio <= hi


def test_gap_closed_summary():
    bench = _load('false_negatives')
    runs = []
    for seed, (simclr, ifnd, supcon, oracle) in enumerate(
            [(80.0, 81.0, 90.0, 86.0), (81.0, 82.5, 90.5, 87.0), (79.0, 79.5, 89.0, 85.0)]):
        for method, top1 in zip(('simclr', 'ifnd', 'supcon', 'oracle_elim'),
                                (simclr, ifnd, supcon, oracle)):
            runs.append({'method': method, 'seed': seed, 'top1': top1})
    summary = bench.summarise(runs, [0, 1, 2])
    assert summary['methods']['simclr']['top1']['mean'] == pytest.approx(80.0)
    assert summary['methods']['simclr']['top1']['sd'] == pytest.approx(1.0)
    assert summary['paired']['ifnd']['top1']['values'] == pytest.approx([1.0, 1.5, 0.5])
    closed = summary['gap_closed']['ifnd']['top1']
    assert closed['share'] == pytest.approx(3.0 / 29.5)
    assert closed['low'] < closed['share'] < closed['high']
    assert summary['gap_closed']['oracle_elim']['top1']['share'] == pytest.approx(18.0 / 29.5)
    assert 'supcon' not in summary['gap_closed'] and 'linear_top1' not in summary['paired']['ifnd']
    # A run not finished yet (read with --skip-train): the method is summarised over its seeds
    # and compared on the seeds it shares with SimCLR and SupCon.
    partial = [r for r in runs if (r['method'], r['seed']) != ('oracle_elim', 2)]
    summary = bench.summarise(partial, [0, 1, 2])
    assert summary['methods']['oracle_elim']['top1']['values'] == [86.0, 87.0]
    assert summary['paired']['oracle_elim']['top1']['seeds'] == [0, 1]
    assert summary['paired']['oracle_elim']['top1']['values'] == pytest.approx([6.0, 6.0])
    assert summary['gap_closed']['oracle_elim']['top1']['share'] == pytest.approx(12.0 / 19.5)
    assert summary['paired']['ifnd']['top1']['seeds'] == [0, 1, 2]
    partial = [dict(r, top1_history=[(30, r['top1'])], seconds=1.0) for r in partial
               if r['method'] != 'ifnd']  # IFND's rows need its clustering rounds
    result = {'settings': {'seeds': [0, 1, 2], 'cifar_stem': None, 'channels': None, 'epochs': 30,
                           'subset': 0.1, 'batch_size': 8, 'backbone': 'resnet18',
                           'eval_split': 'test', 'dataset': 'fmnist', 'preset': 'cpu'},
              'device': 'CPU', 'runs': partial, 'summary': bench.summarise(partial, [0, 1, 2])}
    table = bench.markdown_tables(result)
    assert '| Oracle-elim (2 of 3 seeds) | ground truth, elimination | 86.50 ± 0.71 |' in table
    assert '| 2 | 79.00 | 89.00 | — |' in table


# Slow (about a minute on 2 cores, twelve tools/train.py processes, their start-up most of it): the
# harness's whole chain (training subprocesses, linear probes, collection, paired statistics) for
# real; two seeds are the fewest the paired intervals take, one epoch (after the kNN and the round
# before training) and 30% of digits' training split the least that trains and clusters.
def test_false_negatives_end_to_end_on_digits(tmp_path):
    """Two seeds of SimCLR, IFND and SupCon through tools/train.py, linear probes included."""
    from helpers import digits_config
    from mmengine.config import Config

    bench = _load('false_negatives')
    configs = {}
    models = {'simclr': dict(type='SimCLR', temperature=0.5), 'ifnd': dict(type='IFND'),
              'supcon': dict(type='SupCon')}
    for method, model in models.items():
        labels = dict(num_clusters=[5, 10], interval=1, kmeans=dict(nredo=2)) \
            if method == 'ifnd' else None
        cfg = digits_config(str(tmp_path / 'cfg'), model, max_epochs=2, pseudo_labels=labels,
                            knn=True)
        cfg.param_scheduler = [
            dict(type='LinearLR', start_factor=0.1, by_epoch=True, begin=0, end=1),
            dict(type='CosineAnnealingLR', T_max=1, by_epoch=True, begin=1, end=2)]
        configs[method] = str(tmp_path / f'{method}.py')
        cfg.dump(configs[method])
    linear = Config.fromfile(osp.join(osp.dirname(BENCHMARKS), 'configs', 'benchmarks', 'linear',
                                      'linear_r18_100e_fmnist.py'))
    eval_view = dict(type='EvalView', size=16)
    loader = dict(num_workers=0, persistent_workers=False, batch_size=128,
                  collate_fn=dict(type='default_collate'))
    linear.train_dataloader = dict(linear.train_dataloader, **loader, dataset=dict(
        type='Digits', split='train', pipeline=dict(type='ContrastiveView', size=16,
                                                    scale=(0.5, 1.0), flip=False)))
    linear.val_dataloader = dict(linear.val_dataloader, **loader,
                                 dataset=dict(type='Digits', split='test', pipeline=eval_view))
    linear.test_dataloader = linear.val_dataloader
    linear.model.data_preprocessor = Config.fromfile(configs['simclr']).model.data_preprocessor
    linear.visualizer = dict(type='Visualizer', vis_backends=[dict(type='LocalVisBackend')])
    linear.log_level = 'WARNING'
    configs['linear'] = str(tmp_path / 'linear.py')
    linear.dump(configs['linear'])
    argv = ['--epochs', '1', '--seeds', '0', '1', '--methods', 'simclr', 'ifnd', 'supcon',
            '--eval-split', 'val', '--val-fraction', '0.2', '--subset', '0.3',
            '--backbone', 'resnet18', '--cifar-stem', '--channels', '8,16,32,64',
            '--neck-hidden', '64', '--batch-size', '64', '--lr', '0.05', '--warmup-epochs', '1',
            '--knn-interval', '1', '--cluster-interval', '1', '--num-workers', '0',
            '--nredo', '1', '--linear-epochs', '1', '--jobs', '2',
            '--work-dir', str(tmp_path / 'runs'), '--out', str(tmp_path / 'fn.json'),
            '--plot', str(tmp_path / 'fn.png')]
    for method, path in configs.items():
        argv += [f'--{method}-config', path]
    result = bench.main(argv)
    with open(tmp_path / 'fn.json') as f:
        saved = json.load(f)  # strict JSON: no NaN or Infinity
    from ifnd.fileio import json_safe
    assert saved['summary'] == json.loads(json.dumps(json_safe(result['summary'])))
    assert osp.getsize(tmp_path / 'fn.png') > 10_000
    runs = {(r['method'], r['seed']): r for r in result['runs']}
    assert len(runs) == 6
    for (method, seed), run in runs.items():
        work_dir = tmp_path / 'runs' / method / f'seed_{seed}'
        # The numbers are the runs' own logs: kNN after each epoch, the probe's accuracy.
        assert [e for e, _ in run['top1_history']] == [0, 1]  # eval_at_start, then each epoch
        assert run['top1'] == bench.read_scalars(str(work_dir), 'knn/top1', None)[-1][1]
        assert run['linear_top1'] == bench.read_scalars(str(work_dir / 'linear'), 'top1',
                                                        None)[-1][1]
        assert 0 < run['top1'] <= 100 and 0 < run['linear_top1'] <= 100
    assert runs['simclr', 0]['top1'] != runs['simclr', 1]['top1']  # the seed reaches the run
    ifnd = runs['ifnd', 1]
    assert [r['epoch'] for r in ifnd['rounds']] == [0, 1]  # before training, then each epoch
    assert ifnd['mtpr'] > 0 and ifnd['mtnr'] < 100
    paired = result['summary']['paired']['ifnd']['top1']
    assert paired['values'] == pytest.approx([runs['ifnd', s]['top1'] - runs['simclr', s]['top1']
                                              for s in (0, 1)])
    assert 'ifnd' in result['summary']['gap_closed']
    # The held-out images are never trained on.
    train = set(np.loadtxt(tmp_path / 'runs' / 'split' / 'train.txt', dtype=int))
    val = set(np.loadtxt(tmp_path / 'runs' / 'split' / 'val.txt', dtype=int))
    assert train and val and not train & val
    # Finished runs are read again, not retrained.
    again = bench.main(argv)
    assert [r['top1'] for r in again['runs']] == [r['top1'] for r in result['runs']]


def test_false_negatives_failed_run_does_not_cancel_the_others(tmp_path, monkeypatch):
    bench = _load('false_negatives')
    from benchmarks.fn_harness import cli
    tried = []

    def run_plan(plan, args):
        tried.append((plan['method'], plan['seed']))
        if (plan['method'], plan['seed']) == ('ifnd', 0):
            raise SystemExit('IFND seed 0: training failed with exit code 1 (log: train.log)')
        return None

    monkeypatch.setattr(cli, 'run_plan', run_plan)
    argv = ['--preset', 'cpu', '--methods', 'simclr', 'ifnd', 'supcon', '--seeds', '0', '1',
            '--jobs', '1', '--work-dir', str(tmp_path)]
    with pytest.raises(SystemExit, match=r'(?s)IFND seed 0: training failed.*1 of 6 run\(s\) '
                                         r'failed; the others are kept'):
        bench.main(argv)
    assert sorted(tried) == sorted((m, s) for m in ('simclr', 'ifnd', 'supcon') for s in (0, 1))


def test_false_negatives_reads_results(tmp_path):
    bench = _load('false_negatives')
    old, new = tmp_path / '20240101_000000', tmp_path / '20240102_000000'
    for run, values in ((old, [(1, 10.0)]), (new, [(2, 50.0), (4, 61.5)])):
        (run / 'vis_data').mkdir(parents=True)
        lines = [json.dumps({'loss': 1.0, 'step': 3})]
        lines += [json.dumps({'knn/top1': top1, 'step': step}) for step, top1 in values]
        (run / 'vis_data' / 'scalars.json').write_text('\n'.join(lines) + '\n')
    top1, step, history = bench.final_knn_top1(str(tmp_path), None)
    assert (top1, step) == (61.5, 4) and len(history) == 2
    (tmp_path / 'pseudo_labels').mkdir()
    rounds = [{'epoch': e, 'rate': e / 4, 'levels': [{'k': 10, 'mtpr': 1.0 * e, 'mtnr': 99.0},
                                                    {'k': 100, 'mtpr': 0.5 * e, 'mtnr': 99.5}]}
              for e in (0, 2, 4)]
    (tmp_path / 'pseudo_labels' / 'rounds.json').write_text(json.dumps(rounds))
    last, used = bench.last_round(str(tmp_path), None)
    assert (last['epoch'], used['epoch']) == (4, 2)
    assert bench.pick_level(last, 'finest') == {'k': 100, 'mtpr': 2.0, 'mtnr': 99.5}
    assert bench.pick_level(last, 0)['k'] == 10


def test_detection_over_training_weights_each_round_by_the_epochs_it_labels():
    bench = _load('false_negatives')
    rounds = [{'epoch': 0, 'levels': [{'mtpr': 0.0, 'mtnr': 100.0}, {'mtpr': 0.0, 'mtnr': 100.0}]},
              {'epoch': 1, 'levels': [{'mtpr': 40.0, 'mtnr': 90.0}, {'mtpr': 20.0, 'mtnr': 98.0}]},
              {'epoch': 3, 'levels': [{'mtpr': 60.0, 'mtnr': 80.0}, {'mtpr': 40.0, 'mtnr': 96.0}]}]
    # Epoch 1 trains on round 0's labels, epochs 2-3 on round 1's, epoch 4 on round 3's.
    got = bench.detection_over_training(rounds, 4)
    assert got['false_negatives_eliminated'] == pytest.approx((0 + 30 + 30 + 50) / 4)
    assert got['true_negatives_eliminated'] == pytest.approx((0 + 6 + 6 + 12) / 4)
    # A warm-up: the first round after epoch 3, so epochs 1-3 eliminate nothing.
    got = bench.detection_over_training(rounds[2:], 4)
    assert got['false_negatives_eliminated'] == pytest.approx((0 + 0 + 0 + 50) / 4)
    assert got['true_negatives_eliminated'] == pytest.approx((0 + 0 + 0 + 12) / 4)


def test_flagged_negatives_are_read_per_epoch_and_tabled(tmp_path):
    """Precision and recall of flagged negatives: the runs' own per-epoch scalars, in percent."""
    bench = _load('false_negatives')
    assert bench.flagged_negatives(str(tmp_path)) is None  # a run that did not log them
    runs = []
    for seed, recalls in enumerate(([0.1, 0.3], [0.2, 0.4])):
        work_dir = tmp_path / f'seed_{seed}'
        (work_dir / '20240101_000000' / 'vis_data').mkdir(parents=True)
        lines = [json.dumps({'loss': 1.0, 'step': 3})]
        lines += [json.dumps({'train/fn_precision': 50 + 10 * seed, 'train/fn_recall': 100 * r,
                              'step': e + 1})
                  for e, r in enumerate(recalls)]
        (work_dir / '20240101_000000' / 'vis_data' / 'scalars.json').write_text(
            '\n'.join(lines) + '\n')
        flagged = bench.flagged_negatives(str(work_dir))
        assert [e for e, _ in flagged['train/fn_recall']] == [1, 2]
        assert [v for _, v in flagged['train/fn_recall']] == pytest.approx([100 * r for r in recalls])
        assert flagged['train/fn_recall_mean'] == pytest.approx(50 * sum(recalls))
        assert flagged['train/fn_precision_mean'] == pytest.approx(50 + 10 * seed)
        for method, top1 in (('simclr', 80.0 + seed), ('supcon', 90.0), ('fnc_elim', 82.0)):
            runs.append({'method': method, 'seed': seed, 'top1': top1, 'top1_history': [(2, top1)],
                         'seconds': 1.0, **({'flagged': flagged} if method == 'fnc_elim' else {})})
    result = {'settings': {'seeds': [0, 1], 'cifar_stem': None, 'channels': None, 'epochs': 2,
                           'subset': 0.1, 'batch_size': 8, 'backbone': 'resnet18',
                           'eval_split': 'test', 'dataset': 'fmnist', 'preset': 'cpu'},
              'device': 'CPU', 'runs': runs, 'summary': bench.summarise(runs, [0, 1])}
    table = bench.markdown_tables(result)
    # precision 50 / 60 (mean 55, sd 7.07); recall means 20 / 30; last epoch 30 / 40.
    assert '| FNC-elim | 55.00 ± 7.07 | 25.00 ± 7.07 | 55.00 ± 7.07 | 35.00 ± 7.07 |' in table
    assert 'gap closed' in table and '| FNC-elim | support views flag negatives' in table
    runs[-1] = dict(runs[-1], flagged=None)  # seed 1 trained before the scalars were logged
    table = bench.markdown_tables(dict(result, runs=runs))
    assert '| FNC-elim (1 of 2 seeds) | 50.00 | 20.00 | 50.00 | 30.00 |' in table
    bench.plot(result, str(tmp_path / 'fn.png'))
    assert osp.getsize(tmp_path / 'fn.png') > 10_000


@pytest.mark.parametrize('method, option, expected', [
    ('debiased', 'model.tau_plu=0.05', "DebiasedCL takes no 'tau_plu'; did you mean debiased:model.tau_plus?"),
    ('fnc_elim', 'model.neck.hiden_dim=64', "(model.neck has no 'hiden_dim'); did you mean "
                                           "'model.neck.hidden_dim'?"),
    ('debiased', 'model.tau_plus=1.5', 'DebiasedCL tau_plus must be a float in [0, 1), got 1.5: the '
                                       'class prior τ⁺'),
    ('hard_negative', 'model.beta=-1', 'HardNegativeCL beta must be a float >= 0, got -1: the '
                                       'hardness β'),
    ('fnc_attr', 'model.top_k=0', 'FNC top_k must be an int >= 1'),
    ('fnc_elim', 'model.top_k=2.5', "config key 'model.top_k' must be int | None, got 2.5 (float)"),
])
def test_false_negatives_method_options_checked_before_any_training(capsys, method, option, expected):
    """A misspelt key or an out-of-range value fails the dry run, naming the method, the key and the fix."""
    with pytest.raises(SystemExit) as exit_info:
        _load('false_negatives').main(['--dry-run', '--seeds', '0', '--linear-epochs', '0',
                                       '--methods', 'simclr', method, '--method-options',
                                       f'{method}:{option}'])
    message = str(exit_info.value.code)
    assert message.startswith(f'error: --method-options {method}:{option}: ') and '\n' not in message
    assert expected in message
    assert '$ ' not in capsys.readouterr().out, 'no command is planned'


def test_false_negatives_checks_every_run_option_before_any_training(capsys):
    """A --cfg-options key the config does not take fails the dry run, not the run it reaches."""
    with pytest.raises(SystemExit) as exit_info:
        _load('false_negatives').main(['--dry-run', '--seeds', '0', '--linear-epochs', '0',
                                       '--methods', 'simclr', 'glofnd',
                                       '--cfg-options', 'model.temprature=0.1'])
    message = str(exit_info.value.code)
    assert message.startswith("error: simclr: the model of simclr_r18_200e_fmnist.py does not "
                              "build with the benchmark's settings: ")
    assert "unexpected keyword argument 'temprature'" in message
    assert '$ ' not in capsys.readouterr().out, 'no command is planned'


def test_false_negatives_method_options_for_a_method_not_run(capsys):
    bench = _load('false_negatives')
    with pytest.raises(SystemExit):
        bench.parse_args(['--methods', 'simclr', 'ifnd', '--method-options', 'debiased:model.tau_plus=0.05'])
    assert ('--method-options debiased:model.tau_plus=0.05: debiased is not in --methods (simclr ifnd); add '
            'it to --methods or drop the option') in capsys.readouterr().err
    # The preset's options of methods not run are not the user's: they are left alone.
    assert bench.parse_args(['--methods', 'simclr']).method_options['debiased'] == \
        bench.METHODS['debiased'].options['cpu']


def _write_run_files(work_dir, run, record):
    """The files a finished run leaves, rebuilt from its entry in a saved result."""
    def scalars(folder, series):
        (folder / '20240101_000000' / 'vis_data').mkdir(parents=True)
        lines = [json.dumps({key: value, 'step': step}) for key, history in series.items()
                 for step, value in history]
        (folder / '20240101_000000' / 'vis_data' / 'scalars.json').write_text('\n'.join(lines) + '\n')

    series = {'knn/top1': run['top1_history'], **{key: run['flagged'][key] for key in
                                                  ('train/fn_precision', 'train/fn_recall')
                                                  if run.get('flagged')}}
    scalars(work_dir, series)
    scalars(work_dir / 'linear', {'top1': [(run['top1_epoch'], run['linear_top1'])]})
    if 'rounds' in run:
        (work_dir / 'pseudo_labels').mkdir()
        (work_dir / 'pseudo_labels' / 'rounds.json').write_text(json.dumps(run['rounds']))
    (work_dir / 'run.json').write_text(json.dumps(record))


@pytest.mark.parametrize('protocol', ['cpu', 'digits', 'vit'])
def test_false_negatives_resummarises_a_published_result(tmp_path, capsys, protocol):
    """docs/false_negatives_<protocol>.json read back through --skip-train: same commands, runs,
    summary (the harness still plans the commands that made it)."""
    with open(osp.join(osp.dirname(BENCHMARKS), 'docs', f'false_negatives_{protocol}.json')) as f:
        saved = json.load(f)
    settings, work_dir = saved['settings'], tmp_path / 'runs'
    python = saved['runs'][0]['command']['pretrain'].split()[0]

    def moved(run):  # runs merged from earlier results name their own work dirs and interpreter
        root = run['command']['pretrain'].split('--work-dir ')[1].split()[0]
        root = root[:-len(f"/{run['method']}/seed_{run['seed']}")]
        own = run['command']['pretrain'].split()[0]
        return {key: text.replace(root, str(work_dir)).replace(own, python, 1)
                for key, text in run['command'].items()}

    for run in saved['runs']:
        commands = moved(run)
        _write_run_files(work_dir / run['method'] / f"seed_{run['seed']}", run,
                         {'commands': commands, 'seconds': run['seconds'],
                          'linear_seconds': run['linear_seconds']})
    threads = [] if settings['threads'] is None else ['--threads', str(settings['threads'])]
    argv = ['--skip-train', '--preset', settings['preset'], '--dataset', settings['dataset'],
            *threads, '--jobs', str(settings['jobs']),
            '--work-dir', str(work_dir), '--python', python, '--out', str(tmp_path / 'fn.json'),
            '--seeds', *map(str, settings['seeds']), '--methods', *settings['methods']]
    result = _load('false_negatives').main(argv)
    # Every saved run is read back (its command is the same); only pairs never run are left out.
    absent = len(settings['methods']) * len(settings['seeds']) - len(saved['runs'])
    assert capsys.readouterr().out.count('left out (--skip-train)') == absent
    with open(tmp_path / 'fn.json') as f:
        again = json.load(f)
    assert again['summary'] == saved['summary']
    # Settings the protocol gained since (methods added later, with their own options) aside.
    expected = dict(settings, work_dir=str(work_dir))
    got = {key: again['settings'][key] for key in expected}
    for options in (got, expected):
        options['method_options'] = {method: values for method, values in
                                     options['method_options'].items()
                                     if method in settings['methods']}
    assert got == expected
    for run in saved['runs']:
        run['command'] = moved(run)
    # Commands were compared above (every run read back); the measurements must be the same.
    def measured(runs):
        return sorted(({key: value for key, value in run.items() if key != 'command'}
                       for run in runs), key=lambda run: (run['method'], run['seed']))
    assert measured(again['runs']) == measured(saved['runs'])
    assert result['summary']['methods'].keys() == saved['summary']['methods'].keys()


def test_false_negatives_table_keeps_a_row_without_timings():
    """Runs that logged no seconds leave only the time cell empty, not the whole row."""
    from benchmarks.fn_harness import report
    with open(osp.join(osp.dirname(BENCHMARKS), 'docs', 'false_negatives_cpu.json')) as f:
        result = json.load(f)
    for run in result['runs']:
        run.pop('seconds', None)
    row = next(line for line in report.markdown_tables(result).splitlines()
               if line.startswith('| SimCLR |'))
    assert row.startswith('| SimCLR | instance labels | 76.76 ± 0.26 |') and row.endswith('| — |')


def _settings(argv):
    """The settings a result of ``argv`` records, as its JSON holds them."""
    from benchmarks.fn_harness.cli import _NOT_SETTINGS

    from ifnd.fileio import json_safe
    args = _load('false_negatives').parse_args(argv)
    return json.loads(json.dumps(json_safe({key: value for key, value in vars(args).items()
                                            if key not in _NOT_SETTINGS})))


def _synthetic_run(method, seed, top1, linear):
    return {'method': method, 'seed': seed, 'top1': top1, 'top1_epoch': 8,
            'top1_history': [[4, top1 - 5.0], [8, top1]], 'linear_top1': linear, 'seconds': 30.0,
            'linear_seconds': 20.0, 'command': {'pretrain': f'train {method} {seed}', 'linear': None}}


# Top-1 (kNN, linear) per method and seed: SimCLR and SupCon come from the earlier result.
EARLIER = {('simclr', 0): (90.0, 89.0), ('simclr', 1): (91.0, 90.5),
           ('supcon', 0): (96.0, 95.0), ('supcon', 1): (97.0, 95.5)}
NOW = {('oracle_elim', 0): (93.0, 92.0), ('oracle_elim', 1): (94.5, 93.0),
       ('debiased', 0): (90.5, 89.5), ('debiased', 1): (91.0, 91.0)}


def _previous_file(path, argv, runs, **changes):
    """An earlier result of ``argv`` holding ``runs`` (method, seed) -> (kNN, linear)."""
    settings = dict(_settings(argv), **changes)
    result = {'benchmark': 'false_negatives', 'device': 'CPU: earlier machine',
              'wall_seconds': 123.0, 'settings': settings, 'summary': {},
              'runs': [_synthetic_run(m, s, *top1) for (m, s), top1 in runs.items()]}
    path.write_text(json.dumps(result))
    return str(path)


def test_false_negatives_previous_merges_earlier_runs(tmp_path, capsys):
    """--previous: the earlier result's runs join this invocation's in the table, JSON and plot."""
    bench = _load('false_negatives')
    base = ['--preset', 'digits', '--seeds', '0', '1', '--threads', '1']
    previous = _previous_file(tmp_path / 'earlier.json',
                              [*base, '--methods', 'simclr', 'supcon', '--jobs', '5',
                               '--work-dir', '/elsewhere'], EARLIER)
    argv = [*base, '--methods', 'oracle_elim', 'debiased', '--work-dir', str(tmp_path / 'runs'),
            '--skip-train', '--previous', previous, '--out', str(tmp_path / 'merged.json'),
            '--plot', str(tmp_path / 'merged.png')]
    # This invocation's runs, finished: their logged scalars and run.json, no training.
    for plan in bench.make_plans(bench.parse_args(argv)):
        run = _synthetic_run(plan['method'], plan['seed'], *NOW[plan['method'], plan['seed']])
        commands = {'pretrain': shlex.join(plan['cmd']), 'linear': shlex.join(plan['linear_cmd'])}
        _write_run_files(tmp_path / 'runs' / plan['method'] / f"seed_{plan['seed']}", run,
                         {'commands': commands, 'seconds': 30.0, 'linear_seconds': 20.0})
    capsys.readouterr()
    result = bench.main(argv)
    out = capsys.readouterr().out
    assert f'Merged from {previous}: 4 run(s)' in out and 'left out' not in out
    assert sorted((r['method'], r['seed']) for r in result['runs']) == sorted({**EARLIER, **NOW})
    settings = result['settings']
    assert settings['methods'] == ['simclr', 'supcon', 'oracle_elim', 'debiased']
    assert settings['seeds'] == [0, 1]
    assert settings['simclr_config'] == 'configs/simclr/simclr_r18_8e_digits.py'
    assert settings['jobs'] == 1 and settings['work_dir'] == str(tmp_path / 'runs')
    assert result['device'].endswith('; earlier runs on CPU: earlier machine')
    assert result['merged_from'] == [{'file': previous, 'device': 'CPU: earlier machine',
                                      'wall_seconds': 123.0,
                                      'runs': [[m, s] for m, s in EARLIER]}]
    # The statistics pair the runs across the two results.
    summary = result['summary']
    assert summary['paired']['oracle_elim']['top1']['values'] == pytest.approx([3.0, 3.5])
    assert summary['gap_closed']['oracle_elim']['top1']['share'] == pytest.approx(6.5 / 12.0)
    assert summary['paired']['debiased']['linear_top1']['values'] == pytest.approx([0.5, 0.5])
    assert '4 of the 8 runs read from earlier.json' in out
    for title in ('SimCLR', 'SupCon', 'Oracle-elim', 'Debiased'):
        assert f'| {title} |' in out
    with open(tmp_path / 'merged.json') as f:
        saved = json.load(f)
    assert saved['summary']['methods'].keys() == {'simclr', 'supcon', 'oracle_elim', 'debiased'}
    assert saved['merged_from'][0]['file'] == previous
    assert osp.getsize(tmp_path / 'merged.png') > 10_000
    # The merged file merges again, its own sources kept; seed 2 of SimCLR and SupCon, planned
    # here, is not finished, so the eight merged runs are all there is.
    again = _load('false_negatives').main(
        ['--preset', 'digits', '--seeds', '2', '--threads', '1', '--methods', 'simclr', 'supcon',
         '--work-dir', str(tmp_path / 'more'), '--skip-train', '--previous',
         str(tmp_path / 'merged.json')])
    assert len(again['runs']) == 8  # seed 2 is not finished: nothing of it is read
    assert again['settings']['seeds'] == [0, 1, 2]
    assert again['merged_from'][0]['merged_from'][0]['file'] == previous


def test_false_negatives_previous_refused_when_the_settings_differ(tmp_path, capsys):
    """Any difference but which runs were made, where and how fast is named before training."""
    bench = _load('false_negatives')
    base = ['--preset', 'digits', '--seeds', '0', '1']
    earlier = [*base, '--methods', 'simclr', 'debiased', 'glofnd']
    argv = [*base, '--methods', 'debiased', 'oracle_elim', '--dry-run']
    # Methods, seeds, work dir, jobs, threads and the settings of methods not trained here: fine.
    fine = _previous_file(tmp_path / 'fine.json', earlier, EARLIER, work_dir='/elsewhere',
                          jobs=7, threads=3, seeds=[0, 1, 5], glofnd_config='other.py',
                          method_options=dict(bench.own_options('digits'),
                                              glofnd={'model.detector.alpha': 0.3}))
    assert bench.main([*argv, '--previous', fine]) == {}
    assert 'Merged from' in capsys.readouterr().out
    # An earlier debiased run this invocation does not train again (seed 5) would be mixed with
    # its own: its settings must agree.
    bad = _previous_file(tmp_path / 'bad.json', earlier, {**EARLIER, ('debiased', 5): (90.0, 89.0)},
                         epochs=9, eval_split='val',
                         method_options=dict(bench.own_options('digits'),
                                             debiased={'model.tau_plus': 0.5}))
    with pytest.raises(SystemExit) as exit_info:
        bench.main([*argv, '--previous', bad])
    message = str(exit_info.value.code)
    assert message.startswith(f'--previous {bad}: its settings differ from this invocation\'s in ')
    assert 'epochs: 9 there, 8 here' in message
    assert "eval_split: 'val' there, 'test' here" in message
    tau_plus = bench.METHODS['debiased'].options['digits']['model.tau_plus']
    assert ("method_options of debiased: ['model.tau_plus=0.5'] there, "
            f"['model.tau_plus={tau_plus}'] here") in message
    assert 'glofnd' not in message and 'work_dir' not in message.split('. ')[0]
    assert '$ ' not in capsys.readouterr().out, 'no command is planned'
    # A method trained again on every seed the earlier result has replaces its runs, whatever
    # its settings were.
    replaced = _previous_file(tmp_path / 'replaced.json', earlier,
                              {**EARLIER, ('debiased', 0): (80.0, 79.0), ('debiased', 1): (81.0, 80.0)},
                              debiased_config='former.py',
                              method_options=dict(bench.own_options('digits'),
                                                  debiased={'model.tau_plus': 0.5}))
    assert bench.main([*argv, '--previous', replaced]) == {}
    capsys.readouterr()
    # The same option written as text on the command line is the same setting.
    texts = _previous_file(tmp_path / 'texts.json', earlier, EARLIER, method_options={
        'debiased': {'model.tau_plus': str(tau_plus)}})
    bench.main([*argv, '--previous', texts])
    # One method and seed in two earlier results is ambiguous.
    with pytest.raises(SystemExit,
                       match=r'simclr seed 0 is in both .*fine\.json and .*texts\.json'):
        bench.main([*argv, '--previous', fine, '--previous', texts])
    # A file that is not a result of this benchmark.
    (tmp_path / 'other.json').write_text(json.dumps({'benchmark': 'step_cost', 'rows': []}))
    (tmp_path / 'broken.json').write_text('{"benchmark": ')
    for name, expected in (('other.json', 'not a false_negatives result'),
                           ('broken.json', 'not JSON'), ('missing.json', 'cannot be read')):
        with pytest.raises(SystemExit, match=expected):
            bench.main([*argv, '--previous', str(tmp_path / name)])


@pytest.mark.parametrize('change, problem', [
    (lambda r: r['runs'][1].update(top1=250.0),
     'runs[1].top1 is 250.0, not a number in [0, 100] (a percentage)'),
    (lambda r: r['runs'][0].update(linear_top1='ninety'),
     "runs[0].linear_top1 is 'ninety', not a number in [0, 100] (a percentage) or null"),
    (lambda r: r['runs'][2].update(top1=math.nan), 'runs[2].top1 is nan, not a number'),
    (lambda r: r['runs'][0].update(top1_history=[4, 85.0]),
     'runs[0].top1_history[0] is 4, not a list of 2 (an int >= 0, a number in [0, 100]'),
    (lambda r: r.update(runs={'simclr': r['runs']}), "runs is {'simclr': [{'method': "),
    (lambda r: r['settings'].update(seeds=[0, 1.5]), 'settings.seeds[1] is 1.5, not an int'),
    (lambda r: r['runs'][3].pop('top1'), 'runs[3].top1 is missing (a number in [0, 100]'),
    (lambda r: r['runs'][3].update(seed=True), 'runs[3].seed is True, not an int in [0, 2**32)'),
    (lambda r: r['runs'][0].update(method='ifnd'), 'runs[0].rounds is missing (a list, which '
                                                   'ifnd runs have)'),
], ids=['top1-250', 'ninety', 'nan', 'flat-history', 'runs-a-mapping', 'float-seed',
        'no-top1', 'bool-seed', 'ifnd-without-rounds'])
def test_false_negatives_previous_values_checked_before_any_training(tmp_path, capsys, change,
                                                                     problem):
    """A value the tables would misread (a top-1 of 250 or 'ninety', NaN, wrong nesting) is named
    with its file and its path inside, before anything is planned."""
    bench = _load('false_negatives')
    base = ['--preset', 'digits', '--seeds', '0', '1']
    path = _previous_file(tmp_path / 'earlier.json', [*base, '--methods', 'simclr', 'supcon'],
                          EARLIER)
    result = json.loads((tmp_path / 'earlier.json').read_text())
    change(result)
    (tmp_path / 'earlier.json').write_text(json.dumps(result))  # NaN as NaN, as json writes it
    with pytest.raises(SystemExit) as exit_info:
        bench.main([*base, '--methods', 'debiased', '--dry-run', '--previous', path])
    message = str(exit_info.value.code)
    assert message.startswith(f'--previous {path}: {problem}') and '\n' not in message
    assert message.endswith('; correct that value, or give the JSON file an earlier run wrote '
                            'with --out')
    assert '$ ' not in capsys.readouterr().out, 'no command is planned'


@pytest.mark.parametrize('content, problem', [
    ('[' * 100_000 + ']' * 100_000, 'nested deeper than 64 levels'),
    (b'{"benchmark": "false_negatives", "device": "\xff"}', 'not UTF-8 text (byte 44)'),
], ids=['deep', 'not-utf-8'])
def test_false_negatives_previous_unreadable_files(tmp_path, content, problem):
    path = tmp_path / 'earlier.json'
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(SystemExit) as exit_info:
        _load('false_negatives').main(['--preset', 'digits', '--methods', 'simclr', '--dry-run',
                                       '--previous', str(path)])
    assert str(exit_info.value.code) == (f'--previous {path}: {problem}; give the JSON file an '
                                         'earlier run wrote with --out')


SLOT_METHODS = ('simclr', 'ifnd', 'supcon', 'oracle_elim_linear')


def test_false_negatives_gpu_slot_plans_one_seed_of_four_methods_on_full_fashion_mnist(
        tmp_path, capsys):
    """--preset gpu-slot --dry-run: the four methods once on all 60,000 images at the slot's
    budget; the seed is the first no --previous result has."""
    bench = _load('false_negatives')
    slot = ['--preset', 'gpu-slot', '--dry-run']
    assert bench.main(slot) == {}
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith('$ ')]
    assert len(commands) == 2 * len(SLOT_METHODS)
    pretrain, linear = commands[0::2], commands[1::2]
    budget = ['randomness.seed=0', 'train_cfg.max_epochs=8', 'train_dataloader.batch_size=256',
              'optim_wrapper.optimizer.lr=0.5', 'param_scheduler.0.end=1',
              'model.backbone.cifar_stem=True', "'model.backbone.channels=(64,128,256,512)'",
              'model.backbone.channels_last=True', 'model.neck.hidden_dim=512',
              'model.temperature=0.2', 'train_dataloader.dataset.augment_on=device',
              'train_dataloader.num_workers=0', '--amp']
    for line, method in zip(pretrain, SLOT_METHODS, strict=True):
        assert f' {bench.METHODS[method].config("fmnist")} ' in line and f'/{method}/seed_0 ' in line
        assert set(budget) <= set(line.split())
        assert 'subset_fraction' not in line  # all of the training split
    # IFND clusters after every epoch (nredo 2), the oracle accepts on that schedule; kNN every 4.
    assert {'custom_hooks.0.interval=1', 'custom_hooks.0.kmeans.nredo=2',
            'custom_hooks.1.interval=4'} <= set(pretrain[1].split())
    assert 'model.detector.acceptance.interval=1' in pretrain[3].split()
    for line in linear:
        assert 'linear_r18_100e_fmnist.py' in line
        assert {'train_cfg.max_epochs=10', 'train_dataloader.dataset.augment_on=device',
                'model.backbone.channels_last=True', '--amp'} <= set(line.split())
    args = bench.parse_args(slot)
    assert (args.jobs, args.time_limit, args.seeds, args.subset) == (4, 480.0, [0], 1.0)
    # Two slots' results: the next run trains seed 2.
    runs = {(m, s): (80.0 + s, 79.0) for m in SLOT_METHODS for s in (0, 1)}
    previous = _previous_file(tmp_path / 'slots.json', [*slot, '--seeds', '0', '1'], runs)
    result = json.loads((tmp_path / 'slots.json').read_text())
    for run in result['runs']:
        if run['method'] == 'ifnd':  # the clustering methods' runs carry their rounds
            run.update(rounds=[], detection={'false_negatives_eliminated': 10.0,
                                             'true_negatives_eliminated': 0.5})
    (tmp_path / 'slots.json').write_text(json.dumps(result))
    assert bench.main([*slot, '--previous', previous]) == {}
    pretrain = [line for line in capsys.readouterr().out.splitlines() if line.startswith('$ ')][::2]
    assert len(pretrain) == 4
    assert all('randomness.seed=2' in line.split() and '/seed_2 ' in line for line in pretrain)


@pytest.mark.skipif(torch.cuda.is_available(), reason='the refusal is for machines without CUDA')
def test_false_negatives_gpu_slot_refused_without_cuda(tmp_path):
    """Without CUDA the slot preset trains only as a rehearsal; the refusal says what to add."""
    with pytest.raises(SystemExit, match=r'^error: --preset gpu-slot is sized for 8 minutes of '
                                         r'one GPU and no CUDA device is here: add --dry-run .* '
                                         r'or --rehearse'):
        _load('false_negatives').main(['--preset', 'gpu-slot', '--work-dir', str(tmp_path)])
    assert not list(tmp_path.iterdir())  # nothing started


def test_false_negatives_time_limit_stops_a_run_and_skips_one_that_cannot_finish(tmp_path,
                                                                                  capsys):
    bench = _load('false_negatives')
    from benchmarks.fn_harness import running
    args = bench.parse_args(['--preset', 'digits', '--work-dir', str(tmp_path)])
    args.time_limit_clock = running.TimeLimit(1.0)
    plan = {'method': 'simclr', 'seed': 0, 'work_dir': str(tmp_path / 'simclr'),
            'cmd': [sys.executable, '-c', 'import time; time.sleep(60)'], 'linear_cmd': None}
    tic = time.monotonic()
    assert running.run_plan(plan, args) is None
    assert time.monotonic() - tic < 20  # stopped at the limit, not after its 60 s
    assert not (tmp_path / 'simclr' / 'run.json').exists()
    assert 'SimCLR seed 0: stopped at the time limit (1 s); not finished' in capsys.readouterr().out
    # Once a run took longer than the time left, the next one is not started.
    args.time_limit_clock = running.TimeLimit(60.0)
    args.time_limit_clock.record(100.0)
    assert running.run_plan(dict(plan, method='ifnd'), args) is None
    assert 'IFND seed 0: not started: 60 s of the time limit left, a run here took 100 s' in \
        capsys.readouterr().out
    assert not (tmp_path / 'ifnd').exists()


def test_false_negatives_time_limit_with_no_run_finished(tmp_path, monkeypatch, capsys):
    """Runs stopped by the time limit are named, and one line says nothing finished."""
    bench = _load('false_negatives')
    from benchmarks.fn_harness import cli
    monkeypatch.setattr(cli, 'run_plan', lambda plan, args: None)
    with pytest.raises(SystemExit, match=r'^no run finished in the time limit \(5 s\); nothing '
                                         r'to report: raise --time-limit'):
        bench.main(['--preset', 'digits', '--methods', 'simclr', 'supcon', '--seeds', '3',
                    '--time-limit', '5', '--work-dir', str(tmp_path)])
    assert ('2 of 2 run(s) not finished in the time limit (5 s): SimCLR seed 3, SupCon seed 3; '
            'the same command again trains them') in capsys.readouterr().out


# About 40 s on 2 idle cores (8 training processes, their start-up most of it): one epoch on
# half of digits and no probes keep it so (the slot's probe commands are checked by the dry run
# above; the preset's own rehearsal trains 2 epochs and the probes).
def test_false_negatives_gpu_slot_rehearsal_adds_a_seed_per_run(tmp_path):
    """--rehearse trains the slot's four runs at toy size on the CPU; each run with the last
    result as --previous adds the next seed, merged into one result."""
    bench = _load('false_negatives')
    slot = ['--preset', 'gpu-slot', '--rehearse', '--epochs', '1', '--subset', '0.5',
            '--linear-epochs', '0', '--work-dir', str(tmp_path / 'runs')]
    first = bench.main([*slot, '--out', str(tmp_path / 'slot_1.json')])
    assert sorted((r['method'], r['seed']) for r in first['runs']) == \
        sorted((m, 0) for m in SLOT_METHODS)
    assert first['settings']['dataset'] == 'digits' and first['settings']['augment_on'] == 'device'
    second = bench.main([*slot, '--previous', str(tmp_path / 'slot_1.json'),
                         '--out', str(tmp_path / 'slot_2.json')])
    saved = json.loads((tmp_path / 'slot_2.json').read_text())
    assert saved['settings']['seeds'] == [0, 1]
    assert sorted((r['method'], r['seed']) for r in saved['runs']) == \
        sorted((m, s) for m in SLOT_METHODS for s in (0, 1))
    for method in SLOT_METHODS:
        assert saved['summary']['methods'][method]['top1']['seeds'] == [0, 1]
    assert saved['summary']['paired']['ifnd']['top1']['seeds'] == [0, 1]
    assert [r['seed'] for r in second['runs'] if r['method'] == 'ifnd'] == [1, 0]
    assert (tmp_path / 'runs' / 'ifnd' / 'seed_1' / 'run.json').is_file()
    ifnd = next(r for r in second['runs'] if r['method'] == 'ifnd')
    assert [r['epoch'] for r in ifnd['rounds']] == [0, 1]  # its clustering rounds were read


def test_the_harness_shows_each_rounds_accepted_share_and_flag_precision():
    """Runs whose rounds carry the flags' precision get an acceptance table per clustering method;
    runs without them get none."""
    from benchmarks.fn_harness import report
    with open(osp.join(osp.dirname(BENCHMARKS), 'docs', 'false_negatives_cpu.json')) as f:
        result = json.load(f)
    before = report.markdown_tables(result)
    # IFND's published runs predate the flags' precision in rounds.json; the confident labels' have it.
    assert '\nIFND acceptance per clustering round' not in before
    assert '\nIFND, confident labels acceptance per clustering round' in before
    for run in result['runs']:
        for number, rnd in enumerate(run.get('rounds') or []):
            for level in rnd['levels']:
                level.update(accept_rate=0.25, flag_precision=80.0 + number, flag_recall=10.0)
    table = report.markdown_tables(result).split('\nIFND acceptance per clustering round', 1)[1]
    assert '| 0 | 25.0% · 80.0 / 10.0 | 25.0% · 80.0 / 10.0 | 25.0% · 80.0 / 10.0 |' in table
    assert '| 3 | 25.0% · 81.0 / 10.0 |' in table


@pytest.mark.parametrize('value', ['nan', 'inf', '-1'])
def test_false_negatives_refuses_a_time_limit_that_would_not_limit(capsys, value):
    """A NaN compares false with everything: it meant no limit at all."""
    with pytest.raises(SystemExit):
        _load('false_negatives').main(['--dry-run', '--seeds', '0', '--time-limit', value])
    assert f'--time-limit must be a finite number of seconds >= 0 (0: no limit), got {float(value)}' \
        in capsys.readouterr().err


def test_every_benchmark_entry_point_runs_as_a_script_from_anywhere(tmp_path):
    """``python benchmarks/NAME.py``, as older docs and habit type it, works like ``python -m
    benchmarks.NAME`` (here: its help), also started from another folder."""
    entries = sorted(name[:-3] for name in os.listdir(BENCHMARKS)
                     if name.endswith('.py') and "if __name__ == '__main__'" in open(osp.join(BENCHMARKS, name)).read())
    assert {'false_negatives', 'gpu_report', 'step_cost'} <= set(entries)
    started = {name: subprocess.Popen([sys.executable, osp.join(BENCHMARKS, f'{name}.py'), '--help'], cwd=tmp_path,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for name in entries}
    for name, process in started.items():
        out = process.communicate(timeout=120)[0]
        assert process.returncode == 0 and out.startswith(f'usage: {name}.py'), out[-2000:]
        if name in ('step_cost', 'clustering_cost', 'false_negatives'):
            assert re.search(r'--out\b', out), out
