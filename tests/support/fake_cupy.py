"""A strict stand-in for the parts of CuPy that minigrad uses, backed by NumPy: tests only.

The ``fake_cupy`` fixture in tests/conftest.py loads this file as ``cupy`` (and the
``cupyx`` modules it builds as ``cupyx``), for one test, so that the project's CuPy code
path (``backend.py``, every ``xp`` branch, ``cupyx`` special functions, device moves in
checkpoints, generation and LoRA) runs on a machine without a GPU. Outside that fixture
nothing can import it as ``cupy``: this folder is never on ``sys.path``.

Where it matters, it behaves as CuPy does (``cupy/_core/core.pyx``):
- ``ndarray`` is its own type; nothing converts it to NumPy implicitly: ``np.asarray(x)``
  raises TypeError with CuPy's message, and so does any NumPy function or ufunc given one
  (CuPy would dispatch some of those to itself; the stand-in refuses them all, so the
  project asks the array's own namespace, ``xp_of(x)``, as it must for the ones CuPy lacks).
- A CuPy function or operator given a NumPy array raises TypeError ("Unsupported type"),
  except where CuPy copies host data in: ``asarray``/``array``/``ascontiguousarray``,
  indices, and the value of an item assignment.
- ``.get()`` and ``asnumpy`` are the explicit ways to the host; ``item``, ``tolist``,
  ``float``/``int``/``bool``, ``repr`` and boolean-mask indexing (CuPy counts the mask on the
  host to size its result) are the implicit ones. Each counts one device-to-host transfer in
  ``device_to_host``, so a test can see an op that quietly synchronises with the host;
  ``host_to_device`` counts the copies the other way, so it can see a constant re-uploaded
  at every step.
- ``RawModule`` and ``RawKernel`` run the CUDA sources on the CPU through
  ``minigrad.kernels.emulator``, and ``cuda.Device()`` is the GPU that it pretends to be.
- ``cuda.nccl`` (also ``cupy.cuda.nccl`` in ``sys.modules``) runs NCCL's ``allReduce`` and
  ``allGather`` on the memory behind device pointers (``x.data.ptr``), through the mpi4py
  communicator a test hands it in ``cuda.nccl.mpi_comm``: no device-to-host transfer counted,
  as none happens on GPUs. Like NCCL, it refuses two ranks on one GPU.
- ``kernel_launches`` counts what CuPy would launch: each operator, function, reduction,
  copy, gather, item assignment, ``add.at``, RawKernel call and random draw on device arrays;
  a result that shares memory with an input (a reshape, a transpose, a basic slice) is a view
  and counts none, and ``empty`` only allocates. ``bytes_allocated`` adds up the new arrays'
  sizes and ``generators_created`` the RandomStates made (bench/gpu_step_counts.py reads all).
- ``bytes_moved`` adds up what each of those launches reads and writes in device memory, each
  array it touches once (what it could not do with less: its floor on a GPU's memory
  bandwidth); a gather or an item assignment, the elements it picks. ``matmul_flops`` adds up
  the matrix products' floating-point operations (2 per multiply-add).
- ``cupy._core._routines_linalg.set_compute_type(float32, COMPUTE_TYPE_TF32)`` makes float32
  products round their inputs to TF32 (10 significand bits), as the tensor cores do.
- ``cuda.Device().mem_info`` and ``get_default_memory_pool().free_bytes()`` report the
  module's ``free_memory``, ``total_memory`` and ``pool_free_bytes``, which a test may set (what
  attention's impl="auto" reads to see whether the naive path fits).

Left out on purpose: streams, memory pools beyond their free bytes, and every CuPy function the
project does not call (asking for one raises AttributeError naming it: add it here if CuPy has
it).
"""

from __future__ import annotations

import ctypes
import math
import operator
import os
import types
from typing import Any

import numpy as np

