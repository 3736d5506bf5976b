"""Images per second of tools/train.py's whole loop (loading, augmentation, step), CPU vs device views.

Trains SimCLR with a small ResNet-18 through ``tools/train.py`` (one subprocess per run) on

* ``digits``: scikit-learn's digits held in memory (``configs/_base_/datasets/digits.py``), and
* ``jpeg``: a folder of JPEG files this script generates (ImageFolder layout, ``--jpeg-size`` pixels),

each once with ``augment_on='cpu'`` (torchvision views in ``--workers`` loader workers) and once with
``augment_on='device'`` (views made in batches in the data preprocessor; in-memory data sampled as whole
batches without workers, JPEG files decoded on the device). The JPEG files' device run is made once per
decoder (``--decoder``, default ``both``: TorchCodec and torchvision's decoders, each installed one a row
of the same table, side by side; Pillow decodes in the workers of the CPU run). Every iteration is
logged (``log_processor.window_size=1``); the first ``--warmup`` iterations are left out and the
median iteration time gives images/s (source images; each makes two views).

``--preset fmnist-full`` instead trains the Fashion-MNIST recipe end to end, as a user would:
IFND with a full-width ResNet-18 on all 60,000 training images, batch 256, through
``tools/train.py`` with ``configs/ifnd/ifnd_r18_200e_fmnist_device_aug.py`` (views made on the
device; on a GPU bfloat16, compiled, channels_last) and with ``configs/ifnd/ifnd_r18_200e_fmnist.py``
(views made by 2 loader workers), for ``--epochs`` epochs with a clustering round before training
and after every epoch. It reports the last epoch's images/s (iterations logged every 50, each
logged time the mean of those 50, which ends on the device's own finish), the peak GPU memory, the
last clustering round's seconds (feature extraction, k-means, confidence) and the wall time of the
whole run, compilation included.

``--preset in1k-jpeg`` trains the ImageNet recipe a user runs (``configs/ifnd_r50_200e_in1k.py``:
IFNDMoCo, ResNet-50, 224 px; on a GPU compiled, bfloat16) on a folder of ``--jpeg-images`` generated
JPEGs in ImageNet's layout, batch ``--batch-size`` on one device, views made on the device (files
decoded there) or by ``--workers`` loader workers, for ``--epochs`` epochs (the first compiles), a
clustering round (k = 10, 30, 100, those with 4 images each) after each. It reports the last epoch's images/s (logged once an
epoch: the mean of its steps, no host sync in between), and the decoder that ran with its time per
batch (one batch of the files decoded on the device, timed alone).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import time
from typing import Sequence


if not __package__:  # started as `python benchmarks/NAME.py`: import the package from the repository
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import HelpFormatter, describe_device, make_jpeg_folder, resolve_device

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
AUGMENT_ON = ('cpu', 'device')
# --preset fmnist-full: the configs trained, by where their views are made.
FMNIST_RECIPES = {'device': 'configs/ifnd/ifnd_r18_200e_fmnist_device_aug.py',
                  'cpu': 'configs/ifnd/ifnd_r18_200e_fmnist.py'}
# Iterations per logged (and averaged) time in the preset's runs.
PRESET_LOG_INTERVAL = 50
IN1K_RECIPE = 'configs/ifnd_r50_200e_in1k.py'
# --preset in1k-jpeg: the recipe on the generated folder, a round after each epoch, logged once an epoch.
IN1K_CONFIG = """\
_base_ = [{recipe!r}]
train_dataloader = dict(batch_size={batch_size}, num_workers={workers},
                        dataset=dict(data_root={root!r}, augment_on={views!r}))
custom_hooks = [dict(_base_.pseudo_label_hook, num_clusters={clusters}, num_workers={workers})]
train_cfg = dict(max_epochs={epochs})
default_hooks = dict(logger=dict(interval={steps}), checkpoint=dict(interval={epochs}))
log_processor = dict(window_size={steps})
"""

CONFIG = """\
_base_ = [{runtime!r}, {dataset_base!r}]
model = dict(
    type='SimCLR', temperature=0.5,
    backbone=dict(type='TimmBackbone', model_name='resnet18', cifar_stem={cifar_stem},
                  channels={channels}),
    neck=dict(type='MLPNeck', hidden_dim=64, out_dim=32, num_layers=2),
    data_preprocessor=dict(type='ContrastiveDataPreprocessor', decoder={decoder!r}))
