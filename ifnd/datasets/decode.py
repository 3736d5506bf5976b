"""Image files decoded: on the CPU by Pillow as RGB (``to_rgb``), and for the device views by TorchCodec
where it decodes, else torchvision's decoders.

torchvision deprecated its image decoders (0.29) for TorchCodec's (0.16+), which need no FFmpeg. Either
package decodes JPEGs (on the training device: nvJPEG on CUDA), PNG, GIF and WebP; Pillow decodes every
other format, so each file reads as on the CPU path (Pillow), pixels as stored.
"""
from __future__ import annotations

import functools
import io
import os.path as osp
import warnings
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image

JPEG_MAGIC = b'\xff\xd8\xff'
# The packages that can decode for the device path, in the order decoder='auto' tries them.
DECODERS = ('torchcodec', 'torchvision')
_FIXES = {'torchcodec': "install TorchCodec (pip install 'ifnd[torchcodec]')",
          'torchvision': 'install a torchvision that still has its image decoders (torchvision.io.decode_jpeg)'}


class CorruptImageError(OSError):
    """An image file exists but cannot be decoded."""


class ImageDecoder(NamedTuple):
    """One package's decoders, as the device path calls them."""

    name: str
    # A batch of JPEGs (1-D uint8 CPU tensors) to RGB uint8 [3, H, W] on a device.
    jpegs: Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]]
    # A JPEG, PNG, GIF or WebP to RGB on the CPU: uint16 for 16-bit PNGs, [N, 3, H, W] for animations.
    image: Callable[[torch.Tensor], torch.Tensor]
    # TorchCodec turns images by their EXIF orientation; Pillow (the CPU path) and torchvision do not.
    turns_by_exif: bool


def _torchcodec() -> ImageDecoder:
    from torchcodec.decoders import decode_image, decode_jpeg
    return ImageDecoder('torchcodec', lambda data, device: decode_jpeg(data, mode='RGB', device=device),
                        # 'auto' keeps 16-bit PNGs 16-bit: the CPU path takes their top byte, not a rounding
                        lambda data: decode_image(data, mode='RGB', output_dtype='auto'),
                        turns_by_exif=True)


def _torchvision() -> ImageDecoder:
    from torchvision.io import ImageReadMode, decode_image, decode_jpeg
    return ImageDecoder('torchvision', lambda data, device: decode_jpeg(data, mode=ImageReadMode.RGB, device=device),
                        lambda data: decode_image(data, mode=ImageReadMode.RGB),
                        turns_by_exif=False)


_LOADERS = {'torchcodec': _torchcodec, 'torchvision': _torchvision}


def decoder_names(name: str) -> tuple[str, ...]:
    """The packages decoder ``name`` ('auto', 'torchcodec' or 'torchvision') stands for, in the order tried."""
    if name == 'auto':
        return DECODERS
    if name not in DECODERS:
        raise ValueError(f"Unknown image decoder {name!r}; use 'auto' (TorchCodec where it decodes, else "
                         f"torchvision), {' or '.join(map(repr, DECODERS))}")
    return (name,)


@functools.lru_cache(maxsize=None)
def _load(name: str) -> ImageDecoder | str:
    """Package ``name``'s decoders once they have decoded a small JPEG, else why they cannot."""
    buf = io.BytesIO()
    Image.new('RGB', (8, 8)).save(buf, 'JPEG')
    try:
        decoder = _LOADERS[name]()
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', DeprecationWarning)  # torchvision's: a real decode warns, not this probe
            decoder.jpegs([torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)], torch.device('cpu'))
    except Exception as e:  # a missing package, a native library that does not load, a decoder that fails
        first_line = str(e).strip().splitlines()[:1]
        return f"{name}: {': '.join([type(e).__name__, *first_line])}"
    return decoder


def available_decoders() -> list[str]:
    """The packages that decode here, in the order decoder='auto' tries them."""
    return [name for name in DECODERS if isinstance(_load(name), ImageDecoder)]


