"""The device path's decoders (TorchCodec, torchvision's) read every file as the CPU path (Pillow) does."""
import io

import numpy as np
import pytest
import torch
from PIL import Image

from ifnd.datasets import CorruptImageError, ImageFolder
from ifnd.datasets import decode as decode_module
from ifnd.datasets.decode import read_encoded, to_rgb
from ifnd.datasets.decode import DECODERS, available_decoders, decode_images, image_decoder
from ifnd.models.data_preprocessor import ContrastiveDataPreprocessor

# Each package where it decodes here: torchvision's decoders are in the tested set, TorchCodec may be missing.
EACH_DECODER = [pytest.param(name, marks=pytest.mark.skipif(name not in available_decoders(),
                                                            reason=f'{name} cannot decode here'))
                for name in DECODERS]
# JPEG decoders may differ by their inverse DCT and chroma upsampling. Measured on the JPEGs below
# (and 216 more: 1-640 px, q 50-100, 4:4:4 / 4:2:2 / 4:2:0, baseline and progressive, grey, CMYK):
# TorchCodec, torchvision and Pillow all gave the same pixels (max and mean difference 0), as all three
# use libjpeg-turbo's default accurate integer IDCT and fancy upsampling; 1 grey level allows a rounding
# difference between their builds. nvJPEG on CUDA differs more (tests/test_gpu_report.py).
JPEG_MAX_DIFF, JPEG_MEAN_DIFF = 1, 0.05


def _pixels(img: Image.Image) -> torch.Tensor:
    """An image as the CPU path reads it (``datasets.to_rgb``), as uint8 ``[3, H, W]``."""
    return torch.from_numpy(np.array(to_rgb(img))).permute(2, 0, 1)


