"""Test-session settings shared by every test file."""
import os

import pytest
import torch

# One thread per process, for this process and the tools and gloo workers the tests start: the
# models here are too small to gain from a second thread, and OpenMP threads spin-waiting for
# a core another job holds made a test ten times slower on a busy 2-core machine.
os.environ['OMP_NUM_THREADS'] = '1'
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _own_mmengine_instances():
    """Each test's mmengine loggers, visualisers and message hubs are dropped at its end.

    mmengine keeps one of each per experiment name (the config's name and the second the run
    started) for the whole process: a run starting within the same second as an earlier test's,
    from a config of the same name, would log into that test's files and captured output.
    """
    from mmengine.logging import MessageHub, MMLogger
    from mmengine.visualization import Visualizer

    kinds = (MMLogger, Visualizer, MessageHub)
    before = {kind: set(kind._instance_dict) for kind in kinds}
    yield
    for kind in kinds:
        for name in set(kind._instance_dict) - before[kind]:
            instance = kind._instance_dict.pop(name)
            for handler in getattr(instance, 'handlers', []):
                handler.close()  # the log file's descriptor
