"""Bad input, tried as a new user would: each ends with one line naming the problem and the fix."""
import importlib.util
import os
import os.path as osp

import pytest
import torch
from helpers import TINY_BACKBONE, TINY_NECK, digits_config
from PIL import Image

from ifnd.models.algorithms import SimCLR

REPO = osp.abspath(osp.join(osp.dirname(__file__), '..'))
_spec = importlib.util.spec_from_file_location('train_tool', osp.join(REPO, 'tools', 'train.py'))
train_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_tool)


def _error(*argv: str) -> str:
    """Run tools/train.py in this process; return its one-line error."""
    with pytest.raises(SystemExit) as exit_info:
        train_tool.main(list(argv))
    message = str(exit_info.value.code)
    assert '\n' not in message, message
    return message


def _config_file(tmp_path, max_epochs: int = 1, **overrides) -> str:
    cfg = digits_config(str(tmp_path / 'run'), dict(type='SimCLR', temperature=0.5), max_epochs=max_epochs,
                        **overrides)
    cfg.train_dataloader.dataset.subset_fraction = 0.1
    path = str(tmp_path / 'cfg.py')
    cfg.dump(path)
    return path


def _with(tmp_path, **changes) -> str:
    """The digits config with nested ``changes`` merged, as a file."""
    from mmengine.config import Config
    path = _config_file(tmp_path)
    cfg = Config.fromfile(path)
    cfg.merge_from_dict(changes)
    cfg.dump(path)
    return path


def test_missing_config_file():
    message = _error('configs/ifnd/no_such_config.py')
    assert 'Config file not found: configs/ifnd/no_such_config.py' in message and 'configs/' in message


def test_unknown_registry_type(tmp_path):
    message = _error(_with(tmp_path, model=dict(type='SimCRL')))
    assert message.startswith('error: SimCRL is not in the ifnd::model registry')


@pytest.mark.parametrize('option, suggestion', [
    ('train_cfg.max_epoch=1', "did you mean 'train_cfg.max_epochs'"),
    ('custom_hooks.0.schem=step', "did you mean 'custom_hooks.0.scheme'"),
    ('optim_wrapper.optimizer.momentom=0.5', "did you mean 'optim_wrapper.optimizer.momentum'"),
    ('trian_dataloader.batch_size=8', "did you mean 'train_dataloader'"),
])
def test_cfg_options_typo_names_the_key_and_the_closest_one(option, suggestion):
    message = _error('configs/ifnd/ifnd_r18_demo_fmnist.py', '--cfg-options', option)
    assert f"--cfg-options key '{option.split('=')[0]}' is not in" in message and suggestion in message


def test_misspelt_keyword_of_a_class_taking_any_keyword(tmp_path):
    """IFND passes unknown keywords on to its base class, so the build itself names the typo."""
    message = _error(_config_file(tmp_path), '--cfg-options', 'model.temprature=0.1')
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
    message = _error('configs/ifnd/ifnd_r18_demo_fmnist.py', '--work-dir', str(tmp_path / 'run'),
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
    message = _error(path)
    assert f"Cannot read image '{broken}'" in message and 'remove or replace the file' in message


def test_more_clusters_than_samples(tmp_path):
    cfg = digits_config(str(tmp_path / 'run'), dict(type='IFND', temperature=0.5), max_epochs=1,
                        pseudo_labels=dict(num_clusters=[10, 5000]))
    path = str(tmp_path / 'cfg.py')
    cfg.dump(path)
    message = _error(path)
    assert 'cannot form 5000 clusters from 1347 samples' in message and 'smaller' in message


def test_checkpoint_of_another_architecture(tmp_path):
    other = SimCLR(backbone=dict(TINY_BACKBONE, channels=(16, 32, 64, 128)), neck=TINY_NECK)
    ckpt = tmp_path / 'wide.pth'
    torch.save({'state_dict': other.state_dict(), 'meta': {}}, ckpt)
    message = _error(_config_file(tmp_path), '--cfg-options', f'load_from={ckpt}')
    assert f'checkpoint {ckpt} does not fit the model SimCLR' in message
    assert 'shape mismatches (backbone.model.' in message and 'config it was written with' in message


def test_truncated_checkpoint(tmp_path):
    path = _config_file(tmp_path)
    train_tool.main([path])
    ckpt = tmp_path / 'run' / 'epoch_1.pth'
    data = ckpt.read_bytes()
    cut = tmp_path / 'cut.pth'
    cut.write_bytes(data[:len(data) // 2])
    message = _error(path, '--resume', str(cut))
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
    message = _error(_config_file(tmp_path, batch_size=16))
    assert f'the loss became nan at iteration 3 (epoch 1); the last finite loss was {calls[1]:.6g} ' \
           'at iteration 2' in message and 'Lower the learning rate' in message


def test_full_disk_while_saving_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = _config_file(tmp_path, max_epochs=2)
    real_fsync = os.fsync

    def fsync_disk_full_for_epoch_2(fd):
        if osp.basename(os.readlink(f'/proc/self/fd/{fd}')).endswith('epoch_2.pth'):
            raise OSError(28, 'No space left on device')
        real_fsync(fd)

    monkeypatch.setattr(os, 'fsync', fsync_disk_full_for_epoch_2)
    message = _error(path)
    run = tmp_path / 'run'
    assert f'could not write {run / "epoch_2.pth"} (No space left on device)' in message
    assert 'Free space' in message
    assert sorted(f for f in os.listdir(run) if not osp.isdir(run / f) and f != 'cfg.py') == \
        ['epoch_1.pth', 'last_checkpoint'], 'no temp file is left, the last checkpoint survives'
    assert (run / 'last_checkpoint').read_text().endswith('epoch_1.pth')
    monkeypatch.setattr(os, 'fsync', real_fsync)
    train_tool.main([path, '--resume'])  # space freed: the run continues from epoch 1
    assert torch.load(run / 'epoch_2.pth', weights_only=False)['meta']['epoch'] == 2


def test_resume_in_an_empty_work_dir(tmp_path):
    message = _error(_config_file(tmp_path), '--resume')
    assert 'found no checkpoint in' in message and 'without --resume' in message


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the message on machines without a GPU')
def test_amp_without_a_gpu():
    message = _error('configs/ifnd/ifnd_r18_demo_fmnist.py', '--amp')
    assert '--amp needs a GPU' in message
