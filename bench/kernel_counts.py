"""What each flash-attention kernel does, counted on the CPU, and what that implies on a GPU.

Runs `flash_attention_forward_cuda` and `flash_attention_backward_cuda` on NumPy arrays, so
the emulator runs the real launch plan (grid, block, shared memory, compile options, all
chosen by flash_attention_cuda.py for an sm_90 device), in its counting build
(`emulator.count_launches`): per kernel, the multiply-adds written as fmaf, shared-memory loads
and stores (instructions and 4-byte elements), global loads and stores, barriers and shuffles.
It measures at T/2 and T (default B=1, nh=2, T=256, hs=64, causal: seconds), and scales to
B=4, nh=8, T=4096 by this rule: per (batch, head) every count is a*T^2 + b*T, fitted exactly
through the two measurements (causal attention visits ~T^2/2 tile pairs; per-row work, the
diagonal tiles and the preprocess grow ~T), times B*nh, since every (batch, head) runs the
same blocks. The fit is exact where T/2 and T are multiples of the tile.

Beside the counts, a roofline-style bound per kernel for a named GPU: the larger of
fp32 FMA time, shared-memory time (bytes the threads request over 128 bytes a clock per SM:
exact for conflict-free scalar loads, broadcasts included; a bank conflict costs more, a
broadcast float4 less) and global time (every global access charged at DRAM bandwidth: an
upper bound, as K and V re-reads mostly hit L2). Then the static mix from `nvcc -ptx` per
.entry and registers, spills and shared memory from `nvcc -cubin -Xptxas -v`, with the
occupancy they imply on sm_90, compiled with the options the launcher used.

Leaves out: multiply-adds written as `a * b + c` (the counting build sees fmaf calls only; it
says 'not counted' where the kernel has none), bank conflicts, L2 hit rates, instruction
issue and latency: the bound is a floor, not a prediction. Follows the roofline model of
Williams, Waterman and Patterson, "Roofline" (CACM 2009).

Usage: python bench/kernel_counts.py [--B 1] [--nh 2] [--T 256] [--hs 64] [--gpu h100]
       [--no-causal] [--no-emulate] [--no-nvcc]
"""

from __future__ import annotations

import argparse
import math
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from minigrad.kernels import emulator
from minigrad.kernels.flash_attention_cuda import (
    _SOURCE,
    flash_attention_backward_cuda,
    flash_attention_forward_cuda,
)

KERNELS = tuple(emulator._kernel_names(_SOURCE.read_text()))  # in the order of the source
TARGET = (4, 8, 4096)  # B, nh, T the counts are scaled to (issue 25's benchmark size)
ARCH = "sm_90"  # both GPUs below; the launch plan and nvcc use its limits


@dataclass(frozen=True)
class Gpu:
    """Peak rates of one GPU. Per SM and clock: 128 fp32 FMA lanes and 32 shared-memory banks
    of 4 bytes (CUDA C++ Programming Guide, compute capability 9.0: "Arithmetic Instructions"
    throughput table and "Shared Memory"). SM count from the NVIDIA H100 Tensor Core GPU
    Architecture whitepaper (H100 SXM5: 132 SMs; H200 is the same GH100 chip). The clock is
    the one the datasheets' fp32 peak implies: 67 TFLOP/s / (2 * 132 * 128) = 1.98 GHz. DRAM
    bandwidth from the datasheets: H100 SXM 3.35 TB/s (HBM3), H200 4.8 TB/s (HBM3e)."""

    name: str
    sms: int
    clock_ghz: float
    dram_tb_s: float

    @property
    def fma_per_s(self) -> float:
        return self.sms * 128 * self.clock_ghz * 1e9

    @property
    def shared_bytes_per_s(self) -> float:
        return self.sms * 128 * self.clock_ghz * 1e9


