"""Publish a training checkpoint to the model zoo: strip training state, name by hash, index it.

``--push-to-hub ORG/REPO`` also uploads the file to the Hugging Face Hub (the token of
``huggingface-cli login`` or ``HF_TOKEN``) and indexes it as ``hf://ORG/REPO/FILE@COMMIT``, pinned to
the commit the upload made.
"""
import argparse
import hashlib
import io
import os.path as osp
import re
from typing import Sequence

import torch
import yaml
from mmengine.config import Config

from ifnd.engine.arguments import check_arguments
from ifnd.engine.input_errors import input_errors_as_messages
from ifnd.fileio import AtomicLocalBackend, check_weights, checkpoint_config, config_to_data
from ifnd.models.encoder import load_checkpoint_file
from ifnd.zoo.index import (HUB_REPO, INDEX_PATH, PLAIN_NAME_WORDS, check_index, metric_problem, plain_name,
                            read_index_file, source_problem)

# What loading needs; the optimiser, schedulers and message hub are training state.
KEPT_META = ('cfg', 'epoch', 'iter', 'seed', 'mmengine_version', 'experiment_name')
GIT_LIMIT = 5 * 2**20


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('checkpoint', help='a checkpoint written by tools/train.py')
    parser.add_argument('--name', required=True, help='zoo name, e.g. ifnd_r18_200e_fmnist')
    parser.add_argument('--config', help='the config that trained it (repository path)')
    parser.add_argument('--reproduce', required=True, help='the command that reproduces the file')
    parser.add_argument('--description', default='', help='a sentence on the model')
    parser.add_argument('--metric', nargs=3, action='append', default=[],
                        metavar=('NAME', 'VALUE', 'COMMAND'),
                        help='a measured result and the command that measured it (repeatable)')
    parser.add_argument('--url', action='append', default=[], help='a download URL (repeatable)')
    parser.add_argument('--out-dir', default='work_dirs/published', help='where the file goes')
    parser.add_argument('--index', default=INDEX_PATH, help='the zoo index to update')
    parser.add_argument('--push-to-hub', metavar='ORG/REPO',
                        help='upload the file to this Hugging Face Hub model repository (created '
                             'if missing) and index it at the upload\'s commit')
    return parser.parse_args(argv)


def strip_checkpoint(checkpoint: dict, source: str = 'checkpoint') -> dict:
    """Weights and the plain metadata loading needs, without any training state.

    The training config is kept as plain data (read by :func:`checkpoint_config`, never
    executed), so no config text reaches the published file; it is ``None`` when unreadable.
    """
    meta = {k: v for k, v in (checkpoint.get('meta') or {}).items()
            if k in KEPT_META and k != 'cfg' and isinstance(v, (str, int, float))}
    cfg = checkpoint_config(checkpoint, source)
    meta['cfg'] = config_to_data(cfg) if cfg is not None else None
    state = checkpoint.get('state_dict')
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f'{source} has no state_dict of tensors; publish checkpoints written by '
                         'tools/train.py')
    check_weights(state, state, source)  # no model here: its values must be finite
    return {'state_dict': {k: v.clone() for k, v in state.items()}, 'meta': meta}


def push_to_hub(path: str, file_name: str, repo_id: str, name: str) -> str:
    """Upload a published file to a Hub model repository; its ``hf://`` source at the new commit."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, repo_type='model', exist_ok=True)
    commit = api.upload_file(path_or_fileobj=path, path_in_repo=file_name, repo_id=repo_id,
                             repo_type='model', commit_message=f'Add {name} ({file_name})')
    revision = getattr(commit, 'oid', None)
    if not isinstance(revision, str) or not re.fullmatch(r'[0-9a-f]{40}', revision):
        raise SystemExit(f'error: the Hub upload to {repo_id} returned no commit id ({revision!r}); '
                         'check the repository on the Hub and index the file by hand')
    print(f'uploaded {file_name} to {repo_id} at commit {revision}')
    return f'hf://{repo_id}/{file_name}@{revision}'


def published_file_name(name: str, sha256: str) -> str:
    """The published file's name: the zoo name and the first 8 hex digits of its SHA-256."""
    return f'{name}_{sha256[:8]}.pth'


