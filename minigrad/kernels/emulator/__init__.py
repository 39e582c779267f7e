"""CUDA kernels on the CPU: `RawModule` and `RawKernel` with CuPy's calling convention.

`RawKernel(code, name)(grid, block, args, shared_mem=...)` builds `code` (our .cu source,
unchanged) with the host C++ compiler and `cuda_emulator.h`, then runs the kernel on NumPy
arrays through ctypes, one real thread per CUDA thread. The launch code written for CuPy runs
here as it is: the same grid, block, shared memory and argument order, and the same
`max_dynamic_shared_size_bytes` opt-in, checked against the limits of the GPU the emulator
pretends to be (`use_device("sm_75")`; sm_80 by default). It checks the algorithm, not the
speed: a kernel here is thousands of times slower than on a GPU.

Stricter than CuPy where CuPy would run garbage: every argument must match the kernel's C
parameter (a float32 array for `float*`, np.int32 for `int`; Python ints and floats are
refused, since CuPy widens them to 64 bits), and a launch that breaks a CUDA rule raises
`EmulatorError` naming it (see the header for the list).

Each build is cached by a hash of the source, options, header and compiler, in
$MINIGRAD_KERNEL_CACHE or ~/.cache/minigrad/emulator, like CuPy's ~/.cupy/kernel_cache, so a
source compiles once per machine. $MINIGRAD_EMULATOR_SANITIZER=address or thread builds
under AddressSanitizer (which also catches an out-of-bounds shared-memory index) or
ThreadSanitizer; the process must then start with the sanitizer's runtime preloaded
(`sanitizer_runtime`).

`with count_launches() as launches:` runs every launch inside it in a third build, which counts
(per launch, summed over threads) fmaf calls, mma instructions, shared and global loads and
stores, in instructions and in 4-byte elements, barriers and shuffles, and records each launch
with its `Counts` in `launches`. The build uses -fsanitize=thread's instrumentation without its
runtime: the header defines the hooks the compiler calls before each load and store, and sorts
them by address (the block's shared buffer, the array arguments; the stack, where a GPU keeps
registers, is not counted). Counts are exact and deterministic for one source and launch:
the accesses g++ emits at -O2 without vectorising, one per access the source writes less those
the compiler keeps in a register, as nvcc would (`bench/kernel_counts.py` prints them beside
nvcc's PTX).

Leaves out: static `__shared__` arrays (refused by name), streams, textures, atomics, and
any array library other than NumPy (an array that is not a NumPy array is accepted if it
exposes its address as CuPy's do, `x.data.ptr`).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import numpy as np

from minigrad.fileio import atomic_write

HEADER = Path(__file__).with_name("cuda_emulator.h")
_SANITIZER_FLAGS = {
    "": ["-O2"],
    "address": ["-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer", "-DEMU_ASAN"],
    "thread": ["-O1", "-g", "-fsanitize=thread"],
}
# The counting build: TSan's instrumentation, not its runtime (see the header). No
# vectorising and no scalar replacement of aggregates, so that each load stays as the source
# writes it (a float4 read stays one 16-byte access instead of four 4-byte ones).
_COUNT_FLAGS = [
    "-O2", "-fsanitize=thread", "-fno-tree-vectorize", "-fno-tree-slp-vectorize",
    "-fno-tree-sra", "-DEMU_COUNT",
]  # fmt: skip
# The C type letters of cuda_emulator.h's type_code, for NumPy dtypes and scalars.
_DTYPE_CODES = {
    np.dtype(np.float32): "f",
    np.dtype(np.float64): "d",
    np.dtype(np.int32): "i",
    np.dtype(np.uint32): "I",
    np.dtype(np.int64): "q",
    np.dtype(np.uint64): "Q",
}
_C_NAMES = {
    "f": "float",
    "d": "double",
    "i": "int",
    "I": "unsigned int",
    "q": "long long",
    "Q": "unsigned long long",
    "?": "an unsupported type",
}
_CTYPES = {
    "f": ctypes.c_float,
    "d": ctypes.c_double,
    "i": ctypes.c_int32,
    "I": ctypes.c_uint32,
    "q": ctypes.c_int64,
    "Q": ctypes.c_uint64,
}


class EmulatorError(RuntimeError):
    """A launch broke a rule a GPU enforces (block size, shared memory, a barrier)."""


# ---------------------------------------------------------------------------------------------
# The GPU the emulator pretends to be


@dataclass(frozen=True)
class Device:
    """The limits of one GPU, under the names of CuPy's `Device().attributes`."""

    arch: str
    name: str
    shared_optin: int  # bytes of dynamic shared memory a kernel may opt in to
    attributes: dict = field(init=False, compare=False)

    def __post_init__(self) -> None:
        major, minor = int(self.arch[3:-1]), int(self.arch[-1])
        attributes = {
            "MaxSharedMemoryPerBlock": 48 * 1024,  # without opting in, on every GPU since 2012
            "MaxSharedMemoryPerBlockOptin": self.shared_optin,
            "MaxThreadsPerBlock": 1024,
            "WarpSize": 32,
            "ComputeCapabilityMajor": major,
            "ComputeCapabilityMinor": minor,
        }
        object.__setattr__(self, "attributes", attributes)


