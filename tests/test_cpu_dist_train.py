"""The headline command, tools/dist_train.sh on the ImageNet recipe, on a machine without a GPU:
gloo processes instead of NCCL ones, the recipe's device views, compiled encoder and clustering
rounds kept; a run killed after its first checkpoint resumes to the uninterrupted run's end."""
import os
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch
from fake_data import rgb_image
from helpers import free_port
from test_faults import _assert_same

from ifnd.engine.cli import init_distributed_without_cuda, runner_config

REPO = osp.abspath(osp.join(osp.dirname(__file__), '..'))
TESTS = osp.dirname(osp.abspath(__file__))
RECIPE = osp.join(REPO, 'configs', 'ifnd_r50_200e_in1k.py')

needs_cpu_only = pytest.mark.skipif(torch.cuda.is_available(),
                                    reason='the CPU path: with CUDA, mmengine starts the group')


def _torchrun_env(monkeypatch, world_size: int = 1) -> None:
    monkeypatch.setenv('RANK', '0')
    monkeypatch.setenv('LOCAL_RANK', '0')
    monkeypatch.setenv('WORLD_SIZE', str(world_size))
    monkeypatch.setenv('MASTER_ADDR', '127.0.0.1')
    monkeypatch.setenv('MASTER_PORT', str(free_port()))


@needs_cpu_only
def test_nccl_asked_for_without_cuda_is_refused_in_one_line(monkeypatch, tmp_path):
    _torchrun_env(monkeypatch)
    options = {'env_cfg.dist_cfg.backend': 'nccl'}
    cfg = runner_config(RECIPE, str(tmp_path), cfg_options=options, launcher='pytorch')
    with pytest.raises(SystemExit, match='backend=nccl needs CUDA GPUs and none is available'):
        init_distributed_without_cuda(cfg, options)
    assert not torch.distributed.is_initialized()


@needs_cpu_only
def test_cpu_launch_starts_gloo_and_wraps_without_device_ids(monkeypatch, tmp_path):
    _torchrun_env(monkeypatch)
    cfg = runner_config(RECIPE, str(tmp_path), launcher='pytorch')
    assert cfg.env_cfg.dist_cfg.backend == 'nccl'  # the recipe's GPU default
    try:
        init_distributed_without_cuda(cfg)
        assert torch.distributed.get_backend() == 'gloo'
        assert cfg.env_cfg.dist_cfg.backend == 'gloo'
        assert cfg.model_wrapper_cfg.type == 'MMDistributedDataParallel'
        assert cfg.model_wrapper_cfg.device_ids is None  # a CPU module takes none
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def test_launcher_none_changes_nothing(tmp_path):
    cfg = runner_config(RECIPE, str(tmp_path))
    init_distributed_without_cuda(cfg)
    assert 'model_wrapper_cfg' not in cfg and cfg.env_cfg.dist_cfg.backend == 'nccl'