device_to_host = 0  # transfers so far: explicit (get, asnumpy) and implicit (item, float, ...)
host_to_device = 0  # copies of host data in: asarray/array of host data, host indices and values
kernel_launches = 0  # device kernels: each operator, function, reduction, copy, kernel and draw
generators_created = 0  # random generators made (cupy.random.RandomState)
bytes_allocated = 0  # bytes of the new arrays those kernels made (views and results of none)
bytes_moved = 0  # bytes those kernels read and wrote, each array they touch once
matmul_flops = 0  # floating-point operations of the matrix products (2 per multiply-add)

_HOST_ERROR = (
    "Implicit conversion to a NumPy array is not allowed. "
    "Please use `.get()` to construct a NumPy array explicitly."
)


def _to_host(a: np.ndarray) -> np.ndarray:
    """Count one device-to-host transfer of ``a``."""
    global device_to_host
    device_to_host += 1
    return a


def _from_host(a: Any) -> Any:
    """Count one host-to-device copy of ``a``."""
    global host_to_device
    host_to_device += 1
    return a


def _dev(x: Any) -> Any:
    """The NumPy array behind a device array; NumPy arrays refused, as CuPy refuses them."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, np.ndarray):
        raise TypeError(f"Unsupported type {type(x)}")
    if isinstance(x, (list, tuple)):
        return type(x)(_dev(v) for v in x)
    return x  # Python and NumPy scalars, dtypes, None, slices


def _host_in(x: Any) -> Any:
    """As ``_dev``, but NumPy arrays and lists are copied in (indices, assigned values)."""
    if isinstance(x, np.ndarray):
        return _from_host(x).copy()
    if isinstance(x, tuple):
        return tuple(_host_in(v) for v in x)
    return _dev(x)


def _launched(r: Any, *inputs: Any, moved: int | None = None) -> Any:
    """Count one kernel launch, the new device memory its result holds and the bytes it moves
    (``moved``, else its ``inputs``' and new results' sizes, each array once); wrap the result.

    A result that shares memory with an input is a view (a reshape, a transpose, a basic
    slice): CuPy launches nothing for it, so neither does this count.
    """
    global kernel_launches, bytes_allocated, bytes_moved
    results = r if isinstance(r, (tuple, list)) else (r,)
    arrays = [np.asarray(a) for a in results if isinstance(a, (np.ndarray, np.generic))]
    sources = [a for a in inputs if isinstance(a, np.ndarray)]
    fresh = [a for a in arrays if not any(np.may_share_memory(a, b) for b in sources)]
    if fresh or not arrays:  # a new array, or an in-place kernel that returns none
        kernel_launches += 1
        bytes_allocated += sum(a.nbytes for a in fresh)
        bytes_moved += _nbytes(sources + fresh) if moved is None else moved
    return _wrap(r)


def _nbytes(arrays: Any) -> int:
    """The bytes of the distinct arrays among ``arrays`` (NumPy arrays behind device arrays, or
    device arrays; anything else is no memory): an array a kernel reads twice counts once."""
    behind = (a._a if isinstance(a, ndarray) else a for a in arrays)
    seen = {id(a): a for a in behind if isinstance(a, np.ndarray)}
    return sum(a.nbytes for a in seen.values())


def _wrap(r: Any) -> Any:
    """Results as device arrays: NumPy scalars become 0-d arrays, as CuPy's reductions give."""
    if isinstance(r, (np.ndarray, np.generic)):
        return ndarray._of(np.asarray(r))
    if isinstance(r, tuple):
        return tuple(_wrap(v) for v in r)
    if isinstance(r, list):
        return [_wrap(v) for v in r]
    return r


