"""Seconds per clustering round of IFND versus data-set size N and the number of clusters k.

One round is what PseudoLabelHook does once the features are extracted, by the same function
(``ifnd.clustering.clustering_round``): multi-level k-means, then per level the confidence κ
and the acceptance of the most confident labels. Feature extraction is left out: it costs one
forward pass over the training set and does not depend on k. Features are random L2-normalised
vectors; with a fixed number of Lloyd iterations the cost does not depend on how clustered they are.

``--world-size W`` also runs every torch configuration sharded over W gloo processes on the CPU
(each holds 1/W of the features; k-means all-reduces per-centroid sums, κ per shard, only the
per-sample assignments and κ are gathered), in the same run, and reports the speed-up against
one process and whether the accepted labels are identical.

Example::

    python -m benchmarks.clustering_cost --num-samples 10000 50000 \\
        --ks 10,30,100 100,300,1000 --backends faiss torch --out clustering.json
    python -m benchmarks.clustering_cost --backends torch --world-size 2 --threads 2
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from typing import Sequence


if not __package__:  # started as `python benchmarks/NAME.py`: import the package from the repository
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from ifnd.clustering import (BACKEND_TABLE, ConstantAcceptance, check_round_options,
                             clustering_round, round_seed, sharding_backend)
from ifnd.dist import shard_index
from ifnd.settings import check_temperature

from benchmarks.common import HelpFormatter, describe_device, report_results, resolve_device, synchronize


def available_backends() -> list[str]:
    """k-means backends usable here: those of the backends' table installed here, in its order."""
    return [name for name, backend in BACKEND_TABLE.items() if backend.installed()]


def parse_ks(text: str) -> list[int]:
    """A comma-separated list of cluster counts, e.g. '10,30,100'."""
    try:
        ks = [int(k) for k in text.split(',') if k.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected comma-separated integers, got {text!r}')
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f'expected positive cluster counts, got {text!r}')
    return ks


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(
        description='Seconds per IFND clustering round (multi-level k-means, confidence, '
        'acceptance) vs N and k for each k-means backend; prints a Markdown table.',
        formatter_class=HelpFormatter)
    parser.add_argument('--num-samples', type=int, nargs='+', default=[10000, 50000],
                        help='data-set sizes N')
    parser.add_argument('--ks', type=parse_ks, nargs='+', default=[[10, 30, 100], [100, 300, 1000]],
                        help='cluster-count levels of one round, each comma-separated')
    parser.add_argument('--backends', nargs='+', choices=list(BACKEND_TABLE),
                        default=available_backends(), help='k-means backends')
    parser.add_argument('--dim', type=int, default=128, help='feature dimension')
    parser.add_argument('--niter', type=int, default=20, help='Lloyd iterations')
    parser.add_argument('--nredo', type=int, default=1,
                        help='k-means restarts per level (the configs use 5; cost grows linearly)')
    parser.add_argument('--max-points-per-centroid', type=int, default=1000,
                        help='k-means trains on at most k times this many points')
    parser.add_argument('--min-points-per-centroid', type=int, default=10,
                        help='warning threshold of k-means')
    parser.add_argument('--temperature', type=float, default=0.5, help='τ of the confidence κ')
    parser.add_argument('--rate', type=float, default=0.5, help='acceptance rate of the round')
    parser.add_argument('--repeats', type=int, default=1,
                        help='rounds per configuration (the median is reported)')
    parser.add_argument('--device', default='auto',
                        help="'auto' (CUDA when available), 'cpu', 'cuda': where the features "
                        'live; the torch backend and the confidence run there, faiss uses its '
                        'GPU build when present')
    parser.add_argument('--threads', type=int, default=None,
                        help='CPU threads for torch and faiss (default: their own); with '
                        '--world-size W each sharded process gets threads // W')
    parser.add_argument('--world-size', type=int, default=1,
                        help='also run the torch backend sharded over this many gloo processes '
                        'on the CPU (1: no sharded runs)')
    parser.add_argument('--seed', type=int, default=0, help='random seed')
    parser.add_argument('--out', default=None, help='also write the results as JSON here')
    args = parser.parse_args(argv)
    check_args(parser, args)
    return args


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, through ``parser``, settings no round can run with; set the threads per process."""
    if min(args.num_samples) < 1 or args.dim < 1 or args.niter < 1 or args.nredo < 1 \
            or args.repeats < 1:
        parser.error('--num-samples, --dim, --niter, --nredo and --repeats must be >= 1')
    if not 0.0 <= args.rate <= 1.0:
        parser.error('--rate must be in [0, 1]')
    try:  # the loss's own check and message: κ divides by the same τ
        check_temperature('--temperature: the confidence κ', args.temperature)
    except ValueError as err:
        parser.error(str(err))
    if args.world_size < 1:
        parser.error('--world-size must be >= 1')
    sharding = sharding_backend()
    if args.world_size > 1 and sharding not in args.backends:
        parser.error(f'--world-size > 1 shards the {sharding} backend: include {sharding} in '
                     '--backends')
    if args.world_size > 1 and resolve_device(args.device).type != 'cpu':
        parser.error('--world-size > 1 spawns gloo processes on the CPU: pass --device cpu')
    # The sharded processes share the cores of the one-process run.
    args.threads_per_process = max(1, (args.threads or torch.get_num_threads()) // args.world_size)
    available = available_backends()
    missing = [b for b in args.backends if b not in available]
    if missing:
        parser.error(f'backend(s) {missing} not available here (not importable); '
                     f'available: {available}')
    for n in args.num_samples:
        for ks in args.ks:
            if max(ks) > n:
                parser.error(f'cannot form {max(ks)} clusters from N={n} samples')
    try:  # the k-means options, checked once as PseudoLabelHook checks its config
        for backend in args.backends:
            check_round_options('kappa', kmeans_settings(args, backend))
    except (TypeError, ValueError) as err:
        parser.error(str(err))


def kmeans_settings(args: argparse.Namespace, backend: str) -> dict:
    """The k-means options of the benchmark's rounds on ``backend``."""
    return dict(backend=backend, niter=args.niter, nredo=args.nredo,
                max_points_per_centroid=args.max_points_per_centroid,
                min_points_per_centroid=args.min_points_per_centroid)


