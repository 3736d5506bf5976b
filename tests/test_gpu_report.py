"""benchmarks/gpu_report.py: its commands checked on a CPU (--dry-run), its report, its saved parts;
and the CUDA-only checks it runs (skipped without CUDA)."""
import contextlib
import io
import json
import os
import os.path as osp
import re
import sys
import time
import types

import numpy as np
import pytest
import torch
from fake_data import rgb_image

from benchmarks import gpu_figures, gpu_parts, gpu_report

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')


def test_dry_run_checks_every_command_and_renders_the_report(tmp_path, capsys):
    report = gpu_report.main(['--dry-run', '--out-dir', str(tmp_path / 'r')])
    out = capsys.readouterr().out
    for part in gpu_parts.parts(str(tmp_path / 'r')):
        assert f'[{part.name}] ok: ' in out
    for label, goal, op, unit in gpu_figures.GOALS.values():
        assert f'| {label} |' in report and f'{op} {goal:,g} {unit}' in report
    assert 'not measured' not in report and '| NO |' not in report
    assert '| compiled, bf16 | 4,200 | 4,150 | 1.012 |' in report
    assert '| compiled, bf16 | 1,300 | 1,285 | 1.012 | 75.0 / 1.0 |' in report  # the ViT step
    assert not (tmp_path / 'r').exists()  # nothing run, nothing written


def test_dry_run_names_a_part_whose_arguments_its_script_refuses(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_parts, 'STEP_ARGS', [*gpu_parts.STEP_ARGS, '--no-such-flag'])
    with pytest.raises(SystemExit, match='step_eager_fp32: benchmarks/step_cost.py refuses'):
        gpu_report.main(['--dry-run', '--parts', 'step_eager_fp32', '--out-dir', str(tmp_path)])


def test_missing_and_failing_figures_are_shown_against_their_goals():
    results = gpu_figures.fake_results(gpu_parts.parts('w'))
    del results['clustering']
    results['fmnist_full']['result']['rows'][0]['images_per_s'] = 1000.0
    report = gpu_figures.render(results, 'NVIDIA H100 80GB HBM3')
    assert report.startswith('# GPU report: NVIDIA H100 80GB HBM3')
    assert '| clustering round, 1.28M x 128, k = 1k/3k/10k | not measured s | <= 10 s | - |' in report
    assert '| end to end, Fashion-MNIST (device views) | 1,000.0 img/s | >= 25,000 img/s | NO |' in report


def test_the_vit_step_is_shown_against_its_goal_beside_timms_published_bound():
    """MoCo v3 and IFND-on-MoCo-v3 img/s and their ratio, its goal met or not; timm's RTX 3090 figure
    for ViT-S/16 named with its file, and the MoCo v3 bound it gives on that GPU (not on this one)."""
    results = gpu_figures.fake_results(gpu_parts.parts('w'))
    vit = results['vit_step']['result']
    vit['variants']['IFNDMoCoV3']['images_per_s'] = 1200.0
    vit['ratios']['IFNDMoCoV3/MoCoV3']['ratio_of_medians'] = 1.083
    report = gpu_figures.render(results, 'NVIDIA H100 80GB HBM3')
    assert ('| IFNDMoCoV3 / MoCo v3 step time, ViT-S/16 compiled bf16 | 1.083 x | <= 1.02 x | NO |'
            in report)
    assert '| compiled, bf16 | 1,300 | 1,200 | 1.083 | 75.0 / 1.0 |' in report
    assert ('timm publishes 1,052.92 train samples/s for `vit_small_patch16_224` on an RTX 3090 '
            '(`results/benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv`' in report)
    assert '4 forwards and 2 backwards' in report and 'at most about 395 img/s' in report
    assert 'not scaled to this one' in report
    del results['vit_step']
    report = gpu_figures.render(results, 'NVIDIA H100 80GB HBM3')
    assert '| IFNDMoCoV3 / MoCo v3 step time, ViT-S/16 compiled bf16 | not measured x |' in report
    assert '| compiled, bf16 | 1,300 |' not in report and 'at most about 395 img/s' in report


