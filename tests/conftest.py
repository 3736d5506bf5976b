"""Test-session settings shared by every test file."""
import os

import pytest
import torch

# One thread per process, for this process and the tools and gloo workers the tests start: the
# models here are too small to gain from a second thread, and OpenMP threads spin-waiting for
# a core another job holds made a test ten times slower on a busy 2-core machine.
os.environ['OMP_NUM_THREADS'] = '1'
torch.set_num_threads(1)

# Debian's dataset-fashion-mnist, the configs' default data_root; `make test` installs it (`make data`).
FASHION_MNIST = '/usr/share/datasets/fashion-mnist'


@pytest.fixture(scope='session')
def fashion_mnist() -> str:
    """The real Fashion-MNIST folder; a test that reads it fails (never skips) where it is missing."""
    if not os.path.isfile(os.path.join(FASHION_MNIST, 't10k-labels-idx1-ubyte.gz')):
        pytest.fail(f'Fashion-MNIST is not in {FASHION_MNIST}: run the tests with `make test`, which '
                    "installs Debian's dataset-fashion-mnist there when run as root (`make data`); "
                    'otherwise `sudo apt-get install dataset-fashion-mnist`', pytrace=False)
    return FASHION_MNIST


@pytest.fixture(autouse=True)
def _own_mmengine_instances():
    """Each test's mmengine loggers, visualisers and message hubs are dropped at its end."""
    from helpers import own_mmengine_instances
    with own_mmengine_instances():
        yield
