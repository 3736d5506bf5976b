"""Views made in batches on the device (augment_on='device'), checked against the CPU pipeline on CPU tensors."""
import os.path as osp

import numpy as np
import pytest
import torch
from helpers import TINY_BACKBONE, TINY_NECK, digits_config
from PIL import Image
from scipy.stats import ks_2samp
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from ifnd.datasets import ContrastiveView, CorruptImageError, Digits, ImageFolder, MoCoV2View, SimCLRView
from ifnd.datasets import device_augment
from ifnd.datasets.base import batch_collate
from ifnd.datasets.decode import available_decoders, decode_images
from ifnd.datasets.device_augment import (DRAW_FACTORS, DRAW_ORDER, NUM_DRAWS, DeviceView, DeviceViews,
                                         adjust_brightness, adjust_contrast, adjust_hue, adjust_saturation,
                                         gaussian_blur, grey, resized_crops, sample_crops, solarize)
from ifnd.models.data_preprocessor import ContrastiveDataPreprocessor
from ifnd.registry import RUNNERS

N_CROPS = 4000  # two-sample KS at n = m = 4000 detects a CDF gap of ~0.045 at p = 0.001
N_DEVICE, N_CPU = 4000, 1500  # applied-or-not rates: binomial standard error <= 0.013 for the CPU side


def _crop_scale_ratio(h, w, H, W):
    return np.asarray(h * w / (H * W), dtype=float), np.asarray(w / h, dtype=float)


@pytest.mark.parametrize('view,H,W', [(SimCLRView(size=32), 64, 96), (MoCoV2View(size=28), 28, 28),
                                      (MoCoV2View(size=32), 20, 90)])  # 20 x 90: often the centre fallback
def test_crop_scale_and_ratio_match_torchvision(view, H, W):
    torch.manual_seed(0)
    boxes = sample_crops(torch.full((N_CROPS,), H), torch.full((N_CROPS,), W), view.params['scale'],
                         view.params['ratio']).double().numpy()  # whole numbers
    top, left, kh, kw = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + kh <= H).all() and (left + kw <= W).all()
    assert (kh >= 1).all() and (kw >= 1).all() and (boxes == np.round(boxes)).all()
    img = torch.zeros(3, H, W)
    tv = np.array([v2.RandomResizedCrop.get_params(img, list(view.params['scale']), list(view.params['ratio']))
                   for _ in range(N_CROPS)])
    k_scale, k_ratio = _crop_scale_ratio(kh, kw, H, W)
    t_scale, t_ratio = _crop_scale_ratio(tv[:, 2], tv[:, 3], H, W)
    assert ks_2samp(k_scale, t_scale).pvalue > 1e-3
    assert ks_2samp(k_ratio, t_ratio).pvalue > 1e-3
    # Offsets uniform over the free room, as torchvision's randint: compare the relative position.
    k_pos = (top + 0.5) / (H - kh + 1)
    t_pos = (tv[:, 0] + 0.5) / (H - tv[:, 2] + 1)
    assert ks_2samp(k_pos, t_pos).pvalue > 1e-3
    lo, hi = view.params['scale']
    assert k_scale.min() >= lo * 0.8 and k_scale.max() <= 1.0


def test_crops_resize_in_one_op():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 3, 12, 10, generator=g)
    whole = torch.tensor([[0.0, 0.0, 12.0, 10.0]] * 3)
    torch.testing.assert_close(resized_crops(x, whole, (12, 10)), x)  # a full-size crop is the image
    box = torch.tensor([[2.0, 3.0, 6.0, 4.0]] * 3)
    torch.testing.assert_close(resized_crops(x, box, (6, 4)), x[:, :, 2:8, 3:7])
    # Halving: each output pixel is the mean of its 2 x 2 footprint (antialiased, as torchvision's).
    half = resized_crops(x, whole, (6, 5))
    torch.testing.assert_close(half, torch.nn.functional.avg_pool2d(x, 2), rtol=1e-5, atol=1e-6)


