"""Work dirs and configs that could lose data or be read wrongly: each refused in one line or handled."""
import glob
import json
import math
import os
import os.path as osp
import shutil
import subprocess
import sys
import time

import pytest
import torch
from helpers import CONFIG_DIR, digits_config_file, train_error, train_tool
from mmengine.config import Config

from ifnd.engine.config_checks import check_top_level_keys
from ifnd.engine.config_files import load_config
from ifnd.engine.work_dir import LOCK_NAME, check_new_run, inputs_in_run, resume_checkpoint

REPO = osp.abspath(osp.join(osp.dirname(__file__), '..'))


# --------------------------------------------------------------------- a new run in a used work dir
def test_new_run_refuses_a_work_dir_holding_a_run_unless_overwrite(tmp_path):
    path = digits_config_file(tmp_path)
    run = tmp_path / 'run'
    train_tool.main([path])
    saved = (run / 'epoch_1.pth').read_bytes()
    message = train_error(path)
    assert f'{run} holds a run (' in message and 'last_checkpoint' in message
    assert '--resume' in message and '--work-dir' in message and '--overwrite' in message
    assert (run / 'epoch_1.pth').read_bytes() == saved, 'nothing is overwritten'

    assert 'give one of them' in train_error(path, '--resume', '--overwrite')
    (run / 'epoch_7.pth').write_bytes(b'an earlier, longer run')
    (run / 'pseudo_labels').mkdir()
    (run / 'pseudo_labels' / 'rounds.json').write_text('[]')
    train_tool.main([path, '--overwrite'])
    assert not (run / 'epoch_7.pth').exists() and not (run / 'pseudo_labels' / 'rounds.json').exists()
    assert (run / 'last_checkpoint').read_text().endswith('epoch_1.pth')
    # --overwrite never deletes what the new run reads: the checkpoint it loads or starts from, a
    # file or folder of its data (named directly, or a folder holding the run's files).
    for option in (f'load_from={run / "epoch_1.pth"}', f'load_from={run}/./epoch_1.pth',
                   f'train_dataloader.dataset.subset_file={run / "last_checkpoint"}'):
        key = option.split('=')[0]
        message = train_error(path, '--overwrite', '--cfg-options', option)
        assert 'would delete what this run reads' in message and f'({key})' in message, message
        assert (run / 'epoch_1.pth').is_file() and (run / 'last_checkpoint').is_file()
    data = {'train_dataloader': {'dataset': {'data_root': str(run)}}, 'work_dir': str(run)}
    assert inputs_in_run(str(run), data) == [f'{run / name} (train_dataloader.dataset.data_root)'
                                             for name in ('epoch_1.pth', 'last_checkpoint')]


def test_overwrite_keeps_the_checkpoint_a_linear_probe_reads(tmp_path):
    """The linear protocol's backbone weights, model.pretrained, taken from the work dir it starts over."""
    run = tmp_path / 'run'
    train_tool.main([digits_config_file(tmp_path)])
    linear = osp.join(osp.dirname(__file__), '..', 'configs', 'benchmarks', 'linear', 'linear_r18_100e_digits.py')
    message = train_error(linear, '--work-dir', str(run), '--overwrite', '--cfg-options',
                          f'model.pretrained={run / "epoch_1.pth"}')
    assert f'{run / "epoch_1.pth"} (model.pretrained)' in message and 'copy it out' in message
    assert (run / 'epoch_1.pth').is_file()


def test_logs_alone_or_first_round_labels_are_not_a_run(tmp_path):
    (tmp_path / '20250101_000000' / 'vis_data').mkdir(parents=True)
    (tmp_path / '20250101_000000' / '20250101_000000.log').write_text('a run that failed to start')
    (tmp_path / 'pseudo_labels').mkdir()  # a run stopped before its first checkpoint
    (tmp_path / 'pseudo_labels' / 'epoch_0000.npz').write_bytes(b'')
    check_new_run(str(tmp_path))
    (tmp_path / 'iter_100.pth').write_bytes(b'')
    with pytest.raises(FileExistsError, match='iter_100.pth'):
        check_new_run(str(tmp_path))


