"""Files opened as files, not names (ifnd/fileio/plain_files.py): each kind of non-file (symbolic and
hard links, FIFOs, sockets, folders) planted at each path the project reads state from or writes
state to is refused in one line naming it, never a hang, and nothing it points at is changed."""
import contextlib
import os
import os.path as osp
import signal
import socket
import time

import pytest
from helpers import digits_config, digits_config_file, train_error, train_tool
from test_zoo import peer_files, zoo_env  # noqa: F401 (fixtures)

from ifnd import zoo
from ifnd.engine.work_dir import hold_work_dir, resume_checkpoint
from ifnd.engine.run_paths import DUMP_MARK
from ifnd.fileio import AtomicLocalBackend, NotAPlainFile, check_plain_file, open_plain, read_checkpoint
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
        with contextlib.chdir(osp.dirname(path)):  # a name, not the path: AF_UNIX takes 107 bytes
            server.bind(osp.basename(path))  # the socket file stays after the socket is closed
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


# ------------------------------------------------------------------- every path a training run writes
# Each path a run writes (relative to the test's folder; {ts} a log folder name mmengine may give
# the run), with whether a folder is expected there. The config's CheckpointHook has out_dir='out'.
RUN_PATHS = {
    'work dir': ('run', True),
    'config dump': ('run/cfg.py', False),
    'timestamp folder': ('run/{ts}', True),
    'log file': ('run/{ts}/{ts}.log', False),
    'vis_data folder': ('run/{ts}/vis_data', True),
    'vis_data file': ('run/{ts}/vis_data/scalars.json', False),
    'TensorBoard events': ('run/{ts}/vis_data/events.out.tfevents.{seconds}.{host}.{pid}.0', False),
    'pseudo_labels folder': ('run/pseudo_labels', True),
    'out_dir folder': ('out/run', True),
}
# What the one line calls each kind planted, where a file is expected and where a folder is.
NAMED = {'symbolic link': ('a symbolic link', 'a symbolic link'), 'hard link': ('a hard link', 'a file'),
         'FIFO': ('a FIFO', 'a FIFO'), 'socket': ('a socket', 'a socket'), 'folder': ('a folder', 'a file')}


def _upcoming_log_folders(seconds: int = 8) -> list[tuple[str, int]]:
    """The log folder names (and their seconds) mmengine gives a run started in the next ``seconds``."""
    now = int(time.time())
    return [(time.strftime('%Y%m%d_%H%M%S', time.localtime(t)), t) for t in range(now - 1, now + seconds)]


def _tree(root) -> dict:
    """Every entry under ``root`` (links not followed): a link's target, a file's bytes, else its kind."""
    found = {}
    for folder, names, files in os.walk(root):
        for name in names + files:
            path = osp.join(folder, name)
            rel = osp.relpath(path, root)
            if osp.islink(path):
                found[rel] = 'link to ' + os.readlink(path)
            elif osp.isfile(path):
                with open(path, 'rb') as f:
                    found[rel] = f.read()
            else:
                found[rel] = 'folder' if osp.isdir(path) else 'other'
    return found


def _run_paths_config(tmp_path) -> str:
    """IFND on digits with its pseudo-label hook, TensorBoard and a CheckpointHook out_dir."""
    cfg = digits_config(str(tmp_path / 'run'), dict(type='IFND', temperature=0.5), max_epochs=1,
                        pseudo_labels=dict(num_clusters=[10], interval=1))
    cfg.train_dataloader.dataset.subset_fraction = 0.1
    cfg.visualizer.vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
    cfg.default_hooks.checkpoint.out_dir = str(tmp_path / 'out')
    path = str(tmp_path / 'cfg.py')
    cfg.dump(path)
    return path


@pytest.mark.parametrize('where', RUN_PATHS)
@pytest.mark.parametrize('kind', KINDS)
def test_every_path_a_run_writes_refuses_each_kind_before_anything_is_written(tmp_path, where, kind):
    """mmengine's files (the config dump, the log folder named by the start time, its log, vis_data
    and TensorBoard files) and the project's folders: a link, FIFO, socket or the wrong kind of entry
    is named in one line before any is written; nothing outside changes, nothing waits."""
    config = _run_paths_config(tmp_path)
    relative, folder = RUN_PATHS[where]
    (tmp_path / 'elsewhere').mkdir()
    planted = []
    for ts, seconds in _upcoming_log_folders() if '{ts}' in relative else [('', 0)]:
        path = tmp_path / relative.format(ts=ts, seconds=f'{seconds:010d}', host=socket.gethostname(),
                                          pid=os.getpid())
        path.parent.mkdir(parents=True, exist_ok=True)
        if folder and kind == 'symbolic link':  # a folder elsewhere, which the run would fill
            path.symlink_to(tmp_path / 'elsewhere')
        elif folder and kind == 'folder':  # a file where a folder is expected
            path.write_bytes(b'a file')
        else:
            plant(path, kind, tmp_path)
        planted.append(str(path))
    before = _tree(tmp_path)
    with no_hang():
        message = train_error(config)
    assert message.startswith('error: ') and any(f'{path} is {NAMED[kind][folder]}' in message
                                                 for path in planted), message
    assert 'delete it' in message or '--work-dir' in message, message
    after = _tree(tmp_path)
    new = sorted(set(after) - set(before))
    assert set(new) <= {'run', 'run/.run.lock'}, f'written before the refusal: {new}'  # the held work dir
    assert after == {**before, **{name: after[name] for name in new}}, 'nothing is changed'


