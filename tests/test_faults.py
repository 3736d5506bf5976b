"""Runs killed at every kind of point end bit-identical to an uninterrupted run after --resume.

Kill points are reached by the run itself (tests/fault_injection.py SIGKILLs the process at an
iteration, inside a clustering round, half-way through writing a checkpoint, or right after one),
so no outcome depends on the machine's speed.
"""
import os
import os.path as osp
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from helpers import digits_config

REPO = osp.abspath(osp.join(osp.dirname(__file__), '..'))
TESTS = osp.dirname(osp.abspath(__file__))
EPOCHS = 3


def _config(tmp_path) -> str:
    """IFNDMoCo with pseudo labels every epoch, two persistent loader workers, per-sample seeds."""
    cfg = digits_config(str(tmp_path / 'run'), dict(type='IFNDMoCo', temperature=0.2, queue_len=256,
                                                    momentum=0.99),
                        max_epochs=EPOCHS, batch_size=32,
                        pseudo_labels=dict(num_clusters=[10, 30], interval=1,
                                           kmeans=dict(nredo=1, niter=10)))
    cfg.train_dataloader.update(num_workers=2, persistent_workers=True)  # the config's SeededSampler
    cfg.train_dataloader.dataset.subset_fraction = 0.25  # 337 images, 10 iterations an epoch
    cfg.param_scheduler = dict(type='CosineAnnealingLR', T_max=EPOCHS, by_epoch=True)
    cfg.custom_hooks.append(dict(type='FaultInjectionHook'))
    cfg.custom_imports = dict(imports=['fault_injection'], allow_failed_imports=False)
    path = str(tmp_path / 'cfg.py')
    cfg.dump(path)
    return path


def test_views_depend_on_seed_epoch_and_index_only():
    """The same batches with 0 or 2 loader workers; another epoch gives other views."""
    from mmengine.registry import init_default_scope
    from torch.utils.data import DataLoader

    from ifnd.registry import DATA_SAMPLERS, DATASETS
    init_default_scope('ifnd')
    dataset = DATASETS.build(dict(type='Digits', split='train', subset_fraction=0.05, pipeline=dict(
        type='MultiView', num_views=2, transforms=dict(type='ContrastiveView', size=16, scale=(0.2, 1.0)))))
    sampler = DATA_SAMPLERS.build(dict(type='SeededSampler', dataset=dataset, shuffle=True, seed=3))

    def epoch(number: int, workers: int) -> list:
        sampler.set_epoch(number)
        return [torch.cat(b['inputs']) for b in DataLoader(dataset, 16, sampler=sampler, num_workers=workers)]

    torch.manual_seed(0)
    in_process = epoch(1, 0)
    torch.manual_seed(1)  # the training process's generator plays no part
    _assert_same(epoch(1, 2), in_process)
    assert not torch.equal(epoch(2, 0)[0], in_process[0])


def _command(cfg_path: str, work_dir, fault: str = '', **env) -> tuple[list[str], dict]:
    env = dict(os.environ, IFND_FAULT=fault, OMP_NUM_THREADS='1',
               PYTHONPATH=os.pathsep.join([TESTS, REPO, os.environ.get('PYTHONPATH', '')]), **env)
    return [sys.executable, osp.join(REPO, 'tools', 'train.py'), cfg_path, '--work-dir', str(work_dir),
            '--cfg-options', 'log_level=INFO'], env


def _train(cfg_path: str, work_dir, fault: str = '', resume: bool = False) -> subprocess.CompletedProcess:
    cmd, env = _command(cfg_path, work_dir, fault)
    return subprocess.run(cmd + (['--resume'] if resume else []), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)


def _killed(done: subprocess.CompletedProcess) -> bool:
    return done.returncode == -signal.SIGKILL


def _latest(work_dir) -> str:
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        return osp.basename(f.read().strip())


