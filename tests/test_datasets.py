"""Tests for ifnd.datasets: item format, on-disk readers, subsets, error messages and view transforms."""
import os

import numpy as np
import pytest
import torch
from mmengine.dataset import default_collate
from PIL import Image

from ifnd.datasets import (CIFAR10, CIFAR100, FASHION_MNIST_CLASSES, ContrastiveDataset, ContrastiveView,
                           CorruptImageError, Digits, EvalView, FashionMNIST, ImageFolder, ImageNet, MoCoV2View,
                           MultiView, SimCLRView, balanced_subset_indices, build_pipeline, read_idx)
from ifnd.registry import DATASETS, TRANSFORMS

from fake_data import fake_cifar, fake_fmnist, write_idx



# ----------------------------------------------------------------------------------------------- helpers
def _rgb(seed: int, size=(12, 10)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def _check_item(item, index, num_views=1, shape=None):
    assert set(item) == {'inputs', 'index', 'label'}
    assert isinstance(item['inputs'], list) and len(item['inputs']) == num_views
    for view in item['inputs']:
        assert isinstance(view, torch.Tensor) and view.dtype == torch.float32
        assert view.ndim == 3 and view.shape[0] == 3
        assert 0.0 <= view.min() and view.max() <= 1.0
        if shape is not None:
            assert tuple(view.shape[1:]) == shape
    assert isinstance(item['index'], int) and item['index'] == index
    assert isinstance(item['label'], int)


@pytest.fixture
def image_tree(tmp_path):
    """data_root/{train,val}/<wnid>/*: 3 classes, PNG and JPEG files, plus files that are not images."""
    root = tmp_path / 'imagenet'
    counts = {'n01440764': 4, 'n01443537': 2, 'n01484850': 3}
    k = 0
    for split in ('train', 'val'):
        for wnid, n in counts.items():
            d = root / split / wnid
            d.mkdir(parents=True)
            for i in range(n):
                ext = '.JPEG' if i % 2 == 0 else '.png'
                _rgb(k).save(d / f'{wnid}_{i}{ext}')
                k += 1
            (d / 'notes.txt').write_text('not an image')
    (root / 'train' / '.cache').mkdir()
    (root / 'train' / 'empty_dir').mkdir()
    return root, counts


# ----------------------------------------------------------------------------------------------- transforms
def test_contrastive_view_shape_dtype_range():
    img = _rgb(0, size=(40, 30))
    for view in (ContrastiveView(16), SimCLRView(16), MoCoV2View(16), ContrastiveView(16, blur_p=1.0)):
        out = view(img)
        assert out.shape == (3, 16, 16) and out.dtype == torch.float32
        assert 0.0 <= out.min() and out.max() <= 1.0
    # grayscale input is expected to be converted to RGB by the dataset; the view keeps 3 channels
    assert ContrastiveView(8, grayscale_p=1.0)(img).shape == (3, 8, 8)


def test_solarize_threshold_is_on_the_float_scale():
    assert ContrastiveView(16, solarize_p=0.2).params['solarize_threshold'] == 0.5  # BYOL's 128 of 255
    plain = ContrastiveView(16)
    assert plain.solarize_p == 0.0 and not any('Solarize' in repr(t) for t in plain.transforms)
    with pytest.raises(ValueError, match='solarize_threshold is on the \\[0, 1\\] scale'):
        ContrastiveView(16, solarize_p=0.2, solarize_threshold=128)


def test_presets_blur_only_for_large_images():
    assert SimCLRView(32).blur_p == 0.0 and MoCoV2View(28).blur_p == 0.0
    assert SimCLRView(96).blur_p == 0.5 and MoCoV2View(224).blur_p == 0.5
    blur = [t for t in SimCLRView(224).transforms if 'GaussianBlur' in repr(t)]
    assert len(blur) == 1 and '23' in repr(blur[0])  # 10% of 224, made odd
    jitter = repr(SimCLRView(32).transforms[1])
    assert 'hue=(-0.2, 0.2)' in jitter  # strength 1.0
    assert 'hue=(-0.1, 0.1)' in repr(MoCoV2View(32).transforms[1])
    with pytest.raises(ValueError, match='jitter'):
        ContrastiveView(32, jitter=(0.4, 0.4))


def test_eval_view_is_deterministic_and_resizes():
    img = _rgb(1, size=(50, 40))
    view = EvalView(32)
    a, b = view(img), view(img)
    assert a.shape == (3, 32, 32) and a.dtype == torch.float32 and torch.equal(a, b)
    assert EvalView(32).resize == 32 and EvalView(224).resize == 256 and EvalView(96, resize=120).resize == 120
    assert EvalView(224)(_rgb(2, size=(300, 260))).shape == (3, 224, 224)


def test_multiview_from_config_gives_independent_views():
    torch.manual_seed(0)
    mv = TRANSFORMS.build(dict(type='MultiView', num_views=3, transforms=dict(type='SimCLRView', size=24)))
    assert isinstance(mv, MultiView) and mv.num_views == 3
    views = mv(_rgb(3, size=(48, 48)))
    assert isinstance(views, list) and len(views) == 3
    assert all(v.shape == (3, 24, 24) and v.dtype == torch.float32 for v in views)
    assert not torch.equal(views[0], views[1]) and not torch.equal(views[1], views[2])
    # one transform per view, mixing a config, a list (composed) and a callable
    mv = MultiView([dict(type='EvalView', size=16), [dict(type='EvalView', size=20)], EvalView(8)])
    assert [tuple(v.shape) for v in mv(_rgb(4))] == [(3, 16, 16), (3, 20, 20), (3, 8, 8)]
    assert MultiView(dict(type='EvalView', size=8)).num_views == 2
    with pytest.raises(ValueError, match='num_views'):
        MultiView([EvalView(8), EvalView(8)], num_views=3)


def test_build_pipeline_variants():
    img = _rgb(5)
    default = build_pipeline(None)(img)
    assert default.shape == (3, 10, 12) and default.dtype == torch.float32 and default.max() <= 1.0
    assert torch.allclose(default, torch.from_numpy(np.array(img)).permute(2, 0, 1).float() / 255)
    assert build_pipeline([dict(type='EvalView', size=8)])(img).shape == (3, 8, 8)
    fn = EvalView(6)
    assert build_pipeline(fn) is fn
    with pytest.raises(TypeError, match='pipeline'):
        build_pipeline(3)


# ----------------------------------------------------------------------------------------------- Digits
def test_digits_split_sizes_stratified_and_reproducible():
    train, test, full = Digits('train'), Digits('test'), Digits('all')
    assert (len(train), len(test), len(full)) == (1347, 450, 1797)
    assert isinstance(train, ContrastiveDataset) and train.num_classes == 10 and train.classes[3] == '3'
    # stratified: every class's share in each split is close to its share overall
    overall = np.bincount(full.labels, minlength=10) / len(full)
    for part in (train, test):
        assert np.abs(np.bincount(part.labels, minlength=10) / len(part) - overall).max() < 0.01
    assert np.array_equal(Digits('test', seed=0).labels, test.labels)
    assert np.array_equal(Digits('test', seed=0).data, test.data)
    assert not np.array_equal(Digits('test', seed=1).data, test.data)
    assert len(Digits('test', test_fraction=0.5)) in (898, 899)
    assert train.data.dtype == np.uint8 and train.data.max() == 255 and train.data.shape[1:] == (8, 8)
    img = train.load_image(0)
    assert img.mode == 'RGB' and img.size == (8, 8)
    _check_item(train[5], 5, shape=(8, 8))
    assert train[5]['label'] == int(train.labels[5])
    with pytest.raises(ValueError, match='split'):
        Digits('val')


def test_collate_multiview_batch():
    ds = DATASETS.build(dict(type='Digits', split='test', pipeline=dict(
        type='MultiView', num_views=2, transforms=dict(type='MoCoV2View', size=16))))
    items = [ds[i] for i in range(4)]
    for i, item in enumerate(items):
        _check_item(item, i, num_views=2, shape=(16, 16))
    batch = default_collate(items)
    assert isinstance(batch['inputs'], list) and len(batch['inputs']) == 2
    assert all(x.shape == (4, 3, 16, 16) and x.dtype == torch.float32 for x in batch['inputs'])
    assert batch['index'].tolist() == [0, 1, 2, 3]
    assert batch['label'].tolist() == ds.labels[:4].tolist()
    assert ds.metainfo['num_classes'] == 10
    # the same through worker processes, as the runner's dataloader does
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=default_collate)
    batch = next(iter(loader))
    assert [tuple(x.shape) for x in batch['inputs']] == [(4, 3, 16, 16)] * 2
    assert batch['index'].tolist() == [0, 1, 2, 3]