def test_colour_ops_match_torchvision_per_sample():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(6, 3, 9, 11, generator=g)
    x[0] = 0.5  # a grey image: hue and saturation leave it
    factors = torch.rand(6, generator=g) * 1.6
    hues = torch.rand(6, generator=g) - 0.5
    for ours, theirs, f in ((adjust_brightness, TF.adjust_brightness, factors),
                            (adjust_contrast, TF.adjust_contrast, factors),
                            (adjust_saturation, TF.adjust_saturation, factors),
                            (adjust_hue, TF.adjust_hue, hues)):
        want = torch.stack([theirs(x[i], f[i].item()) for i in range(6)])
        torch.testing.assert_close(ours(x, f), want, rtol=0, atol=2e-6, msg=ours.__name__)
    torch.testing.assert_close(grey(x), TF.rgb_to_grayscale(x), rtol=0, atol=1e-6)
    sigma = torch.rand(6, generator=g) * 1.9 + 0.1
    want = torch.stack([TF.gaussian_blur(x[i], [5, 5], [sigma[i].item()] * 2) for i in range(6)])
    torch.testing.assert_close(gaussian_blur(x, 5, sigma), want, rtol=0, atol=1e-5)
    for threshold in (0.5, 0.2):
        torch.testing.assert_close(solarize(x, threshold), TF.solarize(x, threshold), rtol=0, atol=0)


def test_jitter_order_is_random_per_sample():
    # Brightness then contrast differs from contrast then brightness once values clip; with only these
    # two on, a batch of one repeated image must show both orders, as torchvision's random order.
    view = ContrastiveView(size=8, scale=(1.0, 1.0), jitter=(0.9, 0.9, 0.0, 0.0), jitter_p=1.0, grayscale_p=0.0,
                           flip=False)
    x = _rate_images(1).expand(2000, -1, -1, -1).float() / 255
    draws = torch.rand(x.shape[0], NUM_DRAWS, generator=torch.Generator().manual_seed(3))
    y = DeviceView(view).colour(x, draws)
    order = draws[:, DRAW_ORDER].argsort(1)
    b, c = (0.1 + 1.8 * draws[:, DRAW_FACTORS][:, j] for j in (0, 1))
    bc = adjust_contrast(adjust_brightness(x, b), c)
    cb = adjust_brightness(adjust_contrast(x, c), b)
    first_b = (order == 0).int().argmax(1) < (order == 1).int().argmax(1)
    torch.testing.assert_close(y, torch.where(first_b.view(-1, 1, 1, 1), bc, cb))
    assert 0.4 < first_b.float().mean() < 0.6 and (bc - cb).abs().amax() > 0.05


@pytest.mark.parametrize('p,threshold', [(0.0, 0.5), (1.0, 0.5), (1.0, 0.3)])
def test_solarised_views_equal_the_cpu_views_and_the_direct_computation(p, threshold):
    view = ContrastiveView(size=16, scale=(1.0, 1.0), jitter_p=0.0, grayscale_p=0.0, flip=False, solarize_p=p,
                           solarize_threshold=threshold)
    x = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16).expand(1, 3, 16, 16)  # every value once
    xf = x.float() / 255
    want = torch.where(xf >= threshold, 1 - xf, xf) if p else xf
    cpu = view(Image.fromarray(x[0].permute(1, 2, 0).numpy()))
    torch.testing.assert_close(cpu, want[0], rtol=0, atol=1e-6)  # ToDtype scales by 1/255, not / 255
    torch.testing.assert_close(DeviceView(view)(x), want, rtol=0, atol=0)