def test_overwrite_deletes_only_the_files_a_run_wrote(tmp_path, capsys):
    """Never a folder, never through a link, never a name a run does not write; each deletion listed."""
    path = digits_config_file(tmp_path)
    run = tmp_path / 'run'
    train_tool.main([path])
    outside = tmp_path / 'my_labels'  # a user's folder that pseudo_labels links to
    outside.mkdir()
    (outside / 'epoch_0001.npz').write_bytes(b'the user\'s labels')
    (outside / 'rounds.json').write_text('[]')
    (run / 'pseudo_labels').symlink_to(outside)
    (run / 'epoch_9.pth').mkdir()
    (run / 'epoch_9.pth' / 'notes.txt').write_text('a user folder with a checkpoint name')
    for name in ('epoch_best_manual.pth', 'iter_notes.pth', 'epoch_3.pth.bak'):
        (run / name).write_bytes(b'the user\'s')
    (tmp_path / 'elsewhere.pth').write_bytes(b'the user\'s checkpoint')
    (run / 'iter_5.pth').symlink_to(tmp_path / 'elsewhere.pth')
    (run / 'epoch_7.pth').write_bytes(b'an earlier, longer run')
    capsys.readouterr()
    train_tool.main([path, '--overwrite'])
    out = capsys.readouterr().out
    assert f'--overwrite: deleted {run / "epoch_7.pth"}' in out
    assert f'--overwrite: deleted {run / "epoch_1.pth"}' in out
    assert f'--overwrite: left {run / "pseudo_labels"} (a link)' in out
    assert f'--overwrite: left {run / "epoch_9.pth"} (a folder)' in out
    assert f'--overwrite: left {run / "iter_5.pth"} (a link)' in out
    assert not (run / 'epoch_7.pth').exists()
    assert sorted(p.name for p in outside.iterdir()) == ['epoch_0001.npz', 'rounds.json']
    assert (run / 'epoch_9.pth' / 'notes.txt').is_file()
    for name in ('epoch_best_manual.pth', 'iter_notes.pth', 'epoch_3.pth.bak'):
        assert (run / name).read_bytes() == b'the user\'s', name
    assert (tmp_path / 'elsewhere.pth').read_bytes() == b'the user\'s checkpoint'

    # The run's own pseudo-label folder: its rounds go, anything else in it stays.
    (run / 'pseudo_labels').unlink()
    (run / 'pseudo_labels').mkdir()
    for name in ('epoch_0000.npz', 'epoch_0001.npz', 'rounds.json', 'plot.png'):
        (run / 'pseudo_labels' / name).write_bytes(b'')
    (run / 'epoch_9.pth' / 'notes.txt').unlink()
    (run / 'epoch_9.pth').rmdir()
    train_tool.main([path, '--overwrite'])
    assert sorted(p.name for p in (run / 'pseudo_labels').iterdir()) == ['plot.png']


def _start_training(path: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS='1',
               PYTHONPATH=os.pathsep.join([REPO, os.environ.get('PYTHONPATH', '')]))
    return subprocess.Popen([sys.executable, osp.join(REPO, 'tools', 'train.py'), path, *args],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_second_run_in_a_held_work_dir_is_refused_and_a_killed_run_frees_it(tmp_path):
    path = digits_config_file(tmp_path, max_epochs=500)
    run = tmp_path / 'run'
    first = _start_training(path)
    try:
        deadline = time.monotonic() + 120
        while not ((run / LOCK_NAME).is_file() and (run / LOCK_NAME).read_text()):
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()[-3000:]
            time.sleep(0.2)
        assert not list(run.glob('epoch_*.pth')), 'the first run is still in its first epoch'
        for argv in ([path], [path, '--overwrite'], [path, '--resume', 'auto']):
            message = train_error(*argv)
            assert f'{run} is in use by another run (pid {first.pid} on ' in message, message
            assert 'train.py' in message and '--work-dir' in message
        assert first.poll() is None, 'the first run goes on'
    finally:
        first.kill()
        first.wait()
    # The kill released the lock: the same work dir is taken at once (not through a planted link).
    (run / LOCK_NAME).rename(run / 'lock.bak')
    (run / LOCK_NAME).symlink_to(tmp_path / 'elsewhere')
    assert f'{run / LOCK_NAME} is a link, not the lock file' in train_error(path, '--resume', 'auto')
    assert not (tmp_path / 'elsewhere').exists()
    (run / LOCK_NAME).unlink()
    train_tool.main([path, '--resume', 'auto', '--cfg-options', 'train_cfg.max_epochs=1'])
    assert (run / 'epoch_1.pth').is_file()


def test_a_file_system_without_locks_warns_and_trains(tmp_path, monkeypatch, capsys):
    import errno
    import fcntl

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, 'No locks available')

    monkeypatch.setattr(fcntl, 'flock', no_locks)
    train_tool.main([digits_config_file(tmp_path)])
    assert 'this file system has no locks' in capsys.readouterr().err
    assert (tmp_path / 'run' / 'epoch_1.pth').is_file()


