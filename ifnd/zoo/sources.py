"""Fetching a file from a URL or a mirror folder: resumed over HTTP, stopped at the index's size."""
import os
import os.path as osp
import shutil
import sys
import urllib.error
import urllib.parse
import urllib.request

from tqdm import tqdm

from ifnd.fileio import open_plain

from .cache import CHUNK
from .errors import (OversizeError, SizeError, looks_like_html, not_found_error, oversize_error,
                     web_page_error)


def entry_sources(entry: dict) -> list[str]:
    """Where to look for the file, in order: the IFND_ZOO_URL mirror, then the entry's URLs."""
    sources = []
    base = os.environ.get('IFND_ZOO_URL')
    if base:
        if '://' in base:
            sources.append(base.rstrip('/') + '/' + urllib.parse.quote(entry['file']))
        else:
            sources.append(osp.join(base, entry['file']))
    return sources + list(entry.get('urls') or [])


def fetch_source(name: str, source: str, part: str, size: int | None, limit: int | None,
                 progress: bool, timeout: float) -> None:
    """Copy one source into ``part``, continuing a partial file over HTTP when the server allows.

    Our own code, not ``torch.hub.download_url_to_file``: that one neither resumes nor stops an
    oversized body.
    """
    if '://' not in source:
        _copy_from_folder(name, source, part, limit)
        return
    done = osp.getsize(part) if osp.exists(part) else 0
    request = urllib.request.Request(source, headers={'Range': f'bytes={done}-'} if done else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            announced, start = _receive(name, source, part, response, done, size, limit, progress)
    except urllib.error.HTTPError as err:
        if err.code in (404, 410):  # the same answer on every retry
            raise not_found_error(name, source, f'HTTP {err.code} {err.reason}: no such file there',
                                  "fix the URL (the entry's urls in the index, or IFND_ZOO_URL)"
                                  ) from None
        raise
    except OversizeError:
        if osp.exists(part):
            os.unlink(part)
        raise
    _check_received(name, source, part, size, announced, start)


def _copy_from_folder(name: str, source: str, part: str, limit: int | None) -> None:
    """Copy a file of the IFND_ZOO_URL folder into ``part``, refused over ``limit`` bytes."""
    if not osp.isfile(source):
        raise not_found_error(name, source, 'no such file in the IFND_ZOO_URL folder',
                              f'put {osp.basename(source)} there, or unset IFND_ZOO_URL')
    if limit is not None and osp.getsize(source) > limit:
        raise oversize_error(name, source, limit, osp.getsize(source), announced=True)
    with open(source, 'rb') as src, open_plain(part, 'wb', 'partial download', own=True) as dst:
        shutil.copyfileobj(src, dst)


def _receive(name: str, source: str, part: str, response, done: int, size: int | None,
             limit: int | None, progress: bool) -> tuple[int | None, int]:
    """Write an HTTP body into ``part``; its announced length, and where in the file it starts."""
    content_type = (response.headers.get('Content-Type') or '').split(';')[0].strip().lower()
    if content_type in ('text/html', 'application/xhtml+xml'):
        raise web_page_error(source, f'Content-Type {content_type}')
    resumed = done and getattr(response, 'status', 200) == 206
    mode = 'ab' if resumed else 'wb'
    received = start = done if resumed else 0
    length = response.headers.get('Content-Length') or ''
    announced = int(length) if length.isdigit() else None
    if limit is not None and announced is not None and received + announced > limit:
        raise oversize_error(name, source, limit, received + announced, announced=True)
    with open_plain(part, mode, 'partial download', own=True) as f, tqdm(total=size, initial=received, unit='B',
                                     unit_scale=True, desc=osp.basename(part)[:-5],
                                     disable=not progress, file=sys.stderr) as bar:
        # Never more than the limit and one block: an endless body stops here.
        for block in iter(lambda: response.read(CHUNK), b''):
            received += len(block)
            if limit is not None and received > limit:
                raise oversize_error(name, source, limit, limit + 1)
            f.write(block)
            bar.update(len(block))
    return announced, start


def _check_received(name: str, source: str, part: str, size: int | None, announced: int | None,
                    start: int | None) -> None:
    """Refuse a received file that is a web page, or shorter than the index's size."""
    received = osp.getsize(part)
    with open_plain(part, 'rb', 'partial download', own=True) as f:
        if looks_like_html(f.read(1024)):
            os.unlink(part)  # a page, not the start of the file: never resume from it
            raise web_page_error(source, f'{received} bytes of HTML')
    if size is not None and received < size:
        if announced is not None and received - start == announced:
            os.unlink(part)  # the whole file as the server announced it: the index's size is wrong
            raise SizeError(f'{name}: {source} sent the whole file, {received} bytes, but the '
                            f'index says size {size}; fix the size in the index entry (or the URL)')
        # A dropped connection can end the body early without an error: keep the partial file.
        raise ConnectionError(f'connection closed after {received} of {size} bytes')