DEVICES = {
    "sm_75": Device("sm_75", "Tesla T4 (emulated)", 64 * 1024),  # free notebook services
    "sm_80": Device("sm_80", "A100 (emulated)", 163 * 1024),
    "sm_90": Device("sm_90", "H100 (emulated)", 227 * 1024),
}
_current = [DEVICES["sm_80"]]
# The buffer behind every block's shared memory: the most any of these devices allows.
_SHARED_CAPACITY = max(device.shared_optin for device in DEVICES.values())


def current_device() -> Device:
    """The device launches are checked against (like `cupy.cuda.Device()`)."""
    return _current[-1]


@contextmanager
def use_device(device: str | Device) -> Iterator[Device]:
    """Pretend to be `device` (an arch in DEVICES, or a Device) inside the `with` block.

    >>> with use_device("sm_75") as d:
    ...     d.attributes["MaxSharedMemoryPerBlockOptin"]
    65536
    """
    if isinstance(device, str):
        if device not in DEVICES:
            raise ValueError(f"unknown device {device!r}; choose one of {sorted(DEVICES)}")
        device = DEVICES[device]
    _current.append(device)
    try:
        yield device
    finally:
        _current.pop()


# ---------------------------------------------------------------------------------------------
# Building


def _strip_comments(code: str) -> str:
    """The source without // and /* */ comments (so a comment never looks like code)."""
    return re.sub(r"//[^\n]*|/\*.*?\*/", "", code, flags=re.S)


def _shared_arrays(code: str) -> list[tuple[str, str]]:
    """(type, name) of every `extern __shared__ T name[];`; refuses static __shared__ arrays.

    >>> _shared_arrays("extern __shared__ float smem[]; // __shared__ in a comment")
    [('float', 'smem')]
    """
    code = _strip_comments(code)
    found = re.findall(r"extern\s+__shared__\s+([A-Za-z_][\w ]*?)\s+(\w+)\s*\[\s*\]", code)
    if len(re.findall(r"__shared__", code)) != len(found):
        raise EmulatorError(
            "the emulator runs dynamic shared memory only (extern __shared__ T name[];); "
            "declare static __shared__ arrays as slices of the dynamic buffer"
        )
    return sorted(set(found))


def _kernel_names(code: str) -> list[str]:
    """Names of the __global__ functions.

    >>> _kernel_names('extern "C" __global__ void add(float* x) {}')
    ['add']
    """
    return re.findall(r"__global__\s+void\s+(\w+)\s*\(", _strip_comments(code))


def _translation_unit(code: str) -> str:
    """The kernels' source plus the buffer behind `extern __shared__` and a launcher per kernel.

    Every extern __shared__ array is an alias of one buffer, as on a GPU, where they all
    start at the block's dynamic shared memory.
    """
    lines = [f"alignas(16) unsigned char emu_shared[{_SHARED_CAPACITY}];"]
    for ctype, name in _shared_arrays(code):
        lines.append(
            f"extern {ctype} {name}[{_SHARED_CAPACITY} / sizeof({ctype})] "
            f'__attribute__((alias("emu_shared")));'
        )
    lines += ['#line 1 "kernel.cu"', code, ""]
    for name in _kernel_names(code):
        lines.append(
            f'extern "C" int emu_launch_{name}(const unsigned* grid, const unsigned* block, '
            f'std::size_t shared_bytes, void** args) {{ return emu::launch({name}, "{name}", '
            f"grid, block, shared_bytes, emu_shared, sizeof emu_shared, args); }}"
        )
        lines.append(
            f'extern "C" const char* emu_signature_{name}() {{ return emu::signature({name}); }}'
        )
    lines.append('extern "C" const char* emu_last_error() { return emu::last_error.c_str(); }')
    return "\n".join(lines) + "\n"