def _rate_images(n, seed=0):
    """Random colour 8x8 images (uint8 [n, 3, 8, 8]); no image is left-right symmetric."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 8, 8), generator=g, dtype=torch.uint8)


# Each case: view options that leave one random step on (crops are the whole 8x8 image), and
# how to tell from (input, output) in [0, 1] that the step was applied.
def _changed(x, y):
    return (x - y).abs().flatten(1).amax(1) > 2 / 255


def _grey(x, y):
    return (y[:, 0] - y[:, 1]).abs().flatten(1).amax(1) < 1e-4


def _flipped(x, y):
    return (x.flip(-1) - y).abs().flatten(1).amax(1) < 1e-4


RATE_CASES = {
    'jitter': (dict(jitter_p=0.8, grayscale_p=0.0, flip=False), _changed, 0.8),
    'grayscale': (dict(jitter_p=0.0, grayscale_p=0.2, flip=False), _grey, 0.2),
    'flip': (dict(jitter_p=0.0, grayscale_p=0.0, flip=True), _flipped, 0.5),
    # sigma >= 1, so every applied blur visibly changes random pixels
    'blur': (dict(jitter_p=0.0, grayscale_p=0.0, flip=False, blur_p=0.5, blur_sigma=(1.0, 2.0)), _changed, 0.5),
    # random pixels: every image has some far above the threshold
    'solarize': (dict(jitter_p=0.0, grayscale_p=0.0, flip=False, solarize_p=0.2), _changed, 0.2),
}


@pytest.mark.parametrize('case', list(RATE_CASES))
def test_step_rates_match_cpu_pipeline(case):
    opts, applied, p = RATE_CASES[case]
    view = ContrastiveView(size=8, scale=(1.0, 1.0), **opts)
    torch.manual_seed(1)
    x = _rate_images(N_DEVICE)
    xf = x.float() / 255
    y = DeviceView(view)(x)
    dev_rate = applied(xf, y).float().mean().item()
    xc = _rate_images(N_CPU, seed=2)
    cpu_out = torch.stack([view(Image.fromarray(img.permute(1, 2, 0).numpy())) for img in xc])
    cpu_rate = applied(xc.float() / 255, cpu_out).float().mean().item()
    # 5 standard errors: a false alarm about once in 1.7 million runs.
    assert abs(dev_rate - p) < 5 * np.sqrt(p * (1 - p) / N_DEVICE), (case, dev_rate)
    assert abs(cpu_rate - p) < 5 * np.sqrt(p * (1 - p) / N_CPU), (case, cpu_rate)
    assert abs(dev_rate - cpu_rate) < 5 * np.sqrt(p * (1 - p) * (1 / N_DEVICE + 1 / N_CPU))


def test_views_shape_dtype_range_and_parameters():
    torch.manual_seed(0)
    simclr = SimCLRView(size=96)
    dv = DeviceView(simclr)
    assert dv.size == (96, 96) and dv.scale == (0.08, 1.0)
    assert (dv.jitter_p, dv.grayscale_p, dv.blur_p, dv.flip) == (0.8, 0.2, 0.5, True)
    assert dv.jitter[0][1] == pytest.approx((0.2, 1.8)) and dv.jitter[3][1] == pytest.approx((-0.2, 0.2))
    assert dv.blur_kernel == 9  # ~10% of 96, odd, as the CPU view
    views = DeviceViews(dict(type='MultiView', num_views=3, transforms=dict(type='MoCoV2View', size=28)))
    grey_batch = torch.randint(0, 256, (5, 1, 28, 28), dtype=torch.uint8)
    out = views(grey_batch)
    assert len(out) == 3
    for v in out:
        assert v.shape == (5, 3, 28, 28) and v.dtype == torch.float32
        assert v.min() >= 0 and v.max() <= 1
    assert not torch.equal(out[0], out[1])  # independent draws per view
    assert DeviceView(MoCoV2View(size=28)).blur_p == 0  # small images: no blur, as on the CPU
    with pytest.raises(ValueError, match="augment_on='cpu'"):
        DeviceViews(dict(type='EvalView', size=16))


def test_digits_batches_and_preprocessor():
    pipeline = dict(type='MultiView', num_views=2, transforms=dict(type='ContrastiveView', size=16))
    ds = Digits(split='train', pipeline=pipeline, augment_on='device')
    batch = batch_collate(ds.__getitems__([3, 0, 7]))
    assert batch['inputs'].dtype == torch.uint8 and batch['inputs'].shape == (3, 1, 8, 8)
    assert torch.equal(batch['inputs'][1, 0], torch.from_numpy(ds.data[0]))
    assert batch['index'].tolist() == [3, 0, 7] and batch['label'].tolist() == ds.labels[[3, 0, 7]].tolist()
    out = ContrastiveDataPreprocessor(mean=(0.2,) * 3, std=(0.3,) * 3)(batch, True)
    assert [tuple(v.shape) for v in out['inputs']] == [(3, 3, 16, 16)] * 2
    assert out['data_samples']['index'].tolist() == [3, 0, 7]
    # Evaluation pipelines keep the CPU path even when the training config asks for the device.
    eval_ds = Digits(split='train', pipeline=dict(type='EvalView', size=16), augment_on='device')
    assert isinstance(eval_ds.__getitems__([0, 1]), list)
    with pytest.raises(ValueError, match="augment_on must be 'cpu'"):
        Digits(augment_on='gpu')


def test_runner_trains_on_digits_with_device_views(tmp_path):
    torch.manual_seed(0)
    cfg = digits_config(str(tmp_path), dict(type='SimCLR', temperature=0.5), max_epochs=1)
    cfg.train_dataloader.dataset.augment_on = 'device'
    runner = RUNNERS.build(cfg)
    runner.train()
    assert runner.train_dataloader.dataset.device_pipeline is not None
    losses = np.asarray(runner.message_hub.get_scalar('train/loss').data[0])
    assert len(losses) == (len(runner.train_dataloader.dataset) // 64) and np.isfinite(losses).all()
    assert osp.isfile(tmp_path / 'epoch_1.pth')


def test_features_of_data_held_on_the_device_equal_the_loader_path(monkeypatch):
    """Feature extraction reads device-held uint8 images in batches there, without a DataLoader,
    and gives the loader path's features (grey 8-pixel digits, upscaled to 16 by the eval view)."""
    from mmengine.registry import init_default_scope

    from ifnd.engine import features
    from ifnd.registry import MODELS
    init_default_scope('ifnd')
    torch.manual_seed(0)
    preprocessor = dict(type='ContrastiveDataPreprocessor', mean=(0.2,) * 3, std=(0.3,) * 3)
    model = MODELS.build(dict(type='IFND', backbone=TINY_BACKBONE, neck=TINY_NECK,
                              data_preprocessor=preprocessor))
    view = dict(type='EvalView', size=16)
    on_cpu = Digits(split='train', pipeline=view, subset_fraction=0.2)
    on_device = Digits(split='train', pipeline=view, subset_fraction=0.2, augment_on='device')
    assert on_device.evaluates_on_device and not on_cpu.evaluates_on_device
    expected = {f: features.extract_features(model, on_cpu, f, batch_size=64, num_workers=0)
                for f in ('z', 'f')}

    def no_loader(*args, **kwargs):
        raise AssertionError('a DataLoader was built for data held on the device')

    monkeypatch.setattr(features, 'DataLoader', no_loader)
    calls = []
    monkeypatch.setattr(on_device, 'eval_batch', lambda idx, device, f=on_device.eval_batch:
                        calls.append(len(idx)) or f(idx, device))
    for feature, batch_size in (('z', None), ('f', 100)):
        calls.clear()
        feats, labels = features.extract_features(model, on_device, feature, batch_size=batch_size,
                                                  autocast=True)  # float32 on a CPU
        torch.testing.assert_close(feats, expected[feature][0], rtol=1e-5, atol=1e-6)
        assert torch.equal(labels, expected[feature][1]) and model.training
        assert calls == ([len(on_device)] if batch_size is None else [100, 100, len(on_device) - 200])