GPUS = {
    "h100": Gpu("H100 SXM", 132, 1.98, 3.35),
    "h200": Gpu("H200 SXM", 132, 1.98, 4.8),
}
# sm_90 limits for occupancy (CUDA C++ Programming Guide, "Technical Specifications per
# Compute Capability"): registers, threads, shared memory and blocks per SM.
SM90 = {"registers": 65536, "threads": 2048, "shared": 228 * 1024, "blocks": 32}
SHARED_RESERVED = 1024  # bytes per block the CUDA runtime keeps for itself (sm_80 and later)


# ---------------------------------------------------------------------------------------------
# Counting


def run_kernels(
    B: int, nh: int, T: int, hs: int, causal: bool, run: bool = True
) -> list[emulator.Launch]:
    """Forward and backward through the launcher on NumPy arrays, in the counting build (or
    only recorded, run=False); every launch's record."""
    rng = np.random.default_rng(0)
    q, k, v, grad_o = (rng.standard_normal((B, nh, T, hs)).astype(np.float32) for _ in range(4))
    with emulator.use_device(ARCH), emulator.count_launches(run=run) as launches:
        o, lse = flash_attention_forward_cuda(q, k, v, causal)
        if not run:  # nothing ran: the backward's inputs are the forward's shapes
            o, lse = np.zeros_like(q), np.zeros((B, nh, T), np.float32)
        flash_attention_backward_cuda(q, k, v, o, lse, grad_o, causal)
    return launches


def largest_tile(launches: list[emulator.Launch]) -> int:
    """The largest -DTILE among the launches' compile options (1 where none says)."""
    tiles = [
        int(m) for launch in launches for m in re.findall(r"-DTILE=(\d+)", " ".join(launch.options))
    ]
    return max(tiles, default=1)


def per_kernel(launches: list[emulator.Launch]) -> dict[str, dict[str, int]]:
    """The counts of each kernel, summed over its launches, as {field: count}."""
    totals: dict[str, dict[str, int]] = {}
    for launch in launches:
        total = totals.setdefault(launch.name, {f.name: 0 for f in fields(emulator.Counts)})
        for f in fields(emulator.Counts):
            total[f.name] += getattr(launch.counts, f.name)
    return totals


def scale_count(c1: int, c2: int, t1: int, t2: int, t: int) -> int:
    """c(t) for the c(T) = a T^2 + b T that passes through (t1, c1) and (t2, c2).

    >>> scale_count(3 * 100**2 + 7 * 100, 3 * 200**2 + 7 * 200, 100, 200, 400)  # 3T^2 + 7T
    482800
    """
    per_t1, per_t2 = c1 / t1, c2 / t2  # c / T = a T + b: a line through two points
    a = (per_t2 - per_t1) / (t2 - t1)
    b = per_t1 - a * t1
    return round(a * t * t + b * t)


def scale(
    small: dict[str, dict[str, int]],
    large: dict[str, dict[str, int]],
    measured: tuple[int, int, int, int],
    target: tuple[int, int, int],
) -> dict[str, dict[str, int]]:
    """Counts at target (B, nh, T) from counts at (B, nh, t1) and (B, nh, t2), measured =
    (B, nh, t1, t2): the fit in T of `scale_count`, times the ratio of B * nh."""
    B, nh, t1, t2 = measured
    B_to, nh_to, T_to = target
    heads = (B_to * nh_to) / (B * nh)
    return {
        name: {
            key: round(heads * scale_count(small[name][key], counts[key], t1, t2, T_to))
            for key in counts
        }
        for name, counts in large.items()
    }


# ---------------------------------------------------------------------------------------------
# Printing


