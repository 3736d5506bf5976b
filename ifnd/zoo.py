"""The model zoo: list, describe, download (verified, resumable) and load published checkpoints.

The index is ``model_zoo/models.yaml``. Downloads go to ``$IFND_HOME/checkpoints`` (default
``~/.cache/ifnd``). ``IFND_ZOO_URL`` names a mirror tried before an entry's own URLs: an
``http(s)://`` or ``file://`` base URL, or a plain directory, holding the files by name.
"""
import argparse
import hashlib
import http.client
import os
import os.path as osp
import re
import shutil
import sys
import time
import urllib.parse
import urllib.request
from typing import Sequence

import torch
import yaml
from tqdm import tqdm

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
INDEX_PATH = osp.join(REPO_ROOT, 'model_zoo', 'models.yaml')
CHUNK = 1 << 20


class ChecksumError(RuntimeError):
    """A downloaded file whose SHA-256 differs from the index."""


class WebPageError(OSError):
    """A URL that serves a web page (HTML) instead of the checkpoint; retrying does not help."""


def _looks_like_html(head: bytes) -> bool:
    start = head.lstrip()[:256].lower()
    return start.startswith((b'<!doctype html', b'<html', b'<head', b'<body', b'<?xml'))


def _web_page_error(source: str, why: str) -> WebPageError:
    return WebPageError(f'{source} serves a web page ({why}), not the checkpoint: a download page, '
                        'login or error page; use the direct link to the file')


# Fields every index entry needs (the others are descriptive and may be missing).
REQUIRED_FIELDS = ('name', 'file', 'sha256')
# An entry's ``file`` is a plain name inside the cache: no folders, no '..', nothing unusual.
FILE_NAME = re.compile(r'[A-Za-z0-9][A-Za-z0-9._+-]{0,254}')
SHA256 = re.compile(r'[0-9a-f]{64}')


class ZooIndexError(ValueError):
    """A model zoo index that is not valid YAML, not a mapping, or has a malformed entry."""


def _entry_error(path: str, entry, field: str, problem: str) -> ZooIndexError:
    name = entry.get('name') if isinstance(entry, dict) else None
    which = f'entry {name!r}' if isinstance(name, str) else 'an entry'
    return ZooIndexError(f'model zoo index {path}: {which}: field {field!r} {problem}; fix the index')


def check_entry(entry, path: str = 'the index') -> dict:
    """An index entry, checked: required fields present, ``file`` a plain file name, a SHA-256."""
    if not isinstance(entry, dict):
        raise ZooIndexError(f'model zoo index {path}: field models holds a {type(entry).__name__} '
                          '(expected one mapping per model, with name, file, sha256, ...); fix the index')
    for field in REQUIRED_FIELDS:
        if not isinstance(entry.get(field), str) or not entry[field]:
            raise _entry_error(path, entry, field, 'is missing' if field not in entry
                               else f'must be a non-empty string, not {entry[field]!r}')
    file = entry['file']
    if not FILE_NAME.fullmatch(file) or file in ('.', '..'):
        raise _entry_error(path, entry, 'file', f'{file!r} is not a plain file name (letters, '
                           "digits, '.', '_', '+', '-'; no folders, no absolute path), so it could "
                           'point outside the download folder')
    if not SHA256.fullmatch(entry['sha256']):
        raise _entry_error(path, entry, 'sha256', 'must be 64 lower-case hex digits')
    size = entry.get('size')
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
        raise _entry_error(path, entry, 'size', f'must be a byte count, not {size!r}')
    urls = entry.get('urls')
    if urls is not None and (not isinstance(urls, list) or not all(isinstance(u, str) for u in urls)):
        raise _entry_error(path, entry, 'urls', 'must be a list of URLs')
    return entry


def _index(path: str | None = None) -> dict[str, dict]:
    path = path or os.environ.get('IFND_ZOO_INDEX', INDEX_PATH)
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
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(CHUNK), b''):
            digest.update(block)
    return digest.hexdigest()


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