def test_a_run_keeps_a_users_file_of_its_dumps_name_and_rewrites_its_own(tmp_path):
    """The config dump is written atomically under a first line that marks it: a resumed run rewrites
    its own dump, and a user's file of the dump's name (no mark) is kept, with a warning in the log."""
    config = digits_config_file(tmp_path)
    run = tmp_path / 'run'
    run.mkdir()
    (run / 'cfg.py').write_text('# my notes on this run\n')
    train_tool.main([config])
    assert (run / 'cfg.py').read_text() == '# my notes on this run\n'
    logs = [p.read_text() for p in run.glob('*/*.log')]
    assert any(f'kept {run / "cfg.py"}: a file of that name that no run dumped' in log for log in logs)
    (run / 'cfg.py').unlink()
    train_tool.main([config, '--resume'])
    dump = (run / 'cfg.py').read_text()
    assert dump.startswith(DUMP_MARK) and "log_level = 'WARNING'" in dump
    train_tool.main([config, '--resume', '--cfg-options', 'log_level=ERROR'])
    assert "log_level = 'ERROR'" in (run / 'cfg.py').read_text(), 'its own dump is rewritten'
    assert not list(run.glob('.tmp_*')), 'written whole: no temp file is left'
    from mmengine.config import Config
    assert Config.fromfile(str(run / 'cfg.py')).work_dir == str(run), 'the dump reads as a config'


@pytest.mark.parametrize('kind', ('folder', 'socket', 'FIFO'))
def test_a_file_written_whole_names_what_is_in_its_way(tmp_path, kind):
    """Checkpoints, pseudo labels and JSON results go to a temp file renamed over the name: a folder,
    socket or FIFO there is named with the fix, not met with free-space advice or a bare errno."""
    path = tmp_path / 'epoch_1.pth'
    plant(path, kind, tmp_path)
    with no_hang(), pytest.raises(NotAPlainFile) as err:
        AtomicLocalBackend().put(b'weights', str(path))
    message = str(err.value)
    assert message.startswith(f'{path} is a {kind}') and 'not the plain file expected; delete it' in message
    assert 'Free space' not in message and 'Errno' not in message and '\n' not in message
    (tmp_path / 'pseudo_labels').write_bytes(b'a file where the labels folder goes')
    with pytest.raises(NotAPlainFile, match=r'pseudo_labels is a file, not the folder expected; delete it'):
        AtomicLocalBackend().put(b'labels', str(tmp_path / 'pseudo_labels' / 'epoch_0001.npz'))
    assert sorted(os.listdir(tmp_path)) == sorted(['epoch_1.pth', 'pseudo_labels', f'victim_{kind}']), \
        'the planted entries stay, no temp file is left'


@pytest.mark.skipif(os.geteuid() != 0, reason='giving a folder to another user needs root')
def test_a_log_folder_of_another_user_is_refused(tmp_path):
    """A log folder made in advance by someone else: its owner could put a link in it at any time."""
    config = digits_config_file(tmp_path)
    for ts, _ in _upcoming_log_folders():
        (tmp_path / 'run' / ts).mkdir(parents=True)
        os.chown(tmp_path / 'run' / ts, 12345, 12345)
    with no_hang():
        message = train_error(config)
    assert 'a folder of another user (uid 12345), not the log folder expected; delete it' in message, message


@pytest.mark.parametrize('where', ('visualizer save_dir', 'LoggerHook out_dir'))
def test_folders_set_in_the_config_are_checked_as_the_log_folder(tmp_path, where):
    """A visualizer ``save_dir`` (its ``vis_data``) and a LoggerHook ``out_dir``, where mmengine copies
    the log folder's files under the same names at the end of the run."""
    from mmengine.config import Config

    from ifnd.engine.run_paths import check_run_paths
    cfg = Config(dict(default_hooks=dict(logger=dict(type='LoggerHook'))))
    if where == 'visualizer save_dir':
        cfg.visualizer = dict(type='Visualizer', save_dir=str(tmp_path / 'vis'))
        path = tmp_path / 'vis' / 'vis_data' / 'scalars.json'
    else:
        cfg.default_hooks.logger.out_dir = str(tmp_path / 'out')
        path = tmp_path / 'out' / 'run' / 'vis_data' / 'config.py'
    check_run_paths(cfg, str(tmp_path / 'run'), '20250101_000000')  # nothing there yet
    victim = plant(path, 'symbolic link', tmp_path)
    with pytest.raises(NotAPlainFile, match=rf'^{path} is a symbolic link, not the plain log file expected'):
        check_run_paths(cfg, str(tmp_path / 'run'), '20250101_000000')
    _kept(victim)