# ----------------------------------------------------------------------------------------------- subsets
def test_balanced_subset_indices():
    labels = np.repeat(np.arange(4), [100, 50, 10, 1])
    idx = balanced_subset_indices(labels, 0.1, seed=0)
    assert np.array_equal(idx, np.sort(idx)) and len(np.unique(idx)) == len(idx)
    assert np.bincount(labels[idx], minlength=4).tolist() == [10, 5, 1, 1]  # at least one per class
    assert np.array_equal(idx, balanced_subset_indices(labels, 0.1, seed=0))
    assert not np.array_equal(idx, balanced_subset_indices(labels, 0.1, seed=1))
    assert np.array_equal(balanced_subset_indices(labels, 1.0, seed=3), np.arange(len(labels)))
    for bad in (0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r'subset_fraction must be in \(0, 1\]'):
            balanced_subset_indices(labels, bad, seed=0)


def test_dataset_subset_by_fraction():
    full = Digits('train')
    sub = Digits('train', subset_fraction=0.1, subset_seed=0)
    per_class = np.bincount(full.labels, minlength=10)
    assert np.bincount(sub.labels, minlength=10).tolist() == [int(np.floor(0.1 * n + 0.5)) for n in per_class]
    assert np.array_equal(sub.indices, Digits('train', subset_fraction=0.1, subset_seed=0).indices)
    assert not np.array_equal(sub.indices, Digits('train', subset_fraction=0.1, subset_seed=1).indices)
    # 'index' is the position in the subset; the image is the full dataset's image at sub.indices[i]
    item = sub[3]
    assert item['index'] == 3 and item['label'] == full.labels[sub.indices[3]]
    assert np.array_equal(np.asarray(sub.load_image(3)), np.asarray(full.load_image(int(sub.indices[3]))))
    assert sub.num_classes == 10 and len(sub) == len(sub.labels)
    with pytest.raises(ValueError, match=r'subset_fraction must be in \(0, 1\], got 1.5'):
        Digits('train', subset_fraction=1.5)
    with pytest.raises(ValueError, match='not both'):
        Digits('train', subset_fraction=0.5, subset_file='x.txt')