def test_resume_auto_starts_or_continues_and_a_requeued_job_continues(tmp_path, capsys, monkeypatch):
    path = digits_config_file(tmp_path, max_epochs=1)
    run = tmp_path / 'run'
    train_tool.main([path, '--resume', 'auto'])
    assert 'holds no run yet; starting it' in capsys.readouterr().out
    train_tool.main([path, '--resume', 'auto', '--cfg-options', 'train_cfg.max_epochs=2'])
    assert torch.load(run / 'epoch_2.pth', weights_only=False)['meta']['epoch'] == 2
    assert 'holds no run yet' not in capsys.readouterr().out

    # A requeued job runs its first command again: --overwrite would delete the run, and a
    # --resume CKPT would go back to CKPT. It continues from the latest checkpoint instead, where the
    # work dir holds that very run (its checkpoint's config and seed).
    monkeypatch.setenv('SLURM_RESTART_COUNT', '1')
    second = (run / 'epoch_2.pth').read_bytes()
    train_tool.main([path, '--overwrite', '--cfg-options', 'train_cfg.max_epochs=2'])
    captured = capsys.readouterr()
    assert 'requeued job (restart 1): continuing the run' in captured.out
    assert 'instead of --overwrite' in captured.err and 'deleted' not in captured.out
    assert (run / 'epoch_2.pth').read_bytes() == second, 'nothing was deleted or trained again'
    train_tool.main([path, '--resume', str(run / 'epoch_1.pth'), '--cfg-options', 'train_cfg.max_epochs=2'])
    assert f'instead of --resume {run / "epoch_1.pth"}' in capsys.readouterr().out
    assert (run / 'epoch_2.pth').read_bytes() == second, 'epoch 2 is not trained again'
    # Started by hand in a requeued allocation (SLURM_RESTART_COUNT is set in any of its shells),
    # with another learning rate: not this run's requeue, so --overwrite does what it says.
    train_tool.main([path, '--overwrite', '--cfg-options', 'train_cfg.max_epochs=2',
                     'optim_wrapper.optimizer.lr=0.01'])
    captured = capsys.readouterr()
    assert 'holds another run (its checkpoint differs in optim_wrapper.optimizer.lr)' in captured.err
    assert f'--overwrite: deleted {run / "epoch_2.pth"}' in captured.out
    saved = torch.load(run / 'epoch_2.pth', weights_only=False)['meta']['cfg']
    assert saved['optim_wrapper']['optimizer']['lr'] == 0.01
    monkeypatch.setenv('SLURM_RESTART_COUNT', '2')  # a requeue before the first checkpoint: a start
    train_tool.main([path, '--work-dir', str(tmp_path / 'other')])
    assert (tmp_path / 'other' / 'epoch_1.pth').is_file()


# ------------------------------------------------------------------------- resume from the work dir
def _checkpoints(folder, *names) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b'')