def test_junit_counts_the_host_sync_tests_apart(tmp_path):
    (tmp_path / 'j.xml').write_text(
        '<testsuites><testsuite tests="4">'
        '<testcase name="test_training_step_makes_no_host_sync[IFND]"/>'
        '<testcase name="test_device_view_train_step_makes_no_host_sync[a]"><failure/></testcase>'
        '<testcase name="test_other"><skipped/></testcase><testcase name="test_x"/>'
        '</testsuite></testsuites>')
    assert gpu_report.junit_counts(str(tmp_path / 'j.xml')) == dict(
        passed=2, failed=1, skipped=1, sync_passed=1, sync_failed=1)


def test_saved_parts_are_kept_unless_forced(monkeypatch, tmp_path):
    """A re-run runs only the parts without a saved result; --force runs them again."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda *a: 'Fake GPU')
    fake = gpu_figures.fake_results(gpu_parts.parts(str(tmp_path)))
    ran = []

    def run_part(part, out_dir):
        ran.append(part.name)
        from ifnd.fileio import write_json
        write_json(fake[part.name], osp.join(out_dir, f'{part.name}.json'))
        return fake[part.name]

    monkeypatch.setattr(gpu_report, 'run_part', run_part)
    (tmp_path / 'cuda_tests.json').write_text(json.dumps(fake['cuda_tests']))
    gpu_report.main(['--out-dir', str(tmp_path), '--parts', 'cuda_tests', 'clustering'])
    assert ran == ['clustering']
    report = (tmp_path / 'report.md').read_text()
    assert '# GPU report: Fake GPU' in report and '| clustering |' in report and '| cuda_tests |' in report
    gpu_report.main(['--out-dir', str(tmp_path), '--parts', 'cuda_tests', '--force'])
    assert ran == ['clustering', 'cuda_tests']
    # A rehearsal's toy result is no GPU result: the real run measures that part again.
    (tmp_path / 'clustering.json').write_text(json.dumps(dict(fake['clustering'], rehearsal=True)))
    gpu_report.main(['--out-dir', str(tmp_path), '--parts', 'cuda_tests', 'clustering'])
    assert ran == ['clustering', 'cuda_tests', 'clustering']


def test_the_parts_expected_costs_fit_the_default_budget():
    """The five most valuable parts fit the default seven minutes (costs measured on an H200, or
    estimated where a part has not run yet); a second call of the same length runs the last five."""
    all_parts = gpu_parts.parts('w')
    assert [p.name for p in all_parts] == [
        'cuda_tests', 'fmnist_full', 'step_profile', 'step_compiled_bf16', 'jpeg_folder', 'vit_step',
        'clustering', 'step_eager_bf16', 'step_eager_fp32', 'step_compiled_fp32']
    assert sum(p.expected_s for p in all_parts[:5]) <= gpu_parts.BUDGET_S == 420
    assert sum(p.expected_s for p in all_parts[:6]) > gpu_parts.BUDGET_S
    assert sum(p.expected_s for p in all_parts[5:]) <= gpu_parts.BUDGET_S
    assert gpu_report.parse_args([]).budget == 420
    assert [p.name for p in gpu_parts.parts('w', rehearse=True)] == [p.name for p in all_parts]


def test_a_small_budget_skips_the_later_parts_and_names_them(monkeypatch, tmp_path, capsys):
    """Parts start while their expected cost fits what is left, each limited to that; a second run
    with the same budget completes the rest."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda *a: 'Fake GPU')
    fake = gpu_figures.fake_results(gpu_parts.parts(str(tmp_path)))
    limits = {}

    def run_part(part, out_dir):  # takes exactly its expected time
        limits[part.name] = part.timeout_s
        result = dict(fake[part.name], wall_s=float(part.expected_s), rehearsal=False)
        from ifnd.fileio import write_json
        write_json(result, osp.join(out_dir, f'{part.name}.json'))
        return result

    monkeypatch.setattr(gpu_report, 'run_part', run_part)
    report = gpu_report.main(['--out-dir', str(tmp_path), '--budget', '200'])
    out = capsys.readouterr().out
    assert re.search(r'cuda_tests +45 s +cumulative +45 s', out)  # the plan, before any part
    assert out.index('Plan:') < out.index('[step_eager_bf16] skipped')
    # 45 + 85 + 60 spent, 10 s left: no later part fits.
    assert limits == dict(cuda_tests=135, fmnist_full=155, step_profile=70)
    later = ['step_compiled_bf16', 'jpeg_folder', 'vit_step', 'clustering', 'step_eager_bf16',
             'step_eager_fp32', 'step_compiled_fp32']
    for name in later:
        assert f'| {name} | ' in report and f'[{name}] skipped: expected' in out
    assert '| jpeg_folder | 120 s | skipped: budget (10 s left) | - | - | - |' in report
    assert f"Skipped for the budget (--budget 200 s): {', '.join(later)}. Run the same command again" in report
    assert '| step_profile | 60 s | ran | 0 | 60 s |' in report
    limits.clear()
    report = gpu_report.main(['--out-dir', str(tmp_path), '--budget', '200'])
    # step_compiled_bf16 leaves 90 s: jpeg_folder (120) and vit_step (130) wait, clustering and the
    # eager bf16 step (25 + 25) fit, 40 s left.
    assert list(limits) == ['step_compiled_bf16', 'clustering', 'step_eager_bf16']
    assert '| cuda_tests | 45 s | saved |' in report
    assert 'budget (--budget 200 s): jpeg_folder, vit_step, step_eager_fp32, step_compiled_fp32.' in report


