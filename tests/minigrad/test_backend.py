"""How minigrad.cpu_tuning keeps freed memory, and scatter_add's two paths on the CPU (the rest
of minigrad.backend is tested through every op, and on the GPU in test_cuda_backend.py)."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from minigrad.backend import scatter_add
from minigrad.cpu_tuning import reuse_freed_memory

# Allocate and free four 400 kB arrays, 100 times, and print the page faults per round: with
# glibc's default policy the freed top of the heap goes back to the OS and comes back faulting.
FAULTS_PER_ROUND = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    from minigrad.cpu_tuning import reuse_freed_memory
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


@pytest.mark.parametrize(
    "index, values_shape",
    [
        ([3, 0, 3, 3, 1], (5, 4)),  # the rows path: repeats, a row never named
        ([4, 4], (2, 4)),
        ([2, -1, 4], (3, 4)),  # negative ids: np.add.at, where -1 and 4 are one row
        ([1, 2], (4,)),  # broadcast values: np.add.at
        ([], (0, 4)),
    ],
)
def test_scatter_add_matches_a_python_loop(index, values_shape):
    rng = np.random.default_rng(0)
    target = rng.standard_normal((5, 4)).astype(np.float32)
    values = rng.standard_normal(values_shape).astype(np.float32)
    expected = target.astype(np.float64)
    for i, row in zip(index, np.broadcast_to(values, (len(index), 4)), strict=True):
        expected[i] += row
    scatter_add(target, np.array(index, dtype=np.int64), values)
    np.testing.assert_allclose(target, expected, rtol=1e-6, atol=1e-6)


def test_scatter_add_rows_raises_on_an_index_past_the_end():
    with pytest.raises(IndexError):
        scatter_add(np.zeros((3, 2)), np.array([0, 3]), np.ones((2, 2)))