def test_dataset_subset_by_index_file(tmp_path):
    f = tmp_path / 'subset.txt'
    f.write_text('# comment\n7\n2\n\n40\n2\n')
    ds = Digits('test', subset_file=str(f))
    assert ds.indices.tolist() == [2, 7, 40] and len(ds) == 3
    assert ds.labels.tolist() == Digits('test').labels[[2, 7, 40]].tolist()
    f.write_text('1\n450\n')
    with pytest.raises(ValueError, match="entry '450'"):
        Digits('test', subset_file=str(f))
    f.write_text('1\nfoo.png\n')
    with pytest.raises(ValueError, match="line 2: entry 'foo.png'"):
        Digits('test', subset_file=str(f))
    with pytest.raises(FileNotFoundError, match='missing.txt'):
        Digits('test', subset_file=str(tmp_path / 'missing.txt'))


# ----------------------------------------------------------------------------------------------- Fashion-MNIST
@pytest.mark.parametrize('layout', ['flat_gz', 'torchvision_raw'])
def test_fashion_mnist_from_generated_idx(tmp_path, layout):
    if layout == 'flat_gz':
        arrays = fake_fmnist(tmp_path, gz=True)
    else:
        arrays = fake_fmnist(tmp_path / 'FashionMNIST' / 'raw', gz=False)
    for split, prefix in (('train', 'train'), ('test', 't10k')):
        ds = FashionMNIST(str(tmp_path), split=split)
        images, labels = arrays[prefix]
        assert len(ds) == len(images) and ds.data.dtype == np.uint8 and ds.data.shape[1:] == (28, 28)
        assert np.array_equal(ds.data, images) and ds.labels.dtype == np.int64
        assert np.array_equal(ds.labels, labels.astype(np.int64))
        assert ds.classes == FASHION_MNIST_CLASSES and ds.num_classes == 10
    img = ds.load_image(1)
    assert img.mode == 'RGB' and img.size == (28, 28)
    assert np.array_equal(np.asarray(img)[..., 0], images[1]) and np.array_equal(np.asarray(img)[..., 2], images[1])
    _check_item(ds[1], 1, shape=(28, 28))
    assert ds[1]['label'] == 1