@pytest.fixture(scope='module')
def rehearsal(tmp_path_factory):
    """One --rehearse run (every part's script at toy sizes on the CPU, about a minute), shared by the
    tests that read its report and its parts' real output."""
    out_dir = tmp_path_factory.mktemp('rehearsal')
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        report = gpu_report.main(['--rehearse', '--out-dir', str(out_dir)])
    results = {part.name: json.loads((out_dir / f'{part.name}.json').read_text())
               for part in gpu_parts.parts(str(out_dir), rehearse=True)}
    return types.SimpleNamespace(out_dir=out_dir, report=report, out=printed.getvalue(),
                                 results=results)


def test_the_rehearsal_runs_every_part_on_the_cpu_and_renders_the_report(rehearsal):
    """--rehearse: every part's script at toy sizes, the same result files and report, marked."""
    report, results, out_dir = rehearsal.report, rehearsal.results, rehearsal.out_dir
    for part in gpu_parts.parts(str(out_dir), rehearse=True):
        assert gpu_report.succeeded(part.name, results[part.name], rehearsal=True), (
            part.name, (out_dir / f'{part.name}.log').read_text()[-3000:])
        assert f'| {part.name} | {part.expected_s} s | ran | 0 |' in report
    assert report.startswith('# GPU report rehearsal: CPU') and '**Rehearsal**' in report
    assert report == (out_dir / 'report.md').read_text()
    assert 'Plan: 10 part(s), no budget' in rehearsal.out
    figures = gpu_figures.figures(results)
    # The CUDA tests are collected and skipped: no host-sync figure; every other one was measured.
    assert [k for k, v in figures.items() if v is None] == ['syncs']
    assert results['cuda_tests']['tests']['skipped'] > 40 and results['cuda_tests']['tests']['passed'] == 0
    for label, goal, op, unit in gpu_figures.GOALS.values():
        assert f'| {label} | ' in report
    assert '| yes |' not in report and '| NO |' not in report  # toy figures are not held to the goals
    for variant in ('compiled, bf16', 'compiled, fp32', 'eager, bf16', 'eager, fp32'):
        assert f'| {variant} | ' in report
    # The ViT part ran MoCo v3 and IFND on it, a one-block ViT compiled by the 'eager' backend.
    vit = results['vit_step']['result']
    assert set(vit['variants']) == {'MoCoV3', 'IFNDMoCoV3'} and vit['settings']['compile']
    assert vit['settings']['backbone_options']['depth'] == 1 and vit['settings']['optimizer'] == 'AdamW'
    assert report.count('| compiled, bf16 | ') == 2  # the ResNet-50 and the ViT step
    assert 'nredo 1' in report and 'CUDA-only tests: 0 passed, 0 failed' in report


def test_a_relative_out_dir_is_made_absolute(monkeypatch, tmp_path):
    """The parts run with the repository as their working directory; the report reads from its own."""
    monkeypatch.chdir(tmp_path)
    args = gpu_report.parse_args(['--out-dir', 'rel/report'])
    assert args.out_dir == str(tmp_path / 'rel' / 'report')


def _fails_fast(part, result_path):
    return [sys.executable, '-c', 'raise SystemExit(3)']


