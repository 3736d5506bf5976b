"""The model zoo: list, describe, download (verified, resumable) and load published checkpoints.

The index is ``model_zoo/models.yaml``: this project's models and published baselines of other
methods. Each file is verified as far as its authors allow: a full SHA-256; a published MD5 or
SHA-256 prefix, checked as such, after which the file's full SHA-256 is recorded in the cache and
required of every later download (trust on first use); or, when the authors publish no checksum,
nothing, so such an entry downloads only with ``trust=True`` (``--trust-remote``).

Downloads go to ``$IFND_HOME/checkpoints`` (default ``~/.cache/ifnd``). A source is a URL or a
Hugging Face Hub file, ``hf://ORG/REPO/FILE@COMMIT`` (fetched, cached and resumed by
``huggingface_hub``; ``HF_ENDPOINT`` names another Hub). ``IFND_ZOO_URL`` names a mirror tried
before an entry's own sources: an ``http(s)://`` or ``file://`` base URL, or a plain directory,
holding the files by name.
"""
import argparse
import contextlib
import datetime
import hashlib
import http.client
import json
import os
import os.path as osp
import re
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Iterator, Sequence

import torch
import yaml
from tqdm import tqdm

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
INDEX_PATH = osp.join(REPO_ROOT, 'model_zoo', 'models.yaml')
CHUNK = 1 << 20
# Next to a file verified by a published prefix or trusted: its full SHA-256 at the first download.
RECORD_SUFFIX = '.verified.json'
# huggingface_hub's own cache (blobs, resumable partial files), inside the zoo's folder.
HUB_CACHE = '.hub'


class PermanentError(OSError):
    """A source's answer that a retry would repeat (no such file, a web page, too big)."""


class ChecksumError(RuntimeError):
    """A downloaded file whose checksum differs from the index or from the first download's."""


class UnverifiedError(RuntimeError):
    """An entry whose authors publish no checksum, asked for without ``trust=True``."""


class OversizeError(PermanentError):
    """A download that sends more bytes than the index allows for its entry."""


class WebPageError(PermanentError):
    """A URL that serves a web page (HTML) instead of the checkpoint; retrying does not help."""


class SizeError(PermanentError):
    """A source that sent a whole file of another size than the index's ``size``."""


class SourceNotFoundError(PermanentError):
    """A source that answers that the file, its repository or its commit does not exist."""


class CacheLinkError(RuntimeError):
    """A path in the zoo's cache that is a link leading out of it: nothing is written through it."""


def _looks_like_html(head: bytes) -> bool:
    start = head.lstrip()[:256].lower()
    return start.startswith((b'<!doctype html', b'<html', b'<head', b'<body', b'<?xml'))


def _web_page_error(source: str, why: str) -> WebPageError:
    return WebPageError(f'{source} serves a web page ({why}), not the checkpoint: a download page, '
                        'login or error page; use the direct link to the file')


def _oversize_error(name: str, source: str, limit: int, received: int, announced: bool = False
                    ) -> OversizeError:
    what = f'announces {received} bytes' if announced else f'sent more than {received - 1} bytes'
    return OversizeError(f'{name}: {source} {what}, over the {limit} bytes the index allows for it '
                         '(size or max_size); stopped and deleted the partial file')


# Fields every index entry needs (the others are descriptive and may be missing).
REQUIRED_FIELDS = ('name', 'file')
# How a file can be verified: field -> (algorithm, fewest and most hex digits).
CHECKSUM_FIELDS = {'sha256': ('sha256', 64, 64), 'sha256_prefix': ('sha256', 8, 63),
                   'md5_prefix': ('md5', 8, 31)}
# An entry's ``name`` and ``file`` are plain names: a file inside the cache, a command-line word.
FILE_NAME = re.compile(r'[A-Za-z0-9][A-Za-z0-9._+-]{0,254}')
PLAIN_NAME_WORDS = ("letters, digits, '.', '_', '+', '-', starting with a letter or digit, at most "
                    "255 characters; no spaces, folders or absolute path")
HEX = re.compile(r'[0-9a-f]+')
# 1 TiB: a larger ``size`` or ``max_size`` is a typo, and would read as a download cut short.
MAX_SIZE = 2**40
# A Hub model repository and a Hub file at a pinned commit: hf://ORG/REPO/FILE@COMMIT.
HUB_REPO = re.compile(r'[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*')
HF_SOURCE = re.compile(rf'hf://(?P<repo>{HUB_REPO.pattern})/(?P<file>[^/@]+)'
                       r'@(?P<revision>[0-9a-f]{40})')


class ZooIndexError(ValueError):
    """A model zoo index that is not valid YAML, not a mapping, or has a malformed entry."""


