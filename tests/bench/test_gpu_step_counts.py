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
# norm (1,677 before them: 908), then fused LayerNorm, GELU, dropout and softmax backward, the
# leaves taking their gradients without a copy (596), the attention mask made once and clipping's
# factor applied inside AdamW's kernel: lower it when a fused kernel lands, never raise it to let
# a regression through. Issue 26's target: 3x fewer than 1,677, at most 559.
LAUNCHES = 521


def test_a_step_makes_no_generator_reads_two_numbers_and_keeps_its_launches(fake_cupy, fast_paths):
    fast_paths(True)  # the launches of the fused kernels
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


def test_the_sites_add_up_to_the_step_s_launches_and_the_plain_form_launches_more(
    fake_cupy, fast_paths
):
    import collections

    fast_paths(True)
    sites, moved = collections.Counter(), collections.Counter()
    step = gpu_step_counts.step_counts(cupy=fake_cupy, sites=sites, moved_sites=moved)["step"]
    fused = step["kernel_launches"]
    assert sum(sites.values()) == fused
    assert sum(moved.values()) == step["bytes_moved"] and moved.keys() == sites.keys()
    assert any("layer_norm_forward" in where for where in sites)  # the fused LayerNorm ran
    fast_paths(False)
    plain = gpu_step_counts.step_counts(cupy=fake_cupy)["step"]["kernel_launches"]
    assert plain > fused + 200  # LayerNorm, GELU, dropout, softmax and AdamW each unfused


def test_step_times_synchronise_each_phase_and_restore_the_precision(fake_cupy, monkeypatch):
    """--time cuda's path on the stand-in: three synchronisations a step (after the loss, before
    clipping, at the end), every phase timed, the preset's TF32 for the run only."""
    import minigrad as mg

    syncs = []
    monkeypatch.setattr(fake_cupy.cuda.Device, "synchronize", lambda self: syncs.append(1))
    before = mg.get_float32_matmul_precision()
    row = gpu_step_counts.step_times("cuda", small=True, steps=2, warmup=1)
    assert len(syncs) == 3 * (1 + 2)
    assert mg.get_float32_matmul_precision() == before
    assert row["config"]["train"].matmul_precision == "high"  # baby-gpt's, as nanoGPT
    assert row["config"]["model"].n_embd == gpu_step_counts.SMALL["n_embd"]
    phases = [row[phase] for phase in ("forward", "backward", "optimiser")]
    assert all(ms > 0 for ms in phases) and row["step"] >= max(phases)


def test_time_report_gives_the_host_floor_s_share_with_both_widths():
    from types import SimpleNamespace as NS

    def row(n_embd, block, batch, forward, backward, optimiser):
        config = {
            "model": NS(n_layer=6, n_head=6, n_embd=n_embd, block_size=block),
            "train": NS(batch_size=batch, matmul_precision="high"),
        }
        step = forward + backward + optimiser
        return dict(config=config, forward=forward, backward=backward, optimiser=optimiser,
                    step=step)  # fmt: skip

    small, real = row(48, 32, 4, 5, 4, 1), row(384, 256, 64, 9, 20, 11)
    text = gpu_step_counts.time_report("cuda", [small, real])
    lines = text.splitlines()
    assert "6 layers, 6 heads, matmul_precision high" in lines[0]
    assert lines[2].split() == "n_embd 48, block 32, batch 4 5.00 4.00 1.00 10.00".split()
    assert lines[3].split()[-1] == "40.00"
    assert lines[4].startswith("host floor / step: 0.25 ")
    assert "host floor" not in gpu_step_counts.time_report("cuda", [small])


def test_the_products_flops_are_the_model_s_and_the_floor_reads_them(fake_cupy):
    """The stand-in's FLOP count against the textbook's: every linear layer 2 * tokens * its
    weights forward, the naive attention's two batched products 2 * B * nh * T^2 * hs each, and
    the backward twice the forward (each product's two gradients). The bytes moved exceed
    what the step allocates (each new array written once, and read at least once after)."""
    counts = gpu_step_counts.step_counts(cupy=fake_cupy)
    model, train = counts["config"]["model"], counts["config"]["train"]
    B, T, C, L = train.batch_size, model.block_size, model.n_embd, model.n_layer
    hidden = 4 * C
    weights = L * (C * 3 * C + C * C + 2 * C * hidden) + C * model.vocab_size
    attention = L * 2 * (2 * B * model.n_head * T * T * (C // model.n_head))
    assert counts["forward"]["matmul_flops"] == 2 * B * T * weights + attention
    # the backward: twice that, and LayerNorm's row sums, at most two a norm (2L + 1 norms),
    # which rows.py takes as products with a vector of ones where the BLAS beats a reduction
    extra = counts["backward"]["matmul_flops"] - 2 * counts["forward"]["matmul_flops"]
    assert 0 <= extra <= (2 * L + 1) * 2 * (2 * B * T * C)
    assert counts["optimiser"]["matmul_flops"] == 0
    step = counts["step"]
    assert step["bytes_moved"] > 2 * step["bytes_allocated"]
    gpus = gpu_step_counts.load_gpus()
    text = gpu_step_counts.report(counts, gpus["h100"])
    floor = gpu_step_counts.device_floor(step, train.matmul_precision, gpus["h100"])
    assert f"= {floor['total']:.2f} ms a step" in text and "H100 SXM" in text
    assert floor["memory"] == 1e3 * step["bytes_moved"] / 3.35e12
