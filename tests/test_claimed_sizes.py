"""Every size a file can claim is bounded before anything is built: a checkpoint's config (ViT
depth, widths, heads, patch grid, image size, MLP ratio; ResNet widths and stem), the keys of bare
weights (block numbers, how many) and the shapes of its tensors (an expanded view claims gigabytes in
bytes). Each claim is read by the encoder loader in one fresh process, which measures the time and
the peak memory (``ru_maxrss``) of each reading: each is refused, naming the claim, in under 10 s
and 1 GB, where a million ViT blocks took 110-170 s and 2.8 GB."""
import json
import os
import os.path as osp
import re
import subprocess
import sys

import pytest

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
SECONDS, BYTES = 10.0, 1 << 30

# Claim -> (how the file makes it, what the refusal names). A config's claim stands beside the
# small network's own weights in a backbone-only file (meta['model']); a bare file holds weights
# alone. Each reader falls back to the weights (the config's claims), or refuses them (the keys').
CLAIMS = {
    'vit depth': ("config", dict(depth=2 ** 20), 'model.backbone.depth=1048576 is not a whole number from 1 to 256'),
    'vit embed_dim': ("config", dict(embed_dim=2 ** 20, num_heads=2 ** 20),
                      'MLP of 4.19e+06 features'),
    'vit width x depth': ("config", dict(embed_dim=8192, num_heads=8, depth=256),
                          'ViTBackbone would need'),
    'vit num_heads': ("config", dict(num_heads=2 ** 20), 'num_heads=1048576 does not divide embed_dim=32'),
    'vit num_heads 0': ("config", dict(num_heads=0), 'model.backbone.num_heads=0 is not a whole number'),
    'vit img_size (patch grid)': ("config", dict(img_size=2 ** 20), 'ViTBackbone would need'),
    'vit patch_size': ("config", dict(patch_size=2 ** 20), 'patch_size=1048576 is larger than img_size=16'),
    'vit mlp_ratio': ("config", dict(mlp_ratio=1e30), 'mlp_ratio=1e+30 at embed_dim=32'),
    'resnet channels': ("resnet config", dict(channels=(8, 16, 32, 2 ** 20)), 'would need'),
    'resnet stem_width': ("resnet config", dict(cifar_stem=False, stem_type='deep', stem_width=2 ** 20),
                          'would need'),
    'resnet in_chans': ("resnet config", dict(in_chans=2 ** 20), 'would need'),
    'vit block number': ("keys", 'blocks.999999.norm1.weight', 'blocks.999999.* claims 1000000 transformer blocks'),
    'vit number of blocks': ("keys", 300, 'claims 300 transformer blocks, more than the 256'),
    'resnet block number': ("keys", 'layer1.999999.conv1.weight', 'ResNet'),
    'vit expanded pos_embed': ("expanded", 'pos_embed', 'pos_embed has shape (1, 1073741824, 32)'),
    'resnet expanded conv': ("expanded", 'conv1.weight', 'conv1.weight has shape (1048576, 3, 3, 3) (0.1 GB) but the file holds 4 bytes'),
}

