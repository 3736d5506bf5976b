"""Silent wrong results: outputs that replace inputs, image folders read wrongly, class ids
compared across splits that number their classes differently."""
import copy
import os
import os.path as osp

import numpy as np
import pytest
from helpers import CONFIG_DIR, TINY_BACKBONE, load_tool
from mmengine.config import Config
from mmengine.registry import init_default_scope
from PIL import Image

from ifnd.datasets import ImageFolder
from ifnd.engine.arguments import check_arguments
from ifnd.evaluation.class_match import class_id_map, match_eval_classes
from ifnd.models.classifier import ImageClassifier
from ifnd.registry import MODELS, RUNNERS

# ------------------------------------------------------------------------------ outputs that are inputs
@pytest.mark.parametrize('alias', ['same', 'dot', 'symlink', 'hardlink'])
def test_check_arguments_refuses_an_output_that_is_an_input(tmp_path, monkeypatch, alias):
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'ckpt.pth').write_bytes(b'weights')
    out = {'same': 'ckpt.pth', 'dot': './ckpt.pth'}.get(alias, f'{alias}.pth')
    if alias == 'symlink':
        os.symlink('ckpt.pth', out)
    elif alias == 'hardlink':
        os.link('ckpt.pth', out)
    with pytest.raises(SystemExit, match=rf'--out {out} is the same file as checkpoint ckpt.pth: writing it '
                                         r'would replace it; give --out another path'):
        check_arguments(inputs={'checkpoint': 'ckpt.pth'}, outputs={'--out': out})
    assert (tmp_path / 'ckpt.pth').read_bytes() == b'weights'


def test_check_arguments_refuses_two_outputs_in_one_file_and_keeps_other_paths(tmp_path):
    (tmp_path / 'a.pth').write_bytes(b'a')
    with pytest.raises(SystemExit, match=r'--csv .*x.png is the same file as --out .*x.png'):
        check_arguments(outputs={'--out': str(tmp_path / 'x.png'), '--csv': str(tmp_path / 'x.png')})
    with pytest.raises(SystemExit, match=r'--out .*a.pth is the same file as CKPT .*a.pth'):
        check_arguments(inputs={'CKPT': [str(tmp_path / 'a.pth')], '--config': None},
                        outputs={'--out': str(tmp_path / 'a.pth')})
    # A copy with the same content is another file; a missing optional input is skipped.
    (tmp_path / 'copy.pth').write_bytes(b'a')
    check_arguments(inputs={'checkpoint': str(tmp_path / 'a.pth'), '--config': None},
                    outputs={'--out': str(tmp_path / 'copy.pth'), '--csv': None})


ROUNDS = 'work/pseudo_labels/epoch_1.npz'
# tool: (argv, error) where an output flag names one of the tool's inputs (``IN``: an existing file).
OUTPUT_IS_INPUT = {
    'extract_backbone': (['IN', 'IN'], 'out IN is the same file as checkpoint IN'),
    'convert_to_detectron2': (['IN', './IN'], 'out ./IN is the same file as checkpoint IN'),
    'knn_eval': (['IN', '--config', 'CFG', '--out', 'CFG'], '--out CFG is the same file as --config CFG'),
    'voc07_svm': (['IN', '--data-root', '.', '--out', 'IN'], '--out IN is the same file as checkpoint IN'),
    'make_subset': (['--config', 'CFG', '--fraction', '0.5', '--out', 'CFG'],
                    '--out CFG is the same file as --config CFG'),
    'publish_model': (['IN', '--name', 'x', '--reproduce', 'y', '--index', 'IN'],
                      '--index IN is the same file as checkpoint IN'),
    'analysis/cluster_table': (['IN', '--config', 'CFG', '--out', 'IN'], '--out IN is the same file as CKPT IN'),
    'analysis/plot_embeddings': (['IN', '--config', 'CFG', '--rounds', ROUNDS, '--out', ROUNDS],
                                 f'--out {ROUNDS} is the same file as --rounds {ROUNDS}'),
    'analysis/cluster_quality_curve': (['work', '--out', ROUNDS],
                                       f'--out {ROUNDS} is the same file as WORK_DIR {ROUNDS}'),
}


@pytest.mark.parametrize('name', OUTPUT_IS_INPUT)
def test_tools_refuse_an_output_that_is_an_input(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'IN').write_bytes(b'input')
    (tmp_path / 'CFG').write_text('x = 1\n')
    (tmp_path / ROUNDS).parent.mkdir(parents=True)
    (tmp_path / ROUNDS).write_bytes(b'round')
    argv, message = OUTPUT_IS_INPUT[name]
    with pytest.raises(SystemExit, match=f'error: {message}'.replace('.', r'\.')):
        load_tool(name).main(argv)
    assert (tmp_path / 'IN').read_bytes() == b'input' and (tmp_path / 'CFG').read_text() == 'x = 1\n'
    assert (tmp_path / ROUNDS).read_bytes() == b'round'


