"""Fetching a Hugging Face Hub file, ``hf://ORG/REPO/FILE@COMMIT``, through ``huggingface_hub``."""
import contextlib
import os
import os.path as osp
import sys
from typing import Iterator

from tqdm import tqdm

from .cache import inside_cache
from .errors import OversizeError, SourceNotFoundError, not_found_error, oversize_error
from .index import HF_SOURCE

# huggingface_hub's own cache (blobs, resumable partial files), inside the zoo's folder.
HUB_CACHE = '.hub'


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
                raise oversize_error(name, source, limit, limit + 1)
            return super().update(n)

    return CappedProgress


def _refuse_links_out(root: str) -> None:
    """Refuse a folder holding a link that leads out of it, at any depth."""
    for folder, dirs, files in os.walk(root):  # a linked folder is listed, never entered
        for entry in dirs + files:
            if osp.islink(osp.join(folder, entry)):
                inside_cache(osp.join(folder, entry), root)


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
        return not_found_error(name, source, f'the Hub repository {match["repo"]} is gated',
                               'accept its terms on the Hub, then log in (hf auth login, or HF_TOKEN)')
    if isinstance(err, RepositoryNotFoundError):
        return not_found_error(name, source, f'the Hub has no repository {match["repo"]}, or it is '
                               'private (repository not found)', f'{fix}, or log in (hf auth login, '
                               'or HF_TOKEN) if it is private')
    if isinstance(err, RevisionNotFoundError):
        return not_found_error(name, source, f'{match["repo"]} has no commit {match["revision"]} '
                               '(revision not found)', fix)
    if isinstance(err, EntryNotFoundError):
        return not_found_error(name, source, f'{match["repo"]} has no file {match["file"]} at '
                               f'commit {match["revision"]} (entry not found)', fix)
    response = getattr(err, 'response', None) if isinstance(err, HfHubHTTPError) else None
    if response is not None and response.status_code in (404, 410):
        return not_found_error(name, source, f'HTTP {response.status_code}: not found on the Hub',
                               fix)
    return None


def fetch_hub(name: str, source: str, folder: str, limit: int | None, progress: bool,
               timeout: float) -> str:
    """A Hub file downloaded (cached, resumed) by ``huggingface_hub``; the path of its blob."""
    from huggingface_hub import hf_hub_download

    match = HF_SOURCE.fullmatch(source)
    hub_cache = inside_cache(osp.join(folder, HUB_CACHE), folder)
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
                raise oversize_error(name, source, limit, planned.file_size, announced=True)
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
    blob = osp.realpath(inside_cache(path, hub_cache))
    if osp.islink(path):
        os.unlink(path)  # the blob is moved into the zoo's folder or deleted: no dangling link
    if limit is not None and osp.getsize(blob) > limit:
        received = osp.getsize(blob)
        os.unlink(blob)
        raise oversize_error(name, source, limit, received, announced=True)
    return blob