PROBE = r'''
import json, os, resource, sys, time
import torch
from mmengine.registry import init_default_scope
import ifnd
from ifnd.models import architecture, load_encoder
from ifnd.registry import MODELS
init_default_scope('ifnd')
claims, folder = json.loads(sys.argv[1]), sys.argv[2]
VIT = dict(type='ViTBackbone', model_name='vit_tiny_patch16_224', img_size=16, patch_size=4,
           embed_dim=32, depth=2, num_heads=2)
RESNET = dict(type='TimmBackbone', model_name='resnet18', cifar_stem=True, channels=(8, 16, 32, 64))
bodies = {name: MODELS.build(cfg).model.state_dict() for name, cfg in (('vit', VIT), ('resnet', RESNET))}
lines = []
architecture.print_log = lambda msg, **kwargs: lines.append(msg)

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

def write(name, content):
    path = os.path.join(folder, name.replace(' ', '_') + '.pth')
    torch.save(content, path)
    return path

def file_of(kind, claim):
    vit = not kind.startswith('resnet') and not (kind != 'config' and str(claim).startswith(('layer', 'conv')))
    body = dict(bodies['vit' if vit else 'resnet'])
    if kind.endswith('config'):
        backbone = dict(VIT if vit else RESNET, **claim)
        return {'state_dict': body, 'meta': {'model': {'backbone': backbone}}}
    if kind == 'keys' and isinstance(claim, int):  # every block's keys, more blocks than a ViT has
        block = {k[len('blocks.0.'):]: v for k, v in body.items() if k.startswith('blocks.0.')}
        body.update({f'blocks.{i}.{k}': v for i in range(claim) for k, v in block.items()})
    elif kind == 'keys':
        body[claim] = body[claim.replace('999999', '0')]
    else:  # a stride-0 view: four bytes in the file, gigabytes in its shape
        shape = (1, 2 ** 30, 32) if vit else (2 ** 20, 3, 3, 3)
        body[claim] = torch.zeros(1).expand(*shape)
    return {'state_dict': body}

# The readers once on a file that needs no refusal: their imports and caches are not a claim's cost.
load_encoder(write('plain', {'state_dict': bodies['vit']}), num_heads=2)
start = peak()
for name, (kind, claim, _) in claims.items():
    path = write(name, file_of(kind, claim))
    del lines[:]
    tic = time.perf_counter()
    try:
        load_encoder(path, num_heads=None if name.startswith('resnet') else 2)
        said = ' '.join(lines)
    except ValueError as err:
        said = str(err)
    seconds = time.perf_counter() - tic
    print(json.dumps(dict(name=name, seconds=seconds, said=said, grown=peak() - start)), flush=True)
print(json.dumps(dict(name='baseline', start=start)), flush=True)
'''


@pytest.fixture(scope='module')
def readings(tmp_path_factory):
    """Each claim's reading in one fresh process: seconds, what was said, peak memory grown."""
    folder = tmp_path_factory.mktemp('claims')
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''),
               OMP_NUM_THREADS='1')
    out = subprocess.run([sys.executable, '-c', PROBE, json.dumps(CLAIMS), str(folder)], cwd=REPO,
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{')]
    return {row['name']: row for row in rows}


@pytest.mark.parametrize('name', list(CLAIMS))
def test_a_claimed_size_is_refused_in_seconds_and_little_memory(readings, name):
    reading = readings[name]
    assert CLAIMS[name][2] in reading['said'], reading['said']
    assert reading['seconds'] < SECONDS, reading
    # The peak of the whole process after the readers' warm-up bounds every claim's reading.
    assert reading['grown'] < BYTES, f'{name}: the peak memory grew {reading["grown"] / 1e9:.2f} GB'


@pytest.mark.parametrize('flag, said', [
    ('--depth=1000000000', r'ViTBackbone depth must be an int in \[1, 256\], got 1000000000'),
    ('--embed-dim=1000000000', r'ViTBackbone embed_dim must be an int in \[1, 1048576\]'),
    ('--num-heads=5', 'ViTBackbone num_heads=5 does not divide embed_dim=96'),
])
def test_the_harness_refuses_vit_sizes_with_the_models_own_bound(flag, said, tmp_path):
    """benchmarks/false_negatives.py --dry-run: the model's bound, in one line, before any run."""
    import importlib
    harness = importlib.import_module('benchmarks.false_negatives')
    with pytest.raises(SystemExit) as refused:
        harness.main(['--preset', 'vit', flag, '--dry-run', '--work-dir', str(tmp_path)])
    message = str(refused.value.code)
    assert re.search(f'^error: simclr: .*{said}', message) and '\n' not in message, message