def test_resume_checkpoint_prefers_the_work_dirs_own_files(tmp_path):
    original, copy = tmp_path / 'original', tmp_path / 'copy'
    _checkpoints(original, 'epoch_1.pth', 'epoch_2.pth')
    _checkpoints(copy, 'epoch_1.pth', 'epoch_2.pth')
    (copy / 'last_checkpoint').write_text(str(original / 'epoch_2.pth'))
    path, note = resume_checkpoint(str(copy))
    assert path == str(copy / 'epoch_2.pth') and 'copied or moved' in note

    (copy / 'last_checkpoint').write_text(str(tmp_path / 'gone' / 'epoch_12.pth'))
    _checkpoints(copy, 'epoch_9.pth', 'epoch_10.pth', 'iter_500.pth')
    path, note = resume_checkpoint(str(copy))
    assert path == str(copy / 'epoch_10.pth') and 'does not exist' in note  # by number, not name

    (copy / 'last_checkpoint').unlink()
    assert resume_checkpoint(str(copy))[0] == str(copy / 'epoch_10.pth')
    assert resume_checkpoint(str(tmp_path / 'empty')) == (None, None)

    # CheckpointHook(out_dir=...) saves elsewhere: used, and named when used.
    (copy / 'last_checkpoint').write_text(str(original / 'epoch_2.pth'))
    (copy / 'epoch_2.pth').unlink()
    path, note = resume_checkpoint(str(copy))
    assert path == str(original / 'epoch_2.pth') and f'names {original / "epoch_2.pth"}, outside' in note

    _checkpoints(tmp_path / 'none')
    (tmp_path / 'none' / 'last_checkpoint').write_text(str(original / 'epoch_3.pth'))
    with pytest.raises(FileNotFoundError, match=r'last_checkpoint in .* names .*epoch_3.pth, which '
                       r'does not exist.*--resume PATH/epoch_N.pth'):
        resume_checkpoint(str(tmp_path / 'none'))


@pytest.mark.parametrize('content', [b'', b'\x80\x81garbage\x00', b'a\nb', 'folder'])
def test_bad_last_checkpoint_names_the_file_and_the_fix(tmp_path, content):
    _checkpoints(tmp_path, 'epoch_1.pth')
    pointer = tmp_path / 'last_checkpoint'
    if content == 'folder':
        pointer.mkdir()
    else:
        pointer.write_bytes(content)
    with pytest.raises(ValueError, match=r'last_checkpoint') as err:
        resume_checkpoint(str(tmp_path))
    assert f'--resume {tmp_path / "epoch_1.pth"}' in str(err.value) and 'delete it' in str(err.value)


def test_moved_work_dir_resumes_from_its_own_checkpoint(tmp_path, capfd):
    path = digits_config_file(tmp_path, max_epochs=2)
    original, moved = tmp_path / 'run', tmp_path / 'moved'
    train_tool.main([path, '--cfg-options', 'train_cfg.max_epochs=1'])
    shutil.copytree(original, moved)
    (original / 'epoch_1.pth').write_bytes(b'the original, changed since the copy')
    train_tool.main([path, '--resume', '--work-dir', str(moved)])
    assert (moved / 'epoch_2.pth').is_file() and not (original / 'epoch_2.pth').exists()
    assert f'resuming from its own {moved / "epoch_1.pth"}' in capfd.readouterr().out

    (moved / 'last_checkpoint').write_text('')
    message = train_error(path, '--resume', '--work-dir', str(moved))
    assert f'{moved / "last_checkpoint"} is empty' in message and '--resume' in message


