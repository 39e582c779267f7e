"""What each flash-attention kernel does, counted on the CPU, and what that implies on a GPU.

Runs `flash_attention_forward_cuda` and `flash_attention_backward_cuda` on NumPy arrays, so
the emulator runs the real launch plan (grid, block, shared memory, compile options, all
chosen by flash_attention_cuda.py for an sm_90 device), in its counting build
(`emulator.count_launches`): per kernel, the multiply-adds written as fmaf, the tensor cores'
mma.sync instructions (per lane), shared-memory loads and stores (instructions and 4-byte
elements), global loads and stores, barriers and shuffles. Once per `tensor_cores` choice of
the launcher (`--tensor-cores`, all three by default, side by side): "off", the fmaf kernels of
flash_attention.cu; "tf32" and "3xtf32", the mma kernels of flash_attention_mma.cu with one or
three TF32 passes (the backward's preprocess is the fmaf one in all three). One m16n8k8 mma
is 16 * 8 * 8 = 1024 multiply-adds, 32 per lane, so a lane's multiply-adds (mac) are its fmaf
calls + 32 per mma, comparable across the kernels; 3xtf32 counts its three mma per product.
It measures at T/2 and T (default B=1, nh=2, T=256, hs=64, causal: seconds), and scales to
B=4, nh=8, T=4096 by this rule: per (batch, head) every count is a*T^2 + b*T, fitted exactly
through the two measurements (causal attention visits ~T^2/2 tile pairs; per-row work, the
diagonal tiles and the preprocess grow ~T), times B*nh, since every (batch, head) runs the
same blocks. The fit is exact where T/2 and T are multiples of the tile.

Beside the counts, a roofline-style bound per kernel for a named GPU: the largest of
fp32 FMA time, tensor-core time (dense TF32 mma at the datasheet's rate), shared-memory time
(bytes the threads request over 128 bytes a clock per SM: exact for conflict-free scalar
loads, broadcasts included; a bank conflict costs more, a broadcast float4 less) and global
time (every global access charged at DRAM bandwidth: an upper bound, as K and V re-reads
mostly hit L2); and the on-chip floor, the largest of the first three alone, which the bound
falls to where the re-reads hit L2. Then the static mix from `nvcc -ptx` per .entry and
registers, spills and shared memory from `nvcc -cubin -Xptxas -v`, with the occupancy they
imply on sm_90, compiled with the options the launcher used.

Leaves out: multiply-adds written as `a * b + c` (the counting build sees fmaf calls only; it
says 'not counted' where the kernel has none; the mma kernels' scalar work around the
products, exp and the mask, is not counted either), bank conflicts, L2 hit rates, instruction
issue and latency: the bound is a floor, not a prediction. Follows the roofline model of
Williams, Waterman and Patterson, "Roofline" (CACM 2009).

Usage: python bench/kernel_counts.py [--B 1] [--nh 2] [--T 256] [--hs 64] [--gpu h100]
       [--tensor-cores off|tf32|3xtf32|all] [--no-causal] [--no-emulate] [--no-nvcc]
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
    _MMA_ROWS,
    _MMA_SOURCE,
    _SOURCE,
    TENSOR_CORES,
    flash_attention_backward_cuda,
    flash_attention_forward_cuda,
)

KERNELS = tuple(emulator._kernel_names(_SOURCE.read_text()))  # in the order of the source
MMA_KERNELS = tuple(emulator._kernel_names(_MMA_SOURCE.read_text()))
VARIANTS = tuple(TENSOR_CORES)  # the launcher's tensor_cores choices: off, tf32, 3xtf32
MMA_MACS = 16 * 8 * 8 // 32  # multiply-adds per lane of one m16n8k8 mma: 32
TARGET = (4, 8, 4096)  # B, nh, T the counts are scaled to (issue 25's benchmark size)
ARCH = "sm_90"  # both GPUs below; the launch plan and nvcc use its limits


@dataclass(frozen=True)
class Gpu:
    """Peak rates of one GPU. Per SM and clock: 128 fp32 FMA lanes and 32 shared-memory banks
    of 4 bytes (CUDA C++ Programming Guide, compute capability 9.0: "Arithmetic Instructions"
    throughput table and "Shared Memory"). SM count from the NVIDIA H100 Tensor Core GPU
    Architecture whitepaper (H100 SXM5: 132 SMs; H200 is the same GH100 chip). The clock is
    the one the datasheets' fp32 peak implies: 67 TFLOP/s / (2 * 132 * 128) = 1.98 GHz. DRAM
    bandwidth from the datasheets: H100 SXM 3.35 TB/s (HBM3), H200 4.8 TB/s (HBM3e).

    Tensor cores (an assumption: no datasheet gives a per-SM rate for mma.sync): 1024 dense
    TF32 multiply-adds per SM and clock, twice A100's 512 (whitepaper: H100's SM doubles
    A100's dense tensor rate clock for clock), at the whitepaper's tensor-core boost clock of
    1.83 GHz (its Table 3 gives 1.83 GHz for the tensor-core peaks, 1.98 for fp32/fp64):
    132 * 1024 * 2 * 1.83 GHz = 494.7 TFLOP/s, the whitepaper's and datasheet's dense TF32
    peak for H100 SXM5 (989 with sparsity); the H200 datasheet gives the same 989. At 1.98 GHz
    the same 494.7 would mean 946 a clock: the clock, not the per-SM rate, differs."""

    name: str
    sms: int
    clock_ghz: float
    dram_tb_s: float
    tensor_clock_ghz: float = 1.83
    tf32_mac_per_sm_clock: int = 1024

    @property
    def fma_per_s(self) -> float:
        return self.sms * 128 * self.clock_ghz * 1e9

    @property
    def tf32_mac_per_s(self) -> float:
        return self.sms * self.tf32_mac_per_sm_clock * self.tensor_clock_ghz * 1e9

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
    B: int, nh: int, T: int, hs: int, causal: bool, run: bool = True, tensor_cores: str = "off"
) -> list[emulator.Launch]:
    """Forward and backward through the launcher on NumPy arrays, in the counting build (or
    only recorded, run=False), with the kernels `tensor_cores` picks; every launch's record."""
    rng = np.random.default_rng(0)
    q, k, v, grad_o = (rng.standard_normal((B, nh, T, hs)).astype(np.float32) for _ in range(4))
    with emulator.use_device(ARCH), emulator.count_launches(run=run) as launches:
        o, lse = flash_attention_forward_cuda(q, k, v, causal, tensor_cores=tensor_cores)
        if not run:  # nothing ran: the backward's inputs are the forward's shapes
            o, lse = np.zeros_like(q), np.zeros((B, nh, T), np.float32)
        flash_attention_backward_cuda(q, k, v, o, lse, grad_o, causal, tensor_cores=tensor_cores)
    return launches


