"""Row shards of a training micro-batch on several CPU cores, in worker processes.

A step's arithmetic splits cleanly by rows: each sequence's forward and backward pass is its
own, and only the gradients are summed. ``ShardWorkers`` forks ``n - 1`` copies of this
process, each holding the same model, runs shard 0 here and shard i in worker i, and adds the
workers' gradients into ``.grad`` after its own, in shard order, so a run gives the same
numbers every time. This is data parallelism inside one machine, as decoder.training.dist is across
MPI ranks, but without MPI and with one optimiser: the workers never step, they only compute
gradients.

Why processes and not threads: NumPy lets go of Python's lock inside each array operation,
but a training step makes thousands of small ones, and two threads spend much of the step
handing the lock to each other (two threads ran the GELU at 1.16x the speed of one, a
LayerNorm at 0.96x, bench/README.md). Processes share nothing but what we put in shared
memory:
- the parameters: every parameter's array becomes a view into one block of shared memory
  before the fork, so the optimiser's in-place updates here are what the workers read. A
  parameter whose array was replaced since (a checkpoint loaded, a dtype cast) is copied back
  into the block at the next step, and a model whose structure changed (parameters added or
  frozen, buffers replaced, a LoRA merged) gets new workers;
- one gradient block per worker, which it fills and this process adds up.
The batch shards go to the workers, and their losses come back, over pipes.

Left out on purpose: platforms without ``fork`` (macOS and Windows start processes by
re-importing, and the model would have to be pickled): there the shards run one after
another here, with the same numbers. And the evaluation passes, which stay in one process.
"""

from __future__ import annotations

import math
import mmap
import multiprocessing
import signal
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from minigrad.autograd import backward
from minigrad.cpu_tuning import blas_threads
from minigrad.nn import Module

ALIGN = 64  # bytes: each parameter's view starts on a cache line
# NumPy's overflow and NaN warnings, silenced where a NaN is expected and checked: a step's
# loss is, and a NaN stops the run with TrainingDiverged's one line (the warnings only came first)
CHECKED_NAN = np.errstate(over="ignore", invalid="ignore", divide="ignore")


def fork_available() -> bool:
    """Whether worker processes can be forked here (Linux; not macOS or Windows)."""
    return "fork" in multiprocessing.get_all_start_methods() and not _is_macos()


def _is_macos() -> bool:
    import sys

    return sys.platform == "darwin"  # fork exists there but is unsafe with system libraries


def _signature(model: Module) -> tuple:
    """What the workers' copy of ``model`` must still match: its parameters and buffers (by
    identity of the Tensor, shape, dtype, trainability) and its printed structure."""
    params = tuple((id(p), p.shape, p.data.dtype.str, p.requires_grad) for p in _params(model))
    buffers = tuple(id(b.data) for _, b in model.named_buffers())
    return params, buffers, repr(model)


def _params(model: Module) -> list:
    """Every parameter, frozen ones included (a LoRA's base weights are read by the workers)."""
    return model.parameters()


@CHECKED_NAN
def shard_pass(
    model: Module, loss_fn: Callable, x: Any, y: Any, scale: float, into: dict | None = None
) -> float:
    """One shard's loss, adding ``scale`` times its gradients into ``.grad`` (or ``into``, as
    ``backward`` does); a loss that is not finite gets no backward (the step raises before
    any optimiser step). The trainer's shard, a worker's and the in-turn fallback all run this.
    """
    loss = loss_fn(model, x, y)
    value = loss.item()
    if math.isfinite(value):
        backward(loss * scale, into=into)
    return value