def test_make_subset_refuses_to_replace_the_list_file_it_reads(tmp_path):
    (tmp_path / 'img').mkdir()
    Image.new('RGB', (8, 8)).save(tmp_path / 'img' / '0.png')
    (tmp_path / 'list.txt').write_text('img/0.png 0\n')
    config = tmp_path / 'cfg.py'
    config.write_text(f"train_dataloader = dict(dataset=dict(type='ImageFolder', data_root={str(tmp_path)!r}, "
                      "ann_file='list.txt'))\n")
    with pytest.raises(SystemExit, match=r'--out .*list.txt is the same file as '
                                         r'train_dataloader.dataset.ann_file .*list.txt'):
        load_tool('make_subset').make_subset(str(config), 1.0, 0, str(tmp_path / 'list.txt'))
    assert (tmp_path / 'list.txt').read_text() == 'img/0.png 0\n'


# ------------------------------------------------------------------------------ image folders
def _tree(root, counts: dict, colour_of=None) -> None:
    """Class folders ``root/<name>`` with ``counts[name]`` 8x8 images (a class's own colour)."""
    for name, n in counts.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            colour = colour_of[name] if colour_of else (i * 40, 0, 0)
            Image.new('RGB', (8, 8), colour).save(root / name / f'{i}.png')


def test_image_folder_refuses_a_symlink_loop(tmp_path):
    _tree(tmp_path, {'a': 2, 'b': 1})
    os.symlink('.', tmp_path / 'a' / 'self')
    with pytest.raises(ValueError, match=rf"Image folder '{tmp_path}/a/self' is a symlink loop: it leads back to "
                                         rf"'{tmp_path}/a'.*remove the symlink"):
        ImageFolder(str(tmp_path))
    os.unlink(tmp_path / 'a' / 'self')
    os.symlink('..', tmp_path / 'a' / 'up')  # back to the data root
    with pytest.raises(ValueError, match=rf"'{tmp_path}/a/up' is a symlink loop: it leads back to '{tmp_path}'"):
        ImageFolder(str(tmp_path))


def test_image_folder_refuses_a_second_name_for_a_folder_and_follows_other_links(tmp_path):
    _tree(tmp_path / 'data', {'a': 1, 'b': 1})
    _tree(tmp_path / 'elsewhere', {'c': 2})
    os.symlink(tmp_path / 'elsewhere' / 'c', tmp_path / 'data' / 'c')  # a class folder kept elsewhere
    ds = ImageFolder(str(tmp_path / 'data'))
    assert ds.classes == ['a', 'b', 'c'] and ds.labels.tolist() == [0, 1, 2, 2]
    os.symlink('../b', tmp_path / 'data' / 'a' / 'b_again')
    with pytest.raises(ValueError, match=r"'.*data/b' is the same folder as '.*data/a/b_again'"):
        ImageFolder(str(tmp_path / 'data'))


@pytest.mark.parametrize('unreadable', ['b', 'b/nested'])
def test_image_folder_refuses_an_unreadable_folder(tmp_path, monkeypatch, unreadable):
    _tree(tmp_path, {'a': 1, 'b': 1, 'b/nested': 1, 'c': 1})
    blocked = str(tmp_path / unreadable)
    scandir = os.scandir

    def refusing_scandir(path='.'):
        # Tests run as root, where chmod 000 does not stop reading: refuse as a normal user's read would.
        if osp.abspath(os.fspath(path)) == blocked:
            raise PermissionError(13, 'Permission denied', os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, 'scandir', refusing_scandir)
    with pytest.raises(PermissionError, match=rf"Cannot read folder '{blocked}' \(Permission denied\); its images "
                                              r'would be left out.*chmod -R u\+rX'):
        ImageFolder(str(tmp_path))


# ------------------------------------------------------------------------------ class ids across splits
def test_class_id_map_matches_by_name_and_refuses_unknown_classes():
    assert class_id_map(['a', 'b'], ['a', 'b']) is None and class_id_map(None, ['a']) is None
    assert class_id_map(['a', 'b', 'c'], ['a', 'c']).tolist() == [0, 2]
    with pytest.raises(ValueError, match=r"have classes the training split lacks: 'b'; .*accuracy would be"):
        class_id_map(['a', 'c'], ['a', 'b', 'c'])

    class Split:
        classes, labels, num_classes = ['a', 'c'], np.array([0, 1, -1]), 2

    split = Split()
    assert match_eval_classes(['a', 'b', 'c'], split)
    assert split.labels.tolist() == [0, 2, -1] and split.classes == ['a', 'b', 'c'] and split.num_classes == 3
    assert not match_eval_classes(['a', 'b', 'c'], split)  # matched once: unchanged


COLOURS = {'a': (255, 0, 0), 'b': (0, 255, 0), 'c': (0, 0, 255)}