def test_a_crashed_part_reads_back_no_earlier_result(monkeypatch, tmp_path):
    """An earlier run's raw files are removed first, and a failed script part measures nothing."""
    monkeypatch.setattr(gpu_report, 'command', _fails_fast)
    fake = gpu_figures.fake_results(gpu_parts.parts(str(tmp_path)))
    step = gpu_parts.Part('step_compiled_bf16', 'step_cost.py', [], 60)
    (tmp_path / 'step_compiled_bf16.raw.json').write_text(json.dumps(fake['step_compiled_bf16']['result']))
    tests = gpu_parts.Part('cuda_tests', 'pytest', [], 60)
    (tmp_path / 'cuda_tests.raw.json.xml').write_text('<testsuites><testsuite><testcase name="t"/>'
                                                     '</testsuite></testsuites>')
    results = dict(fake, step_compiled_bf16=gpu_report.run_part(step, str(tmp_path)),
                   cuda_tests=gpu_report.run_part(tests, str(tmp_path)))
    assert results['step_compiled_bf16']['returncode'] == 3 and 'result' not in results['step_compiled_bf16']
    assert 'tests' not in results['cuda_tests']
    assert not list(tmp_path.glob('*.raw.json*'))
    # Even with a result left in it, a part that exited non-zero gives no figure.
    results['step_compiled_bf16'] = dict(fake['step_compiled_bf16'], returncode=1)
    results['cuda_tests'] = dict(fake['cuda_tests'], returncode=1)  # failed tests are still a result
    figures = gpu_figures.figures(results)
    assert figures['step'] is None and figures['ratio'] is None
    assert figures['syncs'] == 0.0 and figures['clustering'] == 7.5


def _process_gone(pid: int) -> bool:
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] == 'Z'  # a zombie waiting to be reaped
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='reads /proc')
def test_a_timeout_ends_the_processes_the_part_started(monkeypatch, tmp_path):
    """throughput.py starts tools/train.py: a timeout must not leave it running on the GPU."""
    pid_file = tmp_path / 'grandchild.pid'
    monkeypatch.setattr(gpu_report, 'command', lambda part, path: [
        'sh', '-c', f'sleep 60 & echo $! > {pid_file}; wait'])
    result = gpu_report.run_part(gpu_parts.Part('jpeg_folder', 'throughput.py', [], 1, timeout_s=2), str(tmp_path))
    assert result['returncode'] == 'timeout'
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while not _process_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _process_gone(pid)


