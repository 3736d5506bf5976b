"""What the tests share: tiny configs on scikit-learn's digits for real, short Runner runs, gloo ranks,
scripts run as their command lines would, and mmengine's per-run instances kept apart."""
import contextlib
import copy
import io
import os
import os.path as osp
import re
import runpy
import socket
import subprocess
import sys
import traceback
import warnings

import torch
from mmengine.config import Config
from torch.utils._python_dispatch import TorchDispatchMode

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIG_DIR = osp.join(REPO, 'configs')


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for a gloo process group."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


# Imported once by the server that forks each test's ranks: a rank then starts in a fraction of a
# second instead of importing torch, mmengine and ifnd again (seconds each on two cores).
RANK_PRELOAD = ['torch', 'torch.distributed', 'mmengine.runner', 'ifnd.models', 'ifnd.hooks',
                'ifnd.clustering', 'pytest']


def run_ranks(worker, args: tuple, nprocs: int = 2) -> None:
    """Run ``worker(rank, *args)`` in ``nprocs`` new processes and wait for them all."""
    import multiprocessing

    import torch.multiprocessing as mp
    multiprocessing.set_forkserver_preload(RANK_PRELOAD)  # read when the server first starts
    mp.start_processes(worker, args=args, nprocs=nprocs, join=True, start_method='forkserver')



