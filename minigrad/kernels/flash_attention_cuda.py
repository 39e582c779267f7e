"""CuPy launcher for the FlashAttention-2 kernels in `flash_attention.cu`.

Holds `flash_attention_forward_cuda` and `flash_attention_backward_cuda`: they check their
inputs, pick the tile size and shared memory from the device's limits (`launch_plan`),
compile `flash_attention.cu` with `cupy.RawModule` (NVRTC) once per (tile, head size), and
launch. Semantics, shapes and argument names are those of the NumPy twin in
`flash_attention.py`, which is the reference every kernel is tested against.

Given NumPy arrays instead of CuPy ones, the same code runs the same kernels on the CPU
through `minigrad.kernels.emulator`, whose RawModule has CuPy's calling convention: the one
place that tells the two apart is `_runtime`, so every launch (grid, block, shared memory,
argument order) is tested on machines without a GPU too.

Two sets of kernels compute the same thing: `flash_attention.cu`, every product a scalar
fmaf in float32 (the one a learner reads first), and `flash_attention_mma.cu`, the products on
the tensor cores of an sm_80 or newer GPU, in TF32 or 3xTF32. The `tensor_cores` argument
picks: "auto" (the default) follows `minigrad.set_float32_matmul_precision`, the switch that
lets matmuls use TF32: "highest" (the default) keeps the fmaf kernels, "high" takes the
tensor cores in TF32; "off", "tf32" and "3xtf32" (about float32's accuracy) choose directly.
Both are tested against the twin; `bench/kernel_counts.py` and `bench/attention.py` measure
both.

Leaves out: float16/bfloat16 and float64 (the kernels are float32 only), head sizes outside
16..128, and autograd wiring. cupy is imported inside the functions, so this module imports
on a machine without a GPU.

Follows CuPy's RawModule / RawKernel interface (see CuPy's `examples/gemm`).
"""

from __future__ import annotations

import math
import numbers
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from minigrad.backend import xp_of

Array = Any  # a cupy.ndarray (or a NumPy one for the emulator): no real annotation

_SOURCE = Path(__file__).with_name("flash_attention.cu")
_MMA_SOURCE = Path(__file__).with_name("flash_attention_mma.cu")
# static_assert in the source needs C++11; stated so that every CuPy version compiles it alike.
# No --use_fast_math: accurate expf/logf keep the kernels within ~1e-6 of the twin.
_COMPILE_OPTIONS = ("-std=c++14",)
# TILE in the .cu (BR == BC) per kernel, largest first: the first that fits is used. Bigger
# tiles reload K and V (or Q and dO) less often. dK/dV stops at 32: it holds two accumulator
# blocks, and at 64 rows ptxas spills them at hs = 64 (sm_90, 128 registers a thread).
_TILES = {
    "flash_attn_fwd": (64, 32, 16),
    "flash_attn_bwd_dq": (64, 32, 16),
    "flash_attn_bwd_dkdv": (32, 16),
}
# The tensor-core kernels: a block is 4 warps owning 64 rows (BM in flash_attention_mma.cu); the
# tile the loop walks (KT) is the largest of these that fits, 32 at most above hs 64, where
# two 64-row accumulators of the dK/dV kernel would spill (ptxas, sm_90).
_MMA_TILES = {
    "flash_mma_fwd": (64, 32, 16),
    "flash_mma_bwd_dq": (64, 32, 16),
    "flash_mma_bwd_dkdv": (64, 32, 16),
}
_MMA_ROWS, _MMA_THREADS = 64, 128
# tensor_cores= values: the mma kernels' PASSES (None: the fmaf kernels).
TENSOR_CORES = {"off": None, "tf32": 1, "3xtf32": 3}
_ROWS_PER_THREAD, _LANES_PER_ROW = 4, 16  # RT and TC in the .cu: a block's thread grid
_PREPROCESS_THREADS = 128  # flash_attn_bwd_preprocess: four warps, one query row each
# Above 128 the accumulators outgrow the registers; below 16 most lanes of P V would idle.
_HS_MIN, _HS_MAX = 16, 128
_MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y, which indexes (batch, head)
# A null device pointer passed by value: 8 zero bytes. (Passing None also means null in
# recent CuPy, but older versions turn None into a missing argument.)
_NULL = np.intp(0)