def image_decoder(name: str = 'auto') -> ImageDecoder:
    """The decoders of package ``name`` ('auto': TorchCodec where it decodes, else torchvision's)."""
    names = decoder_names(name)
    for n in names:
        found = _load(n)
        if isinstance(found, ImageDecoder):
            return found
    reasons = '; '.join(_load(n) for n in names)  # type: ignore[misc]
    raise ImportError(f'No image decoder for the device views ({reasons}): '
                      f"{' or '.join(_FIXES[n] for n in names)}, or make the views on the CPU (augment_on='cpu')")


def decode_images(encoded: Sequence[torch.Tensor], paths: Sequence[str] | None = None,
                  device: torch.device | str = 'cpu', decoder: str = 'auto') -> list[torch.Tensor]:
    """Decode encoded image files (1-D uint8 CPU tensors) to RGB uint8 ``[3, H, W]`` on ``device``.

    ``decoder`` picks the package (:func:`image_decoder`). JPEGs are decoded together on ``device``
    (nvJPEG on CUDA, ordered before the caller's stream's later work); PNG, GIF and WebP by the same
    package on the CPU; every other format Pillow reads (BMP, TIFF, PPM, ...) by Pillow, as the CPU path.
    Pixels are read as stored, as Pillow reads them, whatever the EXIF orientation. A JPEG or a file
    Pillow can open whose header claims more pixels than Pillow's ``Image.MAX_IMAGE_PIXELS`` allows is
    refused as the CPU path refuses it, before any decoding; a file Pillow cannot open is left to the decoder.
    """
    dec = image_decoder(decoder)
    device = torch.device(device)
    paths = list(paths) if paths is not None else [f'<item {i}>' for i in range(len(encoded))]
    data = list(encoded)
    out: list[torch.Tensor | None] = [None] * len(encoded)
    # The magic bytes are read from the CPU tensors' memory: no tensor op, nothing to wait for.
    jpeg = [i for i, e in enumerate(encoded) if e[:3].numpy().tobytes() == JPEG_MAGIC]
    for i in jpeg:
        size, app1 = _jpeg_header(encoded[i])
        _check_pixels(size, encoded[i], paths[i])
        if app1 and dec.turns_by_exif:
            data[i] = _without_app1(encoded[i], app1)
    if jpeg:
        try:
            decoded = _decode_jpegs(dec, [data[i] for i in jpeg], device)
        except (RuntimeError, ValueError):
            decoded = [_decode_one(dec, data[i], paths[i], device, jpeg=True) for i in jpeg]  # find the bad file
        for i, img in zip(jpeg, decoded):
            out[i] = img
    for i, e in enumerate(data):
        if out[i] is None:
            out[i] = _decode_one(dec, e, paths[i], device, jpeg=False)
    return out  # type: ignore[return-value]


# JPEG markers without a length field: TEM, RST0-7, SOI.
_JPEG_STANDALONE = {0x01, *range(0xD0, 0xD9)}
# Start-of-frame markers (they hold the size); C4, C8 and CC are other segments.
_JPEG_SOF = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_APP1, _JPEG_APP15, _JPEG_SOS = 0xE1, 0xEF, 0xDA
# What the decoders read as Pillow does (same pixels); the rest is left to Pillow.
_DECODER_FORMATS = ('JPEG', 'MPO', 'PNG', 'GIF', 'WEBP')


