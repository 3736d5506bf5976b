"""Offline weighted kNN of a pre-trained backbone on a labelled data set (top-1 for several k).

The data come from a config: ``--config FILE`` (e.g. the training config) or ``--dataset NAME``
(``configs/_base_/datasets/NAME.py``); a checkpoint's own config decides only its architecture. The bank is its
training split (the whole split: subset keys are dropped), the queries its kNN hook's
``val_dataset`` (or the config's ``val_dataset``), both under its eval transform. ``--zoo NAME``
evaluates a model zoo entry: its file is downloaded, verified and cached, and read like any other.
"""
import argparse
import copy
import os.path as osp

from mmengine.config import Config, DictAction

from ifnd.engine import build_eval_dataset, extract_features, fit_eval_view
from ifnd.engine.arguments import (add_encoder_arguments, add_extraction_arguments, check_arguments,
                                   encoder_options, resolve_device)
from ifnd.engine.input_errors import input_errors_as_messages
from ifnd.evaluation import knn_accuracy
from ifnd.settings import check_knn
from ifnd.evaluation.class_match import match_eval_classes
from ifnd.fileio import write_json
from ifnd.models.encoder import load_encoder
from ifnd.zoo.errors import UnverifiedError
from ifnd.zoo.loading import entry_num_heads

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
DATASET_CONFIG_DIR = osp.join(REPO, 'configs', '_base_', 'datasets')
DATASETS = ('digits', 'fmnist', 'cifar10', 'cifar100', 'imagenet')
SUBSET_KEYS = ('subset_fraction', 'subset_file', 'subset_seed')


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(
        description='Weighted cosine kNN (InstDisc/DINO protocol) on frozen, L2-normalised backbone '
                    "features: the training split is the bank, the validation split the queries.")
    parser.add_argument('checkpoint', nargs='?', help='training checkpoint, backbone file, or MoCo, PCL, '
                        'HCSC, solo-learn, mmselfsup, VISSL, DINO, torchvision/timm checkpoint (or --zoo)')
    parser.add_argument('--zoo', metavar='NAME', help='evaluate a model zoo entry (ifnd-zoo list) in '
                        'place of a checkpoint: downloaded, verified and cached as ifnd-zoo download does')
    parser.add_argument('--trust-remote', action='store_true', help='with --zoo: allow an entry whose '
                        'authors publish no checksum (its SHA-256 is recorded at the first download)')
    source = parser.add_mutually_exclusive_group()
    source.add_argument('--config', help="a training or dataset config giving the data (default: the "
                        "checkpoint's own training config)")
    source.add_argument('--dataset', choices=DATASETS, help='shorthand for --config '
                        'configs/_base_/datasets/NAME.py')
    parser.add_argument('--data-root', help='override data_root of both splits')
    parser.add_argument('--k', type=int, nargs='+', default=[20, 200],
                        help='neighbour counts (default: 20 200)')
    parser.add_argument('--temperature', type=float, default=0.07,
                        help='vote weight exp(sim / T) (default: 0.07)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={},
                        help='override the data settings, e.g. val_dataset.split=val pipeline.size=224 '
                        'train_dataset.subset_fraction=0.1')
    add_encoder_arguments(parser)
    add_extraction_arguments(parser, batch_size=256, num_workers=4)
    parser.add_argument('--out', help='write the results as JSON to this file')
    return parser.parse_args(argv)


def source_config(args: argparse.Namespace) -> tuple[Config, str]:
    """The config that describes the data, and where it came from."""
    path = args.config or (osp.join(DATASET_CONFIG_DIR, f'{args.dataset}.py') if args.dataset else None)
    if path is not None:
        if not osp.isfile(path):
            raise SystemExit(f'Config file not found: {path}')
        return Config.fromfile(path), path
    raise SystemExit(f'Give the data with --config FILE (the config {args.checkpoint} was trained '
                     f'with) or --dataset {{{",".join(DATASETS)}}}; a checkpoint\'s own config decides '
                     'its architecture only')


def data_settings(cfg: Config) -> dict:
    """Bank and query data sets and the eval transform of a training or dataset config."""
    hook = next((h for h in cfg.get('custom_hooks') or [] if 'val_dataset' in h), None) \
        or cfg.get('knn_hook') or {}
    train = hook.get('train_dataset') or (cfg.get('train_dataloader') or {}).get('dataset')
    val = hook.get('val_dataset') or cfg.get('val_dataset')
    pipeline = hook.get('pipeline') or cfg.get('eval_pipeline') or (val or {}).get('pipeline')
    missing = [name for name, value in (('training data set (train_dataloader.dataset)', train),
                                        ('validation data set (val_dataset)', val),
                                        ('eval transform (eval_pipeline)', pipeline)) if not value]
    if missing:
        raise SystemExit(f'The config gives no {", no ".join(missing)}; use --config with a config that '
                         'has them, or --cfg-options')
    train = copy.deepcopy(dict(train))
    for key in SUBSET_KEYS:  # the kNN protocol's bank is the whole labelled training split
        train.pop(key, None)
    return dict(train_dataset=train, val_dataset=copy.deepcopy(dict(val)), pipeline=copy.deepcopy(pipeline))