# ------------------------------------------------------------- --resume with a new optimizer value
@pytest.mark.parametrize('schedule', ['constant', 'cosine'])
def test_resume_takes_the_command_line_lr_instead_of_the_checkpoints(tmp_path, capfd, schedule):
    """1 epoch at lr 0.05, then epoch 2 resumed with lr=0.2: it trains at the new lr, and the
    scheduler continues from the new base value (cosine over 3 epochs: 0.75 x base in epoch 2)."""
    scheduler = (dict(type='ConstantLR', factor=1.0, by_epoch=True) if schedule == 'constant' else
                 dict(type='CosineAnnealingLR', T_max=3, by_epoch=True, begin=0, end=3))
    path = digits_config_file(tmp_path, max_epochs=2, param_scheduler=scheduler)
    run = tmp_path / 'run'
    # mmengine keeps one logger and visualiser per experiment name (config name and start second)
    # for the whole process: names of their own keep each run's logs in its own folder.
    train_tool.main([path, '--cfg-options', 'train_cfg.max_epochs=1', 'log_level=INFO',
                     f'experiment_name=lr_{schedule}_first'])
    time.sleep(1)  # mmengine names a run's log folder by the second it starts: two folders here
    train_tool.main([path, '--resume', '--cfg-options', 'optim_wrapper.optimizer.lr=0.2',
                     'log_level=INFO', f'experiment_name=lr_{schedule}_resumed'])
    factor = [1.0, 1.0, 1.0] if schedule == 'constant' else \
        [(1 + math.cos(math.pi * epoch / 3)) / 2 for epoch in range(3)]
    lrs = {}
    for scalars in glob.glob(str(run / '*' / 'vis_data' / 'scalars.json')):
        for line in open(scalars):
            entry = json.loads(line)
            if 'lr' in entry:
                lrs[entry['step']] = entry['lr']
    assert lrs[1] == pytest.approx(0.05 * factor[0]) and lrs[2] == pytest.approx(0.05 * factor[0])
    assert lrs[3] == pytest.approx(0.2 * factor[1]) and lrs[4] == pytest.approx(0.2 * factor[1])
    ckpt = torch.load(run / 'epoch_2.pth', weights_only=False)
    group = ckpt['optimizer']['param_groups'][0]
    assert group['initial_lr'] == 0.2 and group['lr'] == pytest.approx(0.2 * factor[2])
    assert ckpt['param_schedulers'][0]['base_values'] == [0.2]
    assert "Resumed with lr=0.2 from the command line instead of the checkpoint's 0.05" in \
        capfd.readouterr().out


# ------------------------------------------------------------------------------- config handling
def test_unknown_top_level_key_is_refused_with_the_close_one(tmp_path):
    path = digits_config_file(tmp_path)
    with open(path, 'a') as f:
        f.write('randomnes = 7\n_my_lr = 0.1\n')  # '_' marks a config's own variable
    message = train_error(path)
    assert "config key 'randomnes' in cfg.py is not a Runner setting" in message
    assert "did you mean 'randomness'" in message
    assert not (tmp_path / 'run').exists()


def test_every_shipped_config_passes_the_top_level_key_check(tmp_path):
    paths = [p for p in glob.glob(osp.join(CONFIG_DIR, '**', '*.py'), recursive=True) if '_base_' not in p]
    assert len(paths) > 40
    for path in paths:
        check_top_level_keys(load_config(path))
    # As mmengine dumps a config into its work dir (the variables' values in place).
    dumped = str(tmp_path / 'dumped.py')
    load_config(osp.join(CONFIG_DIR, 'benchmarks', 'linear', 'linear_r50_100e_places205.py')).dump(dumped)
    check_top_level_keys(Config.fromfile(dumped))


def test_circular_base_names_the_cycle(tmp_path):
    (tmp_path / 'a.py').write_text("_base_ = ['b.py']\nx = 1\n")
    (tmp_path / 'b.py').write_text("_base_ = ['./a.py']\ny = 2\n")
    message = train_error(str(tmp_path / 'a.py'))
    assert 'a.py -> b.py -> a.py' in message and 'RecursionError' not in message
    (tmp_path / 'leaf.py').write_text("_base_ = ['_base_/c.py']\n")
    (tmp_path / '_base_').mkdir()
    (tmp_path / '_base_' / 'c.py').write_text("_base_ = ['c.py']\n")
    assert 'c.py -> c.py' in train_error(str(tmp_path / 'leaf.py'))


def test_cfg_options_key_without_a_value(tmp_path):
    message = train_error(digits_config_file(tmp_path), '--cfg-options', 'train_cfg.max_epochs=1', 'key')
    assert message == "error: --cfg-options 'key' has no value: write key=VALUE"