def _write_jpegs(root, sizes):
    rng = np.random.default_rng(0)
    paths = []
    for i, (h, w) in enumerate(sizes):
        cls = root / f'class{i % 2}'
        cls.mkdir(parents=True, exist_ok=True)
        # A smooth image, so JPEG decoders agree closely.
        yy, xx = np.mgrid[0:h, 0:w]
        img = np.stack([(xx * 255 // w), (yy * 255 // h), np.full_like(xx, rng.integers(0, 256))], -1)
        path = cls / f'img{i}.jpg'
        Image.fromarray(img.astype(np.uint8)).save(path, quality=95)
        paths.append(str(path))
    return paths


def test_jpeg_files_decoded_and_augmented_in_batches(tmp_path):
    sizes = [(40, 60), (64, 48), (50, 50), (33, 71)]
    paths = _write_jpegs(tmp_path, sizes)
    Image.fromarray(np.zeros((20, 30, 3), np.uint8) + 100).save(tmp_path / 'class0' / 'flat.png')
    decoded = decode_images([torch.from_numpy(np.fromfile(p, np.uint8)) for p in paths], paths)
    for img, p, (h, w) in zip(decoded, paths, sizes):
        ref = torch.from_numpy(np.array(Image.open(p).convert('RGB'))).permute(2, 0, 1)
        assert img.shape == (3, h, w) and img.dtype == torch.uint8
        assert (img.float() - ref.float()).abs().mean() < 2.0
    pipeline = dict(type='MultiView', num_views=2, transforms=dict(type='MoCoV2View', size=32))
    ds = ImageFolder(str(tmp_path), pipeline=pipeline, augment_on='device')
    loader = torch.utils.data.DataLoader(ds, batch_size=5, collate_fn=batch_collate)
    (batch,) = list(loader)
    # The files in one buffer (one piece of shared memory from a loader worker), split by their sizes.
    assert batch['inputs'].dtype == torch.uint8 and batch['inputs'].ndim == 1 and len(batch['path']) == 5
    files = torch.split(batch['inputs'], batch['encoded_sizes'])
    assert [f.numpy().tobytes() for f in files] == [open(p, 'rb').read() for p in batch['path']]
    out = ContrastiveDataPreprocessor()(batch, True)
    assert [tuple(v.shape) for v in out['inputs']] == [(5, 3, 32, 32)] * 2
    assert out['data_samples']['label'].tolist() == ds.labels.tolist()
    # A corrupt JPEG among good ones is named in the error.
    bad = tmp_path / 'class1' / 'broken.jpg'
    bad.write_bytes(b'\xff\xd8\xff\xe0' + b'\x00' * 64)
    ds = ImageFolder(str(tmp_path), pipeline=pipeline, augment_on='device')
    batch = batch_collate(ds.__getitems__(list(range(len(ds)))))
    with pytest.raises(CorruptImageError, match=r"broken\.jpg.*remove or replace"):
        ContrastiveDataPreprocessor()(batch, True)


def test_throughput_benchmark_configs(tmp_path):
    """The benchmark's generated tools/train.py configs select the asked augmentation and loader."""
    from mmengine.config import Config

    from benchmarks import throughput as bench
    args = bench.parse_args(['--iters', '4', '--warmup', '1', '--workers', '3'])
    digits = Config.fromfile(bench.write_config(str(tmp_path / 'd.py'), 'digits', 'device', args, ''))
    assert digits.train_dataloader.dataset.augment_on == 'device' and digits.train_dataloader.num_workers == 0
    assert digits.train_cfg.max_iters == 5 and digits.custom_hooks == []
    jpeg = Config.fromfile(bench.write_config(str(tmp_path / 'j.py'), 'jpeg', 'cpu', args, str(tmp_path)))
    assert jpeg.train_dataloader.dataset.type == 'ImageFolder' and jpeg.train_dataloader.num_workers == 3
    assert 'split' not in jpeg.train_dataloader.dataset and jpeg.model.data_preprocessor.decoder == 'auto'
    # JPEG files' device runs: one per decoder, each picked in the preprocessor's config.
    assert args.decoder == 'both'
    vision = Config.fromfile(bench.write_config(str(tmp_path / 'v.py'), 'jpeg', 'device', args, str(tmp_path),
                                                'torchvision'))
    assert vision.model.data_preprocessor.decoder == 'torchvision'
    assert bench.decoders_to_time(args) == available_decoders()  # probed under --python, which trains
    with pytest.raises(SystemExit, match='--decoder torchcodec: no such decoder decodes under'):
        bench.decoders_to_time(bench.parse_args(['--decoder', 'torchcodec', '--python', 'false']))
    # Iterations that start a pass over the data (mmengine sleeps there) are found from the data size.
    assert bench.iterations_per_pass('jpeg', bench.parse_args(['--jpeg-images', '130'])) == 2
    assert bench.iterations_per_pass('digits', args) == len(Digits(split='train', pipeline=None)) // 64
    rows = [dict(data=d, augment_on=a, decoder=c, ms_per_iter=t, images_per_s=64000 / t, data_share=0.5)
            for d, a, c, t in (('digits', 'cpu', None, 200.0), ('digits', 'device', None, 100.0),
                               ('jpeg', 'cpu', 'pillow', 400.0), ('jpeg', 'device', 'torchcodec', 100.0),
                               ('jpeg', 'device', 'torchvision', 200.0))]
    table = bench.markdown_table(rows)
    assert '| digits | device | - | 100.0 | 640 | 50% | 2.00x |' in table
    assert '| jpeg | device | torchcodec | 100.0 | 640 | 50% | 4.00x |' in table
    assert '| jpeg | device | torchvision | 200.0 | 320 | 50% | 2.00x |' in table


def test_views_repeat_under_the_same_seed():
    """The views draw only from torch's generator of the images' device: re-seeding (ReseedHook) repeats them."""
    views = DeviceViews(dict(type='MultiView', num_views=2, transforms=dict(type='SimCLRView', size=16, blur_p=0.5)))
    batch = torch.randint(0, 256, (6, 3, 20, 24), dtype=torch.uint8)
    files = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8) for h, w in ((20, 24), (31, 17), (16, 40))]
    runs = []
    for _ in range(2):
        torch.manual_seed(5)
        runs.append(views(batch) + views(files))
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    torch.manual_seed(6)
    assert not torch.equal(views(batch)[0], runs[0][0])


def test_images_of_different_sizes_keep_their_order_across_chunks(monkeypatch):
    monkeypatch.setattr(device_augment, 'PADDED_BATCH_BYTES', 3 * 40 * 40 * 4 * 2)  # a few images per chunk
    view = ContrastiveView(size=8, jitter_p=0.0, grayscale_p=0.0, flip=False)
    sizes = [(40, 30), (12, 20), (33, 33), (9, 15), (40, 40), (20, 12), (16, 16)]
    images = [torch.full((3, h, w), 30 * i, dtype=torch.uint8) for i, (h, w) in enumerate(sizes)]
    assert len(device_augment._padded_chunks(images)) > 1
    (out,) = DeviceViews(view)(images)
    assert out.shape == (len(sizes), 3, 8, 8)
    for i, v in enumerate(out):  # each crop of a flat image is its colour, also at the padded edges
        torch.testing.assert_close(v, torch.full_like(v, 30 * i / 255), rtol=0, atol=1e-6)


def test_full_jitter_equals_the_four_adjustments_in_each_samples_order():
    view = ContrastiveView(size=8, scale=(1.0, 1.0), jitter=(0.4, 0.4, 0.4, 0.1), jitter_p=1.0, grayscale_p=0.0,
                           flip=False)
    x = _rate_images(64).float() / 255
    n = x.shape[0]
    draws = torch.rand(n, NUM_DRAWS, generator=torch.Generator().manual_seed(4))
    y = DeviceView(view).colour(x, draws)
    order = draws[:, DRAW_ORDER].argsort(1)
    u = draws[:, DRAW_FACTORS]
    factors = [0.6 + 0.8 * u[:, j] for j in range(3)] + [-0.1 + 0.2 * u[:, 3]]
    steps = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)
    for i in range(n):
        want = x[i:i + 1]
        for j in order[i].tolist():
            want = steps[j](want, factors[j][i:i + 1])
        torch.testing.assert_close(y[i:i + 1], want, rtol=0, atol=1e-5)