def _compiler() -> str:
    return os.environ.get("CXX", "g++")


@cache
def _compiler_version(compiler: str) -> str:
    try:
        result = subprocess.run([compiler, "--version"], capture_output=True, text=True)
    except FileNotFoundError:
        raise EmulatorError(
            f"the C++ compiler {compiler!r} is not installed; the emulator builds kernels with "
            f"it (install g++ >= 10, or point $CXX at a C++20 compiler)"
        ) from None
    return result.stdout.splitlines()[0] if result.stdout else compiler


def _compile_flags(options: Sequence[str]) -> list[str]:
    """Our g++ flags for CuPy/NVRTC `options`: -D and -I pass through, -std is ours (C++20)."""
    flags = []
    for option in options:
        if option.startswith(("-D", "-I")):
            flags.append(option)
        elif not option.startswith("-std="):
            raise EmulatorError(f"the emulator does not know the NVRTC option {option!r}")
    return flags


# The open count_launches() blocks, innermost last: (their records, whether launches run).
_counting: list[tuple[list[Launch], bool]] = []


@dataclass(frozen=True)
class Counts:
    """What one launch did, summed over its threads (the fields in the header's enum Count).

    Loads and stores count instructions; `*_elements` count the 4-byte words they move (a
    float4 load is one instruction, four elements). `fma` counts fmaf calls only.
    """

    fma: int
    shared_loads: int
    shared_load_elements: int
    shared_stores: int
    shared_store_elements: int
    global_loads: int
    global_load_elements: int
    global_stores: int
    global_store_elements: int
    barriers: int
    shuffles: int
    mma: int  # mma.sync instructions, per lane: a warp's one instruction counts 32


@dataclass(frozen=True)
class Launch:
    """One kernel launch seen by `count_launches`: what was built, how it ran, what it did."""

    name: str
    code: str
    options: tuple[str, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    counts: Counts | None  # None where count_launches(run=False) only recorded the launch


def _mode() -> str:
    """How launches go now: 'run' (the plain or sanitizer build), 'count' or 'record'."""
    if not _counting:
        return "run"
    return "count" if _counting[-1][1] else "record"


@contextmanager
def count_launches(run: bool = True) -> Iterator[list[Launch]]:
    """Run the launches inside the `with` block in the counting build; yield their records.

    With run=False nothing is built or run: each launch is only recorded (counts None), which
    gives the launch plan (kernels, options, grid, block, shared memory) in no time.

    >>> add = RawKernel('extern "C" __global__ void add(float* x) { x[threadIdx.x] += 1.0f; }',
    ...                 "add")
    >>> with count_launches() as launches:
    ...     add((1,), (32,), (np.zeros(32, np.float32),))
    >>> c = launches[0].counts
    >>> c.global_loads, c.global_stores, c.shared_loads
    (32, 32, 0)
    """
    launches: list[Launch] = []
    _counting.append((launches, run))
    try:
        yield launches
    finally:
        _counting.pop()


def sanitizer() -> str:
    """The sanitizer builds use: '', 'address' or 'thread' ($MINIGRAD_EMULATOR_SANITIZER)."""
    name = os.environ.get("MINIGRAD_EMULATOR_SANITIZER", "")
    if name not in _SANITIZER_FLAGS:
        raise EmulatorError(
            f"MINIGRAD_EMULATOR_SANITIZER={name!r}; use 'address', 'thread' or leave it unset"
        )
    return name


def sanitizer_runtime(name: str) -> Path | None:
    """The runtime library to preload for sanitizer `name`, or None if the compiler has none."""
    result = subprocess.run(
        [_compiler(), f"-print-file-name=lib{'a' if name == 'address' else 't'}san.so"],
        capture_output=True,
        text=True,
    )
    path = Path(result.stdout.strip())
    return path if path.is_absolute() and path.exists() else None


def cache_dir() -> Path:
    """Where built kernels are kept: $MINIGRAD_KERNEL_CACHE or ~/.cache/minigrad/emulator."""
    default = Path.home() / ".cache" / "minigrad" / "emulator"
    return Path(os.environ.get("MINIGRAD_KERNEL_CACHE", default))


_loaded: dict[str, ctypes.CDLL] = {}


def _build(code: str, options: Sequence[str], counting: bool = False) -> ctypes.CDLL:
    """Compile `code` once per (source, options, header, compiler, build); load it.

    The counting build compiles with -fsanitize=thread but links without it, so that TSan's
    runtime stays out and the header's hooks take its place.
    """
    compiler = _compiler()
    build_flags = _COUNT_FLAGS if counting else _SANITIZER_FLAGS[sanitizer()]
    flags = [
        "-std=c++20", "-fPIC", "-pthread", "-Wno-unknown-pragmas",
        *build_flags, *_compile_flags(options),
        "-include", str(HEADER),
    ]  # fmt: skip
    unit = _translation_unit(code)
    key = hashlib.sha256(
        "\0".join([unit, HEADER.read_text(), _compiler_version(compiler), *flags]).encode()
    ).hexdigest()[:32]
    if key in _loaded:
        return _loaded[key]
    library = cache_dir() / f"{key}.so"
    if not library.exists():
        library.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            source, built = Path(tmp) / "unit.cpp", Path(tmp) / "unit.so"
            source.write_text(unit)
            if counting:  # compile, then link without -fsanitize (no TSan runtime)
                obj = Path(tmp) / "unit.o"
                link = [compiler, "-shared", "-pthread", str(obj), "-o", str(built)]
                commands = [[compiler, *flags, "-c", str(source), "-o", str(obj)], link]
            else:
                commands = [[compiler, "-shared", *flags, str(source), "-o", str(built)]]
            for cmd in commands:
                result = subprocess.run(cmd, capture_output=True, text=True)
                if result.returncode != 0:
                    raise EmulatorError(f"{' '.join(cmd)} failed:\n{result.stderr[-4000:]}")
            with atomic_write(library) as f:  # a parallel test worker never loads half a file
                f.write(built.read_bytes())
    _loaded[key] = ctypes.CDLL(str(library))
    return _loaded[key]


# ---------------------------------------------------------------------------------------------
# Launching


def _dim3(dims: int | Sequence[int], what: str) -> ctypes.Array:
    dims = (dims,) if isinstance(dims, int | np.integer) else tuple(dims)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, int | np.integer) for d in dims):
        raise TypeError(f"{what} must be an int or a tuple of 1 to 3 ints; got {dims!r}")
    return (ctypes.c_uint * 3)(*(int(d) for d in dims), *(1,) * (3 - len(dims)))