def test_slurm_train_runs_cpu_tasks_when_no_gpus_per_node(tmp_path):
    """GPUS_PER_NODE=0 asks srun for CPU tasks (no --gres), TASKS_PER_NODE of them per node."""
    fake = tmp_path / 'bin'
    fake.mkdir()
    (fake / 'srun').write_text('#!/bin/sh\necho "$@"\n')
    (fake / 'srun').chmod(0o755)
    env = dict(os.environ, PATH=f'{fake}:{os.environ["PATH"]}')

    def srun_args(**extra) -> str:
        done = subprocess.run(['bash', 'tools/slurm_train.sh', 'part', 'job', 'configs/x.py'], cwd=REPO,
                              env={**env, **extra}, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout

    cpu = srun_args(GPUS='4', GPUS_PER_NODE='0', TASKS_PER_NODE='2')
    assert '--gres' not in cpu and '--ntasks=4 --ntasks-per-node=2' in cpu and '--launcher slurm' in cpu
    assert '--gres=gpu:8 --ntasks=8 --ntasks-per-node=8' in srun_args()  # the GPU default unchanged


def _imagenet_folder(root) -> str:
    """data_root/{train,val}/<wnid>/*.JPEG: 3 classes, 8 training and 3 validation JPEGs each, 36-55 px."""
    rng = np.random.default_rng(0)
    for split, count in (('train', 8), ('val', 3)):
        for c in range(3):
            folder = root / split / f'n0000000{c}'
            folder.mkdir(parents=True)
            for i in range(count):
                w, h = (int(s) for s in rng.integers(36, 56, 2))
                rgb_image(100 * c + 10 * (split == 'val') + i, (w, h)).save(folder / f'{i}.JPEG', quality=90)
    return str(root)


def _leaf_config(path, data_root: str) -> str:
    """The recipe with what --cfg-options cannot say: a compile dict and one more hook."""
    with open(path, 'w') as f:
        f.write(f"_base_ = [{RECIPE!r}]\n"
                # aot_eager: dynamo and AOTAutograd as with inductor, without its C++ code generation,
                # which takes about 80 s per process and launch on a 2-core CPU (a 6-minute test).
                "model = dict(backbone=dict(compile=dict(_delete_=True, backend='aot_eager')))\n"
                "custom_imports = dict(imports=['fault_injection'], allow_failed_imports=False)\n"
                "custom_hooks = [*_base_.custom_hooks, dict(type='FaultInjectionHook')]\n")
    return str(path)


def _dist_train(cfg: str, data_root: str, work_dir, fault: str = '', resume: bool = False):
    """tools/dist_train.sh CONFIG 2 with the model, images, batch and epochs shrunk."""
    env = dict(os.environ, IFND_FAULT=fault, OMP_NUM_THREADS='1', PORT=str(free_port()),
               PATH=os.pathsep.join([osp.dirname(sys.executable), os.environ['PATH']]),
               PYTHONPATH=os.pathsep.join([TESTS, os.environ.get('PYTHONPATH', '')]))
    options = [
        f'train_dataloader.dataset.data_root={data_root}', f'custom_hooks.1.val_dataset.data_root={data_root}',
        'train_dataloader.batch_size=4', 'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False',
        'train_dataloader.dataset.augment_on=device',  # JPEGs decoded and views made in the preprocessor
        'train_dataloader.dataset.pipeline.transforms.size=32',
        'model.backbone.model_name=resnet18', 'model.backbone.channels=(8,16,32,64)',
        'model.neck.hidden_dim=64', 'model.neck.out_dim=32', 'model.queue_len=64',
        'custom_hooks.0.num_clusters=[3,6]', 'custom_hooks.0.kmeans.nredo=1', 'custom_hooks.0.kmeans.niter=5',
        'custom_hooks.0.kmeans.min_points_per_centroid=1',
        'custom_hooks.0.kmeans.backend=torch',  # sharded over the 2 processes
        'custom_hooks.0.batch_size=16', 'custom_hooks.0.num_workers=0', 'custom_hooks.0.pipeline.size=32',
        'custom_hooks.1.interval=1', 'custom_hooks.1.k=5', 'custom_hooks.1.batch_size=16',
        'custom_hooks.1.num_workers=0', 'custom_hooks.1.pipeline.size=32',
        'default_hooks.checkpoint.interval=1', 'default_hooks.logger.interval=1',
        'train_cfg.max_epochs=2', 'randomness.deterministic=True']
    cmd = ['bash', osp.join(REPO, 'tools', 'dist_train.sh'), cfg, '2', '--work-dir', str(work_dir),
           *(['--resume'] if resume else []), '--cfg-options', *options]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
                          start_new_session=True)


def _final(work_dir) -> dict:
    ckpt = torch.load(osp.join(work_dir, 'epoch_2.pth'), weights_only=False)
    labels = np.load(osp.join(work_dir, 'pseudo_labels', 'epoch_0002.npz'))['labels']
    return dict(state_dict=ckpt['state_dict'], optimizer=ckpt['optimizer'],
                position=(ckpt['meta']['epoch'], ckpt['meta']['iter']), labels=torch.from_numpy(labels))


# Slow but needed (about 100 s on an idle 2-core CPU, 5 min on a loaded one): the only test of the
# headline command itself (torchrun, 2 gloo processes, the real recipe), which single-process
# tests cannot stand for.
@needs_cpu_only
def test_dist_train_on_cpu_trains_and_resumes_exactly(tmp_path):
    """Two epochs with clustering rounds and kNN, killed after epoch 1's checkpoint and resumed,
    equal an uninterrupted run: weights, buffers (queue, label bank), optimiser, pseudo labels."""
    data_root = _imagenet_folder(tmp_path / 'imagenet')
    cfg = _leaf_config(tmp_path / 'cfg.py', data_root)

    done = _dist_train(cfg, data_root, tmp_path / 'whole')
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert 'NVIDIA driver' not in log and "dist_cfg: {'backend': 'gloo'}" in log
    assert 'k-means: torch on cpu (sharded over 2 processes)' in log
    assert 'After 2 epochs: kNN top-1' in log and 'Clustering round after 2 epochs' in log
    assert sorted(f for f in os.listdir(tmp_path / 'whole') if f.endswith('.pth')) == \
        ['epoch_1.pth', 'epoch_2.pth']  # written once, by rank 0

    work = tmp_path / 'killed'
    done = _dist_train(cfg, data_root, work, fault='after_checkpoint:1')
    log = done.stdout + done.stderr
    assert done.returncode != 0 and 'SIGKILL' in log, log[-3000:]
    assert osp.isfile(work / 'epoch_1.pth') and not osp.exists(work / 'epoch_2.pth')

    done = _dist_train(cfg, data_root, work, resume=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert 'resumed epoch: 1' in done.stdout + done.stderr
    _assert_same(_final(work), _final(tmp_path / 'whole'))