def _runtime(x: Array) -> tuple[ModuleType, Any, dict]:
    """The array module, RawModule class and device attributes for x: CuPy's for a CuPy
    array, the emulator's for a NumPy one. The only line that knows which it got."""
    xp = xp_of(x)
    if xp is np:
        from minigrad.kernels import emulator

        return np, emulator.RawModule, emulator.current_device().attributes
    return xp, xp.RawModule, xp.cuda.Device().attributes


@cache
def _module(
    raw_module: Any, tile: int, hs: int, passes: int | None = None, dropout: bool = False
) -> Any:
    """The kernels built with `tile`-row tiles for head size hs: the fmaf kernels, or with
    `passes` the tensor-core ones; with `dropout`, the build that has attention dropout's mask
    (-DDROPOUT=1; the others leave its code out). Compiled on first use, then cached (CuPy and
    the emulator also keep the binary on disk, keyed by source and options)."""
    extra = ("-DDROPOUT=1",) if dropout else ()
    if passes is None:
        options = (*_COMPILE_OPTIONS, f"-DTILE={tile}", f"-DHS={hs}", *extra)
        return raw_module(code=_SOURCE.read_text(), options=options)
    options = (*_COMPILE_OPTIONS, f"-DKT={tile}", f"-DHS={hs}", f"-DPASSES={passes}", *extra)
    return raw_module(code=_MMA_SOURCE.read_text(), options=options)


def resolve_tensor_cores(tensor_cores: str, attributes: dict) -> int | None:
    """The mma kernels' PASSES for `tensor_cores` on a device with these attributes, or None
    for the fmaf kernels.

    "auto": TF32 where `set_float32_matmul_precision("high")` allows it and the device has
    TF32 tensor cores (compute capability 8.0 or newer), else the fmaf kernels. An explicit
    "tf32" or "3xtf32" on an older device is refused with the reason.

    >>> sm80, sm75 = {"ComputeCapabilityMajor": 8}, {"ComputeCapabilityMajor": 7}
    >>> resolve_tensor_cores("3xtf32", sm80), resolve_tensor_cores("auto", sm75)
    (3, None)
    """
    from minigrad.backend import get_float32_matmul_precision

    has_tf32 = attributes["ComputeCapabilityMajor"] >= 8
    if tensor_cores == "auto":
        return 1 if has_tf32 and get_float32_matmul_precision() == "high" else None
    if tensor_cores not in TENSOR_CORES:
        raise ValueError(
            f"tensor_cores={tensor_cores!r}: use 'auto' (set_float32_matmul_precision decides), "
            f"'off' (float32 fmaf), 'tf32' or '3xtf32'"
        )
    if TENSOR_CORES[tensor_cores] is not None and not has_tf32:
        raise ValueError(
            f"tensor_cores={tensor_cores!r} needs TF32 tensor cores (compute capability 8.0 or "
            f"newer); this GPU is {attributes['ComputeCapabilityMajor']}.x: use 'off'"
        )
    return TENSOR_CORES[tensor_cores]


def _threads(tile: int) -> int:
    """Threads per block, NTHREADS in the .cu: (tile / RT) row groups of TC lanes.

    >>> _threads(64), _threads(32), _threads(16)
    (256, 128, 64)
    """
    return tile // _ROWS_PER_THREAD * _LANES_PER_ROW