def _former_views(view, images, seed):
    """The former views of ``images`` (tests/device_augment_reference.py) and the uniforms they drew,
    placed in the columns of the draws layout (the columns of steps the view leaves out: 0.5)."""
    from unittest import mock

    import device_augment_reference as former
    calls, real = [], torch.rand

    def recording(*args, **kwargs):
        calls.append(real(*args, **kwargs))
        return calls[-1]

    torch.manual_seed(seed)
    with mock.patch.object(torch, 'rand', recording):
        out = former.DeviceView(view)(images)
    n = images.shape[0]
    draws = torch.full((n, NUM_DRAWS), 0.5)
    taken = iter(calls)
    for columns in (device_augment.DRAW_AREA, device_augment.DRAW_ASPECT):
        draws[:, columns] = next(taken)
    draws[:, device_augment.DRAW_OFFSET] = next(taken).t()
    draws[:, device_augment.DRAW_JITTER] = next(taken)
    draws[:, DRAW_ORDER] = next(taken)
    for j, (_, strength) in enumerate(DeviceView(view).jitter):
        if strength:
            draws[:, DRAW_FACTORS.start + j] = next(taken)
    draws[:, device_augment.DRAW_GRAYSCALE] = next(taken)
    if view.params['blur_p'] > 0:
        draws[:, device_augment.DRAW_SIGMA] = next(taken)
        draws[:, device_augment.DRAW_BLUR] = next(taken)
    if view.params['solarize_p'] > 0:
        draws[:, device_augment.DRAW_SOLARIZE] = next(taken)
    if view.params['flip']:
        draws[:, device_augment.DRAW_FLIP] = next(taken)
    assert next(taken, None) is None, 'the former views drew more than the layout holds'
    return out, draws


