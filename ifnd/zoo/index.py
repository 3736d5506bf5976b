"""The zoo's index, ``model_zoo/models.yaml``: read, every entry checked, models looked up."""
import math
import os
import os.path as osp
import re
import urllib.parse

import yaml

from ifnd.settings import MAX_SIZE as MAX_WIDTH

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
INDEX_PATH = osp.join(REPO_ROOT, 'model_zoo', 'models.yaml')

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


def entry_error(path: str, entry, field: str, problem: str) -> ZooIndexError:
    """The error of one entry's field, naming the index file and the entry."""
    name = entry.get('name') if isinstance(entry, dict) else None
    which = f'entry {name!r}' if isinstance(name, str) else 'an entry'
    return ZooIndexError(f'model zoo index {path}: {which}: field {field!r} {problem}; fix the index')


def plain_name(value: object) -> bool:
    """Whether a value is a plain name, as an entry's ``name`` and ``file`` must be."""
    return isinstance(value, str) and bool(FILE_NAME.fullmatch(value)) and value not in ('.', '..')


def source_problem(url: str) -> str | None:
    """What makes a download source unusable in an index entry, or None when it is usable."""
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        return f'{url!r} holds a control character (a newline, tab or NUL), which no URL has'
    if url.startswith('hf://'):
        match = HF_SOURCE.fullmatch(url)
        if not match or not plain_name(match['file']):
            return (f'{url!r} is not hf://ORG/REPO/FILE@COMMIT with a plain file name and a pinned '
                    '40-hex-digit commit')
    elif urllib.parse.urlsplit(url).scheme not in ('http', 'https', 'file'):
        return f'{url!r} is not an http(s)://, file:// or hf:// URL'
    elif '@' in urllib.parse.urlsplit(url).netloc:
        return (f'{urllib.parse.urlsplit(url).scheme}://...@{urllib.parse.urlsplit(url).hostname} carries '
                'credentials (user:password@), which an index shared with others must not hold')
    return None


def metric_problem(value: object) -> str | None:
    """What makes a metric's value unusable in an index entry (a percentage), or None when it is usable."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return f'{value!r} is not a number'
    if not (math.isfinite(value) and 0 <= value <= 100):
        return f'{value!r} is not a percentage (a finite number from 0 to 100)'
    return None


def check_entry(entry, path: str = 'the index') -> dict:
    """An index entry, checked: names, plain file names, checksums, sizes and sources."""
    if not isinstance(entry, dict):
        raise ZooIndexError(f'model zoo index {path}: field models holds a {type(entry).__name__} '
                          '(expected one mapping per model, with name, file, sha256, ...); fix the index')
    for field in REQUIRED_FIELDS:
        if not isinstance(entry.get(field), str) or not entry[field]:
            raise entry_error(path, entry, field, 'is missing' if field not in entry
                              else f'must be a non-empty string, not {entry[field]!r}')
    if not plain_name(entry['name']):
        raise entry_error(path, entry, 'name', f'{entry["name"]!r} is not a plain name '
                          f'({PLAIN_NAME_WORDS}), as commands and file names need')
    file = entry['file']
    if not plain_name(file):
        raise entry_error(path, entry, 'file', f'{file!r} is not a plain file name '
                          f'({PLAIN_NAME_WORDS}), so it could point outside the download folder')
    checks = [field for field in CHECKSUM_FIELDS if field in entry]
    if not checks and entry.get('checksum') != 'none':
        raise entry_error(path, entry, 'sha256', 'is missing (give sha256, or sha256_prefix or '
                          'md5_prefix as the authors publish it, or checksum: none when they '
                          'publish none)')
    for field in checks:
        _, fewest, most = CHECKSUM_FIELDS[field]
        value = entry[field]
        if not isinstance(value, str) or not HEX.fullmatch(value) or not fewest <= len(value) <= most:
            digits = f'{fewest}' if fewest == most else f'{fewest} to {most}'
            raise entry_error(path, entry, field, f'must be {digits} lower-case hex digits')
    for field in ('size', 'max_size'):
        size = entry.get(field)
        if size is not None and (not isinstance(size, int) or isinstance(size, bool)
                                 or not 0 <= size <= MAX_SIZE):
            raise entry_error(path, entry, field, f'must be a byte count from 0 to {MAX_SIZE} '
                              f'(1 TiB), not {size!r}')
    urls = entry.get('urls')
    if urls is not None and (not isinstance(urls, list) or not all(isinstance(u, str) for u in urls)):
        raise entry_error(path, entry, 'urls', 'must be a list of URLs')
    for url in urls or []:
        problem = source_problem(url)
        if problem:
            raise entry_error(path, entry, 'urls', problem)
    metrics = entry.get('metrics')
    if metrics is not None and (not isinstance(metrics, list) or not all(
            isinstance(m, dict) and isinstance(m.get('name'), str) for m in metrics)):
        raise entry_error(path, entry, 'metrics', 'must be a list of mappings with a name and a value')
    for metric in metrics or []:
        problem = metric_problem(metric.get('value'))
        if problem:
            raise entry_error(path, entry, 'metrics', f'{metric["name"]}: {problem}')
    heads = entry.get('num_heads')
    if heads is not None and (not isinstance(heads, int) or isinstance(heads, bool)
                              or not 1 <= heads <= MAX_WIDTH):
        raise entry_error(path, entry, 'num_heads', f'must be a whole number from 1 to {MAX_WIDTH} '
                          f'(the attention heads of a ViT, which its weights cannot show), not {heads!r}')
    if urls and entry.get('size') is None and entry.get('max_size') is None:
        raise entry_error(path, entry, 'size', 'is missing: a download needs the byte count '
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
            raise entry_error(path, entry, 'name', 'is used by two entries')
        index[entry['name']] = entry
    return index


def read_index(path: str | None = None) -> dict[str, dict]:
    """The checked index at ``path``, ``$IFND_ZOO_INDEX`` or the repository's."""
    path = path or os.environ.get('IFND_ZOO_INDEX', INDEX_PATH)
    return check_index(read_index_file(path), path)


def list_models() -> list[str]:
    """Names of the published models."""
    return sorted(read_index())


def info(name: str) -> dict:
    """The index entry of a model: recipe, metrics with their commands, file, size, SHA-256, URLs."""
    index = read_index()
    if name not in index:
        known = ', '.join(sorted(index)) or 'none'
        raise KeyError(f'unknown model {name!r}; known models: {known}')
    return index[name]
