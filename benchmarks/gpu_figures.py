"""The GPU report itself: each figure read from the parts' results, beside its goal, and the
Markdown of the whole report (every step variant, the ViT step beside timm's published bound, the
step's parts, the JPEG decoder, each part's state); made-up results in each part's format for
``--dry-run``.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from benchmarks.gpu_parts import BUDGET_S, Part

GOALS = {
    'step': ('ResNet-50 IFNDMoCo step, compiled bf16', 4000.0, '>=', 'img/s'),
    'ratio': ('IFNDMoCo / MoCo v2 step time, compiled bf16', 1.02, '<=', 'x'),
    'vit_ratio': ('IFNDMoCoV3 / MoCo v3 step time, ViT-S/16 compiled bf16', 1.02, '<=', 'x'),
    'syncs': ('training steps with a host sync (sync-debug tests failed)', 0.0, '<=', ''),
    'clustering': ('clustering round, 1.28M x 128, k = 1k/3k/10k', 10.0, '<=', 's'),
    'fmnist': ('end to end, Fashion-MNIST (device views)', 25000.0, '>=', 'img/s'),
    'ops': ('operators dispatched a step, Fashion-MNIST recipe', 300.0, '<=', ''),
    'jpeg': ('end to end, the ImageNet recipe on a JPEG folder at 224 px', 4000.0, '>=', 'img/s'),
    'jpeg_ratio': ('JPEG end to end / the step alone (IFNDMoCo, compiled bf16)', 0.95, '>=', 'x'),
}
# timm's published training throughput of ViT-S/16 on the only GPU it publishes training figures for:
# train_samples_per_sec of vit_small_patch16_224 in huggingface/pytorch-image-models'
# results/benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv (batch 384, 224 px, AMP, PyTorch 1.12,
# CUDA 11.3), a supervised step of one forward and one backward per image.
TIMM_VIT_S_TRAIN = ('results/benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv', 'RTX 3090', 1052.92)
# A MoCo v3 step encodes both views forward and backward and the momentum encoder both forward: 4
# forwards and 2 backwards an image against 1 and 1; with a backward at about two forwards, 8 forwards'
# work against 3 (the 4096-wide heads add about 0.5% to ViT-S/16's 4.6 GMACs).
MOCOV3_WORK = 8 / 3


def figures(results: dict) -> dict[str, float | None]:
    """The goal figures found in the parts' results (None where a part is missing or failed)."""
    def get(part: str, read: Callable[[dict], float]) -> float | None:
        # A failed script measured nothing; failed CUDA tests still count (they are the figure).
        if part != 'cuda_tests' and results.get(part, {}).get('returncode') != 0:
            return None
        try:
            return float(read(results[part]))
        except (KeyError, TypeError, IndexError, ValueError, StopIteration, ZeroDivisionError):
            return None

    return {
        'step': get('step_compiled_bf16', lambda r: r['result']['variants']['IFNDMoCo']['images_per_s']),
        'ratio': get('step_compiled_bf16', lambda r: r['result']['ratios']['IFNDMoCo/MoCoV2']['ratio_of_medians']),
        'vit_ratio': get('vit_step', lambda r: r['result']['ratios']['IFNDMoCoV3/MoCoV3']['ratio_of_medians']),
        # The sync-debug tests raise at the first host sync of a step: 0 failed of > 0 run is 0 syncs.
        'syncs': get('cuda_tests', lambda r: r['tests']['sync_failed'] if r['tests']['sync_passed']
                     + r['tests']['sync_failed'] else None),
        'clustering': get('clustering', lambda r: r['result']['rows'][0]['total_s']),
        'fmnist': get('fmnist_full', lambda r: next(x['images_per_s'] for x in r['result']['rows']
                                                    if x['views'] == 'device')),
        'ops': get('step_profile', lambda r: r['result']['ops_per_step']),
        'jpeg': get('jpeg_folder', lambda r: next(x['images_per_s'] for x in r['result']['rows']
                                                  if x['views'] == 'device')),
        'jpeg_ratio': get('jpeg_folder', lambda r: next(x['images_per_s'] for x in r['result']['rows']
                                                        if x['views'] == 'device')
                          / results['step_compiled_bf16']['result']['variants']['IFNDMoCo']['images_per_s']),
    }