def largest_tile(launches: list[emulator.Launch]) -> int:
    """The most rows of any tile among the launches: -DTILE (the fmaf kernels), -DKT and the
    block's own _MMA_ROWS (the mma kernels); 1 where no option says.

    >>> mma = emulator.Launch("k", "", ("-DKT=32",), (1, 1, 1), (128, 1, 1), 0, None)
    >>> largest_tile([mma]), largest_tile([])
    (64, 1)
    """
    tiles = [1]
    for launch in launches:
        options = " ".join(launch.options)
        tiles += [int(m) for m in re.findall(r"-D(?:TILE|KT)=(\d+)", options)]
        if "-DKT=" in options:  # an mma kernel: its block owns _MMA_ROWS rows whatever KT is
            tiles.append(_MMA_ROWS)
    return max(tiles)


def label(name: str, tensor_cores: str) -> str:
    """A kernel's row in the report: an mma kernel's name with its variant (tf32 and 3xtf32
    run the same names); every other name as it is.

    >>> label("flash_mma_fwd", "3xtf32"), label("flash_attn_bwd_preprocess", "tf32")
    ('flash_mma_fwd 3xtf32', 'flash_attn_bwd_preprocess')
    """
    return f"{name} {tensor_cores}" if name in MMA_KERNELS else name


def row_order(row: str) -> tuple[int, int]:
    """Sort key of a report row: by its kernel's place in flash_attention.cu (an mma kernel
    beside its fmaf twin), then off, tf32, 3xtf32.

    >>> sorted(["flash_mma_fwd tf32", "flash_attn_bwd_dq", "flash_attn_fwd"], key=row_order)
    ['flash_attn_fwd', 'flash_mma_fwd tf32', 'flash_attn_bwd_dq']
    """
    name, _, variant = row.partition(" ")
    twin = name.replace("flash_mma_", "flash_attn_")
    kernel = KERNELS.index(twin) if twin in KERNELS else len(KERNELS)
    return kernel, VARIANTS.index(variant) if variant in VARIANTS else 0