def test_read_idx_rejects_garbage(tmp_path):
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / 'ok.gz', arr, gz=True)
    assert np.array_equal(read_idx(str(tmp_path / 'ok.gz')), arr)
    (tmp_path / 'bad').write_bytes(b'garbage bytes here')
    with pytest.raises(ValueError, match='not an IDX file'):
        read_idx(str(tmp_path / 'bad'))
    (tmp_path / 'short').write_bytes(b'\x00\x00\x08\x01\x00\x00\x00\x09ab')  # 9 bytes promised, 2 given
    with pytest.raises(ValueError, match='truncated'):
        read_idx(str(tmp_path / 'short'))


def test_fashion_mnist_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match='apt-get install dataset-fashion-mnist') as exc:
        FashionMNIST(str(tmp_path / 'nowhere'))
    assert 'nowhere' in str(exc.value) and 'download=True' in str(exc.value)
    fake_fmnist(tmp_path)
    os.remove(tmp_path / 't10k-labels-idx1-ubyte.gz')
    with pytest.raises(FileNotFoundError, match='t10k-labels-idx1-ubyte'):
        FashionMNIST(str(tmp_path), split='test')


def test_fashion_mnist_real(fashion_mnist):
    train, test = FashionMNIST(fashion_mnist, split='train'), FashionMNIST(fashion_mnist, split='test')
    assert (len(train), len(test)) == (60000, 10000)
    assert np.bincount(test.labels).tolist() == [1000] * 10
    _check_item(test[9999], 9999, shape=(28, 28))


# ----------------------------------------------------------------------------------------------- CIFAR
def test_cifar10_from_fake_batches(tmp_path, monkeypatch):
    import torchvision.datasets.cifar as tv_cifar
    fake_cifar(tmp_path)
    # the fake files cannot match torchvision's md5 sums
    monkeypatch.setattr(tv_cifar, 'check_integrity', lambda path, md5=None: os.path.isfile(path))
    train = CIFAR10(str(tmp_path), split='train', pipeline=dict(type='EvalView', size=32))
    test = DATASETS.build(dict(type='CIFAR10', data_root=str(tmp_path), split='test'))
    assert (len(train), len(test)) == (20, 4)
    assert train.data.shape == (20, 32, 32, 3) and train.data.dtype == np.uint8
    assert train.classes[0] == 'class0' and train.num_classes == 10
    _check_item(train[19], 19, shape=(32, 32))
    assert train[19]['label'] == int(train.labels[19])
    with pytest.raises(ValueError, match='split'):
        CIFAR10(str(tmp_path), split='val')