def render(results: dict, device: str, all_parts: Sequence[Part] = (), skipped: dict[str, float] | None = None,
           budget_s: float = BUDGET_S, rehearsal: bool = False) -> str:
    """The Markdown report: device, each figure beside its goal, every step-cost variant, the step's
    parts (operators, GPU time), the JPEG decoder, each part's state.

    ``skipped``: the parts left out for the budget, with the seconds that were left of it.
    """
    if rehearsal:
        lines = [f'# GPU report rehearsal: {device}', '',
                 '**Rehearsal**: every part ran on the CPU at toy sizes (`--rehearse`), to check the parts '
                 'and this report. No figure below is a GPU figure or says anything about its goal.', '']
    else:
        lines = [f'# GPU report: {device}', '']
    lines += [f'torch {torch.__version__}', '', '| Figure | Measured | Goal | Met |', '|---|---:|---:|:---:|']
    for key, value in figures(results).items():
        label, goal, op, unit = GOALS[key]
        met = ('-' if value is None or rehearsal else
               'yes' if (value >= goal if op == '>=' else value <= goal) else 'NO')
        shown = 'not measured' if value is None else f'{value:,.3f}' if unit == 'x' else f'{value:,.1f}'
        lines.append(f'| {label} | {shown} {unit} | {op} {goal:,g} {unit} | {met} |')
    nredo = results.get('clustering', {}).get('result', {}).get('settings', {}).get('nredo')
    if nredo is not None:
        lines += ['', f'The clustering round restarts k-means {nredo} time(s) per level (nredo {nredo}); the '
                  'configs use 5, and the k-means time grows in proportion.']
    lines += _step_lines(results) + _vit_lines(results) + _profile_lines(results)
    tests = results.get('cuda_tests', {}).get('tests')
    if tests:
        lines += ['', f"CUDA-only tests: {tests['passed']} passed, {tests['failed']} failed, "
                  f"{tests['skipped']} skipped."]
    return '\n'.join(lines + _part_lines(results, all_parts, skipped or {}, budget_s)) + '\n'


def _step_lines(results: dict) -> list[str]:
    """The step-cost variants, one row each."""
    lines = ['', '| Step variant | MoCo v2 img/s | IFNDMoCo img/s | IFNDMoCo / MoCo v2 | '
             'Warm-up s (MoCo v2 / IFNDMoCo) |', '|---|---:|---:|---:|---:|']
    for name in sorted(r for r in results if r.startswith('step_') and r != 'step_profile'):
        res = results[name].get('result')
        if res:
            lines.append(_pair_row(name[5:].replace('_', ', '), res, 'MoCoV2', 'IFNDMoCo'))
    return lines


def _vit_lines(results: dict) -> list[str]:
    """The ViT step (MoCo v3 and IFND on it), then timm's published bound from another GPU."""
    source, gpu, samples_per_s = TIMM_VIT_S_TRAIN
    _, goal, op, _ = GOALS['vit_ratio']
    lines = ['', '| ViT-S/16 step, 224 px, batch 256 | MoCo v3 img/s | IFNDMoCoV3 img/s | '
             f'IFNDMoCoV3 / MoCo v3 (goal {op} {goal:g}) | Warm-up s (MoCo v3 / IFNDMoCoV3) |',
             '|---|---:|---:|---:|---:|']
    res = results.get('vit_step', {}).get('result')
    if res:
        lines.append(_pair_row('compiled, bf16', res, 'MoCoV3', 'IFNDMoCoV3'))
    return lines + [
        '', f'Known bound, from another GPU and not scaled to this one: timm publishes {samples_per_s:,.2f} '
        f'train samples/s for `vit_small_patch16_224` on an {gpu} (`{source}` in huggingface/pytorch-image-models: '
        'batch 384, 224 px, AMP, PyTorch 1.12), a supervised step of one forward and one backward per image. '
        "MoCo v3's step takes 4 forwards and 2 backwards of the encoder per image (both views, and the momentum "
        f'encoder on both), about {MOCOV3_WORK:.2f} times that work: on that GPU at most about '
        f'{samples_per_s / MOCOV3_WORK:,.0f} img/s. timm publishes training figures for no other GPU.']


def _pair_row(label: str, result: dict, base: str, ifnd: str) -> str:
    """One step variant's row: both algorithms' images/s, their step-time ratio, their warm-up seconds."""
    v, ratio = result['variants'], result['ratios'][f'{ifnd}/{base}']['ratio_of_medians']
    warm = ' / '.join('-' if v[k].get('warmup_s') is None else f"{v[k]['warmup_s']:.1f}" for k in (base, ifnd))
    return f"| {label} | {v[base]['images_per_s']:,.0f} | {v[ifnd]['images_per_s']:,.0f} | {ratio:.3f} | {warm} |"


