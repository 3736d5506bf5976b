"""VOC07 transfer: per-class linear SVMs on a pre-trained backbone's frozen features (test mAP)."""
import argparse
import os.path as osp
import time

from ifnd.datasets import VOC07, EvalView
from ifnd.engine import extract_features
from ifnd.engine.arguments import (add_encoder_arguments, add_extraction_arguments, check_arguments,
                                   encoder_options, resolve_device)
from ifnd.engine.input_errors import input_errors_as_messages
from ifnd.evaluation import AP_DEFINITIONS, DEFAULT_SVM_COSTS, evaluate_voc07
from ifnd.fileio import write_json
from ifnd.models.encoder import Encoder, load_encoder

HEADLINE_AP = 'all-point'
DEFAULT_SIZE = 224


def crop_size(encoder: Encoder, size: int | None, checkpoint: str) -> int:
    """The centre-crop size: ``size``, else the backbone's own; refused where the backbone takes another."""
    required = encoder.backbone.input_size
    if size is not None and required is not None and size != required:
        raise SystemExit(f'error: --size {size}: {checkpoint} holds a network that takes {required}-pixel '
                         f'images only (a ViT\'s position embedding fixes its input size); leave --size '
                         f'out or pass --size {required}')
    return size if size is not None else required or DEFAULT_SIZE


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(
        description='VOC07 classification with linear SVMs on frozen, L2-normalised backbone features '
                    '(fair-ssl / PCL protocol): the cost per class by k-fold cross-validation on trainval, '
                    'mAP on test with difficult images left out.')
    parser.add_argument('checkpoint', help='training checkpoint, backbone file, or MoCo, PCL, solo-learn, '
                        'mmselfsup, VISSL, torchvision/timm checkpoint')
    parser.add_argument('--data-root', required=True, help='the VOCdevkit folder (holding VOC2007/)')
    parser.add_argument('--costs', type=float, nargs='+', default=list(DEFAULT_SVM_COSTS),
                        help='SVM costs C to choose from (default: %(default)s)')
    parser.add_argument('--cv-folds', type=int, default=3, help='cross-validation folds (default: 3)')
    parser.add_argument('--train-difficult', choices=['negative', 'ignore'], default='negative',
                        help="difficult trainval images as negatives (the benchmark's full-data script, "
                        "default) or left out")
    add_encoder_arguments(parser)
    parser.add_argument('--size', type=int, help='centre-crop size (default: the input size of a '
                        f'ViT, whose position embedding fixes it, else {DEFAULT_SIZE})')
    parser.add_argument('--resize', type=int, help='shorter side before the crop (default: size / 0.875 '
                        'for crops of 96 pixels or more, else size)')
    add_extraction_arguments(parser, batch_size=64, num_workers=4)
    parser.add_argument('--jobs', type=int, default=-1, help='processes fitting SVMs (default: -1, all CPUs)')
    parser.add_argument('--per-class', action='store_true', help='also print the AP of every class')
    parser.add_argument('--out', help='write the results as JSON to this file')
    return parser.parse_args(argv)


def print_tables(result: dict, per_class: bool) -> None:
    """Markdown tables of the test mAP under each AP definition (and per class when asked)."""
    defs = list(AP_DEFINITIONS)
    folds = result['cv_folds']
    print(f'| mAP (%) | {" | ".join(defs)} |')
    print('|---' * (len(defs) + 1) + '|')
    print(f'| costs chosen per class by {folds}-fold CV on trainval | '
          + ' | '.join(f'{result["map_cv"][d]:.2f}' for d in defs) + ' |')
    print('| best single cost on test (max over costs; selected on test) | '
          + ' | '.join(f'{result["map_best_over_costs"][d]:.2f}' for d in defs) + ' |')
    print('| that cost | ' + ' | '.join(f'{result["best_cost"][d]:g}' for d in defs) + ' |')
    if per_class:
        print()
        print(f'| class | chosen C | CV AP (%) | {" | ".join(f"test AP {d}" for d in defs)} |')
        print('|---' * (len(defs) + 3) + '|')
        for name in result['classes']:
            cost = result['chosen_costs'][name]
            print(f'| {name} | {cost:g} | {result["cv_ap"][name][str(cost)]:.2f} | '
                  + ' | '.join(f'{result["per_class_ap"][d][name]:.2f}' for d in defs) + ' |')


def main(argv: list[str] | None = None) -> dict:
    """Extract features, train and test the SVMs, print and save the results."""
    args = parse_args(argv)
    check_arguments(inputs={'checkpoint': args.checkpoint}, outputs={'--out': args.out},
                    batch_size=args.batch_size, num_workers=args.num_workers)
    device = resolve_device(args.device)
    with input_errors_as_messages():  # a checkpoint that cannot be used: one line, before any data
        encoder = load_encoder(args.checkpoint, **encoder_options(args)).to(device)
    size = crop_size(encoder, args.size, args.checkpoint)
    pipeline = EvalView(size, args.resize)
    trainval = VOC07(args.data_root, 'trainval', pipeline=pipeline)
    test = VOC07(args.data_root, 'test', pipeline=pipeline)
    kwargs = dict(feature='f', batch_size=args.batch_size, num_workers=args.num_workers,
                  source=args.checkpoint)
    start = time.perf_counter()
    with input_errors_as_messages():  # features no SVM can use: one line naming the checkpoint
        train_feats, _ = extract_features(encoder, trainval, desc='VOC07 trainval features', **kwargs)
        test_feats, _ = extract_features(encoder, test, desc='VOC07 test features', **kwargs)
    extract_s = time.perf_counter() - start
    print(f'Training {len(test.classes)} x {len(args.costs)} linear SVMs with {args.cv_folds}-fold CV '
          f'({train_feats.shape[1]}-d features, costs {" ".join(f"{c:g}" for c in args.costs)})', flush=True)
    start = time.perf_counter()
    result = evaluate_voc07(train_feats, trainval.targets, test_feats, test.targets, costs=args.costs,
                            cv_folds=args.cv_folds, train_difficult=args.train_difficult,
                            n_jobs=args.jobs, class_names=test.classes)
    svm_s = time.perf_counter() - start
    result.update(checkpoint=osp.abspath(args.checkpoint), data_root=osp.abspath(args.data_root),
                  num_trainval=len(trainval), num_test=len(test), feature_dim=int(train_feats.shape[1]),
                  size=size, resize=pipeline.resize, headline_ap=HEADLINE_AP,
                  extract_seconds=round(extract_s, 2), svm_seconds=round(svm_s, 2))
    print()
    print(f'VOC07 (trainval {len(trainval)} / test {len(test)} images): mAP '
          f'{result["map_cv"][HEADLINE_AP]:.2f} ({HEADLINE_AP} AP as in the fair-ssl/PCL code, '
          f'costs by {args.cv_folds}-fold CV)')
    print_tables(result, args.per_class)
    if result['not_converged']:
        print(f'note: {result["not_converged"]} SVM fits stopped at the iteration limit (large costs)')
    if args.out:
        write_json(result, args.out, announce=True)
    return result


if __name__ == '__main__':
    main()
