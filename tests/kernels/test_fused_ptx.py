"""Every CuPy ElementwiseKernel of the project compiles for the GPU: nvcc, without a GPU.

The fused kernels (minigrad/kernels/fused.py) and AdamW's (minigrad/optim.py) are C snippets that
CuPy wraps in a loop over the elements and compiles with NVRTC the first time a GPU runs them;
the CuPy stand-in builds the same snippets with g++, which accepts C++ that nvcc may not (and the
other way round). Here each snippet is wrapped as CuPy wraps it (``T`` a typedef, the typed
parameters, the preamble's ``__device__`` helpers, ``i`` the element's index) and compiled to PTX
with nvcc for float32 and float64, warnings as errors, so a snippet that would fail on its first
GPU is caught on any machine with the CUDA toolkit.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from minigrad import optim
from minigrad.kernels import fused

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")

C_TYPES = {"float32": "float", "float64": "double", "bool": "bool", "uint64": "unsigned long long"}


def specs() -> list[tuple]:
    """Every ElementwiseKernel spec: (in_params, out_params, operation, name[, preamble])."""
    found = [optim._ADAMW_KERNEL]
    for value in vars(fused).values():
        if isinstance(value, tuple) and len(value) in (4, 5) and str(value[3])[:9] == "minigrad_":
            found.append(value)
    return found


def wrapped(spec: tuple, t: str) -> str:
    """The snippet as CuPy's ElementwiseKernel wraps it, with T = ``t``, on flat arrays."""
    in_params, out_params, operation, name, *preamble = spec
    params, loads = [], []
    for k, text in enumerate(p.strip() for p in f"{in_params}, {out_params}".split(",")):
        kind, arg = text.split()
        c = t if kind == "T" else C_TYPES[kind]
        const, ref = ("const ", "") if k < len(in_params.split(",")) else ("", "&")
        params.append(f"{const}{c}* _raw_{arg}")
        loads.append(f"{const}{c}{ref} {arg} = _raw_{arg}[i];")
    return (
        f"namespace {name}_{t} {{\ntypedef {t} T;\n{preamble[0] if preamble else ''}\n"
        f"__global__ void kernel({', '.join(params)}, long long n) {{\n"
        f"  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;\n"
        f"       i += (long long)blockDim.x * gridDim.x) {{\n    {' '.join(loads)}\n"
        f"    {operation};\n  }}\n}}\n}}\n"
    )


def test_the_project_s_elementwise_kernels_are_found():
    names = {spec[3] for spec in specs()}
    assert {"minigrad_adamw", "minigrad_ln_forward", "minigrad_gelu_backward"} <= names
    assert {"minigrad_dropout", "minigrad_dropout_mask", "minigrad_softmax_backward"} <= names


@pytest.mark.parametrize("t", ["float", "double"])
def test_every_elementwise_kernel_compiles_with_nvcc(tmp_path, t):
    source = tmp_path / f"elementwise_{t}.cu"
    source.write_text("".join(wrapped(spec, t) for spec in specs()))
    command = ["nvcc", "-arch=sm_80", "--ptx", "-Werror", "all-warnings", str(source)]
    done = subprocess.run(command + ["-o", str(tmp_path / "out.ptx")], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