train_dataloader = dict(batch_size={batch_size}, num_workers={workers}, persistent_workers={persistent},
                        dataset={dataset})
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.05, momentum=0.9))
train_cfg = dict(type='IterBasedTrainLoop', max_iters={iters})
custom_hooks = []
default_hooks = dict(logger=dict(interval=1),
                     checkpoint=dict(interval=10 ** 9, by_epoch=False, save_last=False))
log_processor = dict(window_size=1, by_epoch=False)
log_level = 'WARNING'
"""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0], formatter_class=HelpFormatter)
    p.add_argument('--data', nargs='+', choices=('digits', 'jpeg'), default=['digits', 'jpeg'],
                   help='data sets to time')
    p.add_argument('--iters', type=int, default=30, help='timed iterations per run')
    p.add_argument('--warmup', type=int, default=5, help='iterations run first and left out')
    p.add_argument('--batch-size', type=int, default=64)
    p.add_argument('--workers', type=int, default=2, help='loader workers of the CPU-augmentation runs '
                   '(and of the device runs on JPEG files, which only read the files)')
    p.add_argument('--jpeg-images', type=int, default=256, help='JPEG files to generate')
    p.add_argument('--jpeg-size', type=int, default=224, help='side of the generated JPEG files')
    p.add_argument('--jpeg-crop', type=int, default=224, help='view size on the JPEG data (MoCo v2 view)')
    p.add_argument('--decoder', choices=('both', 'torchcodec', 'torchvision'), default='both',
                   help="JPEG files' device runs: decoded by TorchCodec, by torchvision's decoders, or one "
                   'run (and row) by each of the two installed')
    p.add_argument('--channels', type=int, nargs=4, default=(8, 16, 32, 64), help='ResNet-18 stage widths')
    p.add_argument('--threads', type=int, help='OMP/MKL threads of the training processes')
    p.add_argument('--work-dir', default='work_dirs/throughput', help='configs, logs and the JPEG folder')
    p.add_argument('--python', default=sys.executable, help='interpreter that runs tools/train.py')
    p.add_argument('--out', help='write the results as JSON here')
    p.add_argument('--preset', choices=('fmnist-full', 'in1k-jpeg'),
                   help='train the full Fashion-MNIST IFND recipe, or the ImageNet one on a JPEG folder, end '
                   'to end instead (see above)')
    p.add_argument('--epochs', type=int, default=2, help='epochs of each --preset run')
    p.add_argument('--views', nargs='+', choices=AUGMENT_ON, default=['device', 'cpu'],
                   help='--preset runs: views made on the device, by loader workers on the CPU, or both')
    p.add_argument('--fmnist-root', help='--preset: Fashion-MNIST folder (default: the config\'s, '
                   'Debian\'s /usr/share/datasets/fashion-mnist)')
    p.add_argument('--cfg-options', nargs='+', default=[],
                   help='--preset: more tools/train.py --cfg-options for every run, e.g. '
                   'optim_wrapper.type=OptimWrapper model.backbone.compile=False')
    p.add_argument('--dry-run', action='store_true', help='--preset: print the commands only')
    args = p.parse_args(argv)
    if args.epochs < 1:
        p.error('--epochs must be >= 1')
    return args


def write_config(path: str, data: str, augment_on: str, args: argparse.Namespace, jpeg_root: str,
                 decoder: str = 'auto') -> str:
    """A tools/train.py config for one run (``decoder``: the device path's, see ContrastiveDataPreprocessor)."""
    dataset_base = osp.join(REPO, 'configs', '_base_', 'datasets', 'digits.py' if data == 'digits' else
                            'imagenet.py')
    if data == 'digits':
        dataset = dict(augment_on=augment_on)
    else:
        dataset = dict(_delete_=True, type='ImageFolder', data_root=jpeg_root, augment_on=augment_on,
                       pipeline=dict(type='MultiView', num_views=2,
                                     transforms=dict(type='MoCoV2View', size=args.jpeg_crop)))
    workers = 0 if (data == 'digits' and augment_on == 'device') else args.workers
    text = CONFIG.format(runtime=osp.join(REPO, 'configs', '_base_', 'default_runtime.py'),
                         dataset_base=dataset_base, cifar_stem=data == 'digits', channels=tuple(args.channels),
                         batch_size=args.batch_size, workers=workers, persistent=workers > 0,
                         dataset=repr(dataset), iters=args.warmup + args.iters, decoder=decoder)
    with open(path, 'w') as f:
        f.write(text)
    return path


def iteration_times(work_dir: str) -> tuple[list[float], list[float]]:
    """Per-iteration ``time`` and ``data_time`` of the newest run in ``work_dir``."""
    files = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    if not files:
        raise RuntimeError(f'no scalars.json under {work_dir}/*/vis_data; see {work_dir}/train.log')
    times, data_times = [], []
    with open(files[-1]) as f:
        for line in f:
            row = json.loads(line)
            if 'time' in row:
                times.append(row['time'])
                data_times.append(row['data_time'])
    return times, data_times


def train_env(args: argparse.Namespace) -> dict:
    """The environment of the training processes: this repository importable, ``--threads`` threads."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''))
    if args.threads is not None:
        env['OMP_NUM_THREADS'] = env['MKL_NUM_THREADS'] = str(args.threads)
    return env


def decoders_to_time(args: argparse.Namespace) -> list[str]:
    """The ``--decoder`` packages that decode under ``--python``, which trains (each missing one named)."""
    probe = 'from ifnd.datasets.decode import available_decoders; print(*available_decoders())'
    found = subprocess.run([args.python, '-c', probe], cwd=REPO, env=train_env(args), capture_output=True,
                           text=True).stdout.split()
    wanted = ['torchcodec', 'torchvision'] if args.decoder == 'both' else [args.decoder]
    for name in wanted:
        if name not in found:
            print(f'{name} cannot decode under {args.python}: no JPEG run with it '
                  f"(TorchCodec: pip install 'ifnd[torchcodec]')", flush=True)
    timed = [name for name in wanted if name in found]
    if not timed:
        raise SystemExit(f'--decoder {args.decoder}: no such decoder decodes under {args.python}; install '
                         "TorchCodec (pip install 'ifnd[torchcodec]'), or leave the JPEG data out (--data digits)")
    return timed


def run(data: str, augment_on: str, args: argparse.Namespace, jpeg_root: str, decoder: str = 'auto') -> dict:
    """Train once through tools/train.py; images/s and the data-loading share of the timed iterations."""
    name = f'{data}_{augment_on}' + (f'_{decoder}' if decoder != 'auto' else '')
    work_dir = osp.abspath(osp.join(args.work_dir, name))
    os.makedirs(work_dir, exist_ok=True)
    config = write_config(osp.join(work_dir, 'config.py'), data, augment_on, args, jpeg_root, decoder)
    log_path = osp.join(work_dir, 'train.log')
    with open(log_path, 'w') as log:
        proc = subprocess.run([args.python, 'tools/train.py', config, '--work-dir', work_dir,
                               '--overwrite'],  # each measurement is a new run
                              cwd=REPO, env=train_env(args), stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        with open(log_path) as f:
            print(f.read()[-4000:], file=sys.stderr)
        raise SystemExit(f'{name}: training failed with exit code {proc.returncode} (log: {log_path})')
    times, data_times = iteration_times(work_dir)
    # IterBasedTrainLoop sleeps 2 s (in data_time) whenever it starts a new pass over the data (mmengine's
    # guard against loader-worker deadlocks); iterations that start a pass are left out.
    per_pass = iterations_per_pass(data, args)
    kept = [i for i in range(args.warmup, len(times)) if i % per_pass != 0]
    times, data_times = [times[i] for i in kept], [data_times[i] for i in kept]
    if not times:
        raise SystemExit(f'{name}: no timed iterations logged; raise --iters')
    median = statistics.median(times)
    # What decodes the files: Pillow in the loader workers, or the preprocessor's decoder; digits are arrays.
    decoded_by = None if data == 'digits' else 'pillow' if augment_on == 'cpu' else decoder
    return dict(data=data, augment_on=augment_on, decoder=decoded_by, iters=len(times), ms_per_iter=1000 * median,
                images_per_s=args.batch_size / median, data_share=sum(data_times) / sum(times))


def iterations_per_pass(data: str, args: argparse.Namespace) -> int:
    """Batches in one pass over the training data (the loader drops the last partial batch)."""
    if data == 'jpeg':
        images = args.jpeg_images
    else:
        import ifnd  # noqa: F401  (registers the data sets)
        from ifnd.registry import DATASETS
        images = len(DATASETS.build(dict(type='Digits', split='train', pipeline=None)))
    if images < args.batch_size:
        raise SystemExit(f'{data}: {images} images make no batch of {args.batch_size}; lower --batch-size')
    return images // args.batch_size


def markdown_table(rows: list[dict]) -> str:
    """Results as a Markdown table, with each device run's speed-up over the CPU run on the same data."""
    cpu = {r['data']: r['images_per_s'] for r in rows if r['augment_on'] == 'cpu'}
    lines = ['| Data | Views made on | Decoder | ms / iter | Images / s | Data-time share | vs CPU views |',
             '|---|---|---|---|---|---|---|']
    for r in rows:
        ratio = r['images_per_s'] / cpu[r['data']] if r['data'] in cpu else float('nan')
        lines.append(f"| {r['data']} | {r['augment_on']} | {r.get('decoder') or '-'} | {r['ms_per_iter']:.1f} | "
                     f"{r['images_per_s']:.0f} | {100 * r['data_share']:.0f}% | {ratio:.2f}x |")
    return '\n'.join(lines)


def in1k_jpeg_command(views: str, args: argparse.Namespace) -> tuple[list[str], str]:
    """The tools/train.py command of one ``--preset in1k-jpeg`` run (its config written), and its work dir."""
    work_dir = osp.abspath(osp.join(args.work_dir, f'in1k_jpeg_{views}'))
    root = osp.abspath(osp.join(args.work_dir, 'in1k_jpegs'))
    steps = args.jpeg_images // args.batch_size
    if steps < 1:
        raise SystemExit(f'--preset in1k-jpeg: {args.jpeg_images} images make no batch of {args.batch_size}')
    config = osp.join(work_dir, 'in1k_jpeg.py')
    if not args.dry_run:
        make_jpeg_folder(osp.join(root, 'train'), args.jpeg_images, args.jpeg_size)
        make_jpeg_folder(osp.join(root, 'val'), 64, args.jpeg_size, seed=1)  # the kNN after the last epoch
        os.makedirs(work_dir, exist_ok=True)
        with open(config, 'w') as f:
            f.write(IN1K_CONFIG.format(recipe=osp.join(REPO, IN1K_RECIPE), batch_size=args.batch_size,
                                       workers=args.workers, root=root, views=views, epochs=args.epochs,
                                       steps=steps, clusters=[k for k in (10, 30, 100) if 4 * k <= args.jpeg_images]
                                       or [2]))
    return [args.python, 'tools/train.py', config, '--work-dir', work_dir, '--overwrite',
            *(['--cfg-options', *args.cfg_options] if args.cfg_options else [])], work_dir


def decode_time(args: argparse.Namespace, batches: int = 5) -> dict:
    """The decoder the device views ran ('auto'), and each installed decoder's milliseconds per batch of
    ``--batch-size`` of the preset's files, decoded alone on the device."""
    import torch

    from ifnd.datasets.decode import available_decoders, decode_images, image_decoder, read_encoded_batch
    root = osp.abspath(osp.join(args.work_dir, 'in1k_jpegs', 'train'))
    paths = sorted(glob.glob(osp.join(root, '*', '*.jpg')))[:args.batch_size]
    device = resolve_device('auto')
    buffer, sizes = read_encoded_batch(paths)
    files = torch.split(buffer, sizes)
    ms_per_batch = {}
    for name in available_decoders():
        decode_images(files, paths, device, name)  # first use: the decoder's set-up
        tic = time.perf_counter()
        for _ in range(batches):
            decode_images(files, paths, device, name)
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
        ms_per_batch[name] = 1000 * (time.perf_counter() - tic) / batches
    return dict(decoder=image_decoder('auto').name, device=str(device), images=len(paths), ms_per_batch=ms_per_batch)


def decode_line(decode: dict) -> str:
    """What decoded the files, and each decoder's time per batch alone."""
    times = ', '.join(f'{name} {ms:.1f} ms' for name, ms in decode['ms_per_batch'].items())
    return (f"Decoding: {decode['decoder']} decoded the training batches; one batch of {decode['images']} "
            f"files decoded alone on {decode['device']}: {times}.")


def preset_command(views: str, args: argparse.Namespace) -> tuple[list[str], str]:
    """The tools/train.py command of one --preset run, and its work dir."""
    if args.preset == 'in1k-jpeg':
        return in1k_jpeg_command(views, args)
    work_dir = osp.abspath(osp.join(args.work_dir, f'fmnist_full_{views}'))
    options = [f'train_cfg.max_epochs={args.epochs}',
               'custom_hooks.0.interval=1',  # a clustering round after every epoch
               f'default_hooks.logger.interval={PRESET_LOG_INTERVAL}',
               f'log_processor.window_size={PRESET_LOG_INTERVAL}',
               f'default_hooks.checkpoint.interval={args.epochs}']
    if args.fmnist_root:
        options += [f'train_dataloader.dataset.data_root={args.fmnist_root}',
                    f'custom_hooks.1.val_dataset.data_root={args.fmnist_root}']
    command = [args.python, 'tools/train.py', FMNIST_RECIPES[views], '--work-dir', work_dir, '--overwrite',
               '--cfg-options', *options, *args.cfg_options]
    return command, work_dir


def preset_result(views: str, work_dir: str, epochs: int, wall_s: float, config: str) -> dict:
    """The last epoch's speed, peak memory and last clustering round of a finished --preset run of
    ``config`` (the recipe: its batch size is read from the copy tools/train.py left in ``work_dir``)."""
    from mmengine.config import Config
    files = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    if not files:
        raise RuntimeError(f'no scalars.json under {work_dir}/*/vis_data; see {work_dir}/train.log')
    with open(files[-1]) as f:
        rows = [json.loads(line) for line in f]
    last = [r for r in rows if 'time' in r and r.get('epoch') == epochs]
    if not last:
        raise SystemExit(f'{work_dir}: no iteration of epoch {epochs} was logged; an epoch needs at '
                         'least one logger interval of iterations')
    batch_size = Config.fromfile(osp.join(work_dir, osp.basename(config))).train_dataloader.batch_size
    median = statistics.median(r['time'] for r in last)
    with open(osp.join(work_dir, 'pseudo_labels', 'rounds.json')) as f:
        rounds = json.load(f)
    memory = [r['memory'] for r in last if 'memory' in r]
    return dict(views=views, config=config, epochs=epochs, batch_size=batch_size,
                ms_per_iter=1000 * median, images_per_s=batch_size / median,
                peak_memory_mb=max(memory) if memory else None, wall_s=wall_s,
                clustering_s={part: rounds[-1][f'seconds_{part}']
                              for part in ('extract', 'kmeans', 'confidence')})


def preset_table(rows: list[dict]) -> str:
    """--preset results as a Markdown table."""
    lines = ['| Views made on | Config | ms / iter (last epoch) | Images / s | Peak GPU memory (MB) | '
             'Clustering round (s): extract / k-means / confidence | Wall (s) |',
             '|---|---|---:|---:|---:|---|---:|']
    for r in rows:
        c = r['clustering_s']
        memory = '-' if r['peak_memory_mb'] is None else f"{r['peak_memory_mb']:.0f}"
        lines.append(f"| {r['views']} | `{osp.basename(r['config'])}` | {r['ms_per_iter']:.1f} | "
                     f"{r['images_per_s']:.0f} | {memory} | {c['extract']:.2f} / {c['kmeans']:.2f} / "
                     f"{c['confidence']:.2f} | {r['wall_s']:.0f} |")
    return '\n'.join(lines)


def run_preset(args: argparse.Namespace, device: str) -> dict:
    """Train the --preset runs one after the other; print and return their results."""
    rows = []
    for views in args.views:
        command, work_dir = preset_command(views, args)
        print(' '.join(command), flush=True)
        if args.dry_run:
            continue
        os.makedirs(work_dir, exist_ok=True)
        log_path = osp.join(work_dir, 'train.log')
        tic = time.perf_counter()
        with open(log_path, 'w') as log:
            proc = subprocess.run(command, cwd=REPO, env=train_env(args), stdout=log, stderr=subprocess.STDOUT)
        wall_s = time.perf_counter() - tic
        if proc.returncode != 0:
            with open(log_path) as f:
                print(f.read()[-4000:], file=sys.stderr)
            raise SystemExit(f'{views} views: training failed with exit code {proc.returncode} '
                             f'(log: {log_path})')
        rows.append(preset_result(views, work_dir, args.epochs, wall_s, command[2]))
        if args.preset == 'in1k-jpeg':
            rows[-1]['config'] = IN1K_RECIPE  # what the written config runs
    result = dict(device=device, preset=args.preset, epochs=args.epochs, rows=rows)
    if rows and args.preset == 'in1k-jpeg':
        result['decode'] = decode_time(args)
    if rows:
        what = (f'ImageNet recipe (IFNDMoCo, ResNet-50) on {args.jpeg_images} JPEGs of {args.jpeg_size} px'
                if args.preset == 'in1k-jpeg' else 'Fashion-MNIST, IFND, ResNet-18')
        print(f'\nDevice: {device}; {what}, {args.epochs} epochs, a clustering round before training and '
              'after each epoch\n')
        print(preset_table(rows))
        if 'decode' in result:
            print('\n' + decode_line(result['decode']))
    return result


def main(argv: Sequence[str] | None = None) -> dict:
    """Run every (data, augmentation) pair, print the table and return the results."""
    args = parse_args(argv)
    device = describe_device(resolve_device('auto'))
    if args.preset:
        result = run_preset(args, device)
        if args.out and not args.dry_run:
            from ifnd.fileio import write_json
            write_json(result, args.out, announce=True)
        return result
    if args.threads is not None and 'CPU' in device:
        device = device.rsplit(',', 1)[0] + f', {args.threads} torch threads'
    jpeg_root, decoders = '', []
    if 'jpeg' in args.data:
        decoders = decoders_to_time(args)
        jpeg_root = make_jpeg_folder(osp.abspath(osp.join(args.work_dir, 'jpeg_data')), args.jpeg_images,
                                     args.jpeg_size)
    rows = []
    for data in args.data:
        for augment_on in AUGMENT_ON:
            for decoder in decoders if (data, augment_on) == ('jpeg', 'device') else ['auto']:
                rows.append(run(data, augment_on, args, jpeg_root, decoder))
                print(f"{data} / {augment_on}{f' / {decoder}' if decoder != 'auto' else ''}: "
                      f"{rows[-1]['images_per_s']:.0f} images/s", flush=True)
    result = dict(device=device, batch_size=args.batch_size, workers=args.workers, jpeg_size=args.jpeg_size,
                  jpeg_crop=args.jpeg_crop, channels=list(args.channels), decoders=decoders, rows=rows)
    print(f'\nDevice: {device}; batch {args.batch_size}, {args.workers} loader workers for CPU views, '
          f'{args.iters} timed iterations after {args.warmup}\n')
    print(markdown_table(rows))
    if args.out:
        from ifnd.fileio import write_json
        write_json(result, args.out, announce=True)
    return result


if __name__ == '__main__':
    main()