@contextlib.contextmanager
def own_mmengine_instances():
    """mmengine's loggers, visualisers and message hubs made inside are dropped at the end.

    mmengine keeps one of each per experiment name (the config's name and the second the run
    started) for the whole process: a run starting within the same second as an earlier one, from
    a config of the same name, would log into that run's files and captured output.
    """
    from mmengine.logging import MessageHub, MMLogger
    from mmengine.visualization import Visualizer

    kinds = (MMLogger, Visualizer, MessageHub)
    before = {kind: set(kind._instance_dict) for kind in kinds}
    try:
        yield
    finally:
        for kind in kinds:
            for name in set(kind._instance_dict) - before[kind]:
                instance = kind._instance_dict.pop(name)
                for handler in getattr(instance, 'handlers', []):
                    handler.close()  # the log file's descriptor


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def run_script(script: str, *args: str, cwd: str = REPO,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a Python script as its command line would, in this process (no new interpreter to start).

    What a separate process would show is kept: ``sys.argv``, ``sys.path``, the folder, the
    environment, the exit code (an uncaught exception prints its traceback and gives 1) and
    everything written to stdout and stderr, warnings included, each shown again however often it
    fired before.
    """
    path = osp.join(REPO, script)
    out, err = io.StringIO(), io.StringIO()
    code = 0
    saved = dict(argv=sys.argv, path=list(sys.path), environ=dict(os.environ),
                 deterministic=torch.are_deterministic_algorithms_enabled(), threads=torch.get_num_threads())
    argv = [path, *map(str, args)]
    sys.argv = list(argv)
    sys.path.insert(0, osp.dirname(path))  # as for any script: its folder first
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    try:
        with own_mmengine_instances(), contextlib.chdir(cwd), warnings.catch_warnings(), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.simplefilter('default')
            warnings.showwarning = _show_warning  # to stderr, as the interpreter does, not to a recorder
            try:
                runpy.run_path(path, run_name='__main__')
            except SystemExit as exit_:
                if isinstance(exit_.code, str):
                    print(exit_.code, file=sys.stderr)
                code = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
            except Exception:  # what the interpreter prints for an uncaught exception
                traceback.print_exc()
                code = 1
    finally:
        sys.argv, sys.path[:] = saved['argv'], saved['path']
        os.environ.clear()
        os.environ.update(saved['environ'])
        torch.use_deterministic_algorithms(saved['deterministic'])
        torch.set_num_threads(saved['threads'])
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


TINY_BACKBONE = dict(type='TimmBackbone', model_name='resnet18', cifar_stem=True,
                     channels=(8, 16, 32, 64))
TINY_NECK = dict(type='MLPNeck', hidden_dim=64, out_dim=32, num_layers=2)


# Ops that read a device value on the host (each waits for the device): .item() / bool() / int()
# and friends end in _local_scalar_dense; nonzero(), masked_select and boolean-mask indexing need the
# count of True values for their output size.
SYNC_OPS = ('aten::_local_scalar_dense', 'aten::nonzero', 'aten::is_nonzero', 'aten::item', 'aten::equal',
            'aten::masked_select', 'aten::unique_consecutive', 'aten::_unique2')
MASK_INDEX_OPS = ('aten::index', 'aten::index_put', 'aten::index_put_', 'aten::_index_put_impl_')


class HostSyncOps(TorchDispatchMode):
    """Records every host-sync op dispatched (forward, autograd's backward and optimiser alike) in
    ``seen``; with ``refuse=True`` raises at the first one instead."""

    def __init__(self, refuse: bool = False) -> None:
        super().__init__()
        self.refuse = refuse
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in SYNC_OPS or (name in MASK_INDEX_OPS and any(
                isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1] if i is not None)):
            if self.refuse:
                raise AssertionError(f'{name} (a host sync) dispatched in the training step')
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def end_gloo_worker() -> None:
    """Wait for every rank, then end this spawned worker at once with exit code 0."""
    import torch.distributed as dist
    dist.barrier()  # no rank exits while another still talks to it
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: gloo's threads are sometimes destroyed while still joinable there
    # ('terminate called without an active exception', SIGABRT) after all the work is done, with or
    # without destroy_process_group().
    os._exit(0)


def digits_config(work_dir: str, model: dict, max_epochs: int = 2, pseudo_labels: dict | None = None,
                  knn: bool = False, batch_size: int = 64, fn_detection: bool = False,
                  **overrides) -> Config:
    """A complete training config on digits with a tiny ResNet; hooks as asked."""
    base = Config.fromfile(osp.join(CONFIG_DIR, '_base_', 'datasets', 'digits.py'))
    runtime = Config.fromfile(osp.join(CONFIG_DIR, '_base_', 'default_runtime.py'))
    cfg = Config(dict(runtime.to_dict()))
    model = dict(backbone=copy.deepcopy(TINY_BACKBONE), neck=copy.deepcopy(TINY_NECK),
                 data_preprocessor=dict(type='ContrastiveDataPreprocessor', mean=base.mean,
                                        std=base.std), **model)
    hooks = []
    if pseudo_labels is not None:
        hooks.append(dict(type='PseudoLabelHook', pipeline=base.eval_pipeline, batch_size=128,
                          num_workers=0, **pseudo_labels))
    if knn:
        hooks.append(dict(type='KNNEvalHook', val_dataset=base.val_dataset,
                          pipeline=base.eval_pipeline, interval=1, batch_size=128, num_workers=0,
                          eval_at_start=True))
    if fn_detection:
        hooks.append(dict(type='FalseNegativeDetectionHook'))
    train_dataloader = copy.deepcopy(base.train_dataloader.to_dict())
    train_dataloader['batch_size'] = batch_size
    cfg.merge_from_dict(dict(
        work_dir=work_dir, model=model, train_dataloader=train_dataloader,
        optim_wrapper=dict(type='OptimWrapper',
                           optimizer=dict(type='SGD', lr=0.05, momentum=0.9, weight_decay=1e-4)),
        train_cfg=dict(type='EpochBasedTrainLoop', max_epochs=max_epochs),
        default_hooks=dict(logger=dict(interval=1), checkpoint=dict(interval=1, max_keep_ckpts=5)),
        custom_hooks=hooks, vis_backends=[dict(type='LocalVisBackend')],
        visualizer=dict(type='Visualizer', vis_backends=[dict(type='LocalVisBackend')]),
        env_cfg=dict(cudnn_benchmark=False, dist_cfg=dict(backend='gloo')),
        log_level='WARNING', **overrides))
    return cfg


def layer_decay_factors(names, rate: float, depth: int, vit: str = 'backbone.model.') -> dict:
    """Each parameter's layer-wise lr factor, written out from its name as BEiT and MAE give it:
    the ViT under ``vit`` with blocks 0..depth-1 has block i at rate^(depth - i), its patch
    embedding and tokens at rate^(depth + 1), its final norm and everything else at 1."""
    factors = {}
    for name in names:
        inner = name[len(vit):] if name.startswith(vit) else ''
        block = re.match(r'blocks\.(\d+)\.', inner)
        if block:
            factors[name] = rate ** (depth - int(block.group(1)))
        elif re.match(r'(patch_embed\.|cls_token$|pos_embed$)', inner):
            factors[name] = rate ** (depth + 1)
        else:
            factors[name] = 1.0
    return factors


def load_tool(name: str):
    """A script under tools/ (``'knn_eval'``, ``'analysis/cluster_table'``) imported as a module."""
    import importlib.util
    path = osp.join(osp.dirname(__file__), '..', 'tools', f'{name}.py')
    spec = importlib.util.spec_from_file_location(f'tool_{name.replace("/", "_")}', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train_tool = load_tool('train')


def train_error(*argv: str) -> str:
    """Run tools/train.py in this process; return its one-line error."""
    import pytest
    with pytest.raises(SystemExit) as exit_info:
        train_tool.main(list(argv))
    message = str(exit_info.value.code)
    assert '\n' not in message, message
    return message


def digits_config_file(tmp_path, max_epochs: int = 1, **overrides) -> str:
    """SimCLR on a tenth of digits (2 iterations an epoch) as a config file; work dir ``tmp_path/run``."""
    cfg = digits_config(str(tmp_path / 'run'), dict(type='SimCLR', temperature=0.5),
                        max_epochs=max_epochs, **overrides)
    cfg.train_dataloader.dataset.subset_fraction = 0.1
    path = str(tmp_path / 'cfg.py')
    cfg.dump(path)
    return path