def test_cifar_missing_or_corrupt(tmp_path):
    with pytest.raises(FileNotFoundError, match='cifar-10-batches-py.*download=True'):
        CIFAR10(str(tmp_path / 'nowhere'))
    with pytest.raises(FileNotFoundError, match='cifar-100-python'):
        CIFAR100(str(tmp_path))
    fake_cifar(tmp_path)  # real md5 check fails on fake files
    with pytest.raises(FileNotFoundError, match='missing or corrupt'):
        CIFAR10(str(tmp_path))


# ----------------------------------------------------------------------------------------------- ImageFolder / ImageNet
def test_image_folder_layout(image_tree):
    root, counts = image_tree
    ds = ImageFolder(str(root / 'train'), pipeline=dict(type='EvalView', size=8))
    assert ds.classes == sorted(counts) and ds.num_classes == 3
    assert len(ds) == sum(counts.values())
    assert ds.labels.tolist() == [0] * 4 + [1] * 2 + [2] * 3
    assert ds.get_path(0).endswith('n01440764/n01440764_0.JPEG')
    img = ds.load_image(1)
    assert img.mode == 'RGB' and img.size == (12, 10)
    for i in (0, 1, len(ds) - 1):
        _check_item(ds[i], i, shape=(8, 8))
        assert ds[i]['label'] == ds.labels[i]
    # PNG is lossless, so the default pipeline returns the exact pixels
    raw = ImageFolder(str(root / 'train'))[1]['inputs'][0]
    assert torch.allclose(raw, torch.from_numpy(np.array(img)).permute(2, 0, 1).float() / 255)
    only_png = ImageFolder(str(root / 'train'), extensions=('.png',))
    assert len(only_png) == 4 and all(p.endswith('.png') for p in only_png._all_names)


def test_image_folder_flat_and_grayscale(tmp_path):
    Image.fromarray(np.full((6, 5), 128, dtype=np.uint8)).save(tmp_path / 'a.png')  # mode 'L'
    _rgb(0).save(tmp_path / 'b.jpg')
    ds = ImageFolder(str(tmp_path))
    assert len(ds) == 2 and ds.classes is None and ds.num_classes is None and ds.labels.tolist() == [-1, -1]
    assert ds.load_image(0).mode == 'RGB'
    _check_item(ds[0], 0, shape=(6, 5))
    assert ds[0]['label'] == -1


def test_image_folder_list_file(image_tree, tmp_path):
    root, _ = image_tree
    meta = root / 'meta'
    meta.mkdir()
    (meta / 'train.txt').write_text('train/n01443537/n01443537_0.JPEG 1\ntrain/n01440764/n01440764_1.png 0\n'
                                    '\ntrain/n01484850/n01484850_2.JPEG 2\n')
    (meta / 'unlabelled.txt').write_text('train/n01443537/n01443537_0.JPEG\nval/n01440764/n01440764_1.png\n')
    ds = ImageFolder(str(root), ann_file='meta/train.txt')
    assert len(ds) == 3 and ds.labels.tolist() == [1, 0, 2] and ds.classes is None and ds.num_classes == 3
    _check_item(ds[2], 2, shape=(10, 12))
    unl = ImageFolder(str(root), ann_file=str(meta / 'unlabelled.txt'))
    assert unl.labels.tolist() == [-1, -1] and unl[1]['label'] == -1