FORMER_CASES = {
    'grey_mocov2': (MoCoV2View(size=28), (48, 1, 28, 28)),  # Fashion-MNIST's: grey images stay one channel
    'rgb_mocov2': (MoCoV2View(size=16), (48, 3, 20, 24)),
    'rgb_simclr_blur': (SimCLRView(size=32, blur_p=0.5), (48, 3, 40, 36)),
    'no_hue_no_flip': (ContrastiveView(size=12, jitter=(0.4, 0.0, 0.4, 0.0), flip=False), (48, 3, 16, 16)),
    # MoCo v3's (BYOL's) second view; and a grey one, solarised while it stays one channel
    'rgb_byol_solarize': (ContrastiveView(size=16, scale=(0.08, 1.0), jitter=(0.4, 0.4, 0.2, 0.1), blur_p=0.1,
                                          solarize_p=0.2), (48, 3, 20, 24)),
    'grey_solarize': (ContrastiveView(size=12, solarize_p=0.5, solarize_threshold=0.3), (48, 1, 16, 16)),
}


@pytest.mark.parametrize('case', list(FORMER_CASES))
def test_views_equal_the_former_views_where_the_draws_are_forced_equal(case):
    view, shape = FORMER_CASES[case]
    images = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    want, draws = _former_views(view, images, seed=2)
    got = DeviceView(view)(images, draws)
    assert got.shape == want.shape == (shape[0], 3, *DeviceView(view).size)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def _view_parameters(view, draws, H, W):
    """Each random parameter of the views of ``draws`` (images of H x W): name -> per-image values."""
    dv = DeviceView(view)
    n = draws.shape[0]
    top, left, h, w = sample_crops(torch.full((n,), H), torch.full((n,), W), dv.scale, dv.ratio,
                                   draws[:, device_augment.DRAW_CROP]).double().unbind(1)
    order = draws[:, DRAW_ORDER].argsort(1)
    params = {'crop scale': h * w / (H * W), 'crop ratio': w / h, 'crop top': (top + 0.5) / (H - h + 1),
              'crop left': (left + 0.5) / (W - w + 1),
              'jitter order': (order * torch.tensor([64, 16, 4, 1])).sum(1),  # the permutation's number
              'jitter applied': draws[:, device_augment.DRAW_JITTER] < dv.jitter_p,
              'grayscale applied': draws[:, device_augment.DRAW_GRAYSCALE] < dv.grayscale_p,
              'blur applied': draws[:, device_augment.DRAW_BLUR] < dv.blur_p,
              'solarize applied': draws[:, device_augment.DRAW_SOLARIZE] < dv.solarize_p,
              'flip applied': draws[:, device_augment.DRAW_FLIP] < 0.5}
    lo, hi = dv.blur_sigma
    params['blur sigma'] = lo + (hi - lo) * draws[:, device_augment.DRAW_SIGMA]
    for j, name in enumerate(('brightness', 'contrast', 'saturation', 'hue')):
        params[name] = dv._factors(draws)[:, j]
    return {k: v.double().numpy() for k, v in params.items()}