def _fetch(source: str, part: str, size: int | None, progress: bool, timeout: float) -> None:
    """Copy one source into ``part``, continuing a partial file over HTTP when the server allows."""
    if '://' not in source:
        if not osp.isfile(source):
            raise FileNotFoundError(f'mirror file not found: {source}')
        shutil.copyfile(source, part)
        return
    done = osp.getsize(part) if osp.exists(part) else 0
    request = urllib.request.Request(source, headers={'Range': f'bytes={done}-'} if done else {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        content_type = (response.headers.get('Content-Type') or '').split(';')[0].strip().lower()
        if content_type in ('text/html', 'application/xhtml+xml'):
            raise _web_page_error(source, f'Content-Type {content_type}')
        resumed = done and getattr(response, 'status', 200) == 206
        mode = 'ab' if resumed else 'wb'
        start = done if resumed else 0
        with open(part, mode) as f, tqdm(total=size, initial=start, unit='B', unit_scale=True,
                                         desc=osp.basename(part)[:-5], disable=not progress,
                                         file=sys.stderr) as bar:
            for block in iter(lambda: response.read(CHUNK), b''):
                f.write(block)
                bar.update(len(block))
    received = osp.getsize(part)
    with open(part, 'rb') as f:
        if _looks_like_html(f.read(1024)):
            os.unlink(part)  # a page, not the start of the file: never resume from it
            raise _web_page_error(source, f'{received} bytes of HTML')
    if size is not None and received < size:
        # A dropped connection can end the body early without an error: keep the partial file.
        raise ConnectionError(f'connection closed after {received} of {size} bytes')


def download(name: str, dir: str | None = None, progress: bool = True, retries: int = 3,
             timeout: float = 60.0) -> str:
    """The local path of a model's file, downloaded and verified if not already cached.

    Each source is tried in turn with ``retries`` attempts; an interrupted HTTP download resumes
    from its partial file. A file whose SHA-256 differs from the index is deleted, never used.
    """
    entry = info(name)
    folder = dir or cache_dir()
    os.makedirs(folder, exist_ok=True)
    target = osp.join(folder, entry['file'])
    if osp.dirname(osp.abspath(target)) != osp.abspath(folder):  # check_entry makes this impossible
        raise ValueError(f'model zoo entry {name!r}: field file {entry["file"]!r} leaves {folder}')
    expected = entry['sha256']
    if osp.isfile(target):
        if sha256sum(target) == expected:
            return target
        os.unlink(target)  # a corrupt cached copy is replaced, not trusted
    sources = _sources(entry)
    if not sources:
        raise RuntimeError(f'{name} has no download URL; set IFND_ZOO_URL to a mirror (URL or '
                           f'directory) holding {entry["file"]}, or rebuild it with: '
                           f'{entry.get("reproduce", "see model_zoo/README.md")}')
    part = target + '.part'
    errors = []
    for source in sources:
        for attempt in range(1, retries + 1):
            try:
                _fetch(source, part, entry.get('size'), progress, timeout)
            except WebPageError as err:
                errors.append(str(err))
                break  # the same page again on retry: the next source
            except (OSError, http.client.HTTPException) as err:
                errors.append(f'{source} (attempt {attempt}): {err}')
                time.sleep(min(0.5 * attempt, 2.0))
                continue
            actual = sha256sum(part)
            if actual != expected:
                os.unlink(part)
                errors.append(f'{source}: SHA-256 {actual} differs from the index ({expected}); '
                              'the file was deleted')
                print(f'checksum mismatch for {source}: deleted the download', file=sys.stderr)
                break  # the next mirror, since this one serves a different file
            os.replace(part, target)
            return target
    if osp.exists(part):
        os.unlink(part)
    raise RuntimeError(f'could not download {name}:\n  ' + '\n  '.join(errors))


def load_checkpoint(name: str, **download_kwargs) -> dict:
    """A published checkpoint, downloaded if needed and loaded with ``weights_only=True``."""
    return torch.load(download(name, **download_kwargs), map_location='cpu', weights_only=True)


def get_model(name: str, pretrained: bool = True, algorithm: bool = False,
              **download_kwargs) -> torch.nn.Module:
    """A published model: its backbone as an ``Encoder`` (default) or the whole algorithm."""
    from mmengine.config import Config

    from ifnd.engine.checkpoint import checkpoint_config
    from ifnd.models.encoder import Encoder, load_backbone_weights, load_encoder
    from ifnd.registry import MODELS

    entry = info(name)
    if pretrained:
        path = download(name, **download_kwargs)
        checkpoint = torch.load(path, map_location='cpu', weights_only=True)
        cfg = checkpoint_config(checkpoint, path)  # read as data, never executed
        model_cfg = cfg.get('model') if cfg is not None else None
        if model_cfg is None:
            if algorithm:
                raise ValueError(f'{path} carries no usable model config, so algorithm=True cannot '
                                 f'rebuild {name}; load its backbone alone (algorithm=False)')
            return load_encoder(path).eval()  # the backbone read from the weights
    else:
        model_cfg = Config.fromfile(_repo_config(entry)).model
    if algorithm:
        model = MODELS.build(model_cfg)
        if pretrained:
            model.load_state_dict(checkpoint['state_dict'], strict=True)
        return model.eval()
    encoder = Encoder(model_cfg.backbone, model_cfg.get('data_preprocessor'))
    if pretrained:
        load_backbone_weights(encoder.backbone, path)
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
README_FIELDS = ('algorithm', 'backbone', 'dataset', 'epochs', 'size', 'config', 'reproduce')


def render_readme(index_path: str | None = None) -> str:
    """``model_zoo/README.md``, generated from the index."""
    path = index_path or os.environ.get('IFND_ZOO_INDEX', INDEX_PATH)
    entries = [info for _, info in sorted(_index(path).items())]
    for entry in entries:
        for field in README_FIELDS:
            if field not in entry:
                raise _entry_error(path, entry, field, 'is missing (the model table needs it)')
    lines = ['# Model zoo', '',
             '<!-- Generated from models.yaml by `python tools/zoo.py readme`; do not edit. -->', '',
             'Load a model in Python with `ifnd.zoo.get_model(NAME)` (the backbone as an `Encoder`; '
             '`algorithm=True` for the whole model), download one with `ifnd-zoo download NAME`. '
             '`IFND_ZOO_URL` points at a mirror (URL or folder) holding the files.', '',
             '| name | algorithm | backbone | data set | epochs | metrics | file | size | SHA-256 |',
             '|---|---|---|---|---|---|---|---|---|']
    for e in entries:
        metrics = '<br>'.join(f'{m["name"]}: {m["value"]}' for m in e.get('metrics', []))
        lines.append(f'| {e["name"]} | {e["algorithm"]} | {e["backbone"]} | {e["dataset"]} | '
                     f'{e["epochs"]} | {metrics} | {e["file"]} | {e["size"] / 2**20:.1f} MiB | '
                     f'`{e["sha256"][:16]}…` |')
    lines.append('')
    for e in entries:
        lines += [f'## {e["name"]}', '', e.get('description', '').strip(), '',
                  f'- config: `{e["config"]}`',
                  f'- reproduce: `{e["reproduce"]}`',
                  '- download: ' + (', '.join(e.get('urls') or []) or
                                     'no public URL yet: serve the file from a mirror '
                                     '(`IFND_ZOO_URL`)')]
        lines += [f'- {m["name"]} = {m["value"]}, measured with `{m["command"]}`'
                  for m in e.get('metrics', [])]
        lines.append('')
    return '\n'.join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """``ifnd-zoo list | info NAME | download NAME [--dir DIR] | readme [--check]``."""
    parser = argparse.ArgumentParser(prog='ifnd-zoo', description='The ifnd model zoo.')
    sub = parser.add_subparsers(dest='command', required=True)
    sub.add_parser('list', help='the published models')
    show = sub.add_parser('info', help="a model's recipe, metrics, file and URLs")
    show.add_argument('name')
    get = sub.add_parser('download', help="download and verify a model's checkpoint")
    get.add_argument('name')
    get.add_argument('--dir', help=f'target folder (default: {cache_dir()})')
    readme = sub.add_parser('readme', help='regenerate model_zoo/README.md from the index')
    readme.add_argument('--check', action='store_true', help='fail if the README is out of date')
    args = parser.parse_args(argv)
    try:
        if args.command == 'list':
            for name in list_models():
                entry = info(name)
                print(f'{name:40s} {entry.get("algorithm", "?"):10s} {entry.get("backbone", "?"):24s} '
                      f'{entry.get("dataset", "?")}')
        elif args.command == 'info':
            print(yaml.safe_dump(info(args.name), sort_keys=False, allow_unicode=True), end='')
        elif args.command == 'download':
            print(download(args.name, dir=args.dir))
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
