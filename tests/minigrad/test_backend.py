"""The CPU side of minigrad.backend: how freed memory is handled (the rest is tested through
every op, and on the GPU in test_cuda_backend.py)."""

import subprocess
import sys
import textwrap

import pytest

from minigrad.backend import reuse_freed_memory

# Allocate and free four 400 kB arrays, 100 times, and print the page faults per round: with
# glibc's default policy the freed top of the heap goes back to the OS and comes back faulting.
FAULTS_PER_ROUND = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    from minigrad.backend import reuse_freed_memory
    if sys.argv[1] == "reuse":
        assert reuse_freed_memory()
    def round_trip():
        arrays = [np.ones(100_000, np.float32) for _ in range(4)]
        del arrays
    for _ in range(5):
        round_trip()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(100):
        round_trip()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 100)
    """
)


def faults_per_round(policy: str) -> float:
    cmd = [sys.executable, "-c", FAULTS_PER_ROUND, policy]
    return float(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's (Linux)")
def test_reuse_freed_memory_stops_the_page_faults():
    if not reuse_freed_memory():
        pytest.skip("this Linux's C library is not glibc")
    default, reused = faults_per_round("default"), faults_per_round("reuse")
    assert default > 100, f"the default policy should fault here, got {default} per round"
    assert reused < 5, f"with reuse_freed_memory: {reused} faults per round (default {default})"