def test_imagenet_folder_and_list_layouts(image_tree):
    root, counts = image_tree
    train = DATASETS.build(dict(type='ImageNet', data_root=str(root), split='train'))
    val = ImageNet(str(root), split='val', pipeline=dict(type='EvalView', size=8))
    assert len(train) == len(val) == sum(counts.values()) and train.classes == sorted(counts)
    _check_item(val[0], 0, shape=(8, 8))
    (root / 'meta').mkdir()
    (root / 'meta' / 'val.txt').write_text('val/n01484850/n01484850_0.JPEG 2\nval/n01440764/n01440764_3.png 0\n')
    listed = ImageNet(str(root), split='val', ann_file='meta/val.txt')
    assert listed.labels.tolist() == [2, 0] and listed[1]['label'] == 0
    assert listed.get_path(0) == os.path.join(str(root), 'val/n01484850/n01484850_0.JPEG')


def test_image_folder_subset_file_by_name(image_tree, tmp_path):
    root, _ = image_tree
    f = tmp_path / 'subset.txt'
    # bare file names as in SimCLR's ImageNet subset lists, a relative path, and an index
    f.write_text('n01484850_2.JPEG\nn01440764/n01440764_1.png\n4\n')
    ds = ImageNet(str(root), subset_file=str(f))
    full = ImageNet(str(root))
    names = full._all_names
    assert ds.indices.tolist() == sorted([names.index('n01484850/n01484850_2.JPEG'),
                                         names.index('n01440764/n01440764_1.png'), 4])
    assert ds.labels.tolist() == full.labels[ds.indices].tolist()
    assert ds.get_path(0) == full.get_path(int(ds.indices[0])) and ds[2]['index'] == 2
    f.write_text('n01484850_2.JPEG\nn09999999_1.JPEG\n')
    with pytest.raises(ValueError, match="entry 'n09999999_1.JPEG'"):
        ImageNet(str(root), subset_file=str(f))
    sub = ImageNet(str(root), subset_fraction=0.5, subset_seed=0)
    assert np.bincount(sub.labels).tolist() == [2, 1, 2]


def test_missing_root_and_empty_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="'.*nowhere' does not exist.*class sub-folders"):
        ImageFolder(str(tmp_path / 'nowhere'))
    with pytest.raises(FileNotFoundError, match=r"nowhere/train.*\{train,val\}/<wnid>/\*\.JPEG"):
        ImageNet(str(tmp_path / 'nowhere'))
    with pytest.raises(FileNotFoundError, match='meta/train.txt'):
        ImageNet(str(tmp_path), ann_file='meta/train.txt')
    empty = tmp_path / 'empty'
    (empty / 'cls').mkdir(parents=True)
    (empty / 'cls' / 'readme.txt').write_text('no images')
    with pytest.raises(FileNotFoundError, match=r"No images with extensions .*\.jpg.*\.png.* found in '.*empty'"):
        ImageFolder(str(empty))
    (tmp_path / 'empty.txt').write_text('\n')
    with pytest.raises(ValueError, match='lists no images'):
        ImageFolder(str(tmp_path), ann_file='empty.txt')


def test_corrupt_and_missing_image_files(tmp_path):
    (tmp_path / 'cls').mkdir()
    _rgb(0).save(tmp_path / 'cls' / 'good.png')
    (tmp_path / 'cls' / 'bad.jpg').write_bytes(b'\x00garbage, not a JPEG' * 10)
    ds = ImageFolder(str(tmp_path))
    assert len(ds) == 2  # listed lazily; the bad file only fails when read
    bad = [i for i in range(2) if ds.get_path(i).endswith('bad.jpg')][0]
    with pytest.raises(CorruptImageError, match=r"bad\.jpg.*remove or replace the file") as exc:
        ds[bad]
    assert isinstance(exc.value, OSError)
    _check_item(ds[1 - bad], 1 - bad)
    (tmp_path / 'list.txt').write_text('cls/good.png 0\ncls/gone.png 0\n')
    with pytest.raises(FileNotFoundError, match=r"gone\.png.*list file"):
        ImageFolder(str(tmp_path), ann_file='list.txt')[1]