def test_view_parameters_follow_the_former_distributions():
    """Every random parameter of a view (crop box, jitter order and factors, each step's coin, blur
    sigma) drawn from the batch's one draw, against the former per-step draws (two-sample tests)."""
    from scipy.stats import chi2_contingency
    # SimCLR's view with blur, and solarisation
    view = ContrastiveView(size=8, scale=(0.08, 1.0), jitter=(0.8, 0.8, 0.8, 0.2), blur_p=0.5, solarize_p=0.2)
    H, W = 20, 30
    images = torch.zeros(N_CROPS, 3, H, W, dtype=torch.uint8)
    _, former_draws = _former_views(view, images, seed=0)
    torch.manual_seed(1)
    (draws,) = DeviceViews(view).draw(N_CROPS, 'cpu')
    ours, theirs = _view_parameters(view, draws, H, W), _view_parameters(view, former_draws, H, W)
    for name in ours:
        if name == 'jitter order':
            table = [[np.sum(sample == k) for k in np.union1d(ours[name], theirs[name])] for sample in (ours[name], theirs[name])]
            assert chi2_contingency(table).pvalue > 1e-3, name
            assert len(table[0]) == 24  # every order of the four steps occurs
        elif name.endswith('applied'):
            p = (ours[name].mean() + theirs[name].mean()) / 2
            assert abs(ours[name].mean() - theirs[name].mean()) < 5 * np.sqrt(2 * p * (1 - p) / N_CROPS), name
        else:
            assert ks_2samp(ours[name], theirs[name]).pvalue > 1e-3, name