def _shared_bytes(kernel: str, hs: int, tile: int) -> int:
    """Dynamic shared memory one block of `kernel` needs, mirroring the layout in the .cu.

    Tiles of rows have a stride of hs rounded up to a multiple of 4, plus 4 (LDV), score
    tiles one of tile + 4 (LDP): float4-aligned rows, 4 banks apart. The mma kernels' rows
    have hs rounded up to a multiple of 8, plus 4 (LD), and no score tiles.

    >>> _shared_bytes("flash_attn_fwd", 64, 64)  # Q, K, V tiles + P: (3*64*68 + 64*68) * 4
    69632
    >>> _shared_bytes("flash_mma_fwd", 64, 64)  # Q (64 rows), K, V tiles: (3*64*68) * 4
    52224
    """
    if kernel.startswith("flash_mma"):
        ld, own = -(-hs // 8) * 8 + 4, _MMA_ROWS
        floats = {
            "flash_mma_fwd": (own + 2 * tile) * ld,  # sQ, sK, sV
            "flash_mma_bwd_dq": (2 * own + 2 * tile) * ld,  # sQ, sdO, sK, sV
            "flash_mma_bwd_dkdv": (2 * own + 2 * tile) * ld + 2 * tile,  # + sLse, sD
        }[kernel]
        return 4 * floats
    ldv = -(-hs // 4) * 4 + 4
    rows, scores = tile * ldv, tile * (tile + 4)
    floats = {
        "flash_attn_fwd": 3 * rows + scores,  # sQ, sK, sV, sP
        "flash_attn_bwd_dq": 4 * rows + scores,  # sQ, sdO, sK, sV, sdS
        "flash_attn_bwd_dkdv": 4 * rows + 2 * scores + 2 * tile,  # + sPt, sdSt, sLse, sD
    }[kernel]
    return 4 * floats


def launch_plan(kernel: str, hs: int, attributes: dict) -> tuple[int, int]:
    """(tile, shared bytes) for `kernel` at head size hs on a device with these attributes.

    The largest tile whose shared memory fits the device's opt-in limit: bigger tiles reload
    K and V less often. Raises ValueError, naming the limit, where no tile fits.

    >>> t4 = {"MaxSharedMemoryPerBlockOptin": 64 * 1024}
    >>> launch_plan("flash_attn_fwd", 128, t4), launch_plan("flash_attn_bwd_dkdv", 128, t4)
    ((32, 55296), (16, 36480))
    """
    limit = attributes["MaxSharedMemoryPerBlockOptin"]
    tiles = _MMA_TILES[kernel] if kernel.startswith("flash_mma") else _TILES[kernel]
    if kernel.startswith("flash_mma") and hs > 64:
        tiles = tuple(tile for tile in tiles if tile <= 32)
    for tile in tiles:
        smem = _shared_bytes(kernel, hs, tile)
        if smem <= limit:
            return tile, smem
    raise ValueError(
        f"{kernel} with hs={hs} needs {smem} bytes of shared memory per block even with "
        f"{tile}-row tiles, but this GPU allows {limit}; use a smaller head size"
    )


def _launch(
    name: str,
    n_rows: int,
    batch_heads: int,
    args: tuple,
    hs: int,
    passes: int | None = None,
    dropout: bool = False,
) -> None:
    """Launch a tiled kernel over (tiles of n_rows, batch_heads) blocks, with the tile and
    shared memory of `launch_plan`, opting in above the 48 KB default: the fmaf kernel
    `name`, or with `passes` its tensor-core twin (flash_attn_* -> flash_mma_*); with
    `dropout`, from the module built with attention dropout."""
    _, raw_module, attributes = _runtime(args[0])
    if passes is not None:
        name = name.replace("flash_attn_", "flash_mma_")
    tile, smem = launch_plan(name, hs, attributes)
    kernel = _module(raw_module, tile, hs, passes, dropout).get_function(name)
    if smem > attributes["MaxSharedMemoryPerBlock"]:  # 48 KB without opting in
        # The attribute belongs to the kernel on the current device; setting it is cheap.
        kernel.max_dynamic_shared_size_bytes = smem
    rows, threads = (tile, _threads(tile)) if passes is None else (_MMA_ROWS, _MMA_THREADS)
    grid = (-(-n_rows // rows), batch_heads)
    kernel(grid, (threads,), args, shared_mem=smem)


def _prepare(name: str, x: Array, ndim: int, xp: ModuleType) -> Array:
    """Check that x is a float32 array of `xp` with `ndim` dims; return it C-contiguous.

    Non-contiguous inputs (a transposed or sliced view) are copied, not refused: the kernels
    index rows as `row * hs + d`, and one copy is cheaper than a confused caller.
    """
    if not isinstance(x, xp.ndarray):
        raise TypeError(
            f"{name} must be a {xp.__name__} array like q (got {type(x).__name__}); use "
            f"{xp.__name__}.asarray"
        )
    if x.dtype != xp.float32:
        raise TypeError(
            f"{name} is {x.dtype}, but the CUDA kernels compute in float32 only: pass "
            f"{name}.astype(float32), or use the NumPy twin for float64"
        )
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dims; got shape {x.shape}")
    return xp.ascontiguousarray(x)


def _check_qkv(q: Array, k: Array, v: Array) -> tuple[Array, Array, Array]:
    """Validate the attention inputs (see the module docstring of the twin); return them
    contiguous."""
    xp = xp_of(q)
    q, k, v = _prepare("q", q, 4, xp), _prepare("k", k, 4, xp), _prepare("v", v, 4, xp)
    B, nh, T, hs = q.shape
    Bk, n_kv, S, hs_k = k.shape
    if v.shape != k.shape or Bk != B or hs_k != hs:
        raise ValueError(
            f"expected q (B, nh, T, hs) and k, v (B, n_kv, S, hs) with the same B and hs; got "
            f"{q.shape}, {k.shape}, {v.shape}"
        )
    if nh % n_kv != 0:
        raise ValueError(f"nh={nh} query heads must be a multiple of n_kv={n_kv} kv heads")
    if not 1 <= T <= S:
        raise ValueError(f"need 1 <= T <= S (queries at the end of the keys); got T={T}, S={S}")
    if not _HS_MIN <= hs <= _HS_MAX:
        raise ValueError(
            f"head size hs={hs} is outside the {_HS_MIN}..{_HS_MAX} the kernels support; use "
            f"the NumPy twin for other sizes"
        )
    if B * nh > _MAX_GRID_Y:
        raise ValueError(f"B * nh = {B * nh} exceeds the {_MAX_GRID_Y} blocks of gridDim.y")
    return q, k, v


def _slopes(alibi_slopes: Array | None, nh: int, xp: ModuleType) -> Array:
    """ALiBi slopes as a contiguous float32 vector of `xp`, or a null pointer: no ALiBi."""
    if alibi_slopes is None:
        return _NULL
    slopes = xp.ascontiguousarray(xp.asarray(alibi_slopes, dtype=xp.float32))
    if slopes.shape != (nh,):
        raise ValueError(f"alibi_slopes must have shape (nh,) = ({nh},); got {slopes.shape}")
    return slopes


def _window(window: int | None, causal: bool, S: int) -> np.int32:
    """The kernels' window argument: W, or 0 for none. A window of S or more hides no key
    that causal does not, so it is passed as 0 too (which also keeps S - T + q0 - W and
    k1 + W in int32). Raises ValueError for a window that is not a whole number >= 1 or
    comes without causal.

    >>> int(_window(None, True, 100)), int(_window(5, True, 100)), int(_window(500, True, 100))
    (0, 5, 0)
    """
    if window is None:
        return np.int32(0)
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
        raise ValueError(f"window must be None or a whole number >= 1; got {window!r}")
    if not causal:
        raise ValueError(f"window={window} is a causal band: pass causal=True with it")
    return np.int32(window if window < S else 0)


def _dropout(dropout_p: float, seed: int) -> tuple:
    """The kernels' dropout arguments: p, the kept weights' factor 1 / (1 - p) in float32 (as
    the naive path's dropout computes it, so both scale alike) and the seed as uint64. Raises
    ValueError for p outside [0, 1] or a seed outside [0, 2^64).

    >>> [float(a) for a in _dropout(0.2, 7)]
    [0.20000000298023224, 1.25, 7.0]
    """
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout_p must be in [0, 1] (the probability to drop); got {dropout_p}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be a whole number in [0, 2^64); got {seed!r}")
    # p = 1: every weight is dropped and the factor never used
    keep_scale = 1.0 / (1.0 - dropout_p) if dropout_p < 1 else math.inf
    return np.float32(dropout_p), np.float32(keep_scale), np.uint64(seed)


def _scalars(
    q: Array,
    k: Array,
    causal: bool,
    scale: float | None,
    window: int | None,
    dropout_p: float = 0.0,
    seed: int = 0,
) -> tuple:
    """The kernels' trailing arguments: nh, n_kv, T, S, hs, scale, causal, window, then
    dropout's p, factor and seed."""
    B, nh, T, hs = q.shape
    n_kv, S = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(hs) if scale is None else scale
    ints = (np.int32(nh), np.int32(n_kv), np.int32(T), np.int32(S), np.int32(hs))
    head = (*ints, np.float32(scale), np.int32(bool(causal)), _window(window, causal, S))
    return (*head, *_dropout(dropout_p, seed))


def flash_attention_forward_cuda(
    q: Array,
    k: Array,
    v: Array,
    causal: bool = True,
    alibi_slopes: Array | None = None,
    scale: float | None = None,
    window: int | None = None,
    tensor_cores: str = "auto",
    dropout_p: float = 0.0,
    seed: int = 0,
) -> tuple[Array, Array]:
    """Attention output o (B, nh, T, hs) and row logsumexp lse (B, nh, T) on the GPU.

    q (B, nh, T, hs), k and v (B, n_kv, S, hs), float32 cupy arrays (copied if not
    contiguous); nh % n_kv == 0, 1 <= T <= S, 16 <= hs <= 128. Refuses other dtypes, shapes
    and sizes with a ValueError/TypeError that says why. scale defaults to 1/sqrt(hs). A
    sliding `window` W (causal only) lets query i see keys (S - T) + i - W < j <= (S - T) + i,
    and the key tiles outside that band are never loaded. `tensor_cores` picks the fmaf or
    the tensor-core kernels (see the module docstring). `dropout_p` > 0 drops attention
    weights (training) with the mask of `seed`, the one the naive path's dropout draws on the
    GPU from the same seed (dropout_factor in the .cu); lse stays the undropped logsumexp.
    NumPy arrays run the same kernels in the emulator.
    """
    xp = xp_of(q)
    q, k, v = _check_qkv(q, k, v)
    passes = resolve_tensor_cores(tensor_cores, _runtime(q)[2])
    B, nh, T, hs = q.shape
    slopes = _slopes(alibi_slopes, nh, xp)
    o = xp.empty_like(q)
    lse = xp.empty((B, nh, T), dtype=xp.float32)
    args = (q, k, v, slopes, o, lse, *_scalars(q, k, causal, scale, window, dropout_p, seed))
    # blocks: (query tiles, b * nh + h)
    _launch("flash_attn_fwd", T, B * nh, args, hs, passes, dropout=dropout_p > 0)
    return o, lse


def flash_attention_backward_cuda(
    q: Array,
    k: Array,
    v: Array,
    o: Array,
    lse: Array,
    grad_o: Array,
    causal: bool = True,
    alibi_slopes: Array | None = None,
    scale: float | None = None,
    window: int | None = None,
    tensor_cores: str = "auto",
    dropout_p: float = 0.0,
    seed: int = 0,
) -> tuple[Array, Array, Array]:
    """Gradients dq (B, nh, T, hs), dk and dv (B, n_kv, S, hs) on the GPU.

    o and lse come from `flash_attention_forward_cuda` with the same arguments; grad_o has o's
    shape. Same input rules as the forward. Three launches: D = rowsum(grad_o * o), then dK
    and dV (one block per key tile), then dQ (one block per query tile); the .cu explains
    why dQ has its own kernel instead of atomicAdd. `tensor_cores`, `dropout_p` and `seed` as
    in the forward, which they must equal (the preprocess is the fmaf module's either way: it
    has no product to speed up).
    """
    xp = xp_of(q)
    q, k, v = _check_qkv(q, k, v)
    passes = resolve_tensor_cores(tensor_cores, _runtime(q)[2])
    B, nh, T, hs = q.shape
    n_kv = k.shape[1]
    o, grad_o = _prepare("o", o, 4, xp), _prepare("grad_o", grad_o, 4, xp)
    lse = _prepare("lse", lse, 3, xp)
    if o.shape != q.shape or grad_o.shape != q.shape or lse.shape != (B, nh, T):
        raise ValueError(
            f"o and grad_o must have q's shape {q.shape} and lse (B, nh, T) = {(B, nh, T)}; "
            f"got {o.shape}, {grad_o.shape}, {lse.shape}"
        )
    slopes = _slopes(alibi_slopes, nh, xp)
    scalars = _scalars(q, k, causal, scale, window, dropout_p, seed)

    D = xp.empty((B, nh, T), dtype=xp.float32)
    rows = B * nh * T
    warps_per_block = _PREPROCESS_THREADS // 32  # one warp per row
    pre = _module(_runtime(q)[1], _TILES["flash_attn_bwd_dkdv"][0], hs).get_function(
        "flash_attn_bwd_preprocess"
    )
    grid = (-(-rows // warps_per_block),)
    pre(grid, (_PREPROCESS_THREADS,), (o, grad_o, D, np.int32(rows), np.int32(hs)))

    dq = xp.empty_like(q)  # every element is written once: no zeroing needed
    dk = xp.empty_like(k)
    dv = xp.empty_like(v)
    args_kv = (q, k, v, slopes, grad_o, lse, D, dk, dv, *scalars)
    dropout = dropout_p > 0
    _launch("flash_attn_bwd_dkdv", k.shape[2], B * n_kv, args_kv, hs, passes, dropout)  # key tiles
    args_q = (q, k, v, slopes, grad_o, lse, D, dq, *scalars)
    _launch("flash_attn_bwd_dq", T, B * nh, args_q, hs, passes, dropout)  # (query tiles, b*nh+h)
    return dq, dk, dv