def _entry_error(path: str, entry, field: str, problem: str) -> ZooIndexError:
    name = entry.get('name') if isinstance(entry, dict) else None
    which = f'entry {name!r}' if isinstance(name, str) else 'an entry'
    return ZooIndexError(f'model zoo index {path}: {which}: field {field!r} {problem}; fix the index')


def plain_name(value: object) -> bool:
    """Whether a value is a plain name, as an entry's ``name`` and ``file`` must be."""
    return isinstance(value, str) and bool(FILE_NAME.fullmatch(value)) and value not in ('.', '..')


def source_problem(url: str) -> str | None:
    """What makes a download source unusable in an index entry, or None when it is usable."""
    if url.startswith('hf://'):
        match = HF_SOURCE.fullmatch(url)
        if not match or not plain_name(match['file']):
            return (f'{url!r} is not hf://ORG/REPO/FILE@COMMIT with a plain file name and a pinned '
                    '40-hex-digit commit')
    elif urllib.parse.urlsplit(url).scheme not in ('http', 'https', 'file'):
        return f'{url!r} is not an http(s)://, file:// or hf:// URL'
    return None


def check_entry(entry, path: str = 'the index') -> dict:
    """An index entry, checked: names, plain file names, checksums, sizes and sources."""
    if not isinstance(entry, dict):
        raise ZooIndexError(f'model zoo index {path}: field models holds a {type(entry).__name__} '
                          '(expected one mapping per model, with name, file, sha256, ...); fix the index')
    for field in REQUIRED_FIELDS:
        if not isinstance(entry.get(field), str) or not entry[field]:
            raise _entry_error(path, entry, field, 'is missing' if field not in entry
                               else f'must be a non-empty string, not {entry[field]!r}')
    if not plain_name(entry['name']):
        raise _entry_error(path, entry, 'name', f'{entry["name"]!r} is not a plain name '
                           f'({PLAIN_NAME_WORDS}), as commands and file names need')
    file = entry['file']
    if not plain_name(file):
        raise _entry_error(path, entry, 'file', f'{file!r} is not a plain file name '
                           f'({PLAIN_NAME_WORDS}), so it could point outside the download folder')
    checks = [field for field in CHECKSUM_FIELDS if field in entry]
    if not checks and entry.get('checksum') != 'none':
        raise _entry_error(path, entry, 'sha256', 'is missing (give sha256, or sha256_prefix or '
                           'md5_prefix as the authors publish it, or checksum: none when they '
                           'publish none)')
    for field in checks:
        _, fewest, most = CHECKSUM_FIELDS[field]
        value = entry[field]
        if not isinstance(value, str) or not HEX.fullmatch(value) or not fewest <= len(value) <= most:
            digits = f'{fewest}' if fewest == most else f'{fewest} to {most}'
            raise _entry_error(path, entry, field, f'must be {digits} lower-case hex digits')
    for field in ('size', 'max_size'):
        size = entry.get(field)
        if size is not None and (not isinstance(size, int) or isinstance(size, bool)
                                 or not 0 <= size <= MAX_SIZE):
            raise _entry_error(path, entry, field, f'must be a byte count from 0 to {MAX_SIZE} '
                               f'(1 TiB), not {size!r}')
    urls = entry.get('urls')
    if urls is not None and (not isinstance(urls, list) or not all(isinstance(u, str) for u in urls)):
        raise _entry_error(path, entry, 'urls', 'must be a list of URLs')
    for url in urls or []:
        problem = source_problem(url)
        if problem:
            raise _entry_error(path, entry, 'urls', problem)
    if urls and entry.get('size') is None and entry.get('max_size') is None:
        raise _entry_error(path, entry, 'size', 'is missing: a download needs the byte count '
                           '(size) or, when it is not published, a bound (max_size)')
    return entry


def read_index_file(path: str) -> object:
    """The YAML content of a zoo index file, unchecked (see :func:`check_index`)."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'model zoo index not found: {path}')
    with open(path, encoding='utf-8') as f:
        try:
            content = yaml.safe_load(f)
        except yaml.YAMLError as err:
            mark = getattr(err, 'problem_mark', None)
            where = f' (line {mark.line + 1}, column {mark.column + 1})' if mark else ''
            problem = getattr(err, 'problem', None) or str(err).splitlines()[0]
            raise ZooIndexError(f'model zoo index {path} is not valid YAML{where}: {problem}; '
                              'fix the file') from None
    return content


def check_index(content: object, path: str = 'the index') -> dict[str, dict]:
    """A zoo index's entries by name, once the content and every entry pass :func:`check_entry`."""
    content = {} if content is None else content
    if not isinstance(content, dict):
        raise ZooIndexError(f'model zoo index {path} holds a {type(content).__name__}, not a mapping '
                          'with a field models (a list of entries); fix the file')
    models = content.get('models') or []
    if not isinstance(models, list):
        raise ZooIndexError(f'model zoo index {path}: field models must be a list of entries, not a '
                          f'{type(models).__name__}; fix the file')
    index = {}
    for entry in models:
        entry = check_entry(entry, path)
        if entry['name'] in index:
            raise _entry_error(path, entry, 'name', 'is used by two entries')
        index[entry['name']] = entry
    return index