def test_failed_and_timed_out_parts_run_again(monkeypatch, tmp_path):
    """Only a part that succeeded is skipped on a re-run; failing CUDA tests count as a result."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda *a: 'Fake GPU')
    fake = gpu_figures.fake_results(gpu_parts.parts(str(tmp_path)))
    ran = []
    monkeypatch.setattr(gpu_report, 'run_part', lambda part, out_dir: ran.append(part.name) or fake[part.name])
    saved = {'cuda_tests': dict(returncode='timeout', wall_s=300.0, log='l'),
             'clustering': dict(fake['clustering'], returncode=1),
             'fmnist_full': dict(fake['fmnist_full'], returncode='timeout'),
             'step_eager_fp32': fake['step_eager_fp32'],
             'jpeg_folder': fake['jpeg_folder']}
    for name, result in saved.items():
        (tmp_path / f'{name}.json').write_text(json.dumps(result))
    gpu_report.main(['--out-dir', str(tmp_path), '--parts', *saved])
    assert ran == ['cuda_tests', 'fmnist_full', 'clustering']  # in the parts' order
    (tmp_path / 'cuda_tests.json').write_text(json.dumps(dict(fake['cuda_tests'], returncode=1)))
    ran.clear()
    gpu_report.main(['--out-dir', str(tmp_path), '--parts', 'cuda_tests'])
    assert ran == []


def test_the_figures_are_read_from_the_benchmarks_real_output(rehearsal):
    """step_cost.py and clustering_cost.py at toy sizes on the CPU (the rehearsal's parts): every key
    the report reads exists."""
    results = {name: dict(result=rehearsal.results[name]['result'], returncode=0)
               for name in ('step_compiled_bf16', 'vit_step', 'clustering')}
    figures = gpu_figures.figures(results)
    assert {k: figures[k] is not None for k in ('step', 'ratio', 'vit_ratio', 'clustering')} == dict(
        step=True, ratio=True, vit_ratio=True, clustering=True)
    assert figures['step'] > 0 and figures['ratio'] > 0 and figures['vit_ratio'] > 0 and figures['clustering'] > 0


def test_without_cuda_the_report_is_refused_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    with pytest.raises(SystemExit, match='needs a CUDA device.*--dry-run'):
        gpu_report.main(['--out-dir', str(tmp_path)])


def _jpegs(tmp_path, sizes, subsampling: int = 0) -> list[str]:
    paths = []
    tmp_path.mkdir(parents=True, exist_ok=True)
    for i, (w, h) in enumerate(sizes):
        paths.append(str(tmp_path / f'{i}.jpg'))
        rgb_image(i, (w, h)).save(paths[-1], quality=90, subsampling=subsampling)
    return paths


@needs_cuda
def test_nvjpeg_on_a_side_stream_is_ordered_before_the_callers_work(tmp_path):
    """Decoded on the device from a non-default caller stream: the caller's next kernels see the
    pixels (no host wait between), which match the CPU decoder's."""
    from ifnd.datasets.decode import decode_images
    # 4:4:4, so that pixels compare: nvJPEG upsamples subsampled chroma differently from libjpeg-turbo
    # (measured on an H200: mean |difference| 12.9 on 4:2:0 noise, where only the images' means agree).
    paths = _jpegs(tmp_path, [(64, 48), (33, 71), (120, 90)])
    paths += _jpegs(tmp_path / 'subsampled', [(64, 48)], subsampling=2)
    encoded = [torch.from_numpy(np.fromfile(p, np.uint8)) for p in paths]
    cpu = decode_images(encoded, paths, 'cpu')
    caller = torch.cuda.Stream()
    with torch.cuda.stream(caller):
        decoded = decode_images(encoded, paths, 'cuda')
        sums = torch.stack([img.float().mean() for img in decoded])  # queued on the caller stream
    caller.synchronize()
    for i, (img, ref, total) in enumerate(zip(decoded, cpu, sums.cpu())):
        assert img.is_cuda and img.shape == ref.shape
        if i < 3:
            assert (img.cpu().float() - ref.float()).abs().mean() < 2.0
        assert abs(float(total) - ref.float().mean().item()) < 2.0


@needs_cuda
def test_preprocessor_makes_device_views_of_jpegs_on_cuda(tmp_path):
    """The CUDA branch of the data preprocessor: JPEG files in, normalised views on the GPU out."""
    from ifnd.datasets import ImageFolder
    from ifnd.datasets.base import batch_collate
    from ifnd.models.data_preprocessor import ContrastiveDataPreprocessor
    for c in range(2):
        (tmp_path / f'c{c}').mkdir()
        _jpegs(tmp_path / f'c{c}', [(40, 30), (50, 64)])
    pipeline = dict(type='MultiView', num_views=2, transforms=dict(type='MoCoV2View', size=32))
    ds = ImageFolder(str(tmp_path), pipeline=pipeline, augment_on='device')
    batch = batch_collate(ds.__getitems__(list(range(len(ds)))))
    out = ContrastiveDataPreprocessor().cuda()(batch, True)
    assert [(tuple(v.shape), v.device.type) for v in out['inputs']] == [((4, 3, 32, 32), 'cuda')] * 2
    assert all(torch.isfinite(v).all() for v in out['inputs'])
    assert out['data_samples']['label'].tolist() == ds.labels.tolist()


def test_dry_run_refuses_an_out_dir_that_is_a_file(tmp_path):
    (tmp_path / 'a_file').write_text('')
    for out_dir in (tmp_path / 'a_file', tmp_path / 'a_file' / 'r'):
        with pytest.raises(SystemExit) as exit_info:
            gpu_report.main(['--dry-run', '--parts', 'clustering', '--out-dir', str(out_dir)])
        assert str(exit_info.value.code) == (f'error: --out-dir {out_dir}: {tmp_path / "a_file"} is '
                                             'a file, not a folder; choose another --out-dir')


def test_dry_run_refuses_an_out_dir_in_a_read_only_folder(tmp_path):
    locked = tmp_path / 'locked'
    locked.mkdir(mode=0o500)
    if os.access(locked, os.W_OK):  # root writes anywhere: a read-only file system is refused alike
        pytest.skip('this user may write a read-only folder')
    with pytest.raises(SystemExit, match=f'{locked} is not writable'):
        gpu_report.main(['--dry-run', '--parts', 'clustering', '--out-dir', str(locked / 'r')])