def test_compiled_views_trace_whole_and_equal_the_eager_views():
    """The views compile with fullgraph=True (roi_align included) by inductor, the GPU recipe's
    compiler, from uint8 images to normalised views, and give the eager views from the same draws."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    pipeline = dict(type='MultiView', transforms=[dict(type='SimCLRView', size=16, blur_p=0.5),
                                                  dict(type='ContrastiveView', size=16, blur_p=0.1, solarize_p=0.2)])
    mean, std = torch.full((3, 1, 1), 0.4), torch.full((3, 1, 1), 0.25)
    batch = torch.randint(0, 256, (12, 3, 20, 24), dtype=torch.uint8)
    files = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8) for h, w in ((20, 24), (31, 17), (16, 40))]
    eager = DeviceViews(pipeline)
    torch._dynamo.reset()
    counters.clear()
    compiled = DeviceViews(pipeline, compile={})
    for images in (batch, files):
        draws = eager.draw(len(images), 'cpu')
        want = eager(images, draws, mean, std)
        for _ in range(2):  # the second call runs the compiled code as it is
            got = compiled(images, draws, mean, std)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert counters['stats']['unique_graphs'] == 2 and not counters['graph_break']


class _Stop(Exception):
    """Ends a run at the start of its second epoch, its first epoch's checkpoint written."""


def test_device_views_resume_to_the_bit(tmp_path):
    """Views made on the device from one draw a batch: a run stopped after its first epoch and resumed
    ends with the weights of the uninterrupted run, to the bit (the draws come from the re-seeded
    generator)."""
    from mmengine.hooks import Hook

    class StopAtSecondEpoch(Hook):
        def before_train_epoch(self, runner):
            if runner.epoch == 1:
                raise _Stop

    def train(work_dir, stop=False, resume=False):
        cfg = digits_config(str(work_dir), dict(type='IFND', temperature=0.5), max_epochs=2,
                            pseudo_labels=dict(num_clusters=[5], interval=1, kmeans=dict(nredo=1, niter=5)),
                            resume=resume)
        cfg.train_dataloader.dataset.update(augment_on='device', subset_fraction=0.25)
        cfg.train_dataloader.update(num_workers=0, persistent_workers=False)
        torch.manual_seed(0)
        runner = RUNNERS.build(cfg)
        if stop:
            runner.register_hook(StopAtSecondEpoch())
            with pytest.raises(_Stop):
                runner.train()
            return None
        runner.train()
        return runner.model.state_dict()

    whole = train(tmp_path / 'whole')
    train(tmp_path / 'cut', stop=True)
    resumed = train(tmp_path / 'cut', resume=True)
    assert whole.keys() == resumed.keys()
    for name, value in whole.items():
        assert torch.equal(value, resumed[name]), name


def test_views_without_solarisation_draw_the_uniforms_of_before_it():
    """A pipeline that does not solarise draws the former 35 uniforms a view, so runs made before
    solarisation existed make the same views from the same seeds (the sums were taken then)."""
    from ifnd.datasets.device_augment import DRAW_SOLARIZE
    plain = dict(type='MultiView', num_views=2, transforms=dict(type='MoCoV2View', size=28))
    solarising = dict(type='MultiView', transforms=[dict(type='ContrastiveView', size=28),
                                                     dict(type='ContrastiveView', size=28, solarize_p=0.2)])
    assert DeviceViews(plain).num_draws == DRAW_SOLARIZE
    assert DeviceViews(solarising).num_draws == NUM_DRAWS
    torch.manual_seed(0)
    images = (torch.rand(8, 1, 28, 28) * 255).to(torch.uint8)
    torch.manual_seed(1)
    views = DeviceViews(plain)(images)
    assert [float(v.double().sum()) for v in views] == pytest.approx([10219.33643, 9796.342207], rel=1e-6)