def human(n: float) -> str:
    """A count in 4 significant figures with a k/M/G/T suffix.

    >>> human(950), human(123456), human(2.5e9)
    ('950', '123.5k', '2.5G')
    """
    for suffix, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.4g}{suffix}"
    return f"{n:.0f}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def table(header: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell, the first left-aligned, the rest right-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in
                 enumerate(zip(row, widths, strict=True))]  # fmt: skip
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def counts_table(counts: dict[str, dict[str, int]], fma_counted: bool) -> str:
    rows = []
    for name, c in counts.items():
        fma = human(c["fma"]) if fma_counted else "n/c"
        per_load = ratio(c["fma"], c["shared_loads"]) if fma_counted else "n/c"
        rows.append([
            name, fma,
            f"{human(c['shared_loads'])} / {human(c['shared_load_elements'])}",
            f"{human(c['shared_stores'])} / {human(c['shared_store_elements'])}",
            f"{human(c['global_loads'])} / {human(c['global_load_elements'])}",
            f"{human(c['global_stores'])} / {human(c['global_store_elements'])}",
            human(c["barriers"]), human(c["shuffles"]), per_load,
        ])  # fmt: skip
    header = ["kernel", "fma", "ld.shared i/e", "st.shared i/e", "ld.global i/e",
              "st.global i/e", "barriers", "shuffles", "fma/ld.shared"]  # fmt: skip
    return table(header, rows)


def roofline_table(counts: dict[str, dict[str, int]], gpu: Gpu, fma_counted: bool) -> str:
    """Bound time per kernel in ms: the largest of the fma, shared and global times."""
    rows, total = [], 0.0
    for name, c in counts.items():
        fma_ms = 1e3 * c["fma"] / gpu.fma_per_s
        shared_bytes = 4 * (c["shared_load_elements"] + c["shared_store_elements"])
        shared_ms = 1e3 * shared_bytes / gpu.shared_bytes_per_s
        global_bytes = 4 * (c["global_load_elements"] + c["global_store_elements"])
        global_ms = 1e3 * global_bytes / (gpu.dram_tb_s * 1e12)
        times = {"shared": shared_ms, "global": global_ms}
        if fma_counted:
            times["fma"] = fma_ms
        bound = max(times, key=times.get)
        total += times[bound]
        fma_cell = f"{fma_ms:.3f}" if fma_counted else "n/c"
        rows.append([name, fma_cell, f"{shared_ms:.3f}", f"{global_ms:.3f}",
                     f"{times[bound]:.3f} ({bound})"])  # fmt: skip
    rows.append(["total", "", "", "", f"{total:.3f}"])
    return table(["kernel", "fma ms", "shared ms", "global ms", "bound ms"], rows)


# ---------------------------------------------------------------------------------------------
# nvcc: the static mix and the registers


PTX_PATTERNS = {
    "fma.rn.f32": r"\bfma\.rn\.f32\b",
    "ld.shared": r"\bld\.shared(?!\.v[24])\.",
    "ld.shared.v2": r"\bld\.shared\.v2\.",
    "ld.shared.v4": r"\bld\.shared\.v4\.",
    "st.shared": r"\bst\.shared\.",
    "ld.global": r"\bld\.global\.",
    "bar.sync": r"\bbar(rier)?\.sync\b",
    "shfl": r"\bshfl\.sync\.",
}


def ptx_mix(ptx: str) -> dict[str, dict[str, int]]:
    """Per .entry of the PTX, how many instructions match each of PTX_PATTERNS.

    >>> mix = ptx_mix(".entry k(\\n ld.shared.v4.f32 a; fma.rn.f32 b; fma.rn.f32 c;\\n}")
    >>> mix["k"]["fma.rn.f32"], mix["k"]["ld.shared.v4"], mix["k"]["ld.shared"]
    (2, 1, 0)
    """
    entries = re.split(r"\.entry\s+(\w+)\s*\(", ptx)
    return {
        name: {key: len(re.findall(pattern, body)) for key, pattern in PTX_PATTERNS.items()}
        for name, body in zip(entries[1::2], entries[2::2], strict=True)
    }