def _index(path: str | None = None) -> dict[str, dict]:
    path = path or os.environ.get('IFND_ZOO_INDEX', INDEX_PATH)
    return check_index(read_index_file(path), path)


def list_models() -> list[str]:
    """Names of the published models."""
    return sorted(_index())


def info(name: str) -> dict:
    """The index entry of a model: recipe, metrics with their commands, file, size, SHA-256, URLs."""
    index = _index()
    if name not in index:
        known = ', '.join(sorted(index)) or 'none'
        raise KeyError(f'unknown model {name!r}; known models: {known}')
    return index[name]


def cache_dir() -> str:
    """Where downloaded checkpoints are kept: ``$IFND_HOME/checkpoints``."""
    home = os.environ.get('IFND_HOME', osp.join(osp.expanduser('~'), '.cache', 'ifnd'))
    return osp.join(home, 'checkpoints')


def sha256sum(path: str) -> str:
    """SHA-256 of a file, hex."""
    return _digest(path, 'sha256')


def _digest(path: str, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(CHUNK), b''):
            digest.update(block)
    return digest.hexdigest()


def verification(entry: dict) -> str:
    """How a model's file is verified, in words."""
    if entry.get('sha256'):
        return (f'SHA-256 {entry["sha256"]} (from the index), checked on every download and on '
                'the cached copy')
    first_use = (f'the first download\'s full SHA-256 is then recorded in the cache '
                 f'({entry["file"]}{RECORD_SUFFIX}) and required of every later download and of the '
                 'cached copy (trust on first use)')
    for field in ('sha256_prefix', 'md5_prefix'):
        if entry.get(field):
            algorithm = CHECKSUM_FIELDS[field][0].upper().replace('SHA', 'SHA-')
            return (f'the authors publish only the first {len(entry[field])} hex digits of its '
                    f'{algorithm} ({entry[field]}), checked on the first download; {first_use}')
    return ('the authors publish no checksum, so the file cannot be verified: it downloads only '
            f'with --trust-remote (trust=True in Python); {first_use}')


def _read_record(path: str) -> dict | None:
    """The SHA-256 recorded at a file's first download, if any."""
    if not osp.isfile(path):
        return None
    try:
        with open(path, encoding='utf-8') as f:
            record = json.load(f)
    except (OSError, ValueError) as err:
        raise ChecksumError(f'{path} is not readable JSON ({err}); delete it to verify the file '
                            'again from scratch') from None
    if not isinstance(record, dict) or not isinstance(record.get('sha256'), str):
        raise ChecksumError(f'{path} holds no sha256; delete it to verify the file again from scratch')
    return record


def _verify(entry: dict, path: str, record: dict | None, record_path: str, source: str) -> str:
    """The file's SHA-256, once it matches the index's checksum or the first download's record."""
    actual = sha256sum(path)
    if entry.get('sha256'):
        if actual != entry['sha256']:
            raise ChecksumError(f'{source}: SHA-256 {actual} differs from the index '
                                f'({entry["sha256"]})')
    elif record is not None:
        if actual != record['sha256']:
            raise ChecksumError(
                f'{source}: SHA-256 {actual} differs from the one recorded at the first download '
                f'({record["sha256"]}, {record.get("date", "date unknown")}, in {record_path}): the '
                'remote file has changed since; if you trust the new one, delete that record and '
                'download again')
    else:
        for field in ('sha256_prefix', 'md5_prefix'):
            prefix = entry.get(field)
            if prefix:
                algorithm = CHECKSUM_FIELDS[field][0]
                digest = actual if algorithm == 'sha256' else _digest(path, algorithm)
                if not digest.startswith(prefix):
                    raise ChecksumError(f'{source}: {algorithm.upper()} {digest} does not start with '
                                        f'the published prefix {prefix} (from the index)')
    return actual