def _parse_signature(signature: str) -> list[str]:
    """Split a kernel signature into parameters: '*f' is a pointer to float, 'i' an int.

    >>> _parse_signature("*f*fif")
    ['*f', '*f', 'i', 'f']
    """
    return re.findall(r"\*?.", signature)


def _describe(code: str) -> str:
    return f"{_C_NAMES[code[1]]}*" if code.startswith("*") else _C_NAMES[code]


def _address(value: Any) -> int | None:
    """The address of an array argument (NumPy's, or CuPy-like via .data.ptr), else None."""
    if isinstance(value, np.ndarray):
        return value.ctypes.data
    ptr = getattr(getattr(value, "data", None), "ptr", None)
    return ptr if isinstance(ptr, int) else None


def _marshal(kernel: str, codes: list[str], args: tuple) -> list[ctypes._SimpleCData]:
    """One ctypes value per argument, each checked against its C parameter type."""
    if len(args) != len(codes):
        raise TypeError(f"{kernel} takes {len(codes)} arguments; got {len(args)}")
    values = []
    for index, (code, value) in enumerate(zip(codes, args, strict=True)):
        where = f"{kernel} argument {index} ({_describe(code)})"
        if code.startswith("*"):
            address = _address(value)
            if address is not None:
                dtype_code = _DTYPE_CODES.get(np.dtype(value.dtype), "?")
                if code[1] != "?" and dtype_code != code[1]:
                    raise TypeError(f"{where} got a {value.dtype} array")
            elif isinstance(value, np.intp | np.uintp) and int(value) == 0:
                address = 0  # a null pointer, passed as np.intp(0) as with CuPy
            else:
                raise TypeError(f"{where} got {type(value).__name__}; pass an array or np.intp(0)")
            values.append(ctypes.c_void_p(address))
        elif isinstance(value, np.generic) and _DTYPE_CODES.get(value.dtype) == code:
            values.append(_CTYPES[code](value.item()))
        else:
            raise TypeError(
                f"{where} got {type(value).__name__} {value!r}: pass an explicit NumPy scalar "
                f"of that type (CuPy turns a Python int or float into a 64-bit one)"
            )
    return values