class ndarray:  # noqa: N801 (CuPy's name)
    """A device array: a NumPy array that the host can reach only through ``get()``."""

    __slots__ = ("_a",)
    __hash__ = None

    def __init__(self, shape: Any, dtype: Any = float) -> None:
        self._a = np.empty(shape, dtype=dtype)

    @classmethod
    def _of(cls, a: np.ndarray) -> ndarray:
        x = object.__new__(cls)
        x._a = a
        return x

    # ---- what NumPy sees -----------------------------------------------------------------------
    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError(_HOST_ERROR)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        # subtle: `np.float32(2) * x` reaches here as np.multiply(scalar, x); CuPy computes it
        # on the device, so the operator forms with NumPy scalars are let through.
        scalars_only = all(isinstance(v, (ndarray, np.generic, int, float)) for v in inputs)
        if method == "__call__" and not kwargs and scalars_only and ufunc.__name__ in _OPERATORS:
            operands = [_dev(v) for v in inputs]
            return _launched(ufunc(*operands), *operands)
        raise TypeError(
            f"numpy.{ufunc.__name__}{'' if method == '__call__' else '.' + method} was given a "
            f"cupy array: NumPy cannot compute on device memory; call it from the array's own "
            f"namespace (minigrad.backend.xp_of(x)), or move the data with .get()"
        )

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        raise TypeError(
            f"numpy.{func.__name__} was given a cupy array: NumPy cannot compute on device "
            f"memory; call it from the array's own namespace (minigrad.backend.xp_of(x)), or "
            f"move the data with .get()"
        )

    # ---- the ways to the host ------------------------------------------------------------------
    def get(self) -> np.ndarray:
        return _to_host(self._a).copy()

    def item(self) -> Any:
        return _to_host(self._a).item()

    def tolist(self) -> Any:
        return _to_host(self._a).tolist()

    def __float__(self) -> float:
        return float(_to_host(self._a))

    def __int__(self) -> int:
        return int(_to_host(self._a))

    def __index__(self) -> int:
        return operator.index(_to_host(self._a))

    def __bool__(self) -> bool:
        return bool(_to_host(self._a))

    def __repr__(self) -> str:
        return repr(_to_host(self._a)).replace("array", "cupy.array", 1)

    __str__ = __repr__

    # ---- attributes, indexing and methods --------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    base = property(lambda self: None if self._a.base is None else ndarray._of(self._a.base))
    data = property(lambda self: types.SimpleNamespace(ptr=self._a.ctypes.data))  # the pointer
    T = property(lambda self: ndarray._of(self._a.T))

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self):
        return (ndarray._of(np.asarray(row)) for row in self._a)

    def __getitem__(self, index: Any) -> Any:
        index = _host_in(index)
        parts = index if isinstance(index, tuple) else (index,)
        if any(isinstance(p, np.ndarray) and p.dtype == bool for p in parts):
            _to_host(self._a)  # CuPy counts the mask's True entries on the host
        result = self._a[index]
        if isinstance(result, np.generic):  # one element: CuPy gives a 0-d view, no kernel
            return _wrap(result)
        # a basic slice is a view: no kernel either; a gather reads and writes what it picks
        return _launched(result, self._a, moved=2 * result.nbytes)

    def __setitem__(self, index: Any, value: Any) -> None:
        index, value = _host_in(index), _host_in(value)
        self._a[index] = value
        _launched(None, moved=np.asarray(self._a[index]).nbytes + _nbytes([value]))

    def __getattr__(self, name: str) -> Any:
        if name not in _METHODS:
            raise AttributeError(f"the CuPy stand-in has no ndarray.{name}; add it if CuPy has it")
        method = getattr(self._a, name)
        return lambda *args, **kwargs: _launched(
            method(*_dev(args), **_dev_kwargs(kwargs)), self._a, *_dev(args)
        )


def _dev_kwargs(kwargs: dict) -> dict:
    return {k: _dev(v) for k, v in kwargs.items()}


_METHODS = frozenset(
    "all any argmax argmin argsort astype clip copy cumsum diagonal dot fill flatten max mean "
    "min prod ravel repeat reshape round sort squeeze std sum swapaxes take transpose var "
    "view".split()
)
# ufuncs behind Python's operators: the ones a NumPy scalar on the left sends to __array_ufunc__
_OPERATORS = frozenset(
    "add subtract multiply true_divide divide floor_divide remainder power matmul "
    "bitwise_and bitwise_or bitwise_xor left_shift right_shift equal not_equal less less_equal "
    "greater greater_equal".split()
)


