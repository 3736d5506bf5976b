"""Bad input, tried as a new user would: each ends with one line naming the problem and the fix."""
import json
import os
import os.path as osp
import time

import numpy as np
import pytest
import torch
from helpers import TINY_BACKBONE, TINY_NECK, digits_config, digits_config_file, train_error, train_tool
from PIL import Image

from ifnd.engine.work_dir import LOCK_NAME
from ifnd.models import SimCLR

REPO = osp.abspath(osp.join(osp.dirname(__file__), '..'))


def _with(tmp_path, **changes) -> str:
    """The digits config with nested ``changes`` merged, as a file."""
    from mmengine.config import Config
    path = digits_config_file(tmp_path)
    cfg = Config.fromfile(path)
    cfg.merge_from_dict(changes)
    cfg.dump(path)
    return path


def test_missing_config_file():
    message = train_error('configs/ifnd/no_such_config.py')
    assert 'Config file not found: configs/ifnd/no_such_config.py' in message and 'configs/' in message


def test_unknown_registry_type(tmp_path):
    message = train_error(_with(tmp_path, model=dict(type='SimCRL')))
    assert message.startswith('error: SimCRL is not in the ifnd::model registry')


@pytest.mark.parametrize('option, suggestion', [
    ('train_cfg.max_epoch=1', "did you mean 'train_cfg.max_epochs'"),
    ('custom_hooks.0.intervl=2', "did you mean 'custom_hooks.0.interval'"),
    ('custom_hooks.0.acceptance.final_rat=0.5', "did you mean 'custom_hooks.0.acceptance.final_rate'"),
    ('optim_wrapper.optimizer.momentom=0.5', "did you mean 'optim_wrapper.optimizer.momentum'"),
    ('trian_dataloader.batch_size=8', "did you mean 'train_dataloader'"),
])
def test_cfg_options_typo_names_the_key_and_the_closest_one(option, suggestion):
    message = train_error('configs/ifnd/ifnd_r18_demo_fmnist.py', '--cfg-options', option)
    assert f"--cfg-options key '{option.split('=')[0]}' is not in" in message and suggestion in message


def test_misspelt_keyword_of_a_class_taking_any_keyword(tmp_path):
    """IFND passes unknown keywords on to its base class, so the build itself names the typo."""
    message = train_error(digits_config_file(tmp_path), '--cfg-options', 'model.temprature=0.1')
    assert "unexpected keyword argument 'temprature'; check its spelling" in message


def test_cfg_options_accepts_new_keywords_that_something_takes():
    from ifnd.engine.cli import runner_config
    cfg = runner_config('configs/ifnd/ifnd_r18_demo_fmnist.py', cfg_options={
        'model.backbone.drop_rate': 0.1,  # TimmBackbone passes keywords on to timm
        'optim_wrapper.clip_grad': dict(max_norm=1.0),  # an OptimWrapper argument
        'optim_wrapper.optimizer.nesterov': True,  # torch's SGD argument
        'auto_scale_lr': dict(enable=False, base_batch_size=256)})  # a Runner argument
    assert cfg.model.backbone.drop_rate == 0.1 and cfg.optim_wrapper.optimizer.nesterov


def test_data_root_without_the_expected_files(tmp_path):
    message = train_error('configs/ifnd/ifnd_r18_demo_fmnist.py', '--work-dir', str(tmp_path / 'run'),
                     '--cfg-options', f'train_dataloader.dataset.data_root={tmp_path}')
    assert 'train-images-idx3-ubyte' in message and str(tmp_path) in message


def test_truncated_image_is_named(tmp_path):
    folder = tmp_path / 'images' / 'cat'
    folder.mkdir(parents=True)
    for i in range(4):
        Image.new('RGB', (20, 20), (i * 40, 0, 0)).save(folder / f'{i}.jpg')
    broken = folder / '2.jpg'
    broken.write_bytes(broken.read_bytes()[:60])
    path = _with(tmp_path, train_dataloader=dict(
        batch_size=4, num_workers=1,
        dataset=dict(_delete_=True, type='ImageFolder', data_root=str(tmp_path / 'images'),
                     pipeline=dict(type='MultiView', num_views=2,
                                   transforms=dict(type='ContrastiveView', size=16)))))
    message = train_error(path)
    assert f"Cannot read image '{broken}'" in message and 'remove or replace the file' in message


