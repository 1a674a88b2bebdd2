"""genrec.malloc: a training step's freed tensors are reused without page faults."""

import subprocess
import sys

import pytest

from genrec.malloc import glibc_mallopt

STEPS = """
import resource, sys, torch
torch.set_num_threads(1)
from genrec.malloc import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
x = torch.randn(8192, 1024, requires_grad=True)  # 32 MB per activation
w = torch.randn(1024, 1024, requires_grad=True)
def step():
    torch.relu(x @ w).pow(2).sum().backward()
step(); step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(6):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(glibc_mallopt() is None, reason="glibc only")
def test_keep_freed_memory_avoids_page_faults():
    default, kept = page_faults("default"), page_faults("keep")
    assert default > 6 * 8192 * 1024 * 4 / 4096, default  # glibc unmapped and re-faulted the activations
    assert kept < default / 5, (kept, default)  # at most some heap growth, not every step