def _write_record(entry: dict, record_path: str, sha256: str, path: str, source: str) -> None:
    from ifnd.fileio import write_json  # here: mmengine loads slowly, `list` needs none of it

    check = next((f'{f} {entry[f]}' for f in ('sha256_prefix', 'md5_prefix') if entry.get(f)),
                 'none published: downloaded with trust')
    record = {'name': entry['name'], 'file': entry['file'], 'sha256': sha256,
              'size': osp.getsize(path), 'source': source, 'published_check': check,
              'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}
    write_json(record, record_path, indent=1, newline=True)


def _sources(entry: dict) -> list[str]:
    """Where to look for the file, in order: the IFND_ZOO_URL mirror, then the entry's URLs."""
    sources = []
    base = os.environ.get('IFND_ZOO_URL')
    if base:
        if '://' in base:
            sources.append(base.rstrip('/') + '/' + urllib.parse.quote(entry['file']))
        else:
            sources.append(osp.join(base, entry['file']))
    return sources + list(entry.get('urls') or [])


def _not_found(name: str, source: str, what: str, fix: str) -> SourceNotFoundError:
    return SourceNotFoundError(f'{name}: {source}: {what}; {fix}')


def _fetch(name: str, source: str, part: str, size: int | None, limit: int | None, progress: bool,
           timeout: float) -> None:
    """Copy one source into ``part``, continuing a partial file over HTTP when the server allows.

    Our own code, not ``torch.hub.download_url_to_file``: that one neither resumes nor stops an
    oversized body.
    """
    if '://' not in source:
        if not osp.isfile(source):
            raise _not_found(name, source, 'no such file in the IFND_ZOO_URL folder',
                             f'put {osp.basename(source)} there, or unset IFND_ZOO_URL')
        if limit is not None and osp.getsize(source) > limit:
            raise _oversize_error(name, source, limit, osp.getsize(source), announced=True)
        shutil.copyfile(source, part)
        return
    done = osp.getsize(part) if osp.exists(part) else 0
    request = urllib.request.Request(source, headers={'Range': f'bytes={done}-'} if done else {})
    announced = start = None  # the body's announced length, and where in the file it starts
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            content_type = (response.headers.get('Content-Type') or '').split(';')[0].strip().lower()
            if content_type in ('text/html', 'application/xhtml+xml'):
                raise _web_page_error(source, f'Content-Type {content_type}')
            resumed = done and getattr(response, 'status', 200) == 206
            mode = 'ab' if resumed else 'wb'
            received = start = done if resumed else 0
            length = response.headers.get('Content-Length') or ''
            announced = int(length) if length.isdigit() else None
            if limit is not None and announced is not None and received + announced > limit:
                raise _oversize_error(name, source, limit, received + announced, announced=True)
            with open(part, mode) as f, tqdm(total=size, initial=received, unit='B',
                                             unit_scale=True, desc=osp.basename(part)[:-5],
                                             disable=not progress, file=sys.stderr) as bar:
                # Never more than the limit and one block: an endless body stops here.
                for block in iter(lambda: response.read(CHUNK), b''):
                    received += len(block)
                    if limit is not None and received > limit:
                        raise _oversize_error(name, source, limit, limit + 1)
                    f.write(block)
                    bar.update(len(block))
    except urllib.error.HTTPError as err:
        if err.code in (404, 410):  # the same answer on every retry
            raise _not_found(name, source, f'HTTP {err.code} {err.reason}: no such file there',
                             "fix the URL (the entry's urls in the index, or IFND_ZOO_URL)") from None
        raise
    except OversizeError:
        if osp.exists(part):
            os.unlink(part)
        raise
    received = osp.getsize(part)
    with open(part, 'rb') as f:
        if _looks_like_html(f.read(1024)):
            os.unlink(part)  # a page, not the start of the file: never resume from it
            raise _web_page_error(source, f'{received} bytes of HTML')
    if size is not None and received < size:
        if announced is not None and received - start == announced:
            os.unlink(part)  # the whole file as the server announced it: the index's size is wrong
            raise SizeError(f'{name}: {source} sent the whole file, {received} bytes, but the '
                            f'index says size {size}; fix the size in the index entry (or the URL)')
        # A dropped connection can end the body early without an error: keep the partial file.
        raise ConnectionError(f'connection closed after {received} of {size} bytes')


def _capped_progress(name: str, source: str, limit: int | None, progress: bool) -> type:
    """A progress bar class for ``huggingface_hub`` that stops a body beyond ``limit`` bytes."""
    class CappedProgress(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.update(disable=not progress, file=sys.stderr)
            super().__init__(*args, **kwargs)
            self.received = kwargs.get('initial') or 0  # counted here: a disabled bar keeps no n

        def update(self, n=1):
            self.received += n
            if limit is not None and self.received > limit:
                raise _oversize_error(name, source, limit, limit + 1)
            return super().update(n)

    return CappedProgress


def _inside(path: str, root: str) -> str:
    """``path``, refused when it is, or passes through, a link leading out of ``root``."""
    real, top = osp.realpath(path), osp.realpath(root)
    if not real.startswith(top.rstrip(os.sep) + os.sep):
        raise CacheLinkError(
            f'{path} is a link to {real}, outside the cache {top}: refused, nothing is deleted, '
            f'moved or written through it; remove the link (rm {path} removes the link, not '
            f'{real}) and download again')
    return path


def _refuse_links_out(root: str) -> None:
    """Refuse a folder holding a link that leads out of it, at any depth."""
    for folder, dirs, files in os.walk(root):  # a linked folder is listed, never entered
        for entry in dirs + files:
            if osp.islink(osp.join(folder, entry)):
                _inside(osp.join(folder, entry), root)


@contextlib.contextmanager
def _no_hub_telemetry() -> Iterator[None]:
    """``huggingface_hub`` calls that send no telemetry; the process's setting is restored after.

    With telemetry on, every call (a cached file's too) builds a user agent that fetches the
    library's agent registry from its default endpoint, another host than the source's.
    """
    from huggingface_hub import constants

    before = constants.HF_HUB_DISABLE_TELEMETRY
    constants.HF_HUB_DISABLE_TELEMETRY = True
    try:
        yield
    finally:
        constants.HF_HUB_DISABLE_TELEMETRY = before


def _hub_not_found(name: str, source: str, err: OSError) -> SourceNotFoundError | None:
    """A Hub answer that the repository, commit or file does not exist, named as such; else None."""
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError,
                                        LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    if isinstance(err, LocalEntryNotFoundError):  # wraps what the Hub answered, if it answered
        err = err.__cause__
    match = HF_SOURCE.fullmatch(source)
    fix = "fix the entry's urls in the index"
    if isinstance(err, GatedRepoError):
        return _not_found(name, source, f'the Hub repository {match["repo"]} is gated',
                          'accept its terms on the Hub, then log in (hf auth login, or HF_TOKEN)')
    if isinstance(err, RepositoryNotFoundError):
        return _not_found(name, source, f'the Hub has no repository {match["repo"]}, or it is '
                          'private (repository not found)', f'{fix}, or log in (hf auth login, '
                          'or HF_TOKEN) if it is private')
    if isinstance(err, RevisionNotFoundError):
        return _not_found(name, source, f'{match["repo"]} has no commit {match["revision"]} '
                          '(revision not found)', fix)
    if isinstance(err, EntryNotFoundError):
        return _not_found(name, source, f'{match["repo"]} has no file {match["file"]} at commit '
                          f'{match["revision"]} (entry not found)', fix)
    response = getattr(err, 'response', None) if isinstance(err, HfHubHTTPError) else None
    if response is not None and response.status_code in (404, 410):
        return _not_found(name, source, f'HTTP {response.status_code}: not found on the Hub', fix)
    return None


def _fetch_hub(name: str, source: str, folder: str, limit: int | None, progress: bool,
               timeout: float) -> str:
    """A Hub file downloaded (cached, resumed) by ``huggingface_hub``; the path of its blob."""
    from huggingface_hub import hf_hub_download

    match = HF_SOURCE.fullmatch(source)
    hub_cache = _inside(osp.join(folder, HUB_CACHE), folder)
    # huggingface_hub writes, moves and deletes through the paths of its cache.
    _refuse_links_out(hub_cache)
    # HF_ENDPOINT read now, not when huggingface_hub was imported.
    kwargs = dict(repo_id=match['repo'], filename=match['file'], revision=match['revision'],
                  cache_dir=hub_cache, endpoint=os.environ.get('HF_ENDPOINT') or None,
                  etag_timeout=timeout)
    try:
        with _no_hub_telemetry():
            planned = hf_hub_download(**kwargs, dry_run=True)
            if limit is not None and planned.file_size is not None and planned.file_size > limit:
                raise _oversize_error(name, source, limit, planned.file_size, announced=True)
            path = hf_hub_download(**kwargs,
                                   tqdm_class=_capped_progress(name, source, limit, progress))
    except OversizeError:
        for partial_folder, _, files in os.walk(hub_cache):
            for file in files:
                if file.endswith('.incomplete'):
                    os.unlink(osp.join(partial_folder, file))  # a link itself, never its target
        raise
    except OSError as err:
        not_found = _hub_not_found(name, source, err)
        if not_found is None:
            raise
        raise not_found from None
    blob = osp.realpath(_inside(path, hub_cache))
    if osp.islink(path):
        os.unlink(path)  # the blob is moved into the zoo's folder or deleted: no dangling link
    if limit is not None and osp.getsize(blob) > limit:
        received = osp.getsize(blob)
        os.unlink(blob)
        raise _oversize_error(name, source, limit, received, announced=True)
    return blob


def download(name: str, dir: str | None = None, progress: bool = True, retries: int = 3,
             timeout: float = 60.0, trust: bool = False) -> str:
    """The local path of a model's file, downloaded and verified if not already cached.

    Each source is tried in turn with ``retries`` attempts; an interrupted download resumes from
    its partial file. A file that fails verification (see :func:`verification`) is deleted, never
    used. ``trust=True`` allows an entry whose authors publish no checksum. A link in the cache
    leading out of it is refused: nothing outside the cache is deleted, moved or written.
    """
    entry = info(name)
    folder = dir or cache_dir()
    os.makedirs(folder, exist_ok=True)
    # The file, its partial download and its record: plain names (check_entry), no links out.
    target = _inside(osp.join(folder, entry['file']), folder)
    record_path = _inside(target + RECORD_SUFFIX, folder)
    part = _inside(target + '.part', folder)
    record = None if entry.get('sha256') else _read_record(record_path)
    unverifiable = not any(entry.get(f) for f in CHECKSUM_FIELDS) and record is None
    if unverifiable and not trust:
        raise UnverifiedError(
            f'{name}: its authors publish no checksum for {entry["file"]}, so it cannot be '
            f'verified; if you trust {", ".join(entry.get("urls") or ["its source"])}, download it '
            f'with: ifnd-zoo download {name} --trust-remote (trust=True in Python); its SHA-256 is '
            'then recorded and every later download must match it')
    if osp.isfile(target):
        try:
            actual = _verify(entry, target, record, record_path, f'the cached {target}')
        except ChecksumError as err:
            print(f'{err}; downloading it again', file=sys.stderr)
            os.unlink(target)  # a corrupt cached copy is replaced, not trusted
        else:
            if not entry.get('sha256') and record is None:
                _write_record(entry, record_path, actual, target, target)
            return target
    sources = _sources(entry)
    if not sources:
        raise RuntimeError(f'{name} has no download URL; set IFND_ZOO_URL to a mirror (URL or '
                           f'directory) holding {entry["file"]}, or rebuild it with: '
                           f'{entry.get("reproduce", "see model_zoo/README.md")}')
    limit = entry['size'] if entry.get('size') is not None else entry.get('max_size')
    errors = []
    for source in sources:
        for attempt in range(1, retries + 1):
            try:
                if source.startswith('hf://'):
                    fetched = _fetch_hub(name, source, folder, limit, progress, timeout)
                else:
                    _fetch(name, source, part, entry.get('size'), limit, progress, timeout)
                    fetched = part
            except PermanentError as err:
                errors.append(str(err))
                break  # the same answer again on retry: the next source
            except (OSError, http.client.HTTPException) as err:
                errors.append(f'{source} (attempt {attempt}): {err}')
                time.sleep(min(0.5 * attempt, 2.0))
                continue
            try:
                actual = _verify(entry, fetched, record, record_path, source)
            except ChecksumError as err:
                os.unlink(fetched)
                errors.append(f'{err}; the file was deleted')
                print(f'checksum mismatch for {source}: deleted the download', file=sys.stderr)
                break  # the next mirror, since this one serves a different file
            os.replace(fetched, target)
            if not entry.get('sha256') and record is None:
                _write_record(entry, record_path, actual, target, source)
            return target
    if osp.exists(part):
        os.unlink(part)
    raise RuntimeError(f'could not download {name}:\n  ' + '\n  '.join(errors))


def load_checkpoint(name: str, **download_kwargs) -> dict:
    """A published checkpoint, downloaded if needed and loaded with ``weights_only=True``."""
    from ifnd.fileio import read_checkpoint
    return read_checkpoint(download(name, **download_kwargs))


def get_model(name: str, pretrained: bool = True, algorithm: bool = False,
              **download_kwargs) -> torch.nn.Module:
    """A published model: its backbone as an ``Encoder`` (default) or the whole algorithm."""
    from mmengine.config import Config

    from ifnd.fileio import check_state_fits, read_checkpoint
    from ifnd.models.architecture import checkpoint_architecture
    from ifnd.models.encoder import Encoder, load_backbone_weights, load_encoder
    from ifnd.registry import MODELS

    entry = info(name)
    if pretrained:
        path = download(name, **download_kwargs)
        checkpoint = read_checkpoint(path)
        # The architecture alone, allow-listed: the file's config never compiles or downloads.
        model_cfg = checkpoint_architecture(checkpoint, path)
        if model_cfg is None or 'backbone' not in model_cfg:
            if algorithm:
                raise ValueError(f'{path} carries no usable model config, so algorithm=True cannot '
                                 f'rebuild {name}; load its backbone alone (algorithm=False)')
            return load_encoder(path).eval()  # the backbone read from the weights
    else:
        model_cfg = Config.fromfile(_repo_config(entry)).model
    if algorithm:
        model = MODELS.build(model_cfg)
        if pretrained:
            check_state_fits(model, checkpoint['state_dict'], path)  # shapes, dtypes, finite values
            model.load_state_dict(checkpoint['state_dict'], strict=True)
        return model.eval()
    encoder = Encoder(model_cfg['backbone'], model_cfg.get('data_preprocessor'))
    if pretrained:
        load_backbone_weights(encoder.backbone, path, checkpoint)
    return encoder.eval()


def _repo_config(entry: dict) -> str:
    """The repository config an index entry names, refused unless it lies under ``configs/``."""
    config = entry.get('config')
    configs = osp.join(REPO_ROOT, 'configs')
    path = osp.realpath(osp.join(REPO_ROOT, config)) if isinstance(config, str) and config else ''
    if not path.startswith(osp.realpath(configs) + os.sep) or not osp.isfile(path):
        raise ValueError(f'model zoo entry {entry.get("name")!r}: field config {config!r} is not a '
                         'config file under configs/; fix the index, or use pretrained=True')
    return path


README_PATH = osp.join(REPO_ROOT, 'model_zoo', 'README.md')
README_FIELDS = ('algorithm', 'backbone', 'dataset', 'epochs', 'size', 'sha256', 'config', 'reproduce')
# A published baseline (an entry citing its authors' file in ``published_in``) needs these.
BASELINE_FIELDS = ('algorithm', 'backbone', 'dataset', 'epochs', 'published_in', 'metrics')


def is_baseline(entry: dict) -> bool:
    """Whether an entry is another method's published checkpoint (not trained here)."""
    return 'published_in' in entry


def _cite(published_in: dict) -> str:
    return (f'{published_in.get("repository")}, `{published_in.get("path")}` at '
            f'{str(published_in.get("commit"))[:12]}')


def _checksum_words(entry: dict) -> str:
    if entry.get('sha256'):
        return f'SHA-256 `{entry["sha256"][:16]}…`'
    for field, words in (('sha256_prefix', 'SHA-256 prefix'), ('md5_prefix', 'MD5 prefix')):
        if entry.get(field):
            return f'{words} `{entry[field]}`, then trust on first use'
    return 'none published: `--trust-remote`'


def render_readme(index_path: str | None = None) -> str:
    """``model_zoo/README.md``, generated from the index."""
    path = index_path or os.environ.get('IFND_ZOO_INDEX', INDEX_PATH)
    entries = [info for _, info in sorted(_index(path).items())]
    for entry in entries:
        for field in BASELINE_FIELDS if is_baseline(entry) else README_FIELDS:
            if field not in entry:
                raise _entry_error(path, entry, field, 'is missing (the model table needs it)')
    ours = [e for e in entries if not is_baseline(e)]
    baselines = [e for e in entries if is_baseline(e)]
    lines = ['# Model zoo', '',
             '<!-- Generated from models.yaml by `python tools/zoo.py readme`; do not edit. -->', '',
             'Load a model in Python with `ifnd.zoo.get_model(NAME)` (the backbone as an `Encoder`; '
             '`algorithm=True` for the whole model of ours), download one with '
             '`ifnd-zoo download NAME`, see how it is verified with `ifnd-zoo info NAME`. '
             '`IFND_ZOO_URL` points at a mirror (URL or folder) holding the files.', '',
             '## Ours', '',
             '| name | algorithm | backbone | data set | epochs | metrics | file | size | SHA-256 |',
             '|---|---|---|---|---|---|---|---|---|']
    for e in ours:
        metrics = '<br>'.join(f'{m["name"]}: {m["value"]}' for m in e.get('metrics', []))
        lines.append(f'| {e["name"]} | {e["algorithm"]} | {e["backbone"]} | {e["dataset"]} | '
                     f'{e["epochs"]} | {metrics} | {e["file"]} | {e["size"] / 2**20:.1f} MiB | '
                     f'`{e["sha256"][:16]}…` |')
    lines += ['', '## Published baselines', '',
              'Other methods\' checkpoints from their authors\' own links, read with the layout '
              'readers of `ifnd/models/encoder.py`. Accuracies are the authors\' reports, not '
              'measured here.', '',
              '| name | method | backbone | data set | epochs | reported | checksum | source |',
              '|---|---|---|---|---|---|---|---|']
    for e in baselines:
        reported = '<br>'.join(f'{m["name"]}: {m["value"]}' for m in e['metrics'])
        epochs = e['epochs'] if e['epochs'] is not None else 'not stated'
        lines.append(f'| {e["name"]} | {e["algorithm"]} | {e["backbone"]} | {e["dataset"]} | '
                     f'{epochs} | {reported} | {_checksum_words(e)} | {_cite(e["published_in"])} |')
    lines.append('')
    for e in ours + baselines:
        lines += [f'## {e["name"]}', '', e.get('description', '').strip(), '']
        if is_baseline(e):
            lines.append(f'- published in: {_cite(e["published_in"])}')
        else:
            lines += [f'- config: `{e["config"]}`', f'- reproduce: `{e["reproduce"]}`']
        lines += ['- download: ' + (', '.join(e.get('urls') or []) or
                                     'no public URL yet: serve the file from a mirror '
                                     '(`IFND_ZOO_URL`)'),
                  f'- verification: {verification(e)}']
        lines += [f'- {m["name"]} = {m["value"]}, ' + (f'measured with `{m["command"]}`'
                                                        if 'command' in m else
                                                        f'reported in {m.get("reported_in", "?")}')
                  for m in e.get('metrics', [])]
        lines.append('')
    return '\n'.join(lines)


def _describe(name: str, folder: str | None = None) -> str:
    """``ifnd-zoo info``: the entry, then how it is verified, where it is cached and how to load it."""
    entry = info(name)
    target = osp.join(folder or cache_dir(), entry['file'])
    record = _read_record(target + RECORD_SUFFIX) if not entry.get('sha256') else None
    trust = not any(entry.get(f) for f in CHECKSUM_FIELDS) and record is None
    if osp.isfile(target):
        cached = target + (f' (SHA-256 {record["sha256"]} recorded at its first download, '
                           f'{record.get("date", "date unknown")})' if record else '')
    else:
        cached = 'not downloaded yet'
    lines = [yaml.safe_dump(entry, sort_keys=False, allow_unicode=True, width=100).rstrip(), '',
             f'verification: {verification(entry)}',
             'size: ' + (f'{entry["size"]} bytes' if entry.get('size') is not None else
                         f'not published; a body over {entry["max_size"]} bytes (max_size) is cut off'
                         if entry.get('max_size') is not None else 'unknown'),
             f'cached: {cached}',
             f'download: ifnd-zoo download {name}' + (' --trust-remote' if trust else ''),
             f"load: ifnd.zoo.get_model('{name}'" + (', trust=True' if trust else '') +
             ')  (an Encoder); the downloaded file works with every tool that takes a checkpoint']
    return '\n'.join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """``ifnd-zoo list | info NAME | download NAME [--dir DIR] [--trust-remote] | readme [--check]``."""
    parser = argparse.ArgumentParser(prog='ifnd-zoo', description='The ifnd model zoo.')
    sub = parser.add_subparsers(dest='command', required=True)
    sub.add_parser('list', help='the models: ours and published baselines')
    show = sub.add_parser('info', help="a model's recipe, metrics, sources and verification")
    show.add_argument('name')
    get = sub.add_parser('download', help="download and verify a model's checkpoint")
    get.add_argument('name')
    get.add_argument('--dir', help=f'target folder (default: {cache_dir()})')
    get.add_argument('--trust-remote', action='store_true',
                     help='allow a file whose authors publish no checksum (its SHA-256 is recorded '
                          'at the first download and required of every later one)')
    readme = sub.add_parser('readme', help='regenerate model_zoo/README.md from the index')
    readme.add_argument('--check', action='store_true', help='fail if the README is out of date')
    args = parser.parse_args(argv)
    try:
        if args.command == 'list':
            index = _index()
            for title, group in (('ours', [e for e in index.values() if not is_baseline(e)]),
                                 ('published baselines (authors\' reported accuracy)',
                                  [e for e in index.values() if is_baseline(e)])):
                if not group:
                    continue
                print(f'{title}:')
                print(f'  {"name":32s} {"method":8s} {"backbone":23s} {"data set":12s} '
                      f'{"epochs":>6s}  checksum')
                for e in sorted(group, key=lambda e: e['name']):
                    checksum = ('sha256' if e.get('sha256') else 'sha256 prefix' if
                                e.get('sha256_prefix') else 'md5 prefix' if e.get('md5_prefix')
                                else 'none: --trust-remote')
                    epochs = e.get('epochs')
                    print(f'  {e["name"]:32s} {str(e.get("algorithm", "?")):8s} '
                          f'{str(e.get("backbone", "?")):23s} {str(e.get("dataset", "?")):12s} '
                          f'{"?" if epochs is None else epochs:>6}  {checksum}')
            print('details, sources and verification: ifnd-zoo info NAME')
        elif args.command == 'info':
            print(_describe(args.name))
        elif args.command == 'download':
            print(download(args.name, dir=args.dir, trust=args.trust_remote))
        else:
            text = render_readme()
            if args.check:
                with open(README_PATH, encoding='utf-8') as f:
                    if f.read() != text:
                        raise SystemExit('model_zoo/README.md is out of date: run '
                                         'python tools/zoo.py readme')
            else:
                with open(README_PATH, 'w', encoding='utf-8') as f:
                    f.write(text)
                print(f'wrote {README_PATH}')
    except (KeyError, RuntimeError, OSError, ValueError) as err:
        raise SystemExit(str(err).strip('"\''))


if __name__ == '__main__':
    main()