def check_values(args: argparse.Namespace) -> None:
    """Refuse a value the zoo index would refuse, before anything is read or written."""
    if not plain_name(args.name):
        raise SystemExit(f'error: --name {args.name!r} is not a plain name ({PLAIN_NAME_WORDS}): '
                         'the zoo index would refuse it; give e.g. --name ifnd_r18_200e_fmnist')
    suffix = len(published_file_name('', '0' * 64))  # the file name adds the hash to the name
    if not plain_name(published_file_name(args.name, '0' * 64)):
        raise SystemExit(f'error: --name is {len(args.name)} characters long: its file name would '
                         f'be over 255 characters; give a name of at most {255 - suffix}')
    for url in args.url:
        problem = source_problem(url)
        if problem:
            raise SystemExit(f'error: --url {problem}: the zoo index would refuse it; give the '
                             "file's direct http(s):// or file:// link, or "
                             'hf://ORG/REPO/FILE@COMMIT')
    for metric, value, _ in args.metric:
        try:
            problem = metric_problem(float(value))
        except ValueError:
            problem = 'the value is not a number'
        if problem:
            raise SystemExit(f'error: --metric {metric} {value!r}: {problem}; give NAME VALUE COMMAND, e.g. '
                             '--metric knn_top1 91.5 "python tools/knn_eval.py CKPT"')
    if args.push_to_hub is not None and not HUB_REPO.fullmatch(args.push_to_hub):
        raise SystemExit(f'error: --push-to-hub {args.push_to_hub!r} is not ORG/REPO (e.g. '
                         'my-lab/ifnd-models)')


def updated_index(path: str, entry: dict) -> dict:
    """The index at ``path`` (if any) with ``entry`` added or replaced, checked as the zoo reads it."""
    content = read_index_file(path) if osp.isfile(path) else None
    check_index(content, path)  # a broken index is named, not extended
    content = content or {}
    models = [m for m in content.get('models') or [] if m['name'] != entry['name']] + [entry]
    content['models'] = sorted(models, key=lambda m: m['name'])
    check_index(content, path)
    return content


def describe(cfg: Config) -> dict:
    """Algorithm, backbone, data set and epochs as the config gives them."""
    backbone = cfg.model.backbone
    name = backbone.model_name + ('-cifar-stem' if backbone.get('cifar_stem') else '')
    if backbone.get('channels'):
        name += '-' + 'x'.join(str(c) for c in backbone.channels)
    return {'algorithm': cfg.model.type, 'backbone': name,
            'dataset': cfg.train_dataloader.dataset.type, 'epochs': cfg.train_cfg.max_epochs}


def main(argv: Sequence[str] | None = None) -> None:
    """Write the stripped file and its index entry."""
    args = parse_args(argv)
    check_values(args)
    check_arguments(inputs={'checkpoint': args.checkpoint}, outputs={'--index': args.index},
                    folders={'--out-dir': args.out_dir})
    with input_errors_as_messages():
        publish(args)


def publish(args: argparse.Namespace) -> None:
    """Write the stripped file and its index entry for checked arguments."""
    published = strip_checkpoint(load_checkpoint_file(args.checkpoint), args.checkpoint)
    cfg = Config(published['meta']['cfg']) if published['meta']['cfg'] is not None else None
    if cfg is None or cfg.get('model') is None or cfg.get('train_dataloader') is None:
        raise SystemExit(f'{args.checkpoint} carries no usable training config; publish checkpoints '
                         'written by tools/train.py')
    buffer = io.BytesIO()
    torch.save(published, buffer)
    data = buffer.getvalue()
    sha = hashlib.sha256(data).hexdigest()
    published_file = published_file_name(args.name, sha)
    path = osp.join(args.out_dir, published_file)
    entry = {'name': args.name, **describe(cfg),
             'config': args.config or '', 'description': args.description,
             'metrics': [{'name': n, 'value': float(v), 'command': c} for n, v, c in args.metric],
             'file': published_file, 'size': len(data), 'sha256': sha, 'urls': list(args.url),
             'reproduce': args.reproduce}
    index = updated_index(args.index, entry)  # before the file is written or uploaded
    AtomicLocalBackend().put(data, path)
    torch.load(path, map_location='cpu', weights_only=True)  # what users will do must work
    if args.push_to_hub:
        entry['urls'].append(push_to_hub(path, published_file, args.push_to_hub, args.name))
        check_index(index, args.index)
    AtomicLocalBackend().put_text(yaml.safe_dump(index, sort_keys=False, allow_unicode=True),
                                  args.index)
    print(f'wrote {path} ({len(data) / 2**20:.1f} MiB, sha256 {sha})')
    print(f'updated {args.index}; regenerate the table with: python tools/zoo.py readme')
    if len(data) > GIT_LIMIT:
        print('the file is over 5 MB: host it on a release or mirror, not in git')


if __name__ == '__main__':
    main()
