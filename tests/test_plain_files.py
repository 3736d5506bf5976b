"""Files opened as files, not names (ifnd/fileio/plain_files.py): each kind of non-file (symbolic and
hard links, FIFOs, sockets, folders) planted at each path the project reads state from or writes
state to is refused in one line naming it, never a hang, and nothing it points at is changed."""
import contextlib
import os
import os.path as osp
import signal
import socket

import pytest
from helpers import digits_config_file, train_error
from test_zoo import peer_files, zoo_env  # noqa: F401 (fixtures)

from ifnd import zoo
from ifnd.engine.work_dir import hold_work_dir, resume_checkpoint
from ifnd.fileio import NotAPlainFile, check_plain_file, open_plain, read_checkpoint
from ifnd.fileio.json_files import read_json

KINDS = ('symbolic link', 'hard link', 'FIFO', 'socket', 'folder')


@contextlib.contextmanager
def no_hang(seconds: int = 20):
    """Fail instead of waiting for ever (a FIFO opened for reading waits for a writer)."""
    def expire(signum, frame):
        raise TimeoutError(f'still waiting after {seconds} s: the call hangs')

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def plant(path, kind: str, tmp_path) -> str:
    """Put a ``kind`` at ``path``; the file a link points at (or names) holds b'keep me'."""
    path = str(path)
    os.makedirs(osp.dirname(path), exist_ok=True)
    victim = tmp_path / f'victim_{kind.replace(" ", "_")}'
    victim.write_bytes(b'keep me')
    if kind == 'symbolic link':
        os.symlink(victim, path)
    elif kind == 'hard link':
        os.link(victim, path)
    elif kind == 'FIFO':
        os.mkfifo(path)
    elif kind == 'socket':
        server = socket.socket(socket.AF_UNIX)
        server.bind(path)  # the socket file stays after the socket is closed
        server.close()
    else:
        os.mkdir(path)
    return str(victim)


def _kept(victim: str) -> None:
    with open(victim, 'rb') as f:
        assert f.read() == b'keep me'


@pytest.mark.parametrize('kind', KINDS)
def test_each_kind_is_named_and_a_plain_file_opens(tmp_path, kind):
    path = tmp_path / 'state' / 'file'
    victim = plant(path, kind, tmp_path)
    with no_hang():
        # A file the project keeps for itself: a link of either kind is refused for writing.
        with pytest.raises(NotAPlainFile) as err:
            open_plain(str(path), 'ab', 'state file', own=True)
        with pytest.raises(NotAPlainFile):
            check_plain_file(str(path), 'state file', own=True, writing=True)
        # A file handed in may be reached through a link and read through a hard link.
        if kind in ('symbolic link', 'hard link'):
            with open_plain(str(path), 'rb') as f:
                assert f.read() == b'keep me'
            check_plain_file(str(path))
        else:
            with pytest.raises(NotAPlainFile):
                open_plain(str(path), 'rb')
    message = str(err.value)
    assert message.startswith(f'{path} is a') and kind.split()[0].lower() in message.lower()
    assert 'delete it' in message and '\n' not in message
    _kept(victim)
    plain = tmp_path / 'plain'
    with open_plain(str(plain), 'w', own=True) as f:  # created, then written as usual
        f.write('written')
    with open_plain(str(plain), 'r', own=True) as f:
        assert f.read() == 'written'


@pytest.mark.parametrize('kind', ('symbolic link', 'FIFO', 'socket'))
def test_last_checkpoint_and_lock_are_the_work_dirs_own_files(tmp_path, kind):
    """``--resume`` reads ``last_checkpoint``; every run holds ``.run.lock`` and writes its holder there."""
    work = tmp_path / 'work'
    victim = plant(work / 'last_checkpoint', kind, tmp_path)
    with no_hang(), pytest.raises(NotAPlainFile, match=r'last_checkpoint is a .*delete it'):
        resume_checkpoint(str(work))
    lock = tmp_path / 'other' / '.run.lock'
    plant(lock, kind, tmp_path)
    with no_hang(), pytest.raises(OSError, match=r'\.run\.lock is (a|not)'), hold_work_dir(str(lock.parent)):
        pass
    _kept(victim)


