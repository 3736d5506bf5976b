"""Test-session settings shared by every test file."""
import os

import torch

# One thread per process, for this process and the tools and gloo workers the tests start: the
# models here are too small to gain from a second thread, and OpenMP threads spin-waiting for
# a core another job holds made a test ten times slower on a busy 2-core machine.
os.environ['OMP_NUM_THREADS'] = '1'
torch.set_num_threads(1)
