"""A model's file downloaded and verified, and loaded as a checkpoint, an encoder or a model."""
import http.client
import os
import os.path as osp
import sys
import time

import torch

from ifnd.fileio import check_plain_file

from .cache import RECORD_SUFFIX, cache_dir, inside_cache, read_record, verify, write_record
from .errors import ChecksumError, PermanentError, UnverifiedError
from .hub import fetch_hub
from .index import CHECKSUM_FIELDS, REPO_ROOT, info
from .sources import entry_sources, fetch_source


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
    target = inside_cache(osp.join(folder, entry['file']), folder)
    record_path = inside_cache(target + RECORD_SUFFIX, folder)
    part = inside_cache(target + '.part', folder)
    record = None if entry.get('sha256') else read_record(record_path)
    _check_trust(name, entry, record, trust)
    if osp.isfile(target) and _cached_copy_verifies(entry, target, record, record_path):
        return target
    sources = entry_sources(entry)
    if not sources:
        raise RuntimeError(f'{name} has no download URL; set IFND_ZOO_URL to a mirror (URL or '
                           f'directory) holding {entry["file"]}, or rebuild it with: '
                           f'{entry.get("reproduce", "see model_zoo/README.md")}')
    limit = entry['size'] if entry.get('size') is not None else entry.get('max_size')
    if osp.lexists(part):  # resumed in place: it must be the cache's own file, before any request
        check_plain_file(part, 'partial download', own=True, writing=True)
    errors = []
    for source in sources:
        for attempt in range(1, retries + 1):
            try:
                if source.startswith('hf://'):
                    fetched = fetch_hub(name, source, folder, limit, progress, timeout)
                else:
                    fetch_source(name, source, part, entry.get('size'), limit, progress, timeout)
                    fetched = part
            except PermanentError as err:
                errors.append(str(err))
                break  # the same answer again on retry: the next source
            except (OSError, http.client.HTTPException) as err:
                errors.append(f'{source} (attempt {attempt}): {err}')
                time.sleep(min(0.5 * attempt, 2.0))
                continue
            if _keep_verified(entry, fetched, target, record, record_path, source, errors):
                return target
            break  # the next mirror, since this one serves a different file
    if osp.exists(part):
        os.unlink(part)
    raise RuntimeError(f'could not download {name}:\n  ' + '\n  '.join(errors))


def _check_trust(name: str, entry: dict, record: dict | None, trust: bool) -> None:
    """Refuse an entry that nothing can verify unless the caller trusts its source."""
    unverifiable = not any(entry.get(f) for f in CHECKSUM_FIELDS) and record is None
    if unverifiable and not trust:
        raise UnverifiedError(
            f'{name}: its authors publish no checksum for {entry["file"]}, so it cannot be '
            f'verified; if you trust {", ".join(entry.get("urls") or ["its source"])}, download it '
            f'with: ifnd-zoo download {name} --trust-remote (trust=True in Python); its SHA-256 is '
            'then recorded and every later download must match it')


def _cached_copy_verifies(entry: dict, target: str, record: dict | None, record_path: str) -> bool:
    """Whether the cached file passes verification; a corrupt one is deleted."""
    try:
        actual = verify(entry, target, record, record_path, f'the cached {target}')
    except ChecksumError as err:
        print(f'{err}; downloading it again', file=sys.stderr)
        os.unlink(target)  # a corrupt cached copy is replaced, not trusted
        return False
    if not entry.get('sha256') and record is None:
        write_record(entry, record_path, actual, target, target)
    return True


def _keep_verified(entry: dict, fetched: str, target: str, record: dict | None, record_path: str,
                   source: str, errors: list[str]) -> bool:
    """Move a verified download to ``target``; delete one that fails, noting why in ``errors``."""
    try:
        actual = verify(entry, fetched, record, record_path, source)
    except ChecksumError as err:
        os.unlink(fetched)
        errors.append(f'{err}; the file was deleted')
        print(f'checksum mismatch for {source}: deleted the download', file=sys.stderr)
        return False
    os.replace(fetched, target)
    if not entry.get('sha256') and record is None:
        write_record(entry, record_path, actual, target, source)
    return True


ZOO_PREFIX = 'zoo:'


def checkpoint_path(reference: str, **download_kwargs) -> str:
    """The local file of a checkpoint reference: ``zoo:NAME`` downloaded and verified, else the path."""
    if isinstance(reference, str) and reference.startswith(ZOO_PREFIX):
        return download(reference[len(ZOO_PREFIX):], **download_kwargs)
    return reference


def load_checkpoint(name: str, **download_kwargs) -> dict:
    """A published checkpoint, downloaded if needed and loaded with ``weights_only=True``."""
    from ifnd.fileio import read_checkpoint
    return read_checkpoint(download(name, **download_kwargs))


def entry_num_heads(name: str) -> int | None:
    """The attention heads the index states for a ViT entry (its weights cannot show them), or None."""
    return info(name).get('num_heads')


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
            # The backbone read from the weights; a ViT's heads, which no shape shows, from the index.
            return load_encoder(path, num_heads=entry.get('num_heads')).eval()
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