def per_kernel(
    launches: list[emulator.Launch], tensor_cores: str = "off"
) -> dict[str, dict[str, int]]:
    """The counts of each kernel, summed over its launches, as {field: count}, keyed by its
    `label`."""
    totals: dict[str, dict[str, int]] = {}
    for launch in launches:
        key = label(launch.name, tensor_cores)
        total = totals.setdefault(key, {f.name: 0 for f in fields(emulator.Counts)})
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


def macs(fma: int, mma: int) -> int:
    """A lane's multiply-adds: its fmaf calls and MMA_MACS for each mma it took part in.

    >>> macs(fma=10, mma=2)
    74
    """
    return fma + MMA_MACS * mma


def counts_table(counts: dict[str, dict[str, int]], fma_counted: bool) -> str:
    rows = []
    for name, c in counts.items():
        fma = human(c["fma"]) if fma_counted else "n/c"
        mac = macs(c["fma"], c["mma"])
        per_load = ratio(mac, c["shared_loads"]) if fma_counted else "n/c"
        rows.append([
            name, fma, human(c["mma"]),
            f"{human(c['shared_loads'])} / {human(c['shared_load_elements'])}",
            f"{human(c['shared_stores'])} / {human(c['shared_store_elements'])}",
            f"{human(c['global_loads'])} / {human(c['global_load_elements'])}",
            f"{human(c['global_stores'])} / {human(c['global_store_elements'])}",
            human(c["barriers"]), human(c["shuffles"]), per_load,
        ])  # fmt: skip
    header = ["kernel", "fma", "mma", "ld.shared i/e", "st.shared i/e", "ld.global i/e",
              "st.global i/e", "barriers", "shuffles", "mac/ld.shared"]  # fmt: skip
    return table(header, rows)


def kernel_ms(c: dict[str, int], gpu: Gpu) -> dict[str, float]:
    """Milliseconds of one kernel's counts at each of `gpu`'s peak rates: fmaf on the fp32
    lanes, mma on the tensor cores (3xtf32's three per product are all counted), shared
    memory, and global memory at DRAM bandwidth."""
    shared_bytes = 4 * (c["shared_load_elements"] + c["shared_store_elements"])
    global_bytes = 4 * (c["global_load_elements"] + c["global_store_elements"])
    return {
        "fma": 1e3 * c["fma"] / gpu.fma_per_s,
        "mma": 1e3 * MMA_MACS * c["mma"] / gpu.tf32_mac_per_s,
        "shared": 1e3 * shared_bytes / gpu.shared_bytes_per_s,
        "global": 1e3 * global_bytes / (gpu.dram_tb_s * 1e12),
    }


def roofline_table(
    counts: dict[str, dict[str, int]],
    gpu: Gpu,
    fma_counted: bool,
    totals: dict[str, list[str]] | None = None,
) -> str:
    """Bound time per kernel in ms: the largest of the fma, mma, shared and global times; and
    the on-chip floor, the largest without the global time. `totals` names the sums to print,
    {row name: the kernels it adds up} (default: one "total" of every kernel)."""
    rows, bounds, floors = [], {}, {}
    for name, c in counts.items():
        times = kernel_ms(c, gpu)
        if not fma_counted:
            del times["fma"]
        bound = max(times, key=times.get)
        on_chip = max((key for key in times if key != "global"), key=times.get)
        bounds[name], floors[name] = times[bound], times[on_chip]
        fma_cell = f"{times['fma']:.3f}" if fma_counted else "n/c"
        rows.append([name, fma_cell, f"{times['mma']:.3f}", f"{times['shared']:.3f}",
                     f"{times['global']:.3f}", f"{bounds[name]:.3f} ({bound})",
                     f"{floors[name]:.3f} ({on_chip})"])  # fmt: skip
    for total, names in (totals or {"total": list(counts)}).items():
        bound, floor = sum(bounds[n] for n in names), sum(floors[n] for n in names)
        rows.append([total, "", "", "", "", f"{bound:.3f}", f"{floor:.3f}"])
    header = ["kernel", "fma ms", "mma ms", "shared ms", "global ms", "bound ms", "on-chip ms"]
    return table(header, rows)


# ---------------------------------------------------------------------------------------------
# nvcc: the static mix and the registers