class ShardWorkers:
    """``n - 1`` worker processes for ``model``; ``run`` computes a micro-batch's loss and
    gradients as ``n`` row shards, shard 0 in this process.

    ``loss_fn(model, x, y)`` is the shards' loss (``decoder.training.step.lm_loss``).
    """

    def __init__(self, model: Module, n: int, loss_fn: Callable) -> None:
        self.model, self.n, self.loss_fn = weakref.ref(model), n, loss_fn
        self.signature = _signature(model)
        self.params = _params(model)
        starts, nbytes = [], 0
        for p in self.params:  # one aligned byte range per parameter
            starts.append(nbytes)
            nbytes += -(-p.data.nbytes // ALIGN) * ALIGN
        self._blocks = [mmap.mmap(-1, max(nbytes, 1)) for _ in range(n)]  # MAP_SHARED
        views = [
            [
                np.frombuffer(block, p.data.dtype, p.data.size, start).reshape(p.shape)
                for p, start in zip(self.params, starts, strict=True)
            ]
            for block in self._blocks
        ]
        self.param_views, self.grad_views = views[0], views[1:]
        self.share_parameters()
        context = multiprocessing.get_context("fork")
        self.conns, self.procs = [], []
        for i in range(1, n):
            here, there = context.Pipe()
            # subtle: the fork copies every open pipe end, the trainer's ends included; the
            # worker must close those, or closing them here would never reach it as EOF
            trainer_ends = [*self.conns, here]
            proc = context.Process(
                target=_serve,
                args=(model, self.params, self.grad_views[i - 1], there, loss_fn, trainer_ends),
                name=f"decoder-shard-{i}",
                daemon=True,  # ended with this process
            )
            proc.start()
            there.close()  # the worker's end: a worker that dies then shows up as EOF here
            self.conns.append(here)
            self.procs.append(proc)

    def share_parameters(self) -> None:
        """Put every parameter's current values in shared memory, its array a view there."""
        for p, view in zip(self.params, self.param_views, strict=True):
            if p.data is not view:
                view[...] = p.data
                p.data = view

    def fits(self, model: Module, n: int, loss_fn: Callable) -> bool:
        """Whether these workers still hold ``model`` as it is now."""
        return (
            self.model() is model
            and self.n == n
            and self.loss_fn is loss_fn
            and all(proc.is_alive() for proc in self.procs)
            and _signature(model) == self.signature
        )

    def run(self, xs: list, ys: list, scales: list[float]) -> list[float]:
        """Shard i's loss on (xs[i], ys[i]); adds scales[i] times its gradients into .grad.

        A shard whose loss is not finite adds no gradient (the caller raises before any
        optimiser step). Returns the n losses.
        """
        try:
            return self._run(xs, ys, scales)
        except BaseException:  # Ctrl-C or an error mid-step: a worker may still be computing,
            self.close()  # and its late reply would be read as the next step's: start afresh
            raise

    def _run(self, xs: list, ys: list, scales: list[float]) -> list[float]:
        model = self.model()
        self.share_parameters()
        for conn, x, y, scale in zip(self.conns, xs[1:], ys[1:], scales[1:], strict=True):
            conn.send((x, y, scale, model.training))
        with blas_threads(1):  # one core for this shard's products: the others are busy
            values = [shard_pass(model, self.loss_fn, xs[0], ys[0], scales[0])]
        for i, conn in enumerate(self.conns):
            try:
                reply = conn.recv()
            except EOFError:
                raise RuntimeError(
                    f"shard worker {i + 1} died (out of memory?): set --shards=1 to train "
                    f"in one process"
                ) from None
            if reply[0] == "error":
                raise RuntimeError(f"shard worker {i + 1} failed:\n{reply[1]}")
            _, value, has_grad = reply
            values.append(value)
            for p, g, has in zip(self.params, self.grad_views[i], has_grad, strict=True):
                if has:  # in shard order, after this process's own: the same sums each run
                    if p.grad is None:
                        p.grad = g.copy()
                    else:
                        p.grad += g
        return values

    def close(self) -> None:
        """Stop the workers (each reads EOF and exits); ``workers_for`` then makes new ones."""
        global _current
        if _current is self:
            _current = None
        for conn in self.conns:
            conn.close()
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():  # stuck: stop it, and reap it
                proc.terminate()
                proc.join()
        self.conns, self.procs = [], []


def _serve(
    model: Module, params: list, grads: list, conn: Any, loss_fn: Callable, trainer_ends: list
) -> None:
    """A worker's loop: a shard in, its loss out, its gradients into ``grads`` (shared)."""
    for end in trainer_ends:  # this process's copies of the trainer's ends (see __init__)
        end.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    blas_threads(1).__enter__()  # for the worker's life: one core per shard
    while True:
        try:
            x, y, scale, training = conn.recv()
        except (EOFError, OSError):  # the trainer closed its end, exited, or was killed
            return
        try:
            model.train(training)
            sink: dict = {}
            value = shard_pass(model, loss_fn, x, y, scale, into=sink)
            has_grad = [False] * len(params)
            for i, p in enumerate(params):
                entry = sink.get(id(p))
                if entry is not None:
                    grads[i][...] = entry[1]
                    has_grad[i] = True
            reply = ("ok", value, has_grad)
        except Exception:  # the trainer raises it, with this traceback
            reply = ("error", traceback.format_exc())
        try:
            conn.send(reply)
        except OSError:  # the trainer closed its end mid-step (Ctrl-C, an error): stop
            return


_current: ShardWorkers | None = None  # one set of workers at a time, for the model last run


def workers_for(model: Module, n: int, loss_fn: Callable) -> ShardWorkers:
    """The workers for ``model`` in ``n`` shards: the current ones if they still fit it, else
    new ones (the old ones are stopped first)."""
    global _current
    if _current is not None and _current.fits(model, n, loss_fn):
        return _current
    if _current is not None:
        _current.close()
    _current = ShardWorkers(model, n, loss_fn)
    return _current


def workers_peak_rss_bytes() -> int:
    """The current workers' peak resident memory, summed (Linux's VmHWM; 0 without workers).

    An upper bound on what they add: pages they share with this process (the parameters'
    block, and whatever the fork left untouched) count here and in this process's own.
    """
    total = 0
    for proc in _current.procs if _current is not None else []:
        try:
            with open(f"/proc/{proc.pid}/status") as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1]) * 1024  # reported in kB
        except OSError:  # gone, or not Linux
            pass
    return total