def _unary(fn: Any) -> Any:
    return lambda self: _launched(fn(self._a), self._a)


def _binary(fn: Any) -> Any:
    return lambda self, other: _launched(fn(self._a, _dev(other)), self._a, _dev(other))


def _reflected(fn: Any) -> Any:
    return lambda self, other: _launched(fn(_dev(other), self._a), _dev(other), self._a)


def _inplace(fn: Any) -> Any:
    def op(self: ndarray, other: Any) -> ndarray:
        self._a = fn(self._a, _dev(other))  # operator.iadd & co. write into the array itself
        _launched(None, moved=2 * self._a.nbytes + _nbytes([other]))
        return self

    return op


for _name in "add sub mul truediv floordiv mod pow matmul and or xor lshift rshift".split():
    _fn = getattr(operator, _name + "_" if _name in ("and", "or") else _name)
    setattr(ndarray, f"__{_name}__", _binary(_fn))
    setattr(ndarray, f"__r{_name}__", _reflected(_fn))
    setattr(ndarray, f"__i{_name}__", _inplace(getattr(operator, f"i{_name}")))
for _name in "eq ne lt le gt ge".split():
    setattr(ndarray, f"__{_name}__", _binary(getattr(operator, _name)))
for _name in "neg pos abs invert".split():
    setattr(ndarray, f"__{_name}__", _unary(getattr(operator, _name)))


# ---- float32 matrix products: exact, or TF32 (cupy._core._routines_linalg's compute type) ----
_compute_types: dict[np.dtype, int] = {}
_routines_linalg = types.SimpleNamespace(
    COMPUTE_TYPE_DEFAULT=1,
    COMPUTE_TYPE_TF32=7,
    set_compute_type=lambda dtype, kind: _compute_types.__setitem__(np.dtype(dtype), kind),
    get_compute_type=lambda dtype: _compute_types.get(np.dtype(dtype), 1),
)
_core = types.SimpleNamespace(_routines_linalg=_routines_linalg)


