"""Tools end bad input with one line, checked before any work: paths, batch size, launcher, and
files that are no checkpoint (a web page, Python source, text, a truncated archive)."""
import argparse
import contextlib
import functools
import io
import os
import os.path as osp
import subprocess
import sys
from unittest import mock

import pytest
import torch
from helpers import digits_config_file, load_tool, train_error

from ifnd.models.backbones import TimmBackbone

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
TORCHRUN_VARIABLES = ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'LOCAL_RANK')


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    """A backbone file, a folder of checkpoints, and a plain file to put paths under."""
    root = tmp_path_factory.mktemp('tools')
    backbone = dict(type='TimmBackbone', model_name='resnet18', cifar_stem=True, channels=(8, 16, 32, 64))
    model = TimmBackbone('resnet18', cifar_stem=True, channels=(8, 16, 32, 64))
    ckpt = root / 'backbone.pth'
    torch.save({'state_dict': model.model.state_dict(), 'meta': {'model': {'backbone': backbone}}}, ckpt)
    (root / 'run').mkdir()
    (root / 'run' / 'epoch_3.pth').write_bytes(ckpt.read_bytes())
    (root / 'a_file').write_text('x')
    return root


def _run(tool, *args):
    """Run a tool's ``main`` in this process (one import of torch for all the cases), as its
    command line would: the exit status and what it printed to stderr."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), mock.patch.dict(os.environ):
        for name in TORCHRUN_VARIABLES:
            os.environ.pop(name, None)
        try:
            _tool(tool).main([str(a) for a in args])
            code = 0
        except SystemExit as exit_info:
            code = exit_info.code
            if isinstance(code, str):  # what Python prints for SystemExit(message), status 1
                print(code, file=sys.stderr)
                code = 1
    return subprocess.CompletedProcess(args, code or 0, '', stderr.getvalue())


@functools.cache
def _tool(name: str):
    return load_tool(name)


def _fails_with(out, *fragments):
    assert out.returncode == 1 and 'Traceback' not in out.stderr, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert lines and lines[-1].startswith('error: '), out.stderr[-3000:]
    assert all(f in lines[-1] for f in fragments), out.stderr[-3000:]


# (tool, how it takes the checkpoint and the output: positional out or --out)
DIGITS = osp.join(REPO, 'configs', '_base_', 'datasets', 'digits.py')
TOOLS = [('knn_eval', ['--dataset', 'digits', '--out']), ('extract_backbone', []),
         ('convert_to_detectron2', []), ('analysis/cluster_table', ['--config', DIGITS, '--out']),
         ('analysis/plot_embeddings', ['--config', DIGITS, '--out']),
         ('voc07_svm', ['--data-root', 'x', '--out'])]


@pytest.mark.parametrize('tool, out_flag', TOOLS)
@pytest.mark.parametrize('problem', ['checkpoint is a folder', 'output is a folder',
                                     'output under a file'])
def test_paths_are_checked_before_the_work(files, tool, out_flag, problem):
    ckpt, out = files / 'backbone.pth', files / 'out' / 'result.json'
    expected = ()
    if problem == 'checkpoint is a folder':
        ckpt, expected = files / 'run', ('is a folder; pass the file inside it', 'epoch_3.pth')
    elif problem == 'output is a folder':
        out, expected = files / 'run', ('is a folder; give a file name',)
    else:
        out, expected = files / 'a_file' / 'result.json', ('a_file is a file, not a folder',)
    _fails_with(_run(tool, ckpt, *out_flag, out), *expected)
    assert not (files / 'out').exists()


@pytest.mark.parametrize('tool', ['knn_eval', 'analysis/cluster_table'])
def test_batch_size_zero(files, tool):
    _fails_with(_run(tool, files / 'backbone.pth', '--config', DIGITS, '--batch-size', '0'),
                '--batch-size must be at least 1, got 0')


def test_publish_model_checks_its_paths(files):
    args = ['--name', 'x', '--reproduce', '-']
    _fails_with(_run('publish_model', files / 'run', *args), 'is a folder; pass the file inside it')
    _fails_with(_run('publish_model', files / 'backbone.pth', *args, '--out-dir', files / 'a_file'),
                '--out-dir', 'is a file, not a folder')
    _fails_with(_run('publish_model', files / 'backbone.pth', *args, '--index', files / 'run'),
                '--index', 'is a folder')


@pytest.mark.parametrize('tool, args', [
    ('train', ['configs/simclr/simclr_r18_200e_fmnist.py']),
    ('transfer_coco', ['CKPT', '--config', 'configs/benchmarks/coco/mask_rcnn_c4_tiny_shapes.py',
                       '--engine', 'torchvision'])])
def test_launcher_pytorch_without_torchrun(files, tmp_path, tool, args):
    args = [files / 'backbone.pth' if a == 'CKPT' else a for a in args]
    _fails_with(_run(tool, *args, '--launcher', 'pytorch', '--work-dir', tmp_path / 'w'),
                '--launcher pytorch needs the variables torchrun sets', 'RANK', 'torchrun')
    assert not (tmp_path / 'w').exists()


def _not_checkpoints(folder) -> dict:
    """Files that are not checkpoints, and what the error says each is."""
    page, source, text = folder / 'page.pth', folder / 'config.py', folder / 'notes.pth'
    page.write_text('<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body></body></html>\n')
    source.write_text("_base_ = ['../_base_/default_runtime.py']\nmodel = dict(type='SimCLR')\n")
    text.write_text('weights are on the shared drive\n')
    cut = folder / 'cut.pth'
    cut.write_bytes((folder / 'backbone.pth').read_bytes()[:2000])
    objects = folder / 'objects.pth'
    torch.save({'state_dict': torch.load(folder / 'backbone.pth', weights_only=True)['state_dict'],
                'hyper_parameters': argparse.Namespace(method='byol')}, objects)
    return {page: ('looks like an HTML page', 'download it again'),
            source: ('is Python source', 'pass the checkpoint file (.pth)'),
            text: ('is a text file', "starts with 'weights are on the shared drive'"),
            cut: ('is truncated or corrupt', 'copy the file again'),
            objects: ('holds Python objects (argparse.Namespace)', 'save the weights alone')}


@pytest.mark.parametrize('tool, args', [('knn_eval', ['--dataset', 'digits']), ('extract_backbone', ['OUT']),
                                        ('convert_to_detectron2', ['OUT']),
                                        ('voc07_svm', ['--data-root', 'x'])])
def test_a_file_that_is_no_checkpoint_is_named_without_unsafe_advice(files, tmp_path, tool, args):
    for path, says in _not_checkpoints(files).items():
        out = _run(tool, path, *[tmp_path / 'out' if a == 'OUT' else a for a in args])
        _fails_with(out, str(path), *says)
        assert 'weights_only' not in out.stderr, out.stderr
    assert not (tmp_path / 'out').exists()


def test_resume_from_a_file_that_is_no_checkpoint(files, tmp_path):
    config = digits_config_file(tmp_path)
    for path, says in _not_checkpoints(files).items():
        if path.name not in ('page.pth', 'config.py'):
            continue
        message = train_error(config, '--resume', str(path))
        assert str(path) in message and all(s in message for s in says), message
        assert 'weights_only' not in message, message