def zoo_checkpoint(name: str, trust: bool) -> str:
    """The cached, verified file of a model zoo entry; a refusal ends with a one-line error."""
    from ifnd.zoo import download
    try:
        return download(name, trust=trust)
    except UnverifiedError as err:
        raise SystemExit(f'error: {err}; or pass --trust-remote to this tool') from None
    except (KeyError, RuntimeError, OSError, ValueError) as err:
        raise SystemExit(f'error: {" ".join(str(err).strip(chr(34) + chr(39)).split())}') from None


def main(argv: list[str] | None = None) -> dict:
    """Extract bank and query features, run kNN for every k, print and save the results."""
    args = parse_args(argv)
    if (args.checkpoint is None) == (args.zoo is None):
        raise SystemExit('error: give a checkpoint file or --zoo NAME (one of them)')
    if args.zoo is not None:
        args.checkpoint = zoo_checkpoint(args.zoo, args.trust_remote)
        if args.num_heads is None:  # a ViT's heads, which its weights cannot show, from the index
            args.num_heads = entry_num_heads(args.zoo)
    check_arguments(inputs={'checkpoint': args.checkpoint, '--config': args.config}, outputs={'--out': args.out},
                    batch_size=args.batch_size, num_workers=args.num_workers)
    with input_errors_as_messages():
        return run(args)


def run(args: argparse.Namespace) -> dict:
    """The evaluation of checked arguments."""
    cfg, source = source_config(args)
    settings = Config(data_settings(cfg))
    if args.data_root is not None:
        for key in ('train_dataset', 'val_dataset'):
            if 'data_root' not in settings[key]:
                raise SystemExit(f'--data-root: {settings[key].type} takes no data_root')
            settings[key].data_root = args.data_root
    settings.merge_from_dict(args.cfg_options)
    settings = settings.to_dict()
    bank_set = build_eval_dataset(settings['train_dataset'], settings['pipeline'])
    query_set = build_eval_dataset(settings['val_dataset'], settings['pipeline'])
    # Query labels in the bank's class ids by name (folder data sets number classes per split).
    match_eval_classes(getattr(bank_set, 'classes', None), query_set, 'the kNN queries (validation split)',
                       'kNN accuracy')
    for k in args.k:  # before any feature is computed, as training checks its kNN hook
        check_knn(k, args.temperature, len(bank_set))

    device = resolve_device(args.device)
    encoder = load_encoder(args.checkpoint, **encoder_options(args)).to(device)
    # Only a ViT trained at another size changes the view: the data sets are built again then,
    # since the data's checks above come before the checkpoint is read.
    pipeline = fit_eval_view(settings['pipeline'], encoder.backbone, args.checkpoint)
    if pipeline is not settings['pipeline']:
        settings['pipeline'] = pipeline
        bank_set = build_eval_dataset(settings['train_dataset'], pipeline)
        query_set = build_eval_dataset(settings['val_dataset'], pipeline)
    kwargs = dict(feature='f', batch_size=args.batch_size, num_workers=args.num_workers,
                  source=args.checkpoint)
    bank, bank_labels = extract_features(encoder, bank_set, desc='kNN bank', **kwargs)
    query, query_labels = extract_features(encoder, query_set, desc='kNN queries', **kwargs)
    if min(bank_labels.min(), query_labels.min()) < 0:
        raise SystemExit('kNN needs labelled data, but some images have no label (-1)')
    num_classes = int(max(bank_labels.max(), query_labels.max())) + 1
    top1 = {k: knn_accuracy(bank.to(device), bank_labels, query, query_labels, num_classes, k=k,
                            temperature=args.temperature) for k in args.k}

    bank_name, query_name = type(bank_set).__name__, type(query_set).__name__
    print(f'\nWeighted kNN (cosine, T={args.temperature:g}, {bank.shape[1]}-d backbone features): '
          f'{bank_name} {settings["train_dataset"].get("split", "")} bank of {len(bank_set)}, '
          f'{query_name} {settings["val_dataset"].get("split", "")} queries {len(query_set)}, '
          f'{num_classes} classes')
    print('| k | top-1 (%) |\n|---|---|')
    for k, acc in top1.items():
        print(f'| {k} | {acc:.2f} |')
    result = dict(checkpoint=osp.abspath(args.checkpoint), zoo=args.zoo, data_config=source, **settings,
                  num_bank=len(bank_set), num_queries=len(query_set), num_classes=num_classes,
                  feature_dim=int(bank.shape[1]), temperature=args.temperature,
                  top1={str(k): acc for k, acc in top1.items()})
    if args.out:
        write_json(result, args.out, announce=True)
    return result


if __name__ == '__main__':
    main()