@MODELS.register_module(force=True)
class ColourOracle(ImageClassifier):
    """A perfect classifier of ``COLOURS`` images: the brightest channel is the class id that
    training on the folders a, b, c gives (a red 0, b green 1, c blue 2)."""

    def forward(self, inputs, data_samples=None, mode='tensor'):
        """The real head for the loss; perfect scores for predictions."""
        if mode != 'predict':
            return super().forward(inputs, data_samples, mode)
        views = inputs[0] if isinstance(inputs, (list, tuple)) else inputs
        scores = views.float().mean((2, 3)).cpu()
        labels = self._labels(data_samples, len(scores)).cpu()
        return [dict(pred_score=s, gt_label=y) for s, y in zip(scores, labels)]


def _linear_config(tmp_path, train_counts: dict, val_counts: dict) -> Config:
    """The Fashion-MNIST linear benchmark on tiny colour folders with the perfect classifier."""
    _tree(tmp_path / 'train', train_counts, COLOURS)
    _tree(tmp_path / 'val', val_counts, COLOURS)
    cfg = Config.fromfile(osp.join(CONFIG_DIR, 'benchmarks', 'linear', 'linear_r18_100e_fmnist.py'))
    loader = dict(num_workers=0, persistent_workers=False, batch_size=4, collate_fn=dict(type='default_collate'))
    view = dict(type='EvalView', size=8)
    cfg.train_dataloader = dict(cfg.train_dataloader, **loader,
                                dataset=dict(type='ImageFolder', data_root=str(tmp_path / 'train'), pipeline=view))
    cfg.val_dataloader = dict(cfg.val_dataloader, **loader,
                              dataset=dict(type='ImageFolder', data_root=str(tmp_path / 'val'), pipeline=view))
    cfg.test_dataloader = cfg.val_dataloader
    cfg.model = dict(cfg.model, type='ColourOracle', backbone=copy.deepcopy(TINY_BACKBONE), num_classes=3,
                     data_preprocessor=dict(type='ContrastiveDataPreprocessor', mean=(0.5,) * 3, std=(0.5,) * 3))
    cfg.val_evaluator = cfg.test_evaluator = dict(type='Accuracy', topk=(1,))
    cfg.merge_from_dict(dict(
        work_dir=str(tmp_path / 'work'), train_cfg=dict(max_epochs=1, val_interval=1),
        default_hooks=dict(logger=dict(interval=5), checkpoint=dict(interval=1)),
        visualizer=dict(type='Visualizer', vis_backends=[dict(type='LocalVisBackend')]),
        env_cfg=dict(cudnn_benchmark=False, dist_cfg=dict(backend='gloo')), log_level='WARNING'))
    return cfg


def test_linear_evaluation_matches_class_names_across_splits(tmp_path):
    init_default_scope('ifnd')
    # val has no class b: per-split ids give its c id 1, training's c is 2 (50% instead of 100%).
    cfg = _linear_config(tmp_path, {'a': 2, 'b': 2, 'c': 2}, {'a': 2, 'c': 2})
    runner = RUNNERS.build(cfg)
    runner.train()
    assert runner.message_hub.get_scalar('val/top1').current() == 100.0
    # Evaluation alone, from the checkpoint: its meta records the training classes.
    test_cfg = copy.deepcopy(cfg)
    test_cfg.merge_from_dict(dict(work_dir=str(tmp_path / 'test'), load_from=str(tmp_path / 'work' / 'epoch_1.pth')))
    assert RUNNERS.build(test_cfg).test()['top1'] == 100.0


def test_linear_evaluation_refuses_a_class_the_training_split_lacks(tmp_path):
    init_default_scope('ifnd')
    # train/b is empty, so it is no class there: a perfect model would score 33%.
    cfg = _linear_config(tmp_path, {'a': 2, 'b': 0, 'c': 2}, {'a': 1, 'b': 1, 'c': 1})
    runner = RUNNERS.build(cfg)
    with pytest.raises(ValueError, match=r"the validation images \(validation split\) have classes the training "
                                         r"split lacks: 'b'; .*classes=\[\.\.\.\]"):
        runner.train()
    assert runner.iter == 0, 'refused before training'


def test_knn_tool_refuses_a_class_the_bank_lacks(tmp_path):
    _tree(tmp_path / 'train', {'a': 2, 'b': 0, 'c': 2})
    _tree(tmp_path / 'val', {'a': 1, 'b': 1, 'c': 1})
    config = tmp_path / 'data.py'
    config.write_text(f"train_dataloader = dict(dataset=dict(type='ImageFolder', data_root={str(tmp_path / 'train')!r}))\n"
                      f"val_dataset = dict(type='ImageFolder', data_root={str(tmp_path / 'val')!r})\n"
                      "eval_pipeline = dict(type='EvalView', size=8)\n")
    (tmp_path / 'ckpt.pth').write_bytes(b'never read: the splits are refused first')
    init_default_scope('ifnd')
    with pytest.raises(SystemExit, match=r"error: the kNN queries \(validation split\) have classes the training "
                                         r"split lacks: 'b'"):
        load_tool('knn_eval').main([str(tmp_path / 'ckpt.pth'), '--config', str(config), '--num-workers', '0',
                                    '--device', 'cpu'])
