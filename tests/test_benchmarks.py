"""The step-cost and clustering-cost benchmarks run end to end with tiny settings."""
import importlib.util
import json
import os.path as osp
import re
import subprocess
import sys

import pytest
import torch

BENCHMARKS = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'benchmarks')


def _load(name):
    """Import benchmarks/<name>.py as a module (the folder is scripts, not a package)."""
    path = osp.join(BENCHMARKS, f'{name}.py')
    spec = importlib.util.spec_from_file_location(f'bench_{name}', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _restore_threads():
    """The benchmarks run with --threads 1 (tiny problems); give other tests their threads back."""
    threads = torch.get_num_threads()
    faiss = sys.modules.get('faiss')
    faiss_threads = faiss.omp_get_max_threads() if faiss is not None else None
    yield
    torch.set_num_threads(threads)
    if faiss_threads is not None:
        faiss.omp_set_num_threads(faiss_threads)


def _table_rows(text):
    """Cells of the Markdown table rows (header and separator rows excluded)."""
    rows = []
    for line in text.splitlines():
        if line.startswith('|') and not line.startswith('|---'):
            rows.append([cell.strip() for cell in line.strip('|').split('|')])
    return rows


STEP_ARGS = ['--batch-size', '4', '--image-size', '8', '--neck-hidden', '16', '--out-dim', '8',
             '--queue-len', '64', '--num-samples', '256', '--warmup', '1', '--repeats', '2',
             '--threads', '1', '--device', 'cpu']


def test_step_cost_table_and_json(tmp_path, capsys):
    out = tmp_path / 'step.json'
    result = _load('step_cost').main(STEP_ARGS + ['--out', str(out)])
    text = capsys.readouterr().out
    rows = {r[0]: r[1:] for r in _table_rows(text)}
    for name in ('SimCLR', 'IFND', 'MoCoV2', 'IFNDMoCo', 'IFND/SimCLR', 'IFNDMoCo/MoCoV2'):
        assert name in rows, text
        assert all(float(cell) > 0 for cell in rows[name]), rows[name]
    assert 'CPU' in text
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(result))
    assert set(saved['variants']) == {'SimCLR', 'IFND', 'MoCoV2', 'IFNDMoCo'}
    for v in saved['variants'].values():
        assert v['median_ms'] > 0 and v['steps_timed'] == 2
    for r in saved['ratios'].values():
        assert r['ratio_of_medians'] > 0 and r['median_paired_ratio'] > 0


def test_step_cost_label_bank_is_realistic():
    bench = _load('step_cost')
    labels = bench.realistic_labels([3, 7], 1000, 0.5, torch.Generator().manual_seed(0))
    assert labels.shape == (2, 1000)
    accepted = labels >= 0
    assert 0.4 < float(accepted.float().mean()) < 0.6
    assert int(labels[0][accepted[0]].max()) < 3 and int(labels[1][accepted[1]].max()) < 7
    unique = -(torch.arange(1000) + 1)
    assert torch.equal(labels[~accepted], unique.expand(2, -1)[~accepted])


def test_step_cost_one_pair():
    result = _load('step_cost').main(STEP_ARGS + ['--pairs', 'moco'])
    assert set(result['variants']) == {'MoCoV2', 'IFNDMoCo'}
    assert set(result['ratios']) == {'IFNDMoCo/MoCoV2'}


def test_clustering_cost_table_and_json(tmp_path, capsys):
    bench = _load('clustering_cost')
    out = tmp_path / 'clustering.json'
    result = bench.main(['--num-samples', '300', '600', '--ks', '3,5', '10', '--niter', '3',
                         '--dim', '16', '--threads', '1', '--device', 'cpu', '--out', str(out)])
    text = capsys.readouterr().out
    rows = _table_rows(text)[1:]  # minus the header
    backends = bench.available_backends()
    assert len(rows) == 2 * 2 * len(backends), text
    assert {r[0] for r in rows} == set(backends)
    assert {(r[1], r[2]) for r in rows} == {(n, ks) for n in ('300', '600')
                                           for ks in ('3, 5', '10')}
    for r in rows:
        kmeans_s, conf_s, total_s = map(float, r[3:6])
        assert kmeans_s > 0 and conf_s > 0
        assert total_s == pytest.approx(kmeans_s + conf_s, rel=0.02, abs=2e-3)
    saved = json.loads(out.read_text())
    assert len(saved['rows']) == len(result['rows']) == len(rows)
    # Half of the samples accepted per level at the default rate 0.5.
    assert all(r['accepted_per_level'] == r['num_samples'] / 2 for r in saved['rows'])


def test_clustering_cost_rejects_too_many_clusters():
    with pytest.raises(SystemExit):
        _load('clustering_cost').parse_args(['--num-samples', '50', '--ks', '100'])


@pytest.mark.parametrize('name', ['step_cost', 'clustering_cost', 'false_negatives'])
def test_help(name):
    proc = subprocess.run([sys.executable, osp.join(BENCHMARKS, f'{name}.py'), '--help'],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r'--out\b', proc.stdout)


def test_false_negatives_dry_run_commands(capsys):
    """Only the command lines (training is far too slow for the test suite)."""
    result = _load('false_negatives').main(['--dry-run', '--epochs', '3', '--subset', '0.1'])
    assert result == {}
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith('$ ')]
    assert len(commands) == 3
    for line, config in zip(commands, ('simclr_r18', 'ifnd_r18', 'supcon_r18')):
        assert config in line and 'tools/train.py' in line
        assert 'train_cfg.max_epochs=3' in line
        assert 'train_dataloader.dataset.subset_fraction=0.1' in line
        assert 'param_scheduler.1.T_max=' in line
    # The kNN hook is custom_hooks.1 in the IFND config (after PseudoLabelHook), .0 elsewhere.
    assert 'custom_hooks.1.interval=3' in commands[1]
    assert 'custom_hooks.0.interval=1' in commands[1]
    assert 'custom_hooks.0.interval=3' in commands[0]


def test_false_negatives_reads_results(tmp_path):
    bench = _load('false_negatives')
    old, new = tmp_path / '20240101_000000', tmp_path / '20240102_000000'
    for run, values in ((old, [(1, 10.0)]), (new, [(2, 50.0), (4, 61.5)])):
        (run / 'vis_data').mkdir(parents=True)
        lines = [json.dumps({'loss': 1.0, 'step': 3})]
        lines += [json.dumps({'knn/top1': top1, 'step': step}) for step, top1 in values]
        (run / 'vis_data' / 'scalars.json').write_text('\n'.join(lines) + '\n')
    top1, step, history = bench.final_knn_top1(str(tmp_path), None)
    assert (top1, step) == (61.5, 4) and len(history) == 2
    (tmp_path / 'pseudo_labels').mkdir()
    rounds = [{'epoch': e, 'rate': e / 4, 'levels': [{'k': 10, 'mtpr': 1.0 * e, 'mtnr': 99.0},
                                                    {'k': 100, 'mtpr': 0.5 * e, 'mtnr': 99.5}]}
              for e in (0, 2, 4)]
    (tmp_path / 'pseudo_labels' / 'rounds.json').write_text(json.dumps(rounds))
    last, used = bench.last_round(str(tmp_path), None)
    assert (last['epoch'], used['epoch']) == (4, 2)
    assert bench.pick_level(last, 'finest') == {'k': 100, 'mtpr': 2.0, 'mtnr': 99.5}
    assert bench.pick_level(last, 0)['k'] == 10
