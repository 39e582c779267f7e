"""bench/gpu_step_counts.py: one baby-gpt step's device work, counted on the CuPy stand-in, held
at its level (issue 26: fewer launches, no generator per dropout mask, two host reads a step)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "bench" / "gpu_step_counts.py"
spec = importlib.util.spec_from_file_location("gpu_step_counts", SCRIPT)
gpu_step_counts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_step_counts)

# Launches of one baby-gpt step on 2026-11-27, after the fused AdamW, dropout mask and clipping
# norm (1,677 before them): lower it when a fused kernel lands, never raise it to let a
# regression through.
LAUNCHES = 908


def test_a_step_makes_no_generator_reads_two_numbers_and_keeps_its_launches(fake_cupy):
    counts = gpu_step_counts.step_counts(cupy=fake_cupy)
    step = counts["step"]
    assert step["generators_created"] == 0  # dropout's masks come from a counter, not a generator
    assert step["device_to_host"] == 2  # the loss and the clipping norm
    assert step["host_to_device"] == 2  # the batch's ids and targets
    assert 0 < step["kernel_launches"] <= LAUNCHES
    for key in ("kernel_launches", "bytes_allocated", "device_to_host"):
        parts = sum(counts[phase][key] for phase in ("forward", "backward", "optimiser"))
        assert parts == step[key], key
    assert counts["forward"]["kernel_launches"] > 0 and counts["optimiser"]["kernel_launches"] > 0
    assert "6 layers, 6 heads" in gpu_step_counts.report(counts)