def faiss_note() -> str:
    """Where faiss runs: its GPU build or the CPU, with its thread count."""
    try:
        import faiss
    except ImportError:
        return 'faiss: not installed'
    gpus = getattr(faiss, 'get_num_gpus', lambda: 0)()
    if gpus > 0:
        return f'faiss {faiss.__version__}: {gpus} GPU(s)'
    return f'faiss {faiss.__version__}: CPU, {faiss.omp_get_max_threads()} threads'


def timed_round(feats: torch.Tensor, ks: Sequence[int], backend: str, args: argparse.Namespace,
                seed: int, num: int | None = None) -> dict:
    """Time one round as PseudoLabelHook runs it: k-means, then confidence and acceptance.

    ``num``: the features are this process's shard of ``num`` (sharded round, torch backend).
    """
    synchronize(feats.device)  # earlier work on the device is not this round's
    acceptance = ConstantAcceptance(final_rate=args.rate)
    acceptance.set_epoch(0, 1)
    result = clustering_round(feats, ks, acceptance=acceptance, temperature=args.temperature,
                              seed=seed, kmeans=kmeans_settings(args, backend), num_samples=num)
    kmeans_s, confidence_s = result.stats['seconds_kmeans'], result.stats['seconds_confidence']
    return {'kmeans_s': kmeans_s, 'confidence_s': confidence_s,
            'total_s': kmeans_s + confidence_s, 'accepted': int((result.labels >= 0).sum()),
            'labels': result.labels}


def _summary(rounds: list[dict], backend: str, n: int, ks: Sequence[int], processes: int) -> dict:
    row = {'backend': backend, 'processes': processes, 'num_samples': n, 'ks': list(ks)}
    for key in ('kmeans_s', 'confidence_s', 'total_s'):
        row[key] = statistics.median(r[key] for r in rounds)
    row['accepted_per_level'] = rounds[-1]['accepted'] / len(ks)
    print(f"  {backend:5s} x{processes} N={n:>8d} ks={','.join(map(str, ks)):<16s} "
          f"k-means {row['kmeans_s']:.2f}s confidence {row['confidence_s']:.3f}s",
          file=sys.stderr, flush=True)
    return row