def _assert_same(a, b, path='') -> None:
    """Nested containers equal, tensors and arrays bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            _assert_same(a[key], b[key], f'{path}.{key}')
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f'{path}[{i}]')
    else:
        assert a == b, (path, a, b)


def _final(work_dir) -> dict:
    ckpt = torch.load(osp.join(work_dir, f'epoch_{EPOCHS}.pth'), weights_only=False)
    labels = np.load(osp.join(work_dir, 'pseudo_labels', f'epoch_{EPOCHS:04d}.npz'))['labels']
    return dict(state_dict=ckpt['state_dict'], optimizer=ckpt['optimizer'],
                param_schedulers=ckpt['param_schedulers'],
                position=(ckpt['meta']['epoch'], ckpt['meta']['iter']), labels=torch.from_numpy(labels))


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp('uninterrupted')
    cfg = _config(tmp_path)
    started = time.monotonic()
    done = _train(cfg, tmp_path / 'run')
    assert done.returncode == 0, done.stderr[-3000:]
    return cfg, _final(tmp_path / 'run'), time.monotonic() - started


# Slow (about 80 s on 2 cores): a real run killed in four places (mid-epoch, mid-round, mid-write,
# after a checkpoint) and resumed each time; one kill per fault point is what is being tested.
def test_run_killed_at_every_fault_point_resumes_bit_identical(uninterrupted, tmp_path):
    """One run killed four times, resumed after each; its end equals the uninterrupted run's.

    What is compared: every weight and buffer (MoCo queue and its sample indices, the pseudo-label
    bank), the optimiser's momentum, the schedulers, the epoch/iteration reached and the last
    round's saved labels. Logged timings and the message hub's history differ by nature.
    """
    cfg, expected, _ = uninterrupted
    work = tmp_path / 'run'
    done = _train(cfg, work, 'iteration:2.5')  # half-way through the second epoch
    assert _killed(done), done.stderr[-3000:]
    assert _latest(work) == 'epoch_1.pth' and not osp.exists(work / 'epoch_2.pth')

    done = _train(cfg, work, 'clustering:2', resume=True)  # in the round after epoch 2
    assert _killed(done), done.stderr[-3000:]
    assert 'resumed epoch: 1' in done.stdout + done.stderr
    assert _latest(work) == 'epoch_1.pth' and not osp.exists(work / 'pseudo_labels' / 'epoch_0002.npz')

    done = _train(cfg, work, 'checkpoint_write:2', resume=True)
    assert _killed(done), done.stderr[-3000:]
    assert _latest(work) == 'epoch_1.pth' and not osp.exists(work / 'epoch_2.pth')
    assert [f for f in os.listdir(work) if f.startswith('.tmp_')], 'a half-written file is left'

    done = _train(cfg, work, 'after_checkpoint:2', resume=True)
    assert _killed(done), done.stderr[-3000:]
    log = done.stdout + done.stderr
    assert 'resumed epoch: 1' in log and 'left by a run stopped while writing it' in log
    assert _latest(work) == 'epoch_2.pth'
    assert not [f for f in os.listdir(work) if f.startswith('.tmp_')]

    done = _train(cfg, work, resume=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert 'resumed epoch: 2' in done.stdout + done.stderr
    assert not osp.exists(work / f'epoch_{EPOCHS + 1}.pth')
    _assert_same(_final(work), expected)


# Slow (about a minute on 2 cores): the kills land wherever the machine's speed puts them.
def test_requeued_job_killed_at_random_moments_ends_as_the_uninterrupted_run(uninterrupted, tmp_path):
    """A pre-empted job started again with the same command (SLURM's requeue: SLURM_RESTART_COUNT
    counts the restarts) continues the work dir's run, whatever moment it was killed at, and ends
    with the uninterrupted run's weights, buffers, optimiser state and labels, bit for bit."""
    cfg, expected, seconds = uninterrupted
    work = tmp_path / 'run'
    rng = random.Random(int(time.time()))
    # The first start is cut well before the uninterrupted run's time, so at least one kill lands
    # however the machine's load varies; the later ones anywhere in the rest.
    delays = [round(rng.uniform(0.15, high) * seconds, 1) for high in (0.5, 0.8, 0.8)]
    logs, killed = [], 0
    for restart, delay in enumerate(delays + [None]):
        cmd, env = _command(cfg, work, SLURM_RESTART_COUNT=str(restart))
        with subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) as job:
            try:
                out, _ = job.communicate(timeout=delay if delay is not None else 900)
            except subprocess.TimeoutExpired:
                job.kill()  # SIGKILL: pre-emption gives no chance to save
                out, _ = job.communicate()
                killed += 1
        logs.append(f'restart {restart} (killed after {delay} s): exit {job.returncode}\n{out[-1500:]}')
        assert 'is in use by another run' not in out, logs[-1]
    assert job.returncode == 0 and killed, '\n'.join(logs)
    _assert_same(_final(work), expected)
