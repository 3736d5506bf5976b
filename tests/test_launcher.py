"""tools/dist_train.sh and tools/dist_transfer_coco.sh: a process count, file or port they cannot
use is refused in one line before anything starts, and no worker outlives the launcher."""
import os
import os.path as osp
import signal
import socket
import subprocess
import sys
import time

import pytest
from helpers import free_port

from ifnd.launch import node_devices

REPO = osp.abspath(osp.join(osp.dirname(__file__), '..'))
CONFIG = 'configs/simclr/simclr_r18_8e_digits.py'  # the smallest training config
SCRIPTS = {'tools/dist_train.sh': 'CONFIG', 'tools/dist_transfer_coco.sh': 'CKPT'}
ENV = dict(os.environ, PATH=os.pathsep.join([osp.dirname(sys.executable), os.environ['PATH']]))
linux_only = pytest.mark.skipif(not sys.platform.startswith('linux'), reason='reads /proc, Linux prctl')


def _script(script: str, *args, **env) -> subprocess.CompletedProcess:
    return subprocess.run(['bash', script, *map(str, args)], cwd=REPO, env={**ENV, **env},
                          capture_output=True, text=True, timeout=120)


def _refused(done: subprocess.CompletedProcess, *fragments, usage: bool = True) -> None:
    """One ``error:`` line holding ``fragments`` (after the usage line when ``usage``), status 1."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and 'Traceback' not in done.stderr, done.stderr[-3000:]
    assert len(lines) == 1 + usage and lines[-1].startswith('error: '), done.stderr[-3000:]
    assert not usage or lines[0].startswith('usage: tools/dist_'), done.stderr[-3000:]
    assert all(f in lines[-1] for f in fragments), done.stderr[-3000:]


@pytest.mark.parametrize('script', SCRIPTS)
@pytest.mark.parametrize('args, expected', [
    ([], ['{FILE} and N are missing']),
    ([CONFIG], ['N (the number of processes on this node) is missing']),
    ([CONFIG, '0'], ["N must be a whole number of processes of at least 1, got '0'"]),
    ([CONFIG, '-1'], ["got '-1'"]),
    ([CONFIG, 'abc'], ["got 'abc'"]),
    (['configs/missing.py', '2'], ['{FILE} not found: configs/missing.py', 'check the path']),
    (['configs', '2'], ['{FILE} configs is a folder']),
])
def test_bad_arguments_refused_with_the_usage(script, args, expected):
    _refused(_script(script, *args), *(e.format(FILE=SCRIPTS[script]) for e in expected))


def test_more_processes_than_devices():
    available, kind = node_devices()
    _refused(_script('tools/dist_train.sh', CONFIG, available + 1),
             f'N={available + 1} processes, but this node has {available} {kind}',
             f'give N at most {available}')


def test_multi_node_checks_the_count_per_node_and_not_the_port():
    available, _ = node_devices()
    with socket.socket() as held:
        held.bind(('127.0.0.1', 0))
        held.listen()
        done = _script('tools/dist_train.sh', CONFIG, available + 1, NNODES='2',
                       PORT=str(held.getsockname()[1]))
    _refused(done, 'processes per node (NNODES=2)', f'give N at most {available}')


@pytest.mark.parametrize('script', SCRIPTS)
@pytest.mark.parametrize('bound_to', ['127.0.0.1', ''])
def test_port_in_use_names_another(script, bound_to):
    with socket.socket() as held:
        held.bind((bound_to, 0))
        held.listen()
        port = held.getsockname()[1]
        done = _script(script, CONFIG, 1, PORT=str(port))
    _refused(done, f'port {port} on 127.0.0.1 is in use', 'PORT=', f' {script} ...', usage=False)


@pytest.mark.parametrize('env, expected', [
    (dict(MASTER_ADDR='192.0.2.1'), 'MASTER_ADDR=192.0.2.1 is not an address of this machine'),
    (dict(PORT='http'), "PORT must be a TCP port number (1-65535), got 'http'"),
    (dict(NNODES='0'), "NNODES must be a whole number of nodes of at least 1, got '0'")])
def test_bad_rendezvous_settings(env, expected):
    _refused(_script('tools/dist_train.sh', CONFIG, 1, **env), expected, usage=False)


# A launcher as torchrun is one: two workers, each in a session of its own.
FAKE_LAUNCHER = """
import signal, subprocess, sys, time
mode, marker = sys.argv[1:]
workers = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', marker],
                            start_new_session=True) for _ in range(2)]