def _sharded_worker(rank: int, port: int, args: argparse.Namespace, data_path: str,
                    out_path: str) -> None:
    """One of ``world_size`` gloo processes: every configuration on this rank's shard."""
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.set_num_threads(args.threads_per_process)
    dist.init_process_group('gloo', rank=rank, world_size=args.world_size)
    data = torch.load(data_path, weights_only=True)
    part = lambda x: x[shard_index(len(x))].contiguous()  # noqa: E731
    timed_round(part(data['warm']), [2], sharding_backend(), args, args.seed, len(data['warm']))
    out = {}
    for n in args.num_samples:
        feats = part(data[n])
        for ks in args.ks:
            rounds = []
            for r in range(args.repeats):
                dist.barrier()  # every rank starts the round together
                rounds.append(timed_round(feats, ks, sharding_backend(), args,
                                          round_seed(args.seed, r), n))
            out[(n, tuple(ks))] = rounds
    if rank == 0:
        torch.save({str(key): value for key, value in out.items()}, out_path)
    dist.barrier()  # no rank exits while another still talks to it


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def run_benchmark(args: argparse.Namespace) -> dict:
    """Every (backend, N, ks) configuration, ``repeats`` rounds each; medians of the timings."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
        if 'faiss' in available_backends():
            import faiss
            faiss.omp_set_num_threads(args.threads)
    device = resolve_device(args.device)
    g = torch.Generator().manual_seed(args.seed)
    # One untimed tiny round per backend first: library start-up is not a clustering cost.
    data = {'warm': F.normalize(torch.randn(256, args.dim, generator=g), dim=1)}
    for backend in args.backends:
        timed_round(data['warm'].to(device), [2], backend, args, args.seed)
    rows, single_labels = [], {}
    for n in args.num_samples:
        data[n] = F.normalize(torch.randn(n, args.dim, generator=g), dim=1)
        feats = data[n].to(device)
        for ks in args.ks:
            for backend in args.backends:
                rounds = [timed_round(feats, ks, backend, args, round_seed(args.seed, r))
                          for r in range(args.repeats)]
                rows.append(_summary(rounds, backend, n, ks, 1))
                if backend == sharding_backend():
                    single_labels[(n, tuple(ks))] = (rows[-1], rounds[-1]['labels'])
    if args.world_size > 1:
        rows += _sharded_rows(args, data, single_labels)
    settings = {key: value for key, value in vars(args).items() if key != 'out'}
    return {
        'benchmark': 'clustering_cost',
        'device': describe_device(device),
        'faiss': faiss_note(),
        'torch': torch.__version__,
        'settings': settings,
        'rows': rows,
    }


def _sharded_rows(args: argparse.Namespace, data: dict, single: dict) -> list[dict]:
    """The sharding backend's configurations again, sharded over ``world_size`` spawned gloo processes."""
    with tempfile.TemporaryDirectory() as tmp:
        data_path, out_path = os.path.join(tmp, 'features.pt'), os.path.join(tmp, 'rounds.pt')
        torch.save(data, data_path)
        mp.spawn(_sharded_worker, args=(_free_port(), args, data_path, out_path),
                 nprocs=args.world_size, join=True)
        out = torch.load(out_path, weights_only=True)
    rows = []
    for (n, ks), (one, labels) in single.items():
        rounds = out[str((n, ks))]
        row = _summary(rounds, sharding_backend(), n, ks, args.world_size)
        row['speedup'] = one['total_s'] / row['total_s']
        # The same seeds as the one-process rounds: the labels must match.
        row['same_labels'] = bool(rounds[-1]['labels'].equal(labels))
        rows.append(row)
    return rows


def _seconds(value: float) -> str:
    # Three significant digits: tiny stages stay visible, large ones keep two decimals.
    return f'{value:#.3g}' if value < 100 else f'{value:.1f}'


def markdown_table(result: dict) -> str:
    """The results as a Markdown table, one row per (backend, processes, N, ks)."""
    s = result['settings']
    sharded = s.get('world_size', 1) > 1
    lines = [
        f"Clustering round on {result['device']}; {result['faiss']} (torch {result['torch']}): "
        f"random unit features of dim {s['dim']}, niter {s['niter']}, nredo {s['nredo']}, "
        f"max {s['max_points_per_centroid']} points/centroid, acceptance rate {s['rate']}, "
        f"median of {s['repeats']} round(s)"
        + (f"; sharded rows: {s['world_size']} gloo processes on this CPU, "
           f"{s['threads_per_process']} thread(s) each" if sharded else ''),
        '',
        '| Backend | N | k per level | k-means (s) | confidence + acceptance (s) | total (s) |'
        + (' processes | speed-up vs 1 process | same labels |' if sharded else ''),
        '|---|---:|---|---:|---:|---:|' + ('---:|---:|---|' if sharded else ''),
    ]
    # Each sharded row right below the one-process rows of its configuration.
    groups: dict = {}
    for r in result['rows']:
        groups.setdefault((r['num_samples'], tuple(r['ks'])), []).append(r)
    for r in (row for group in groups.values() for row in group):
        ks = ', '.join(map(str, r['ks']))
        line = (f"| {r['backend']} | {r['num_samples']} | {ks} | {_seconds(r['kmeans_s'])} | "
                f"{_seconds(r['confidence_s'])} | {_seconds(r['total_s'])} |")
        if sharded:
            extra = (f" {r['speedup']:.2f}x | {'yes' if r['same_labels'] else 'NO'} |"
                     if 'speedup' in r else ' | |')
            line += f" {r['processes']} |" + extra
        lines.append(line)
    return '\n'.join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the benchmark, print the table, optionally write JSON; returns the results."""
    args = parse_args(argv)
    result = run_benchmark(args)
    return report_results(result, markdown_table(result), args.out)


if __name__ == '__main__':
    main(sys.argv[1:])