def _profile_lines(results: dict) -> list[str]:
    """The Fashion-MNIST step by part (operators, GPU time, idle share, launches) and the JPEG decoder."""
    lines = []
    profile = results.get('step_profile', {}).get('result')
    if profile:
        from benchmarks.op_count import ops_table
        lines += ['', ops_table(profile)]
    decode = results.get('jpeg_folder', {}).get('result', {}).get('decode')
    if decode:
        from benchmarks.throughput import decode_line
        lines += ['', f'The ImageNet recipe on JPEGs. {decode_line(decode)}']
    return lines


def _part_lines(results: dict, all_parts: Sequence[Part], skipped: dict[str, float], budget_s: float
                ) -> list[str]:
    """Each part's expected cost, state, exit code, wall time and log; the parts skipped for the budget."""
    lines = ['', '| Part | Expected (one H100) | State | Exit code | Wall time | Log |',
             '|---|---:|---|---:|---:|---|']
    expected = {p.name: p.expected_s for p in all_parts}
    for name in [p.name for p in all_parts] + [r for r in results if r not in expected]:
        exp = f'{expected[name]} s' if name in expected else '-'
        r = results.get(name)
        if r is not None:
            state = 'saved' if r.get('kept') else 'ran'
            lines.append(f"| {name} | {exp} | {state} | {r['returncode']} | {r['wall_s']:.0f} s | {r['log']} |")
        elif name in skipped:
            lines.append(f'| {name} | {exp} | skipped: budget ({skipped[name]:.0f} s left) | - | - | - |')
        else:
            lines.append(f'| {name} | {exp} | not run (--parts) | - | - | - |')
    if skipped:
        lines += ['', f"Skipped for the budget (--budget {budget_s:g} s): {', '.join(skipped)}. Run the same "
                  'command again: the parts done are kept and these run.']
    return lines


def fake_results(all_parts: list[Part]) -> dict:
    """Made-up results in each part's real format, for --dry-run's rendering."""
    step = dict(variants={'MoCoV2': dict(images_per_s=4200.0, warmup_s=80.0),
                          'IFNDMoCo': dict(images_per_s=4150.0, warmup_s=1.0)},
                ratios={'IFNDMoCo/MoCoV2': dict(ratio_of_medians=1.012)})
    made = {'cuda_tests': dict(tests=dict(passed=40, failed=0, skipped=0, sync_passed=30, sync_failed=0)),
            'clustering': dict(result=dict(rows=[dict(total_s=7.5)], settings=dict(nredo=1))),
            'fmnist_full': dict(result=dict(rows=[dict(views='device', images_per_s=30000.0)])),
            'step_profile': dict(result=dict(
                config='configs/ifnd/ifnd_r18_200e_fmnist_device_aug.py', device='CUDA: Fake GPU', torch='2',
                compiled=False, batch_size=256, steps_counted=10, ops_per_step_min=150, ops_per_step_max=153,
                labels_accepted=True, ops_per_step=150, kernels_per_step=70,
                by_part=dict(data=3, augmentation=5, forward=23, loss=8, backward=105, optimizer=1, hooks=5),
                kernels_by_part=dict(data=2, augmentation=5, forward=22, loss=7, backward=33, optimizer=1, hooks=0),
                profile=dict(gpu_ms_per_step_by_part=dict(data=0.01, augmentation=0.3, forward=2.0, loss=0.4,
                                                          backward=3.5, optimizer=0.2, hooks=0.0),
                             gpu_ms_per_step=6.5, timeline_ms_per_step=7.0, gpu_idle_share=0.07,
                             launches_per_step=160.0, steps_profiled=8))),
            'vit_step': dict(result=dict(
                variants={'MoCoV3': dict(images_per_s=1300.0, warmup_s=75.0),
                          'IFNDMoCoV3': dict(images_per_s=1285.0, warmup_s=1.0)},
                ratios={'IFNDMoCoV3/MoCoV3': dict(ratio_of_medians=1.012)})),
            'jpeg_folder': dict(result=dict(rows=[dict(views='device', images_per_s=4100.0)],
                                            decode=dict(decoder='torchvision', device='cuda:0', images=256,
                                                        ms_per_batch=dict(torchvision=20.0))))}
    return {p.name: dict(made.get(p.name, dict(result=step)), returncode=0, wall_s=1.0, log=f'{p.name}.log')
            for p in all_parts}
