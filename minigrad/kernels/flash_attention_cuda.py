"""CuPy launcher for the FlashAttention-2 kernels in `flash_attention.cu`.

Holds `flash_attention_forward_cuda` and `flash_attention_backward_cuda`: they check their
inputs, compile `flash_attention.cu` once with `cupy.RawModule` (NVRTC), size the grids and
shared memory, and launch. Semantics, shapes and argument names are those of the NumPy twin
in `flash_attention.py`, which is the reference every kernel is tested against.

Leaves out: float16/bfloat16 and float64 (the kernels are float32 only), head sizes outside
16..128, and autograd wiring. cupy is imported inside the functions, so this module imports
on a machine without a GPU.

Follows CuPy's RawModule / RawKernel interface (see CuPy's `examples/gemm`).
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

Array = Any  # a cupy.ndarray; cupy is not importable everywhere, so no real annotation

_SOURCE = Path(__file__).with_name("flash_attention.cu")
# static_assert in the source needs C++11; stated so that every CuPy version compiles it alike.
# No --use_fast_math: accurate expf/logf keep the kernels within ~1e-6 of the twin.
_COMPILE_OPTIONS = ("-std=c++14",)
_TILE = 32  # BR == BC in the .cu: query rows and key rows per tile
_THREADS = 128  # NTHREADS in the .cu: TPR = 4 threads per tile row
_HS_MIN, _HS_MAX = 16, 128  # HS_MAX in the .cu; below 16 most lanes would idle
_DEFAULT_SHARED = 48 * 1024  # bytes a block gets without opting in to more
_MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y, which indexes (batch, head)
# A null device pointer passed by value: 8 zero bytes. (Passing None also means null in
# recent CuPy, but older versions turn None into a missing argument.)
_NULL = np.intp(0)


@cache
def _module() -> Any:
    """The compiled module; CuPy compiles on first use and caches the binary per device."""
    import cupy

    return cupy.RawModule(code=_SOURCE.read_text(), options=_COMPILE_OPTIONS)


def _shared_bytes(kernel: str, hs: int) -> int:
    """Dynamic shared memory one block of `kernel` needs, mirroring the layout in the .cu.

    Tiles have a row stride of hs rounded up to odd (hs | 1); score tiles have TILE + 1.

    >>> _shared_bytes("flash_attn_fwd", 64)  # Q, K, V tiles + P: (3*32*65 + 32*33) * 4
    29184
    """
    ld = hs | 1
    scores = _TILE * (_TILE + 1)
    floats = {
        "flash_attn_fwd": 3 * _TILE * ld + scores,  # sQ, sK, sV, sP
        "flash_attn_bwd_dq": 4 * _TILE * ld + scores,  # sQ, sdO, sK, sV, sdS
        "flash_attn_bwd_dkdv": 4 * _TILE * ld + 2 * scores + 2 * _TILE,  # + sLse, sD
    }[kernel]
    return 4 * floats


def _launch(name: str, grid: tuple[int, ...], args: tuple, hs: int) -> None:
    """Launch a tiled kernel with its shared memory, opting in above the 48 KB default."""
    import cupy

    kernel = _module().get_function(name)
    smem = _shared_bytes(name, hs)
    if smem > _DEFAULT_SHARED:
        limit = cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"]
        if smem > limit:
            raise ValueError(
                f"{name} with hs={hs} needs {smem} bytes of shared memory per block, but this "
                f"GPU allows {limit}; use a smaller head size (hs <= 64 fits every GPU)"
            )
        # The attribute belongs to the kernel on the current device; setting it is cheap.
        kernel.max_dynamic_shared_size_bytes = smem
    kernel(grid, (_THREADS,), args, shared_mem=smem)


def _prepare(name: str, x: Array, ndim: int) -> Array:
    """Check that x is a float32 cupy array of `ndim` dims; return it C-contiguous.

    Non-contiguous inputs (a transposed or sliced view) are copied, not refused: the kernels
    index rows as `row * hs + d`, and one copy is cheaper than a confused caller.
    """
    import cupy

    if not isinstance(x, cupy.ndarray):
        raise TypeError(f"{name} must be a cupy array (got {type(x).__name__}); use cupy.asarray")
    if x.dtype != cupy.float32:
        raise TypeError(
            f"{name} is {x.dtype}, but the CUDA kernels compute in float32 only: pass "
            f"{name}.astype(cupy.float32), or use the NumPy twin for float64"
        )
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dims; got shape {x.shape}")
    return cupy.ascontiguousarray(x)


def _check_qkv(q: Array, k: Array, v: Array) -> tuple[Array, Array, Array]:
    """Validate the attention inputs (see the module docstring of the twin); return them
    contiguous."""
    q, k, v = _prepare("q", q, 4), _prepare("k", k, 4), _prepare("v", v, 4)
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


def _slopes(alibi_slopes: Array | None, nh: int) -> Array:
    """ALiBi slopes as a contiguous float32 cupy vector, or a null pointer: no ALiBi."""
    import cupy

    if alibi_slopes is None:
        return _NULL
    slopes = cupy.ascontiguousarray(cupy.asarray(alibi_slopes, dtype=cupy.float32))
    if slopes.shape != (nh,):
        raise ValueError(f"alibi_slopes must have shape (nh,) = ({nh},); got {slopes.shape}")
    return slopes


def _scalars(q: Array, k: Array, causal: bool, scale: float | None) -> tuple:
    """The kernels' trailing int/float arguments: nh, n_kv, T, S, hs, scale, causal."""
    B, nh, T, hs = q.shape
    n_kv, S = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(hs) if scale is None else scale
    ints = (np.int32(nh), np.int32(n_kv), np.int32(T), np.int32(S), np.int32(hs))
    return (*ints, np.float32(scale), np.int32(bool(causal)))