def _jpeg_header(data: torch.Tensor) -> tuple[tuple[int, int] | None, list[int]]:
    """(width, height) from a JPEG's start-of-frame segment (None where unreadable), and its APP1 markers' offsets.

    Read here rather than by Pillow, which parses every segment of the header: this runs for each
    image of each batch in the training step.
    """
    buf = memoryview(data.numpy())
    size, app1 = None, []
    i, n = 2, len(buf)
    while i + 4 <= n and buf[i] == 0xFF:
        marker = buf[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _JPEG_STANDALONE:
            i += 2
            continue
        if marker == _JPEG_SOS:  # the header ends (before any frame header: no size)
            break
        if marker == _JPEG_APP1:
            app1.append(i)
        elif marker in _JPEG_SOF and size is None:
            if i + 9 > n:
                break
            size = (buf[i + 7] << 8) | buf[i + 8], (buf[i + 5] << 8) | buf[i + 6]
        i += 2 + ((buf[i + 2] << 8) | buf[i + 3])
    return size, app1


def _without_app1(data: torch.Tensor, app1: list[int]) -> torch.Tensor:
    """A copy of a JPEG whose APP1 segments (EXIF, XMP: metadata) are marked APP15, which decoders skip.

    TorchCodec then finds no EXIF orientation to turn the image by: it reads the pixels as stored.
    """
    copy = data.numpy().copy()
    copy[np.asarray(app1) + 1] = _JPEG_APP15
    return torch.from_numpy(copy)


def _refuse_bomb(path: str, err: Exception) -> CorruptImageError:
    # The CPU path's message (datasets.load_rgb_image), so both paths refuse a file alike.
    return CorruptImageError(f"Cannot read image '{path}' ({err}); remove or replace the file, or leave it "
                             'out of the data set')


def _check_pixels(size: tuple[int, int] | None, data: torch.Tensor, path: str) -> None:
    """Refuse a decompression bomb as Pillow does on the CPU path (its limit, warning and message)."""
    if size is None:  # a header this reader does not follow: Pillow reads it and checks
        _pil_header(data, path)
        return
    try:
        # Pillow's own check: Image.MAX_IMAGE_PIXELS (None: off), a warning above it, an error above twice it.
        Image._decompression_bomb_check(size)
    except Image.DecompressionBombError as e:
        raise _refuse_bomb(path, e) from None


def _pil_header(data: torch.Tensor, path: str) -> Image.Image | None:
    """The file opened by Pillow (header only; it refuses decompression bombs), or None if not an image it reads."""
    try:
        return Image.open(io.BytesIO(data.numpy().tobytes()))
    except Image.DecompressionBombError as e:
        raise _refuse_bomb(path, e) from None
    except (OSError, ValueError, SyntaxError):
        return None


def _decode_jpegs(dec: ImageDecoder, data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    if device.type != 'cuda':
        return dec.jpegs(data, device)
    # torchvision's nvJPEG decodes on a stream of its own, then makes the current stream *of the current
    # device* wait for it (some versions: the legacy default stream); TorchCodec's decodes on the current
    # stream and waits for it on the host. Decode on a side stream of the target device, as its current
    # stream, so that wait lands there, then order the caller's stream after the side stream: later kernels
    # read the images only once they are written, with no host wait on the caller's queued work. The side
    # stream does not wait for the caller's: the decode reads host memory only and writes memory of its own
    # stream's pool, so it overlaps the previous step's kernels still queued there.
    caller = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    with torch.cuda.device(device), torch.cuda.stream(side):
        images = dec.jpegs(data, device)
    caller.wait_stream(side)
    for img in images:
        img.record_stream(caller)  # the allocator must not hand this memory out while the caller uses it
    return images


def _decode_one(dec: ImageDecoder, data: torch.Tensor, path: str, device: torch.device, jpeg: bool) -> torch.Tensor:
    if jpeg and device.type != 'cpu':
        try:
            return _decode_jpegs(dec, [data], device)[0]
        except (RuntimeError, ValueError):
            pass  # e.g. a CMYK JPEG nvJPEG does not take: the CPU decoders may
    header = None if jpeg else _pil_header(data, path)
    # TorchCodec would turn a PNG or WebP by its EXIF orientation, which Pillow leaves as stored.
    turned = header is not None and dec.turns_by_exif and 'exif' in header.info
    if header is None or (header.format in _DECODER_FORMATS and not turned):
        try:
            image = dec.image(data)
        except (RuntimeError, ValueError) as e:
            if header is None and jpeg:
                header = _pil_header(data, path)  # e.g. a 12-bit or arithmetic-coded JPEG Pillow reads
            if header is None:
                raise CorruptImageError(f"Cannot decode image '{path}' ({str(e).splitlines()[0]}); remove or "
                                        'replace the file, or leave it out of the data set') from e
        else:
            if image.dim() == 4:  # an animated GIF or WebP: its first frame, as Pillow reads it
                image = image[0]
            if image.dtype == torch.uint16:  # 16-bit PNGs: the top byte, as the CPU path (to_rgb)
                image = image.to(torch.int32).bitwise_right_shift_(8).to(torch.uint8)
            return image.to(device)
    return _decode_with_pil(header, path).to(device)


def _decode_with_pil(header: Image.Image, path: str) -> torch.Tensor:
    """A file Pillow has opened, decoded as the CPU path decodes it (``to_rgb``), as ``[3, H, W]``."""
    try:
        with header:
            header.load()
            rgb = to_rgb(header)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise CorruptImageError(f"Cannot read image '{path}' ({e}); remove or replace the file, or leave it "
                                'out of the data set') from e
    return torch.from_numpy(np.array(rgb, dtype=np.uint8)).permute(2, 0, 1).contiguous()


# Pillow's modes for 16-bit (and 32-bit integer) single-channel images, e.g. 16-bit grayscale PNGs.
_WIDE_INTEGER_MODES = ('I;16', 'I;16L', 'I;16B', 'I;16N', 'I')


def to_rgb(img: Image.Image) -> Image.Image:
    """An image as 8-bit RGB; 16-bit grayscale keeps its full range, scaled to 8 bits (its top byte).

    Pillow's ``convert('RGB')`` clips 16-bit values at 255; the top byte is what Pillow keeps of
    16-bit RGB files and what the device path takes of every 16-bit image (``decode_images``).
    """
    if img.mode == 'RGB':
        return img
    if img.mode in _WIDE_INTEGER_MODES:
        values = np.clip(np.asarray(img, dtype=np.int64), 0, 65535) >> 8
        img = Image.fromarray(values.astype(np.uint8), mode='L')
    return img.convert('RGB')


def load_rgb_image(path: str, listed_in: str = 'the list file') -> Image.Image:
    """An image file decoded as RGB, with errors that name the file and the fix."""
    try:
        with Image.open(path) as img:
            img.load()  # decode now, so a truncated file fails here with its name, not inside a transform
            return to_rgb(img)
    except FileNotFoundError:
        raise FileNotFoundError(f"Image file '{path}' does not exist; restore it or leave it out of "
                                f'{listed_in}') from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise CorruptImageError(f"Cannot read image '{path}' ({e}); remove or replace the file, or leave it "
                                f'out of {listed_in}') from e


def read_encoded(path: str) -> torch.Tensor:
    """The bytes of an image file as a 1-D uint8 tensor, with an error naming a missing file."""
    return read_encoded_batch([path])[0]


def read_encoded_batch(paths: Sequence[str]) -> tuple[torch.Tensor, list[int]]:
    """The bytes of image files one after the other in one 1-D uint8 tensor, and each file's byte count
    (``torch.split(buffer, sizes)`` gives the files): one piece of shared memory from a loader worker,
    not one a file."""
    sizes = []
    for path in paths:
        if not osp.isfile(path):
            raise FileNotFoundError(f"Image file '{path}' does not exist; restore it or leave it out of the data set")
        sizes.append(osp.getsize(path))
    buffer = torch.empty(sum(sizes), dtype=torch.uint8)
    view = memoryview(buffer.numpy())
    start = 0
    for path, size in zip(paths, sizes):
        with open(path, 'rb') as f:
            read = f.readinto(view[start:start + size])
        if read != size:  # the file changed between the size and the read
            raise CorruptImageError(f"Image file '{path}' changed while it was read ({read} of {size} bytes); "
                                    'read it again or leave it out of the data set')
        start += size
    return buffer, sizes