def ptxas_usage(log: str) -> dict[str, dict[str, int]]:
    """Per entry of a `-Xptxas -v` log: registers, spill stores and loads, static smem bytes."""
    patterns = {
        "registers": r"Used (\d+) registers",
        "spill_stores": r"(\d+) bytes spill stores",
        "spill_loads": r"(\d+) bytes spill loads",
        "smem": r"(\d+) bytes smem",
    }
    usage = {}
    for name, body in re.findall(r"entry function '(\w+)'(.*?)(?=Compiling|\Z)", log, re.S):
        found = {key: re.search(pattern, body) for key, pattern in patterns.items()}
        usage[name] = {key: int(m.group(1)) if m else 0 for key, m in found.items()}
    return usage


def occupancy(registers: int, threads: int, shared_bytes: int) -> tuple[int, str, float]:
    """(blocks per SM, what limits them, warps resident / 64) on sm_90.

    Registers are allocated per warp in units of 256 (8 a thread).

    >>> occupancy(128, 128, 40000)  # 128 regs: 16384 a block, 4 blocks by registers
    (4, 'registers', 0.25)
    """
    warps = -(-threads // 32)
    regs_per_warp = -(-registers * 32 // 256) * 256
    limits = {
        "registers": SM90["registers"] // (regs_per_warp * warps) if registers else SM90["blocks"],
        "threads": SM90["threads"] // threads,
        "shared": SM90["shared"] // (shared_bytes + SHARED_RESERVED),
        "blocks": SM90["blocks"],
    }
    limit = min(limits, key=limits.get)
    return limits[limit], limit, limits[limit] * warps / (SM90["threads"] // 32)


def nvcc_report(launches: list[emulator.Launch]) -> str:
    """The static mix and register report of every launched kernel, compiled by nvcc with
    the options the launcher gave it; a note where nvcc is absent."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return "nvcc not found: the static mix and the register report are skipped."
    first = {}
    for launch in launches:  # each kernel's first launch: its options, block and shared bytes
        first.setdefault(launch.name, launch)
    mix_rows, usage_rows = [], []
    by_options: dict[tuple[str, ...], list[str]] = {}
    for name, launch in first.items():
        by_options.setdefault(launch.options, []).append(name)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "kernel.cu"
        for options, names in by_options.items():
            source.write_text(first[names[0]].code)
            common = [nvcc, f"-arch={ARCH}", *options, str(source)]
            ptx = subprocess.run([*common, "-ptx", "-o", "-"], capture_output=True, text=True)
            cubin = subprocess.run([*common, "-cubin", "-Xptxas", "-v", "-o", f"{tmp}/k.cubin"],
                                   capture_output=True, text=True)  # fmt: skip
            for result in (ptx, cubin):
                if result.returncode != 0:
                    return f"nvcc failed ({' '.join(options)}):\n{result.stderr[-2000:]}"
            mix, usage = ptx_mix(ptx.stdout), ptxas_usage(cubin.stderr + cubin.stdout)
            for name in names:
                m, u, launch = mix[name], usage[name], first[name]
                loads = m["ld.shared"] + m["ld.shared.v2"] + m["ld.shared.v4"]
                mix_rows.append([name, " ".join(options), *(str(m[k]) for k in PTX_PATTERNS),
                                 ratio(m["fma.rn.f32"], loads)])  # fmt: skip
                threads = math.prod(launch.block)
                shared = launch.shared_mem + u["smem"]
                blocks, limit, occ = occupancy(u["registers"], threads, shared)
                usage_rows.append([
                    name, str(threads), str(u["registers"]),
                    f"{u['spill_stores']} / {u['spill_loads']}", str(shared),
                    f"{blocks} ({limit})", f"{occ:.0%}",
                ])  # fmt: skip
    order = {name: i for i, name in enumerate(KERNELS)}  # rows in the order of the source
    mix_rows.sort(key=lambda row: order.get(row[0], len(order)))
    usage_rows.sort(key=lambda row: order.get(row[0], len(order)))
    mix = table(["kernel", "options", *PTX_PATTERNS, "fma/ld.shared"], mix_rows)
    usage = table(["kernel", "threads", "registers", "spill st/ld B", "smem B",
                   "blocks/SM (limit)", "occupancy"], usage_rows)  # fmt: skip
    return (
        f"Static mix: nvcc -arch={ARCH} -ptx, instructions per .entry (not executed counts)\n"
        f"{mix}\n\nRegisters: nvcc -cubin -Xptxas -v; smem = the launch's dynamic shared memory "
        f"+ static; occupancy on {ARCH}\n{usage}"
    )


# ---------------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--nh", type=int, default=2)
    p.add_argument("--T", type=int, default=256, help="measured at T // 2 and T")
    p.add_argument("--hs", type=int, default=64)
    p.add_argument("--gpu", choices=sorted(GPUS), default="h100")
    p.add_argument("--no-causal", dest="causal", action="store_false")
    p.add_argument("--no-emulate", action="store_true", help="skip the counts and roofline")
    p.add_argument("--no-nvcc", action="store_true", help="skip the static mix")
    args = p.parse_args()
    B, nh, T, hs = args.B, args.nh, args.T, args.hs
    t1 = T // 2
    if t1 < 1:
        p.error("--T must be at least 2 (the counts are measured at T // 2 and T)")
    fma_counted = "fmaf(" in emulator._strip_comments(_SOURCE.read_text())
    mask = "causal" if args.causal else "full"
    print(f"{_SOURCE.name}: {', '.join(KERNELS)}; {mask}, hs={hs}, {ARCH} launch plan")

    launches = run_kernels(B, nh, T, hs, args.causal, run=not args.no_emulate)
    if not args.no_emulate:
        large = per_kernel(launches)
        small = per_kernel(run_kernels(B, nh, t1, hs, args.causal))
        target = scale(small, large, (B, nh, t1, T), TARGET)
        print(
            "\nCounts summed over threads; i/e = instructions / 4-byte elements (a float4 load "
            "is 1 / 4)."
        )
        if not fma_counted:
            print(
                "fma: not counted (n/c): the kernel writes its multiply-adds as a * b + c, and "
                "the counting build counts fmaf calls only."
            )
        print(f"\nMeasured, B={B} nh={nh} T={T}:\n{counts_table(large, fma_counted)}")
        tile = largest_tile(launches)
        if t1 % tile or T % tile:  # below a tile, the counts do not follow a T^2 + b T yet
            print(
                f"\nNot scaled: the fit needs T // 2 = {t1} and T = {T} to be multiples of the "
                f"largest tile ({tile}); pass --T {max(2 * tile, T + (-T) % (2 * tile))}."
            )
            if not args.no_nvcc:
                print()
                print(nvcc_report(launches))
            return
        B_to, nh_to, T_to = TARGET
        print(
            f"\nScaled to B={B_to} nh={nh_to} T={T_to}: per (batch, head) each count is "
            f"a*T^2 + b*T through T={t1} and T={T}, times B*nh:\n"
            f"{counts_table(target, fma_counted)}"
        )
        gpu = GPUS[args.gpu]
        print(
            f"\nRoofline bound on {gpu.name} ({gpu.sms} SMs at {gpu.clock_ghz} GHz: fp32 "
            f"{2 * gpu.fma_per_s / 1e12:.0f} TFLOP/s, shared {gpu.shared_bytes_per_s / 1e12:.1f}"
            f" TB/s, DRAM {gpu.dram_tb_s} TB/s) at B={B_to} nh={nh_to} T={T_to}:\n"
            f"{roofline_table(target, gpu, fma_counted)}"
        )
        not_launched = [name for name in KERNELS if name not in large]
        if not_launched:
            print(f"Not launched by the launcher: {', '.join(not_launched)}")
    if not args.no_nvcc:
        print()
        print(nvcc_report(launches))


if __name__ == "__main__":
    main()