def flash_attention_forward_cuda(
    q: Array,
    k: Array,
    v: Array,
    causal: bool = True,
    alibi_slopes: Array | None = None,
    scale: float | None = None,
) -> tuple[Array, Array]:
    """Attention output o (B, nh, T, hs) and row logsumexp lse (B, nh, T) on the GPU.

    q (B, nh, T, hs), k and v (B, n_kv, S, hs), float32 cupy arrays (copied if not
    contiguous); nh % n_kv == 0, 1 <= T <= S, 16 <= hs <= 128. Refuses other dtypes, shapes
    and sizes with a ValueError/TypeError that says why. scale defaults to 1/sqrt(hs).
    """
    import cupy

    q, k, v = _check_qkv(q, k, v)
    B, nh, T, hs = q.shape
    slopes = _slopes(alibi_slopes, nh)
    o = cupy.empty_like(q)
    lse = cupy.empty((B, nh, T), dtype=cupy.float32)
    grid = (-(-T // _TILE), B * nh)  # (query tiles, b * nh + h)
    args = (q, k, v, slopes, o, lse, *_scalars(q, k, causal, scale))
    _launch("flash_attn_fwd", grid, args, hs)
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
) -> tuple[Array, Array, Array]:
    """Gradients dq (B, nh, T, hs), dk and dv (B, n_kv, S, hs) on the GPU.

    o and lse come from `flash_attention_forward_cuda` with the same arguments; grad_o has o's
    shape. Same input rules as the forward. Three launches: D = rowsum(grad_o * o), then dK
    and dV (one block per key tile), then dQ (one block per query tile); the .cu explains
    why dQ has its own kernel instead of atomicAdd.
    """
    import cupy

    q, k, v = _check_qkv(q, k, v)
    B, nh, T, hs = q.shape
    n_kv, S = k.shape[1], k.shape[2]
    o, grad_o = _prepare("o", o, 4), _prepare("grad_o", grad_o, 4)
    lse = _prepare("lse", lse, 3)
    if o.shape != q.shape or grad_o.shape != q.shape or lse.shape != (B, nh, T):
        raise ValueError(
            f"o and grad_o must have q's shape {q.shape} and lse (B, nh, T) = {(B, nh, T)}; "
            f"got {o.shape}, {grad_o.shape}, {lse.shape}"
        )
    slopes = _slopes(alibi_slopes, nh)
    scalars = _scalars(q, k, causal, scale)

    D = cupy.empty((B, nh, T), dtype=cupy.float32)
    rows = B * nh * T
    warps_per_block = _THREADS // 32  # one warp per row
    pre = _module().get_function("flash_attn_bwd_preprocess")
    pre((-(-rows // warps_per_block),), (_THREADS,), (o, grad_o, D, np.int32(rows), np.int32(hs)))

    dq = cupy.empty_like(q)  # every element is written once: no zeroing needed
    dk = cupy.empty_like(k)
    dv = cupy.empty_like(v)
    grid_kv = (-(-S // _TILE), B * n_kv)  # (key tiles, b * n_kv + kv_head)
    _launch("flash_attn_bwd_dkdv", grid_kv, (q, k, v, slopes, grad_o, lse, D, dk, dv, *scalars), hs)
    grid_q = (-(-T // _TILE), B * nh)  # (query tiles, b * nh + h)
    _launch("flash_attn_bwd_dq", grid_q, (q, k, v, slopes, grad_o, lse, D, dq, *scalars), hs)
    return dq, dk, dv