def test_more_clusters_than_samples(tmp_path):
    cfg = digits_config(str(tmp_path / 'run'), dict(type='IFND', temperature=0.5), max_epochs=1,
                        pseudo_labels=dict(num_clusters=[10, 5000]))
    path = str(tmp_path / 'cfg.py')
    cfg.dump(path)
    message = train_error(path)
    assert 'cannot form 5000 clusters from 1347 samples' in message and 'smaller' in message


def test_checkpoint_of_another_architecture(tmp_path):
    other = SimCLR(backbone=dict(TINY_BACKBONE, channels=(16, 32, 64, 128)), neck=TINY_NECK)
    ckpt = tmp_path / 'wide.pth'
    torch.save({'state_dict': other.state_dict(), 'meta': {}}, ckpt)
    message = train_error(digits_config_file(tmp_path), '--cfg-options', f'load_from={ckpt}')
    assert f'checkpoint {ckpt} does not fit the model SimCLR' in message
    assert 'shape mismatches (backbone.model.' in message and 'config it was written with' in message


def test_truncated_checkpoint(tmp_path):
    path = digits_config_file(tmp_path)
    train_tool.main([path])
    ckpt = tmp_path / 'run' / 'epoch_1.pth'
    data = ckpt.read_bytes()
    cut = tmp_path / 'cut.pth'
    cut.write_bytes(data[:len(data) // 2])
    message = train_error(path, '--resume', str(cut))
    assert f'checkpoint {cut} is truncated or corrupt' in message and 'earlier checkpoint' in message


def test_nan_loss_stops_with_the_iteration_and_the_last_finite_loss(tmp_path, monkeypatch):
    calls = []
    finite_loss = SimCLR.loss

    def loss_nan_at_third_step(self, inputs, data_samples):
        out = finite_loss(self, inputs, data_samples)
        calls.append(float(out['loss']))
        if len(calls) == 3:
            out['loss'] = out['loss'] * float('nan')
        return out

    monkeypatch.setattr(SimCLR, 'loss', loss_nan_at_third_step)
    message = train_error(digits_config_file(tmp_path, batch_size=16))
    assert f'the loss became nan at iteration 3 (epoch 1); the last finite loss was {calls[1]:.6g} ' \
           'at iteration 2' in message and 'Lower the learning rate' in message


def _fill_disk_at_epoch_2(monkeypatch) -> None:
    """Make ``os.fsync`` of epoch_2.pth fail as on a full disk (ENOSPC); other files sync as usual."""
    real_fsync = os.fsync

    def fsync_disk_full_for_epoch_2(fd):
        if osp.basename(os.readlink(f'/proc/self/fd/{fd}')).endswith('epoch_2.pth'):
            raise OSError(28, 'No space left on device')
        real_fsync(fd)

    monkeypatch.setattr(os, 'fsync', fsync_disk_full_for_epoch_2)


def _run_files(run) -> list[str]:
    """The files (not folders) of a work dir, without the dumped config and the run's lock."""
    return sorted(f for f in os.listdir(run) if not osp.isdir(run / f) and f not in ('cfg.py', LOCK_NAME))


def test_full_disk_while_saving_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = digits_config_file(tmp_path, max_epochs=2)
    real_fsync = os.fsync
    _fill_disk_at_epoch_2(monkeypatch)
    message = train_error(path)
    run = tmp_path / 'run'
    assert f'could not write {run / "epoch_2.pth"} (No space left on device)' in message
    assert 'Free space' in message
    assert _run_files(run) == ['epoch_1.pth', 'last_checkpoint'], \
        'no temp file is left, the last checkpoint survives'
    assert (run / 'last_checkpoint').read_text().endswith('epoch_1.pth')
    monkeypatch.setattr(os, 'fsync', real_fsync)
    train_tool.main([path, '--resume'])  # space freed: the run continues from epoch 1
    assert torch.load(run / 'epoch_2.pth', weights_only=False)['meta']['epoch'] == 2


def test_full_disk_gives_one_line_and_no_traceback(tmp_path, monkeypatch, capsys):
    """The disk fills after epoch 1's checkpoint: the log file's writes fail, then epoch 2's checkpoint."""
    import logging
    path = digits_config_file(tmp_path, max_epochs=2)
    run = tmp_path / 'run'
    real_flush = logging.StreamHandler.flush

    def log_file_flush_on_a_full_disk(handler):  # FileHandler only: the console handler still works
        if (run / 'epoch_1.pth').exists():
            raise OSError(28, 'No space left on device')
        real_flush(handler)

    _fill_disk_at_epoch_2(monkeypatch)
    monkeypatch.setattr(logging.FileHandler, 'flush', log_file_flush_on_a_full_disk, raising=False)
    capsys.readouterr()
    message = train_error(path, '--cfg-options', 'log_level=INFO')  # epoch 2 logs lines after the disk filled
    out, err = capsys.readouterr()
    assert message.startswith(f'error: could not write {run / "epoch_2.pth"} (No space left on device); '
                              'earlier files are intact. Free space in')
    assert 'Traceback' not in out + err and 'Logging error' not in out + err
    assert (out + err).count('could not write the log file') == 1  # one warning, then the console only
    assert _run_files(run) == ['epoch_1.pth', 'last_checkpoint']


def test_resume_in_an_empty_work_dir(tmp_path):
    message = train_error(digits_config_file(tmp_path), '--resume')
    assert 'found no checkpoint in' in message and 'without --resume' in message


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the message on machines without a GPU')
def test_amp_without_a_gpu():
    message = train_error('configs/ifnd/ifnd_r18_demo_fmnist.py', '--amp')
    assert '--amp needs a GPU' in message


# ------------------------------------------------------------------- silent wrong results, refused
def _ifnd_config_file(tmp_path, num_clusters=(10,), max_epochs: int = 1, name: str = 'cfg.py',
                      **overrides) -> str:
    cfg = digits_config(str(tmp_path / 'run'), dict(type='IFND', temperature=0.5),
                        max_epochs=max_epochs, batch_size=64,
                        pseudo_labels=dict(num_clusters=list(num_clusters), interval=1), **overrides)
    cfg.train_dataloader.dataset.subset_fraction = 0.1
    path = str(tmp_path / name)
    cfg.dump(path)
    return path


def test_fewer_samples_than_one_batch_with_drop_last(tmp_path):
    message = train_error(digits_config_file(tmp_path, batch_size=256))
    assert 'the training set has 136 samples, fewer than one batch of 256 with drop_last=True' in message
    assert 'train_dataloader.batch_size to at most 136' in message and 'drop_last=False' in message
    assert not list((tmp_path / 'run').glob('*.pth')), 'no untrained checkpoint is written'


def _gradient_png16(path, rgb: bool = False) -> None:
    ramp = (np.arange(64 * 64, dtype=np.uint32).reshape(64, 64) * 16).astype(np.uint16)
    if rgb:  # Pillow cannot write 48-bit PNGs: OpenCV can (BGR order)
        import cv2
        cv2.imwrite(str(path), np.stack([ramp.T, ramp[::-1], ramp], -1))
    else:
        Image.fromarray(ramp).save(path)


@pytest.mark.parametrize('rgb', [False, True], ids=['gray16', 'rgb48'])
def test_16_bit_png_reads_at_full_range_on_both_paths(tmp_path, rgb):
    from ifnd.datasets import ImageFolder
    from ifnd.datasets.decode import decode_images, read_encoded
    (tmp_path / 'cls').mkdir()
    path = tmp_path / 'cls' / 'ramp.png'
    _gradient_png16(path, rgb)
    cpu = np.asarray(ImageFolder(str(tmp_path)).load_image(0))  # [H, W, 3] uint8
    device = decode_images([read_encoded(str(path))], [str(path)])[0]
    assert device.dtype == torch.uint8 and device.shape == (3, 64, 64)
    assert np.array_equal(device.permute(1, 2, 0).numpy(), cpu)
    assert len(np.unique(cpu)) > 200, 'the 16-bit range is scaled to 8 bits, not clipped'
    assert cpu[..., 0].max() == 255 and cpu[..., 0].min() == 0


def _splits_with_an_empty_class(root) -> None:
    """train/ant is empty, val/ant is not: folder order alone gives the splits different ids."""
    for split, counts in (('train', {'ant': 0, 'bee': 2, 'cat': 2}), ('val', {'ant': 1, 'bee': 1, 'cat': 1})):
        for name, n in counts.items():
            (root / split / name).mkdir(parents=True)
            for i in range(n):
                Image.new('RGB', (8, 8), (i * 50, 0, 0)).save(root / split / name / f'{i}.png')


def test_knn_refuses_splits_whose_class_ids_differ(tmp_path):
    from ifnd.hooks.knn_hook import KNNEvalHook
    _splits_with_an_empty_class(tmp_path)

    def hook(**extra):
        return KNNEvalHook(val_dataset=dict(type='ImageFolder', data_root=str(tmp_path / 'val'), **extra),
                           train_dataset=dict(type='ImageFolder', data_root=str(tmp_path / 'train'), **extra),
                           pipeline=dict(type='EvalView', size=8), num_workers=0)

    with pytest.raises(ValueError, match=r"\(validation split\) have classes the training split lacks: 'ant'; "
                                         r'.*meaningless.*classes=\[\.\.\.\]'):
        hook()._build_datasets(runner=None)
    train, val = hook(classes=['ant', 'bee', 'cat'])._build_datasets(runner=None)  # one shared class list
    assert train.classes == val.classes == ['ant', 'bee', 'cat']
    assert train.labels.tolist() == [1, 1, 2, 2] and val.labels.tolist() == [0, 1, 2]


def test_knn_compares_class_ids_by_name(tmp_path):
    from ifnd.hooks.knn_hook import query_class_ids
    assert query_class_ids(['a', 'b'], ['a', 'b']) is None
    assert query_class_ids(['a', 'b', 'c'], ['b', 'c']).tolist() == [1, 2]


def test_image_folder_classes_argument(tmp_path):
    from ifnd.datasets import ImageFolder
    _splits_with_an_empty_class(tmp_path)
    with pytest.raises(ValueError, match="has class folders not in classes: cat; add them"):
        ImageFolder(str(tmp_path / 'val'), classes=['ant', 'bee'])


def test_a_level_with_one_cluster_is_refused(tmp_path):
    message = train_error(_ifnd_config_file(tmp_path, num_clusters=[10, 1]))
    assert 'num_clusters=[10, 1] has a level with k=1' in message
    assert 'all negatives would be eliminated' in message and 'k >= 2' in message


# -------------------------------------------------------------------------- config mistakes, named
@pytest.mark.parametrize('option, expected', [
    ('train_cfg.max_epochs=ten', "config key 'train_cfg.max_epochs' must be int, got 'ten' (str)"),
    ('custom_hooks.0.num_clusters=10', "config key 'custom_hooks.0.num_clusters' must be list[int], got 10"),
    ('model.temperature=hot', "config key 'model.temperature' must be float, got 'hot' (str)"),
    ('custom_hooks.0.kmeans.niter=many', "config key 'custom_hooks.0.kmeans.niter' must be int"),
])
def test_config_value_of_the_wrong_type_names_key_and_type(tmp_path, option, expected):
    message = train_error('configs/ifnd/ifnd_r18_demo_fmnist.py', '--work-dir', str(tmp_path),
                     '--cfg-options', option)
    assert expected in message and '--cfg-options' in message


@pytest.mark.parametrize('channels', ['(8,16,32)', '(8,16,32,64,128)'])
def test_channels_of_the_wrong_length(tmp_path, channels):
    message = train_error(digits_config_file(tmp_path), '--cfg-options', f'model.backbone.channels={channels}')
    assert f'model.backbone.channels={channels.replace(",", ", ")}' in message
    assert 'resnet18 has 4 stages; give one width per stage' in message


def test_config_with_a_syntax_error_names_file_and_line(tmp_path):
    broken = tmp_path / 'broken.py'
    broken.write_text("model = dict(type='SimCLR',\n             temperature=0.5\ntrain_cfg = dict()\n")
    message = train_error(str(broken))
    assert message.startswith(f'error: config {broken} line ') and 'fix the file' in message
    leaf = tmp_path / 'leaf.py'
    leaf.write_text("_base_ = ['broken.py']\n")
    assert f'config {broken} line ' in train_error(str(leaf)), 'an error in a base file names that file'


def test_python_config_saved_as_yaml(tmp_path):
    path = tmp_path / 'cfg.yaml'
    path.write_text(open(digits_config_file(tmp_path)).read())
    message = train_error(str(path))
    assert f'config {path} is Python, not yaml: rename it to {tmp_path / "cfg.py"}' in message


def test_documented_kmeans_options_pass_the_key_check(tmp_path):
    from ifnd.engine.cli import runner_config
    shipped = ['configs/ifnd/ifnd_r18_demo_fmnist.py', 'configs/ifnd_r50_200e_in1k.py',
               'configs/ifnd/pcl_r50_1000e_cifar100.py', _ifnd_config_file(tmp_path)]  # last: no kmeans dict
    for path in shipped:
        cfg = runner_config(path, cfg_options={'custom_hooks.0.kmeans.backend': 'torch',
                                               'custom_hooks.0.kmeans.sharded': False})
        assert cfg.custom_hooks[0].kmeans.backend == 'torch' and cfg.custom_hooks[0].kmeans.sharded is False
    for path in (shipped[0], shipped[-1]):
        message = train_error(path, '--cfg-options', 'custom_hooks.0.kmeans.backnd=torch')
        assert "did you mean 'custom_hooks.0.kmeans.backend'" in message


def test_cfg_options_values_keep_their_spaces():
    args = train_tool.parse_args(['cfg.py', '--cfg-options', 'train_dataloader.dataset.data_root=/data/my images',
                                  'custom_hooks.0.num_clusters=[10, 30]', "a.b=['x y', 'z']", 'c=(1, 2)', 'd=1,2'])
    assert args.cfg_options == {'train_dataloader.dataset.data_root': '/data/my images',
                                'custom_hooks.0.num_clusters': [10, 30], 'a.b': ['x y', 'z'],
                                'c': (1, 2), 'd': [1, 2]}


# ------------------------------------------------------------------------ pseudo-label files on resume
def _rounds_json(run) -> list:
    def refuse(constant):
        raise AssertionError(f'rounds.json holds {constant}, which is not JSON')
    return json.loads((run / 'pseudo_labels' / 'rounds.json').read_text(), parse_constant=refuse)


def _next_second() -> None:
    """Wait for the next second: mmengine names a run's logger and log folder by the second it
    starts, so a second run started in the same second by the same process would log nowhere new."""
    time.sleep(1.01 - time.time() % 1)


def test_rounds_json_is_strict_json_and_survives_corruption(tmp_path, caplog):
    path = _ifnd_config_file(tmp_path, max_epochs=2)
    run = tmp_path / 'run'
    train_tool.main([path, '--cfg-options', 'train_cfg.max_epochs=1'])
    rounds = _rounds_json(run)
    assert rounds[0]['epoch'] == 0 and rounds[0]['levels'][0]['smallest_accepted'] is None  # was Infinity
    summary = run / 'pseudo_labels' / 'rounds.json'
    summary.write_text(summary.read_text()[:40])  # a run killed mid-write by another tool, a full disk
    leftover = run / 'pseudo_labels' / '.tmp_abc_epoch_0001.npz'  # a run killed while writing labels
    leftover.write_bytes(b'half')
    _next_second()
    train_tool.main([path, '--resume'])
    assert not leftover.exists()
    assert (run / 'epoch_2.pth').is_file(), 'the epoch and its checkpoint are not lost'
    assert [r['epoch'] for r in _rounds_json(run)] == [2]
    assert len((run / 'pseudo_labels' / 'rounds.json.corrupt').read_text()) == 40, 'kept for a look'
    log = ''.join(p.read_text() for p in run.glob('*/*.log'))
    assert f'{summary} is corrupt' in log and 'rounds.json.corrupt' in log


def test_resume_with_other_cluster_numbers_clusters_again(tmp_path):
    path = _ifnd_config_file(tmp_path, max_epochs=2)
    run = tmp_path / 'run'
    train_tool.main([path, '--cfg-options', 'train_cfg.max_epochs=1'])
    _next_second()
    train_tool.main([path, '--resume', '--cfg-options', 'custom_hooks.0.num_clusters=[12]'])
    log = ''.join(p.read_text() for p in run.glob('*/*.log'))
    assert ("pseudo labels (k=[10], independent, 136 samples) do not match this run "
            "(num_clusters=[12], hierarchy='independent'") in log
    assert np.load(run / 'pseudo_labels' / 'epoch_0001.npz')['num_clusters'].tolist() == [12]
    state = torch.load(run / 'epoch_2.pth', weights_only=False)['state_dict']
    assert state['label_bank.num_clusters'].tolist() == [12]


def test_full_disk_while_saving_pseudo_labels(tmp_path, monkeypatch):
    real_fsync = os.fsync

    def fsync_disk_full_for_labels(fd):
        if os.readlink(f'/proc/self/fd/{fd}').endswith('.npz'):
            raise OSError(28, 'No space left on device')
        real_fsync(fd)

    monkeypatch.setattr(os, 'fsync', fsync_disk_full_for_labels)
    message = train_error(_ifnd_config_file(tmp_path))
    folder = tmp_path / 'run' / 'pseudo_labels'
    assert f'could not write {folder / "epoch_0000.npz"} (No space left on device)' in message
    assert 'Free space' in message and os.listdir(folder) == [], 'no temp file is left'


def _deep(levels: int) -> str:
    return '[' * levels + ']' * levels


@pytest.mark.parametrize('damage', [
    pytest.param(lambda p: p.write_text(_deep(100_000)), id='deeper-than-the-parser'),
    pytest.param(lambda p: p.write_text(f'[{{"epoch": 0, "levels": {_deep(200)}}}]'), id='deep'),
    pytest.param(lambda p: p.write_text('42'), id='a-number'),
    pytest.param(lambda p: p.write_text('{"epoch": 0, "rate": 0.5}'), id='a-mapping'),
    pytest.param(lambda p: p.write_text('[{"epoch": true}, 3]'), id='a-list-of-other-things'),
    pytest.param(lambda p: p.write_bytes(b'[{"epoch": 0, "note": "\xff\xfe"}]'), id='not-utf-8'),
    pytest.param(lambda p: p.write_text('[{"epoch": 0, "rate": NaN}]'), id='not-strict-json'),
    pytest.param(lambda p: (p.write_text('['), os.truncate(p, 65 << 20)), id='huge'),  # sparse
    pytest.param(lambda p: (p.mkdir(), (p / 'x.json').write_text('[]')), id='a-folder'),
])
def test_a_damaged_rounds_json_never_costs_the_checkpoint(tmp_path, damage):
    """Whatever lies at pseudo_labels/rounds.json, the rounds and the epoch's checkpoint are
    written: the damaged file is logged and set aside, and the summary starts anew."""
    from ifnd.registry import RUNNERS
    run = tmp_path / 'run'
    summary = run / 'pseudo_labels' / 'rounds.json'
    summary.parent.mkdir(parents=True)
    damage(summary)
    cfg = digits_config(str(run), dict(type='IFND', temperature=0.5), max_epochs=1,
                        pseudo_labels=dict(num_clusters=[10], interval=1))
    cfg.train_dataloader.dataset.subset_fraction = 0.1
    RUNNERS.build(cfg).train()
    assert (run / 'epoch_1.pth').is_file(), 'the epoch and its checkpoint are not lost'
    assert [r['epoch'] for r in _rounds_json(run)] == [0, 1]
    assert (run / 'pseudo_labels' / 'rounds.json.corrupt').exists(), 'kept for a look'
    log = ''.join(p.read_text() for p in run.glob('*/*.log'))
    assert f'{summary} is corrupt (' in log and 'moved to' in log
