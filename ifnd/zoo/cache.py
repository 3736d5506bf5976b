"""The zoo's cache folder: where files go, links out of it refused, checksums, first-use records."""
import datetime
import hashlib
import json
import os
import os.path as osp

from ifnd.fileio import open_plain

from .errors import CacheLinkError, ChecksumError
from .index import CHECKSUM_FIELDS

CHUNK = 1 << 20
# Next to a file verified by a published prefix or trusted: its full SHA-256 at the first download.
RECORD_SUFFIX = '.verified.json'


def cache_dir() -> str:
    """Where downloaded checkpoints are kept: ``$IFND_HOME/checkpoints``."""
    home = os.environ.get('IFND_HOME', osp.join(osp.expanduser('~'), '.cache', 'ifnd'))
    return osp.join(home, 'checkpoints')


def sha256sum(path: str) -> str:
    """SHA-256 of a file, hex."""
    return _digest(path, 'sha256')


def _digest(path: str, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with open_plain(path, 'rb', 'cached file', own=True) as f:
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


def read_record(path: str) -> dict | None:
    """The SHA-256 recorded at a file's first download, if any."""
    if not osp.isfile(path):
        return None
    try:
        with open_plain(path, 'r', 'checksum record', own=True, encoding='utf-8') as f:
            record = json.load(f)
    except (OSError, ValueError) as err:
        raise ChecksumError(f'{path} is not readable JSON ({err}); delete it to verify the file '
                            'again from scratch') from None
    if not isinstance(record, dict) or not isinstance(record.get('sha256'), str):
        raise ChecksumError(f'{path} holds no sha256; delete it to verify the file again from scratch')
    return record


def verify(entry: dict, path: str, record: dict | None, record_path: str, source: str) -> str:
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


def write_record(entry: dict, record_path: str, sha256: str, path: str, source: str) -> None:
    from ifnd.fileio import write_json  # here: mmengine loads slowly, `list` needs none of it

    check = next((f'{f} {entry[f]}' for f in ('sha256_prefix', 'md5_prefix') if entry.get(f)),
                 'none published: downloaded with trust')
    record = {'name': entry['name'], 'file': entry['file'], 'sha256': sha256,
              'size': osp.getsize(path), 'source': source, 'published_check': check,
              'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}
    write_json(record, record_path, indent=1, newline=True)


def inside_cache(path: str, root: str) -> str:
    """``path``, refused when it is, or passes through, a link leading out of ``root``."""
    real, top = osp.realpath(path), osp.realpath(root)
    if not real.startswith(top.rstrip(os.sep) + os.sep):
        raise CacheLinkError(
            f'{path} is a link to {real}, outside the cache {top}: refused, nothing is deleted, '
            f'moved or written through it; remove the link (rm {path} removes the link, not '
            f'{real}) and download again')
    return path