def _encoded(img: Image.Image, fmt: str = 'JPEG', **options) -> torch.Tensor:
    buf = io.BytesIO()
    img.save(buf, fmt, **options)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _textured(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A gradient with noise: smooth areas and edges, as photos have."""
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) % 256], -1)
    return np.clip(base + np.random.default_rng(seed).normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)


def _jpegs() -> dict[str, torch.Tensor]:
    """JPEGs of several sizes (odd ones: partial blocks), modes, chroma subsamplings and qualities."""
    files = {}
    for h, w in ((1, 1), (17, 23), (64, 48), (120, 250)):
        img = Image.fromarray(_textured(h, w, seed=h))
        for subsampling in (0, 1, 2):  # 4:4:4, 4:2:2, 4:2:0
            for progressive in (False, True):
                files[f'{h}x{w} rgb {subsampling} p{progressive:d}'] = _encoded(
                    img, quality=90, subsampling=subsampling, progressive=progressive)
        files[f'{h}x{w} grey'] = _encoded(img.convert('L'), quality=75)
        files[f'{h}x{w} cmyk'] = _encoded(img.convert('CMYK'), quality=95)
    return files


def _assert_close_jpeg(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == torch.uint8 and got.shape == want.shape, what
    diff = (got.int() - want.int()).abs()
    assert diff.max() <= JPEG_MAX_DIFF and diff.float().mean() <= JPEG_MEAN_DIFF, what


@pytest.mark.parametrize('decoder', EACH_DECODER)
def test_jpegs_decode_as_pillow_reads_them(decoder):
    files = _jpegs()
    decoded = decode_images(list(files.values()), list(files), 'cpu', decoder)
    for (name, data), img in zip(files.items(), decoded):
        _assert_close_jpeg(img, _pixels(Image.open(io.BytesIO(data.numpy().tobytes()))), name)


def test_torchcodec_and_torchvision_decode_the_same_jpegs():
    if set(available_decoders()) != set(DECODERS):
        pytest.skip(f'needs both decoders; here: {available_decoders()}')
    files = _jpegs()
    codec, vision = (decode_images(list(files.values()), list(files), 'cpu', name) for name in DECODERS)
    for name, a, b in zip(files, codec, vision):
        _assert_close_jpeg(a, b, name)


@pytest.mark.parametrize('decoder', EACH_DECODER)
@pytest.mark.parametrize('fmt', ['JPEG', 'PNG', 'WEBP'])
def test_exif_orientation_is_left_as_pillow_leaves_it(decoder, fmt):
    """TorchCodec turns images by their EXIF orientation; Pillow (the CPU path) reads them as stored."""
    img = Image.fromarray(_textured(24, 36))
    options = {'JPEG': dict(quality=95), 'PNG': {}, 'WEBP': dict(lossless=True)}[fmt]
    files = []
    for orientation in (3, 6, 8):  # turned 180, 90 and 270 degrees
        exif = Image.Exif()
        exif[0x0112] = orientation
        files.append(_encoded(img, fmt, exif=exif.tobytes(), **options))
    for data, got in zip(files, decode_images(files, None, 'cpu', decoder)):
        _assert_close_jpeg(got, _pixels(Image.open(io.BytesIO(data.numpy().tobytes()))), fmt)


def test_auto_takes_torchcodec_else_torchvision_else_names_both(monkeypatch):
    def missing():
        raise ImportError("No module named 'absent'")

    decode_module._load.cache_clear()
    try:
        monkeypatch.setitem(decode_module._LOADERS, 'torchcodec', missing)
        assert image_decoder('auto').name == 'torchvision' and available_decoders() == ['torchvision']
        with pytest.raises(ImportError, match=r"torchcodec: ImportError: No module named 'absent'.*ifnd\[torchcodec\]"):
            image_decoder('torchcodec')
        decode_module._load.cache_clear()
        monkeypatch.setitem(decode_module._LOADERS, 'torchvision', missing)
        with pytest.raises(ImportError) as err:
            decode_images([_encoded(Image.new('RGB', (4, 4)))])
        assert 'torchcodec: ImportError' in str(err.value) and 'torchvision: ImportError' in str(err.value)
        assert "pip install 'ifnd[torchcodec]'" in str(err.value) and "augment_on='cpu'" in str(err.value)
    finally:
        decode_module._load.cache_clear()
    with pytest.raises(ValueError, match=r"Unknown image decoder 'torchcodex'; use 'auto'"):
        ContrastiveDataPreprocessor(decoder='torchcodex')


def _save_in(path, fmt: str) -> None:
    """A small textured image in ``fmt`` (an animated GIF or WebP for 'GIF-anim', 'WEBP-anim')."""
    yy, xx = np.mgrid[0:24, 0:36]
    img = np.stack([xx * 7 % 256, yy * 10 % 256, (xx + yy) * 3 % 256], -1).astype(np.uint8)
    if fmt.endswith('-anim'):
        frames = [Image.fromarray(img), Image.fromarray(255 - img)]
        frames[0].save(path, fmt[:-5], save_all=True, append_images=frames[1:],
                       **({'lossless': True} if fmt.startswith('WEBP') else {}))
    else:
        Image.fromarray(img).save(path, fmt, **({'lossless': True} if fmt == 'WEBP' else {}))


@pytest.mark.parametrize('decoder', EACH_DECODER)
@pytest.mark.parametrize('fmt, ext', [('JPEG', 'jpg'), ('PNG', 'png'), ('GIF', 'gif'), ('GIF-anim', 'gif'),
                                      ('WEBP', 'webp'), ('WEBP-anim', 'webp'), ('BMP', 'bmp'), ('TIFF', 'tif'),
                                      ('PPM', 'ppm')])
def test_device_decoding_reads_every_format_as_the_cpu_path(tmp_path, fmt, ext, decoder):
    (tmp_path / 'cls').mkdir()
    path = tmp_path / 'cls' / f'img.{ext}'
    _save_in(path, fmt)
    cpu = ImageFolder(str(tmp_path), extensions=(f'.{ext}',)).load_image(0)  # GIF is not a default extension
    cpu = torch.from_numpy(np.array(cpu)).permute(2, 0, 1)
    device = decode_images([read_encoded(str(path))], [str(path)], decoder=decoder)[0]
    assert device.dtype == torch.uint8 and device.shape == cpu.shape == (3, 24, 36)
    if fmt == 'JPEG':
        _assert_close_jpeg(device, cpu, fmt)
    else:
        assert torch.equal(device, cpu)


def _claiming_a_huge_size(path, fmt: str, width: int = 20000, height: int = 10000) -> None:
    """A small image file whose header claims ``width`` x ``height`` pixels (above Pillow's bomb limit)."""
    import struct
    import zlib
    _save_in(path, fmt)
    data = bytearray(path.read_bytes())
    if fmt == 'PNG':  # IHDR's width and height, then its CRC (Pillow checks it)
        data[16:24] = struct.pack('>II', width, height)
        data[29:33] = struct.pack('>I', zlib.crc32(bytes(data[12:29])))
    elif fmt == 'JPEG':  # the start-of-frame segment's height and width
        sof = data.index(b'\xff\xc0')
        data[sof + 5:sof + 9] = struct.pack('>HH', height, width)
    elif fmt == 'BMP':  # BITMAPINFOHEADER's width and height
        data[18:26] = struct.pack('<ii', width, height)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize('decoder', EACH_DECODER)
@pytest.mark.parametrize('fmt, ext', [('JPEG', 'jpg'), ('PNG', 'png'), ('BMP', 'bmp')])
def test_device_decoding_refuses_decompression_bombs_as_the_cpu_path(tmp_path, fmt, ext, decoder):
    (tmp_path / 'cls').mkdir()
    path = tmp_path / 'cls' / f'bomb.{ext}'
    _claiming_a_huge_size(path, fmt)
    with pytest.raises(CorruptImageError) as cpu:
        ImageFolder(str(tmp_path)).load_image(0)
    good = tmp_path / 'cls' / 'good.jpg'
    _save_in(good, 'JPEG')  # a good file in the batch: the bomb is still found and named
    with pytest.raises(CorruptImageError) as device:
        decode_images([read_encoded(str(good)), read_encoded(str(path))], [str(good), str(path)], decoder=decoder)
    reason = f"Cannot read image '{path}' (Image size (200000000 pixels) exceeds limit of 178956970 pixels"
    assert str(cpu.value).startswith(reason) and 'decompression bomb' in str(cpu.value)
    assert str(device.value).startswith(str(cpu.value).split('; ')[0])
    assert 'remove or replace the file' in str(device.value)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')


@needs_cuda
@pytest.mark.parametrize('decoder', EACH_DECODER)
def test_each_decoder_on_cuda_is_ordered_before_the_callers_work(decoder):
    """nvJPEG through either package, from a non-default caller stream: the caller's next kernels see
    the pixels, as stored (no EXIF turn), close to the CPU decode's."""
    exif = Image.Exif()
    exif[0x0112] = 6
    # 4:4:4, so that pixels compare: nvJPEG upsamples subsampled chroma differently from libjpeg-turbo
    # (measured on an H200: mean |difference| 3.7 on 4:2:0, where only the images' means agree).
    files = [_encoded(Image.fromarray(_textured(h, w, seed=h)), quality=90, subsampling=0)
             for h, w in ((64, 48), (33, 71))]
    files.append(_encoded(Image.fromarray(_textured(40, 56)), quality=90, subsampling=0, exif=exif.tobytes()))
    files.append(_encoded(Image.fromarray(_textured(48, 64)), quality=90, subsampling=2))
    cpu = decode_images(files, None, 'cpu', decoder)
    caller = torch.cuda.Stream()
    with torch.cuda.stream(caller):
        decoded = decode_images(files, None, 'cuda', decoder)
        means = torch.stack([img.float().mean() for img in decoded])  # queued on the caller stream
    caller.synchronize()
    for i, (img, ref, mean) in enumerate(zip(decoded, cpu, means.cpu())):
        assert img.is_cuda and img.shape == ref.shape
        if i < 3:
            assert (img.cpu().float() - ref.float()).abs().mean() < 2.0  # nvJPEG's IDCT differs
        assert abs(float(mean) - ref.float().mean().item()) < 2.0
