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
from dataclasses import dataclass, field
from functools import cache
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


def _build(code: str, options: Sequence[str]) -> ctypes.CDLL:
    """Compile `code` once per (source, options, header, compiler, sanitizer); load it."""
    compiler, flavour = _compiler(), sanitizer()
    flags = [
        "-std=c++20", "-shared", "-fPIC", "-pthread", "-Wno-unknown-pragmas",
        *_SANITIZER_FLAGS[flavour], *_compile_flags(options),
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
            cmd = [compiler, *flags, str(source), "-o", str(built)]
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
        self._library = _build(code, self.options)
        signature = getattr(self._library, f"emu_signature_{name}")
        signature.restype = ctypes.c_char_p
        self._codes = _parse_signature(signature().decode())
        self._launch = getattr(self._library, f"emu_launch_{name}")
        self._launch.restype = ctypes.c_int
        self._max_dynamic_shared = 0

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
        values = _marshal(self.name, self._codes, tuple(args))
        pointers = (ctypes.c_void_p * max(1, len(values)))(
            *(ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values)
        )
        status = self._launch(
            _dim3(grid, "grid"), _dim3(block, "block"), ctypes.c_size_t(shared_mem), pointers
        )
        if status != 0:
            last_error = self._library.emu_last_error
            last_error.restype = ctypes.c_char_p
            raise EmulatorError(last_error().decode())


class RawModule:
    """Every kernel of `code`, as `cupy.RawModule(code=..., options=...).get_function(name)`."""

    def __init__(self, code: str, options: Sequence[str] = ()) -> None:
        self.code, self.options = code, tuple(options)
        _build(code, self.options)  # build errors show here, as with CuPy's compile on load

    def get_function(self, name: str) -> RawKernel:
        return RawKernel(self.code, name, self.options)
