"""The false-negative harness's ViT protocol: its presets' commands (the ViT configs, the budget's
ViT sizes reaching pre-training and probe), the GPU slot's plan and refusal, and a rehearsal that
trains and probes MoCo v3 with and without IFND at toy size."""
import importlib
import json

import pytest
import torch

from ifnd.fileio.checkpoint import read_checkpoint


def _load(name):
    """The benchmark module ``benchmarks.<name>``."""
    return importlib.import_module(f'benchmarks.{name}')


VIT_METHODS = ('simclr', 'mocov3', 'ifnd', 'ifnd_nested', 'ifnd_mocov3', 'supcon', 'oracle_elim_linear',
               'hcsc')


def test_false_negatives_vit_protocol_commands(capsys):
    """--preset vit: SimCLR and MoCo v3, IFND on each, the oracles and HCSC on their ViT configs,
    three seeds, the ViT cut to 4 blocks 96 wide, and the probe on the same ViT."""
    bench = _load('false_negatives')
    assert bench.main(['--preset', 'vit', '--dry-run']) == {}
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith('$ ')]
    assert len(commands) == 2 * len(VIT_METHODS) * 3
    pretrain, linear = commands[0::2], commands[1::2]
    budget = {'train_cfg.max_epochs=12', 'train_dataloader.dataset.subset_fraction=0.05',
              'train_dataloader.batch_size=128', 'optim_wrapper.optimizer.lr=0.001',
              'model.backbone.embed_dim=96', 'model.backbone.depth=4',
              'model.backbone.num_heads=3', 'train_dataloader.dataset.augment_on=device'}
    for i, line in enumerate(pretrain):
        method, seed = VIT_METHODS[i % len(VIT_METHODS)], i // len(VIT_METHODS)
        assert f' {bench.METHODS[method].config("fmnist_vit")} ' in line
        assert '_vit-tiny-p4_200e_fmnist.py' in line and f'randomness.seed={seed} ' in line
        assert budget <= set(line.split()) and 'model.backbone.channels' not in line
    assert 'custom_hooks.0.warmup_epochs=1' in pretrain[VIT_METHODS.index('hcsc')]
    for line in linear:
        assert 'linear_vit-tiny-p4_100e_fmnist.py' in line
        assert {'model.backbone.embed_dim=96', 'model.backbone.depth=4'} <= set(line.split())
    # A ViT method on a ResNet protocol is named as missing, not silently trained on a ResNet.
    with pytest.raises(SystemExit, match='mocov3 has no config for --dataset fmnist'):
        bench.main(['--preset', 'cpu', '--methods', 'mocov3', '--dry-run'])


def test_false_negatives_vit_gpu_slot_plans_four_vit_runs(capsys):
    """--preset vit-gpu-slot --dry-run: SimCLR and MoCo v3 with and without IFND once, on all of
    Fashion-MNIST with the configs' ViT-Tiny in bfloat16; refused without CUDA like gpu-slot."""
    bench = _load('false_negatives')
    assert bench.main(['--preset', 'vit-gpu-slot', '--dry-run']) == {}
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith('$ ')]
    pretrain = commands[0::2]
    assert [line.split('tools/train.py ')[1].split()[0] for line in pretrain] == [
        'configs/simclr/simclr_vit-tiny-p4_200e_fmnist.py', 'configs/ifnd/ifnd_vit-tiny-p4_200e_fmnist.py',
        'configs/mocov3/mocov3_vit-tiny-p4_200e_fmnist.py',
        'configs/ifnd/ifnd_mocov3_vit-tiny-p4_200e_fmnist.py']
    for line in pretrain:
        assert {'--amp', 'train_cfg.max_epochs=10', 'optim_wrapper.optimizer.lr=0.0005'} <= \
            set(line.split())
        assert 'subset_fraction' not in line and 'embed_dim' not in line
    args = bench.parse_args(['--preset', 'vit-gpu-slot', '--rehearse', '--dry-run'])
    assert (args.dataset, args.embed_dim, args.depth, args.subset) == ('fmnist_vit', 32, 1, 0.01)
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match=r'^error: --preset vit-gpu-slot is sized for 8 '
                                             r'minutes of one GPU'):
            bench.main(['--preset', 'vit-gpu-slot', '--work-dir', '/nonexistent/never'])


# About 30 s on 2 idle cores: the ViT protocol's two MoCo v3 methods at rehearsal size (a one-block
# ViT 32 wide, 1% of Fashion-MNIST), one epoch and a one-epoch probe each.
def test_false_negatives_vit_rehearsal_trains_and_probes_moco_v3_with_and_without_ifnd(tmp_path, fashion_mnist):
    bench = _load('false_negatives')
    result = bench.main(['--preset', 'vit', '--rehearse', '--methods', 'mocov3', 'ifnd_mocov3',
                         '--seeds', '0', '--epochs', '1', '--jobs', '2',
                         '--work-dir', str(tmp_path / 'runs'), '--out', str(tmp_path / 'vit.json')])
    runs = {run['method']: run for run in result['runs']}
    assert set(runs) == {'mocov3', 'ifnd_mocov3'}
    for run in runs.values():
        assert 0 <= run['top1'] <= 100 and 0 <= run['linear_top1'] <= 100
    assert [r['epoch'] for r in runs['ifnd_mocov3']['rounds']] == [0, 1]
    saved = json.loads((tmp_path / 'vit.json').read_text())['settings']
    assert (saved['dataset'], saved['embed_dim'], saved['depth']) == ('fmnist_vit', 32, 1)
    checkpoint = read_checkpoint(str(tmp_path / 'runs' / 'mocov3' / 'seed_0' / 'epoch_1.pth'))
    backbone = checkpoint['meta']['cfg']['model']['backbone']
    assert (backbone['type'], backbone['embed_dim'], backbone['patch_size']) == ('ViTBackbone', 32, 4)