PTX_PATTERNS = {
    "fma.rn.f32": r"\bfma\.rn\.f32\b",
    "mma.sync": r"\bmma\.sync\.",
    "cvt.tf32": r"\bcvt\.rna\.tf32\.f32\b",  # the mma kernels' float -> TF32 roundings
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
    >>> mma = ptx_mix(".entry m(\\n mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 d;\\n}")
    >>> mma["m"]["mma.sync"], mma["m"]["fma.rn.f32"], mma["m"]["cvt.tf32"]
    (1, 0, 0)
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


def nvcc_report(launches: dict[str, list[emulator.Launch]]) -> str:
    """The static mix and register report of every launched kernel ({tensor_cores: its
    launches}), compiled by nvcc with the options the launcher gave it; a note where nvcc is
    absent."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return "nvcc not found: the static mix and the register report are skipped."
    first = {}  # each kernel's first launch: its options, block and shared bytes
    for tensor_cores, variant_launches in launches.items():
        for launch in variant_launches:
            first.setdefault(label(launch.name, tensor_cores), launch)
    mix_rows, usage_rows = [], []
    by_options: dict[tuple[str, ...], list[str]] = {}
    for row, launch in first.items():
        by_options.setdefault(launch.options, []).append(row)
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
            for row in names:
                launch = first[row]
                m, u = mix[launch.name], usage[launch.name]
                loads = m["ld.shared"] + m["ld.shared.v2"] + m["ld.shared.v4"]
                mac = macs(m["fma.rn.f32"], m["mma.sync"])  # per lane, as in the counts
                mix_rows.append([row, " ".join(options), *(str(m[k]) for k in PTX_PATTERNS),
                                 ratio(mac, loads)])  # fmt: skip
                threads = math.prod(launch.block)
                shared = launch.shared_mem + u["smem"]
                blocks, limit, occ = occupancy(u["registers"], threads, shared)
                usage_rows.append([
                    row, str(threads), str(u["registers"]),
                    f"{u['spill_stores']} / {u['spill_loads']}", str(shared),
                    f"{blocks} ({limit})", f"{occ:.0%}",
                ])  # fmt: skip
    mix_rows.sort(key=lambda r: row_order(r[0]))  # in the order of the source, twins together
    usage_rows.sort(key=lambda r: row_order(r[0]))
    mix = table(["kernel", "options", *PTX_PATTERNS, "mac/ld.shared"], mix_rows)
    usage = table(["kernel", "threads", "registers", "spill st/ld B", "smem B",
                   "blocks/SM (limit)", "occupancy"], usage_rows)  # fmt: skip
    return (
        f"Static mix: nvcc -arch={ARCH} -ptx, instructions per .entry (not executed counts)\n"
        f"{mix}\n\nRegisters: nvcc -cubin -Xptxas -v; smem = the launch's dynamic shared memory "
        f"+ static; occupancy on {ARCH}\n{usage}"
    )


# ---------------------------------------------------------------------------------------------


def print_counts(
    launches: dict[str, list[emulator.Launch]],
    small: dict[str, list[emulator.Launch]],
    measured: tuple[int, int, int, int],
    gpu: Gpu,
) -> None:
    """The counts at the measured size, scaled to TARGET, and the roofline on `gpu`, for
    each tensor_cores choice in `launches` ({choice: its launches at (B, nh, T)}; `small` the
    same at (B, nh, t1), measured = (B, nh, t1, T)), in one table, every mma kernel beside its
    fmaf twin, with a total per choice."""
    B, nh, t1, T = measured
    fma_counted = "fmaf(" in emulator._strip_comments(_SOURCE.read_text())
    large_by = {v: per_kernel(launches[v], v) for v in launches}
    large = {row: c for counts in large_by.values() for row, c in counts.items()}
    large = dict(sorted(large.items(), key=lambda item: row_order(item[0])))
    print(
        "\nCounts summed over threads; i/e = instructions / 4-byte elements (a float4 load "
        "is 1 / 4)."
    )
    if not fma_counted:
        print(
            "fma: not counted (n/c): the kernel writes its multiply-adds as a * b + c, and "
            "the counting build counts fmaf calls only."
        )
    if any(v != "off" for v in launches):
        print(
            f"mma: mma.sync per lane (a warp's one counts 32). mac = fma + {MMA_MACS} * mma: one "
            f"m16n8k8 mma is\n16*8*8 multiply-adds, {MMA_MACS} a lane, so mac/ld.shared "
            "compares the mma kernels with the fmaf ones (there\nmac = fma). 3xtf32 takes three "
            "mma a product (big*big, big*small, small*big): a third of its mac are\nthe "
            "product's own. The mma kernels' fma are their few fmaf calls outside the products."
        )
    print(f"\nMeasured, B={B} nh={nh} T={T}:\n{counts_table(large, fma_counted)}")
    tile = largest_tile([launch for group in launches.values() for launch in group])
    if t1 % tile or T % tile:  # below a tile, the counts do not follow a T^2 + b T yet
        print(
            f"\nNot scaled: the fit needs T // 2 = {t1} and T = {T} to be multiples of the "
            f"largest tile ({tile}); pass --T {max(2 * tile, T + (-T) % (2 * tile))}."
        )
        return
    small_counts = {row: c for v in small for row, c in per_kernel(small[v], v).items()}
    target = scale(small_counts, large, measured, TARGET)
    B_to, nh_to, T_to = TARGET
    print(
        f"\nScaled to B={B_to} nh={nh_to} T={T_to}: per (batch, head) each count is "
        f"a*T^2 + b*T through T={t1} and T={T}, times B*nh:\n"
        f"{counts_table(target, fma_counted)}"
    )
    totals = {"total" if len(launches) == 1 else f"total {v}": list(large_by[v]) for v in launches}
    print(
        f"\nRoofline bound on {gpu.name} at B={B_to} nh={nh_to} T={T_to}: {gpu.sms} SMs at "
        f"{gpu.clock_ghz} GHz: fp32 {2 * gpu.fma_per_s / 1e12:.0f} TFLOP/s, shared "
        f"{gpu.shared_bytes_per_s / 1e12:.1f} TB/s, DRAM {gpu.dram_tb_s} TB/s;\nTF32 mma "
        f"{2 * gpu.tf32_mac_per_s / 1e12:.1f} TFLOP/s dense (assumed: "
        f"{gpu.tf32_mac_per_sm_clock} multiply-adds per SM and clock at "
        f"{gpu.tensor_clock_ghz} GHz). bound: the largest time, global\ncharged at DRAM for "
        "every access (an upper bound: K and V re-reads mostly hit L2); on-chip: the largest "
        f"of\nfma, mma and shared, the floor where they all do:\n"
        f"{roofline_table(target, gpu, fma_counted, totals)}"
    )
    for v, counts in large_by.items():
        names = {row.split(" ")[0] for row in counts}
        kernels = KERNELS if v == "off" else MMA_KERNELS
        not_launched = [name for name in kernels if name not in names]
        if not_launched:
            print(f"Not launched by the launcher ({v}): {', '.join(not_launched)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--nh", type=int, default=2)
    p.add_argument("--T", type=int, default=256, help="measured at T // 2 and T")
    p.add_argument("--hs", type=int, default=64)
    p.add_argument("--gpu", choices=sorted(GPUS), default="h100")
    p.add_argument(
        "--tensor-cores",
        choices=(*VARIANTS, "all"),
        default="all",
        help="the launcher's kernels to count: off (fmaf), tf32, 3xtf32, or all side by side",
    )
    p.add_argument("--no-causal", dest="causal", action="store_false")
    p.add_argument("--no-emulate", action="store_true", help="skip the counts and roofline")
    p.add_argument("--no-nvcc", action="store_true", help="skip the static mix")
    args = p.parse_args()
    B, nh, T, hs = args.B, args.nh, args.T, args.hs
    t1 = T // 2
    if t1 < 1:
        p.error("--T must be at least 2 (the counts are measured at T // 2 and T)")
    variants = VARIANTS if args.tensor_cores == "all" else (args.tensor_cores,)
    mask = "causal" if args.causal else "full"
    sources = [f"{_SOURCE.name}: {', '.join(KERNELS)}"] if "off" in variants else []
    mma = [v for v in variants if v != "off"]
    if mma:
        sources.append(f"{_MMA_SOURCE.name} ({', '.join(mma)}): {', '.join(MMA_KERNELS)}")
    print(f"{'; '.join(sources)}; {mask}, hs={hs}, {ARCH} launch plan")

    run = not args.no_emulate
    launches = {v: run_kernels(B, nh, T, hs, args.causal, run, v) for v in variants}
    if run:
        small = {v: run_kernels(B, nh, t1, hs, args.causal, tensor_cores=v) for v in variants}
        print_counts(launches, small, (B, nh, t1, T), GPUS[args.gpu])
    if not args.no_nvcc:
        print()
        print(nvcc_report(launches))


if __name__ == "__main__":
    main()