def _tf32(a: np.ndarray) -> np.ndarray:
    """float32 rounded to TF32 as the tensor cores take it (PTX cvt.rna.tf32.f32): 10 significand
    bits, to nearest with ties away from zero; inf and NaN as they are."""
    rounded = ((a.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(np.isfinite(a), rounded, a)


def _matmul(a: Any, b: Any) -> Any:
    global matmul_flops
    tf32 = _compute_types.get(np.dtype(np.float32)) == _routines_linalg.COMPUTE_TYPE_TF32
    if tf32 and np.result_type(a, b) == np.float32:
        a, b = _tf32(np.asarray(a, np.float32)), _tf32(np.asarray(b, np.float32))
    out = np.matmul(a, b)
    matmul_flops += 2 * np.size(out) * np.shape(a)[-1]  # a multiply and an add per k
    return out


ndarray.__matmul__, ndarray.__rmatmul__ = _binary(_matmul), _reflected(_matmul)


# ---- the cupy namespace ----------------------------------------------------------------------
def asarray(a: Any, dtype: Any = None, order: Any = None) -> ndarray:
    """Device data as is (or cast); host data copied to the device."""
    if isinstance(a, ndarray):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    return array(a, dtype=dtype)


def array(a: Any, dtype: Any = None, copy: bool = True) -> ndarray:
    if isinstance(a, ndarray):
        return _launched(np.array(a._a, dtype=dtype, copy=copy), a._a)
    host = _from_host(_dev(a) if isinstance(a, (list, tuple)) else a)
    return ndarray._of(np.array(host, dtype=dtype))


def ascontiguousarray(a: Any, dtype: Any = None) -> ndarray:
    source = asarray(a)._a
    return _launched(np.ascontiguousarray(source, dtype=dtype), source)


def asnumpy(a: Any) -> np.ndarray:
    return a.get() if isinstance(a, ndarray) else np.asarray(a)


def get_array_module(*args: Any) -> types.ModuleType:
    import sys

    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else np


def _device_function(fn: Any) -> Any:
    def on_device(*args: Any, **kwargs: Any) -> Any:
        inputs = _dev(args)
        result = fn(*inputs, **_dev_kwargs(kwargs))
        if fn.__name__ in _ALLOCATE_ONLY:  # memory, no kernel to fill it
            global bytes_allocated
            bytes_allocated += result.nbytes
            return _wrap(result)
        flat = [x for x in inputs for x in (x if isinstance(x, (list, tuple)) else (x,))]
        return _launched(result, *flat)

    on_device.__name__ = fn.__name__
    return on_device


_ALLOCATE_ONLY = frozenset(("empty", "empty_like"))
# NumPy functions CuPy has, run on the arrays behind the device arrays
_FUNCTIONS = (
    "abs absolute add all any arange argmax argmin argsort atleast_1d bincount broadcast_to ceil "
    "clip concatenate cos cumprod cumsum divide dot einsum empty empty_like equal exp exp2 "
    "expand_dims expm1 eye flip floor full full_like greater greater_equal inner isclose "
    "isfinite isinf isnan less less_equal linspace log log1p log2 logaddexp logical_and "
    "logical_not logical_or matmul max maximum mean min minimum moveaxis multiply negative "
    "not_equal ones ones_like outer power prod ravel repeat reshape round sign sin sort split "
    "sqrt square squeeze stack std subtract sum swapaxes take take_along_axis tanh tensordot "
    "tile transpose tril triu true_divide var vdot where zeros zeros_like"
).split()
_NAMESPACE = {name: _device_function(getattr(np, name)) for name in _FUNCTIONS}
_NAMESPACE["matmul"] = _device_function(_matmul)  # honours the compute type, as @ does


class _AddUfunc:
    """cupy.add: called as the function, and ``add.at(a, indices, b)``, the in-place add with
    repeated indices adding up (what replaces the deprecated ``cupyx.scatter_add``)."""

    __name__ = "add"
    __call__ = staticmethod(_NAMESPACE["add"])

    @staticmethod
    def at(a: ndarray, indices: Any, b: Any) -> None:
        if not isinstance(a, ndarray):
            raise TypeError(f"Unsupported type {type(a)}")
        np.add.at(a._a, _host_in(indices), _dev(b))
        rows = np.asarray(_dev(b)).nbytes  # read b, and read and write as much of a
        _launched(None, moved=3 * rows)


_NAMESPACE["add"] = _AddUfunc()
# dtypes and constants are NumPy's own, as in CuPy
_NAMESPACE.update(
    (name, getattr(np, name))
    for name in (
        "bool_ int8 int16 int32 int64 uint8 uint16 uint32 uint64 intp float16 float32 float64 "
        "dtype finfo iinfo result_type promote_types can_cast issubdtype integer floating "
        "newaxis inf nan pi e"
    ).split()
)


def __getattr__(name: str) -> Any:
    # subtle: looked up here, not set as globals, so `sum`, `any`, `max`... inside this
    # module stay Python's builtins
    if name in _NAMESPACE:
        return _NAMESPACE[name]
    raise AttributeError(f"the CuPy stand-in has no cupy.{name}; add it if CuPy has it")


# ---- random, cuda, kernels -------------------------------------------------------------------
class _RandomState:
    """cupy.random.RandomState: its own stream (CuPy's is not NumPy's either)."""

    def __init__(self, seed: int) -> None:
        global generators_created
        generators_created += 1
        self._rng = np.random.default_rng(seed)

    def random_sample(self, size: Any = None, dtype: Any = float) -> ndarray:
        return _launched(np.asarray(self._rng.random(size, dtype=dtype)))

    def standard_normal(self, size: Any = None, dtype: Any = float) -> ndarray:
        return _launched(np.asarray(self._rng.standard_normal(size, dtype=dtype)))


random = types.SimpleNamespace(RandomState=_RandomState)


class _Device:
    """cupy.cuda.Device(): the GPU the kernel emulator pretends to be (its use_device)."""

    def __init__(self, device_id: int = 0) -> None:
        from minigrad.kernels.emulator import current_device

        self.id = device_id
        self.attributes = dict(current_device().attributes)
        major, minor = (self.attributes[f"ComputeCapability{p}"] for p in ("Major", "Minor"))
        self.compute_capability = f"{major}{minor}"

    @property
    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes, as the driver reports them."""
        return free_memory, total_memory

    def synchronize(self) -> None:
        pass

    def use(self) -> None:
        global _current_device
        _current_device = self.id


_current_device = 0  # cupy.cuda.runtime.getDevice(), set by Device(i).use()
total_memory = free_memory = 80 * 2**30  # bytes, an 80 GB GPU with nothing allocated
pool_free_bytes = 0  # bytes CuPy's memory pool holds unused


def get_default_memory_pool() -> types.SimpleNamespace:
    return types.SimpleNamespace(free_bytes=lambda: pool_free_bytes)


# ---- cupy.cuda.nccl: the collectives through an MPI communicator --------------------------------
_NCCL_DTYPES = {6: np.float16, 7: np.float32, 8: np.float64}  # ncclFloat16, 32, 64


def _at(ptr: int, count: int, datatype: int) -> np.ndarray:
    """The ``count`` elements of NCCL type ``datatype`` at device pointer ``ptr``, writable."""
    dtype = np.dtype(_NCCL_DTYPES[datatype])
    memory = (ctypes.c_char * (count * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(memory, dtype=dtype)


class _NcclCommunicator:
    """cupy.cuda.nccl.NcclCommunicator(ndev, commId, rank), over ``cupy.cuda.nccl.mpi_comm``."""

    def __init__(self, ndev: int, commId: bytes, rank: int) -> None:  # noqa: N803 (CuPy's)
        comm = _nccl.mpi_comm
        if comm is None:
            raise RuntimeError("the NCCL stand-in needs cupy.cuda.nccl.mpi_comm set by the test")
        if not (isinstance(commId, bytes) and len(commId) == 128):
            raise TypeError("commId must be the 128 bytes that nccl.get_unique_id() returns")
        if (ndev, rank) != (comm.Get_size(), comm.Get_rank()):
            raise ValueError(f"rank {rank} of {ndev} is not the MPI communicator's")
        gpus = comm.allgather(_current_device)
        if len(set(gpus)) < len(gpus):
            raise RuntimeError(f"NCCL error: Duplicate GPU detected (devices {gpus})")
        self._comm = comm

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream) -> None:  # noqa: N802
        if op != _nccl.NCCL_SUM:
            raise NotImplementedError("the NCCL stand-in sums only; add the other ops if needed")
        send = _at(sendbuf, count, datatype).copy()  # the buffers may be the same (in place)
        self._comm.Allreduce(send, _at(recvbuf, count, datatype))

    def allGather(self, sendbuf, recvbuf, count, datatype, stream) -> None:  # noqa: N802
        send = _at(sendbuf, count, datatype).copy()
        self._comm.Allgather(send, _at(recvbuf, count * self._comm.Get_size(), datatype))


_nccl = types.ModuleType("cupy.cuda.nccl")
_nccl.available = True
_nccl.mpi_comm = None  # the mpi4py communicator the collectives go through, set by the test
_nccl.NCCL_FLOAT16, _nccl.NCCL_FLOAT32, _nccl.NCCL_FLOAT64, _nccl.NCCL_SUM = 6, 7, 8, 0
_nccl.NcclCommunicator = _NcclCommunicator
_nccl.get_unique_id = lambda: bytes(range(128))

cuda = types.SimpleNamespace(
    runtime=types.SimpleNamespace(
        getDeviceCount=lambda: 1,
        getDevice=lambda: _current_device,
        memGetInfo=lambda: (free_memory, total_memory),  # (free, total) bytes
    ),
    Device=_Device,
    get_current_stream=lambda: types.SimpleNamespace(ptr=0),  # the null stream
    nccl=_nccl,
)


class RawKernel:
    """cupy.RawKernel on the CPU: the emulator, given the arrays behind the device arrays."""

    def __init__(self, code: str, name: str, options: tuple = ()) -> None:
        from minigrad.kernels.emulator import RawKernel as Emulated

        object.__setattr__(self, "_kernel", Emulated(code, name, options))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kernel, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._kernel, name, value)  # max_dynamic_shared_size_bytes, checked there

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        self._kernel(grid, block, tuple(_dev(a) for a in args), shared_mem=shared_mem)
        _launched(None, moved=_nbytes(args))  # each array argument once: read, written or both


class RawModule:
    """cupy.RawModule: a source whose kernels are fetched by name."""

    def __init__(self, code: str, options: tuple = ()) -> None:
        self.code, self.options = code, options

    def get_function(self, name: str) -> RawKernel:
        return RawKernel(self.code, name, self.options)


# ---- ElementwiseKernel: CuPy's C snippet, built by g++ into a loop over the elements ---------
_C_TYPES = {
    "float32": ("float", ctypes.c_float),
    "float64": ("double", ctypes.c_double),
    "bool": ("bool", ctypes.c_bool),
    "int32": ("int", ctypes.c_int32),
    "int64": ("long long", ctypes.c_int64),
    "uint32": ("unsigned int", ctypes.c_uint32),
    "uint64": ("unsigned long long", ctypes.c_uint64),
}


def _params(text: str) -> list[tuple[str, str]]:
    """CuPy's parameter list, "T x, float32 lr", as [(type, name)]; ``raw`` is refused."""
    params = [tuple(p.split()) for p in text.split(",") if p.strip()]
    if any(len(p) != 2 for p in params):
        raise ValueError(f"the stand-in's ElementwiseKernel takes 'type name' params: {text!r}")
    return params


class ElementwiseKernel:
    """cupy.ElementwiseKernel on the CPU: ``operation`` (C, as CuPy takes it, with ``i`` the
    element's index) in a loop that g++ builds, on the arrays behind the device arrays, as one
    launch. The subset the project uses: typed and ``T`` parameters, array and scalar inputs
    broadcast to one shape (as CuPy does; ``i`` indexes that shape), outputs of that shape passed
    in (written in place, contiguous) or made; no ``raw``."""

    def __init__(self, in_params: str, out_params: str, operation: str, name: str = "kernel",
                 preamble: str = "") -> None:  # fmt: skip
        self.ins, self.outs = _params(in_params), _params(out_params)
        self.operation, self.name, self.preamble = operation, name, preamble

    def __call__(self, *args: Any) -> Any:
        ins, outs = list(args[: len(self.ins)]), list(args[len(self.ins) :])
        arrays = [_dev(a) for a in [*ins, *outs] if isinstance(a, ndarray)]
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
        if any(_dev(a).shape != shape for a in outs if isinstance(a, ndarray)):
            raise ValueError(f"{self.name}: an output's shape is not the broadcast {shape}")
        # inputs as CuPy reads them: broadcast and strided ones through their index, here copies
        ins = [
            ndarray._of(np.ascontiguousarray(np.broadcast_to(a._a, shape)))
            if isinstance(a, ndarray) and (a.shape != shape or not a._a.flags.c_contiguous)
            else a
            for a in ins
        ]
        typed = [(t, a) for (t, _), a in zip(self.ins + self.outs, args, strict=False)]
        t_arrays = [_dev(a).dtype for t, a in typed if t == "T" and isinstance(a, ndarray)]
        t_dtype = t_arrays[0] if t_arrays else None  # T: the type of the first T array
        dtypes = [np.dtype(t_dtype if t == "T" else t) for t, _ in self.ins + self.outs]
        made = [ndarray(shape, dtypes[len(ins) + k]) for k in range(len(outs), len(self.outs))]
        outs += made
        values = []
        for (_, name), dtype, value in zip(self.ins + self.outs, dtypes, ins + outs, strict=True):
            if isinstance(value, ndarray):
                if not value._a.flags.c_contiguous:
                    raise ValueError(f"{self.name}: the stand-in needs contiguous arrays ({name})")
                values.append(ctypes.c_void_p(value._a.ctypes.data))
            else:
                values.append(_C_TYPES[dtype.name][1](value))
        kernel = self._build(
            tuple(d.name for d in dtypes),
            tuple(isinstance(v, ndarray) for v in ins + outs),
            np.dtype(t_dtype).name if t_dtype is not None else None,
        )
        kernel(ctypes.c_int64(int(np.prod(shape, dtype=np.int64))), *values)
        global bytes_allocated
        bytes_allocated += sum(m.nbytes for m in made)
        _launched(None, moved=_nbytes([*args, *made]))  # broadcast inputs at their own size
        return outs[0] if len(outs) == 1 else tuple(outs)  # as CuPy: every output, given or made

    def _build(self, dtypes: tuple[str, ...], is_array: tuple[bool, ...], t: str | None) -> Any:
        import hashlib
        import subprocess

        from minigrad.kernels.emulator import cache_dir

        params, loads = ["long long size_"], []  # CuPy keeps i and _-names
        for k, ((_, name), dtype, array) in enumerate(
            zip(self.ins + self.outs, dtypes, is_array, strict=True)
        ):
            c = _C_TYPES[dtype][0]
            if not array:
                params.append(f"{c} {name}")
            elif k < len(self.ins):
                params.append(f"const {c}* {name}_")
                loads.append(f"const {c} {name} = {name}_[i];")
            else:
                params.append(f"{c}* {name}_")
                loads.append(f"{c}& {name} = {name}_[i];")
        typedef = f"typedef {_C_TYPES[t][0]} T;\n" if t else ""  # CuPy names the T type T
        source = (
            f"#include <math.h>\n#define __device__\n{typedef}{self.preamble}\n"
            f'extern "C" void {self.name}({", ".join(params)}) {{\n'
            f"  for (long long i = 0; i < size_; ++i) {{ {' '.join(loads)} {self.operation}; }}"
            "\n}\n"
        )
        key = hashlib.sha256(source.encode()).hexdigest()[:16]
        folder = cache_dir() / "elementwise"
        library = folder / f"{self.name}-{key}.so"
        if not library.exists():
            folder.mkdir(parents=True, exist_ok=True)
            src = folder / f"{self.name}-{key}.cpp"
            src.write_text(source)
            tmp = library.with_suffix(f".{os.getpid()}.tmp")
            cmd = ["g++", "-O2", "-shared", "-fPIC", "-std=c++17", str(src), "-o", str(tmp)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{self.name} did not build:\n{done.stderr[-3000:]}")
            os.replace(tmp, library)
        function = getattr(ctypes.CDLL(str(library)), self.name)
        function.restype = None
        return function


# ---- cupyx: the special functions (not scatter_add: CuPy deprecates it for cupy.add.at) -----
def _elementwise(fn: Any) -> Any:
    def special(x: ndarray) -> ndarray:
        a = _dev(x)
        out = np.vectorize(fn, otypes=[np.float64])(a)
        return _launched(out.astype(a.dtype if a.dtype.kind == "f" else np.float64), a)

    special.__name__ = fn.__name__
    return special


_special = types.ModuleType("cupyx.scipy.special")
_special.erf, _special.erfc = _elementwise(math.erf), _elementwise(math.erfc)
_scipy = types.ModuleType("cupyx.scipy")
_scipy.special = _special
_cupyx = types.ModuleType("cupyx")
_cupyx.scipy = _scipy
# what the fixture puts in sys.modules beside this module itself
MODULES = {
    "cupyx": _cupyx,
    "cupyx.scipy": _scipy,
    "cupyx.scipy.special": _special,
    "cupy.cuda.nccl": _nccl,
}