if mode == 'graceful':  # as torchrun: a SIGTERM ends the workers, then the launcher
    def stop(signum, frame):
        for w in workers:
            w.terminate()
        sys.exit(1)
    signal.signal(signal.SIGTERM, stop)
if mode == 'stubborn':
    signal.signal(signal.SIGINT, signal.SIG_IGN)
print('ready', flush=True)
if mode == 'fails':
    sys.exit(3)
time.sleep(600)
"""


def _running(marker: str) -> list[int]:
    """Live processes whose command line holds ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def _wait_gone(marker: str, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while _running(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _running(marker)


@pytest.fixture
def supervised(tmp_path):
    """Start ``python -m ifnd.launch run`` over the fake launcher in a mode; end what is left after."""
    marker = f'fake-worker-{tmp_path.name}'
    (tmp_path / 'launcher.py').write_text(FAKE_LAUNCHER)
    started = []

    def start(mode: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, '-m', 'ifnd.launch', 'run', sys.executable,
                                 str(tmp_path / 'launcher.py'), mode, marker], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started.append(proc)
        assert proc.stdout.readline() == 'ready\n', proc.communicate(timeout=30)
        return proc

    yield start, marker
    for pid in _running(marker) + [p.pid for p in started if p.poll() is None]:
        os.kill(pid, signal.SIGKILL)


@linux_only
@pytest.mark.parametrize('mode, signals, status', [
    ('fails', [], 3),  # the launcher ends with an error, its workers still running
    ('sleeps', [signal.SIGTERM], 128 + signal.SIGTERM),  # passed on: the launcher dies of it
    ('stubborn', [signal.SIGINT, signal.SIGINT], 128 + signal.SIGKILL)])  # the second one kills
def test_no_worker_outlives_the_launcher(supervised, mode, signals, status):
    start, marker = supervised
    proc = start(mode)
    for sig in signals:
        time.sleep(0.3)
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == status, err
    assert _running(marker) == [] and 'launch: ended 2 processes the launcher left running' in err


@linux_only
def test_launcher_stopped_when_the_supervisor_is_killed(supervised):
    start, marker = supervised
    os.kill(start('graceful').pid, signal.SIGKILL)
    assert _wait_gone(marker, 30) == []  # the launcher got SIGTERM and ended its workers


# The one test that starts real workers (about 10-25 s on a 2-core CPU): torchrun with 2 gloo
# processes, killed as a crash or the OOM killer would kill it, which left both running before.
@linux_only
@pytest.mark.skipif(node_devices()[0] < 2, reason='needs 2 GPUs, or 2 cores without CUDA')
def test_killed_torchrun_leaves_no_worker(tmp_path):
    marker = str(tmp_path / 'work')  # the --work-dir, on every worker's command line
    env = {**ENV, 'PORT': str(free_port()), 'OMP_NUM_THREADS': '1'}
    with open(tmp_path / 'log', 'w') as log:
        proc = subprocess.Popen(['bash', 'tools/dist_train.sh', CONFIG, '2', '--work-dir', marker],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        torchrun = workers = None
        while not workers and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            commands = {}
            for pid in _running(marker):
                with open(f'/proc/{pid}/cmdline', 'rb') as f:
                    commands[pid] = f.read().decode().split('\0')
            torchrun = [p for p, c in commands.items() if c[1:3] == ['-m', 'torch.distributed.run']]
            workers = [p for p, c in commands.items() if c[1:3] == ['-u', 'tools/train.py']]
            workers = workers if len(workers) == 2 else None
        assert torchrun and workers, (tmp_path / 'log').read_text()[-3000:]
        os.kill(torchrun[0], signal.SIGKILL)
        assert proc.wait(timeout=30) == 128 + signal.SIGKILL
        log = (tmp_path / 'log').read_text()
        assert _running(marker) == [], log[-3000:]
        assert 'launch: ended 2 processes the launcher left running' in log, log[-3000:]
    finally:
        for pid in _running(marker):
            os.kill(pid, signal.SIGKILL)