def test_a_hard_linked_lock_is_not_written(tmp_path):
    work = tmp_path / 'work'
    victim = plant(work / '.run.lock', 'hard link', tmp_path)
    with pytest.raises(NotAPlainFile, match='hard link'), hold_work_dir(str(work)):
        pass
    _kept(victim)


def test_resume_auto_with_a_fifo_as_last_checkpoint_ends_in_one_line(tmp_path):
    config = digits_config_file(tmp_path)
    os.makedirs(tmp_path / 'run')
    os.mkfifo(tmp_path / 'run' / 'last_checkpoint')
    with no_hang(60):
        message = train_error(config, '--resume', 'auto')
    assert 'last_checkpoint is a FIFO' in message, message


@pytest.mark.parametrize('kind', ('FIFO', 'socket', 'folder'))
def test_inputs_that_are_not_files_end_in_one_line(tmp_path, kind):
    """A config, a checkpoint, a JSON result (the harness's --previous) and a list file."""
    config = tmp_path / 'config.py'
    plant(config, kind, tmp_path)
    with no_hang(60):
        message = train_error(str(config))
    assert f'{config} is a' in message and 'not the plain config file' in message, message
    with no_hang(), pytest.raises(NotAPlainFile, match='not the plain checkpoint file'):
        read_checkpoint(str(config))
    with no_hang(), pytest.raises(NotAPlainFile, match='not the plain JSON file'):
        read_json(str(config), 1000)
    from ifnd.datasets import Digits
    with no_hang(), pytest.raises(NotAPlainFile, match='not the plain subset file'):
        Digits(split='train', pipeline=None, subset_file=str(config))


def test_the_harness_refuses_a_fifo_as_previous(tmp_path, capsys):
    from test_benchmarks import _load
    previous = tmp_path / 'previous.json'
    os.mkfifo(previous)
    with no_hang(60), pytest.raises(SystemExit) as err:
        _load('false_negatives').main(['--preset', 'digits', '--dry-run', '--previous', str(previous)])
    message = str(err.value) + capsys.readouterr().err
    assert 'FIFO' in message and str(previous) in message, message


@pytest.mark.parametrize('kind', ('FIFO', 'symbolic link'))
def test_a_damaged_rounds_summary_is_set_aside(tmp_path, kind):
    """The pseudo-label hook's ``rounds.json``: a FIFO or link there is moved aside, the run goes on."""
    from ifnd.hooks.pseudo_label_hook import read_rounds
    path = tmp_path / 'pseudo_labels' / 'rounds.json'
    victim = plant(path, kind, tmp_path)
    warnings = []
    logger = type('Logger', (), {'warning': lambda self, text: warnings.append(text)})()
    with no_hang():
        assert read_rounds(str(path), logger) == []
    assert 'rounds.json is corrupt' in warnings[0] and 'moved to' in warnings[0]
    assert not osp.lexists(path) and osp.lexists(str(path) + '.corrupt')
    _kept(victim)


def test_a_hard_link_in_the_zoo_cache_is_never_written_through(peer_files, zoo_env, tmp_path):
    """A hard link passes every real-path check: the partial download, resumed in place, is checked
    as a file before anything is asked of the server (the cache's other files are replaced whole)."""
    planted = 'peer.pth.tar.part'
    _, files = peer_files
    server, publish = zoo_env
    publish(files['moco'], 'md5_prefix', hub=False)
    victim = plant(osp.join(zoo.cache_dir(), planted), 'hard link', tmp_path)
    with no_hang(60), pytest.raises(SystemExit) as err:
        zoo.main(['download', 'peer'])
    message = str(err.value)
    assert 'hard link' in message and planted in message and '\n' not in message, message
    _kept(victim)
    assert server.requests == []