class RawKernel:
    """One kernel of `code`, launched as `kernel(grid, block, args, shared_mem=0)`."""

    def __init__(self, code: str, name: str, options: Sequence[str] = ()) -> None:
        if name not in _kernel_names(code):
            raise EmulatorError(f"no __global__ function {name!r} in the source")
        self.code, self.name, self.options = code, name, tuple(options)
        self._libraries: dict[bool, ctypes.CDLL] = {}  # by counting or not
        if _mode() != "record":
            self._library(counting=_mode() == "count")  # build errors show here
        self._max_dynamic_shared = 0

    def _library(self, counting: bool) -> ctypes.CDLL:
        """The built kernel (plain or sanitizer build, or the counting one); cached."""
        if counting not in self._libraries:
            self._libraries[counting] = _build(self.code, self.options, counting=counting)
        return self._libraries[counting]

    @cached_property
    def _codes(self) -> list[str]:
        """The kernel's parameter types, from the build, to check arguments against."""
        signature = getattr(self._library(_mode() == "count"), f"emu_signature_{self.name}")
        signature.restype = ctypes.c_char_p
        return _parse_signature(signature().decode())

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        """Dynamic shared memory this kernel has opted in to (0: the 48 KB default)."""
        return self._max_dynamic_shared

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value: int) -> None:
        device = current_device()
        limit = device.attributes["MaxSharedMemoryPerBlockOptin"]
        if not 0 <= value <= limit:
            raise EmulatorError(
                f"{self.name}: max_dynamic_shared_size_bytes = {value} is above the {limit} "
                f"bytes per block that {device.name} ({device.arch}) allows"
            )
        self._max_dynamic_shared = int(value)

    def __call__(self, grid, block, args: tuple, *, shared_mem: int = 0) -> None:
        device = current_device()
        allowed = max(device.attributes["MaxSharedMemoryPerBlock"], self._max_dynamic_shared)
        if shared_mem > allowed:
            raise EmulatorError(
                f"{self.name}: shared_mem = {shared_mem} bytes is above the {allowed} bytes "
                f"this kernel may use on {device.name} ({device.arch}); above the 48 KB default "
                f"set kernel.max_dynamic_shared_size_bytes first (up to "
                f"{device.attributes['MaxSharedMemoryPerBlockOptin']})"
            )
        grid3, block3, mode = _dim3(grid, "grid"), _dim3(block, "block"), _mode()
        if mode == "record":
            self._record(grid3, block3, shared_mem, None)
            return
        values = _marshal(self.name, self._codes, tuple(args))
        pointers = (ctypes.c_void_p * max(1, len(values)))(
            *(ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values)
        )
        library = self._library(counting=mode == "count")
        if mode == "count":  # the array arguments are global memory
            ranges = [(a, a + x.nbytes) for x in args if (a := _address(x)) is not None]
            flat = (ctypes.c_ulonglong * max(1, 2 * len(ranges)))(*(e for r in ranges for e in r))
            library.emu_count_set_global_ranges(flat, ctypes.c_int(len(ranges)))
        launch = getattr(library, f"emu_launch_{self.name}")
        launch.restype = ctypes.c_int
        if launch(grid3, block3, ctypes.c_size_t(shared_mem), pointers) != 0:
            last_error = library.emu_last_error
            last_error.restype = ctypes.c_char_p
            raise EmulatorError(last_error().decode())
        if mode == "count":
            out = (ctypes.c_ulonglong * len(fields(Counts)))()
            library.emu_count_get(out)
            self._record(grid3, block3, shared_mem, Counts(*(int(n) for n in out)))

    def _record(self, grid3, block3, shared_mem: int, counts: Counts | None) -> None:
        launch = Launch(
            self.name, self.code, self.options, tuple(grid3), tuple(block3), int(shared_mem), counts
        )
        _counting[-1][0].append(launch)


class RawModule:
    """Every kernel of `code`, as `cupy.RawModule(code=..., options=...).get_function(name)`."""

    def __init__(self, code: str, options: Sequence[str] = ()) -> None:
        self.code, self.options = code, tuple(options)
        if _mode() != "record":  # build errors show here, as with CuPy's compile on load
            _build(code, self.options, counting=_mode() == "count")

    def get_function(self, name: str) -> RawKernel:
        return RawKernel(self.code, name, self.options)
