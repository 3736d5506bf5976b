"""The ``ifnd-zoo`` command: list, info, download and readme."""
import argparse
import os.path as osp
from typing import Sequence

import yaml

from .cache import RECORD_SUFFIX, cache_dir, read_record, verification
from .index import CHECKSUM_FIELDS, info, read_index
from .loading import download
from .readme import README_PATH, is_baseline, render_readme


def _describe(name: str, folder: str | None = None) -> str:
    """``ifnd-zoo info``: the entry, then how it is verified, where it is cached and how to load it."""
    entry = info(name)
    target = osp.join(folder or cache_dir(), entry['file'])
    record = read_record(target + RECORD_SUFFIX) if not entry.get('sha256') else None
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
            index = read_index()
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
