"""Data-parallel training over MPI: one averaged gradient per step, and ZeRO stage 1.

    mpirun -n 2 python -m decoder.train --ddp --preset tiny          # each rank: 1 BLAS thread
    mpirun -n 2 python -m decoder.train --ddp --zero --preset tiny   # AdamW's moments sharded

Every rank holds the whole model, starts from the same seed (so the same weights), and runs
``decoder.training.step.train_step`` on its own rows of each step's batch. After the last
micro-batch's backward pass, ``average_gradients`` packs every gradient, a has-a-gradient flag per
parameter and the loss into one flat buffer and sums it over the ranks with a single ``Allreduce``;
divided by the number of ranks, that is the gradient of the mean loss over all the ranks' rows, so N
ranks of b rows take the step one process takes with N * b rows. Clipping then runs on identical
numbers everywhere, and every rank takes the same optimiser step.

Ranks launched apart must agree on the run (``agree``); ``--zero`` shards the optimiser's step
(ZeRO stage 1, ``step``); on CuPy the collectives run on the GPUs through NCCL
(``_device_comm``).

mpi4py is imported only by ``DataParallel.from_mpi``: a run without ``--ddp`` never loads it.
Left out: overlapping communication with the backward pass, and ZeRO's later stages (sharded
gradients and parameters).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from minigrad.backend import cuda_available, to_numpy, xp_of
from minigrad.optim import Optimizer
from minigrad.tensor import Tensor

INSTALL_HINT = "pip install -e '.[dist]' (or: make dist)"
ABORT_GRACE_S = 0.5  # how long a failing rank waits, its error written, before it aborts the job


class DataParallel:
    """This process's place in a data-parallel run over the MPI communicator ``comm``."""

    def __init__(self, comm: Any, zero: bool = False):
        from mpi4py import MPI  # a communicator exists, so mpi4py is importable

        self.comm, self.mpi = comm, MPI
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.zero = zero
        self.comm_time = 0.0  # seconds in Allreduce and Allgather (NCCL: queueing them)
        self._grads: Any = None  # gradients, flags and loss (NCCL: the gradients), reused
        self._params: Any = None  # ZeRO-1: the flat, padded parameters (host or device)
        self._nccl: Any = None  # the NCCL communicator, once the first collective on CuPy asks
        self._transport_chosen = False  # NCCL or host memory, decided once by every rank

    @classmethod
    def from_mpi(cls, zero: bool = False) -> DataParallel:
        """The world communicator's rank; a clear error where mpi4py is missing."""
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise RuntimeError(
                f"--ddp needs mpi4py and an MPI library ({e}): {INSTALL_HINT}"
            ) from None
        dist = cls(MPI.COMM_WORLD, zero)
        if importlib.util.find_spec("cupy") is not None and cuda_available():
            dist.use_local_gpu()
        return dist

    def use_local_gpu(self) -> None:
        """Make this rank's GPU the current one: its rank among the ranks on its host, modulo
        the host's GPUs (more ranks than GPUs share them, and then NCCL is left out)."""
        import cupy

        local_rank = self.comm.Split_type(self.mpi.COMM_TYPE_SHARED).Get_rank()
        cupy.cuda.Device(local_rank % cupy.cuda.runtime.getDeviceCount()).use()

    @property
    def is_main(self) -> bool:
        """Rank 0 evaluates, logs, draws the progress bar and writes the checkpoints."""
        return self.rank == 0

    def rows(self, n: int) -> slice:
        """This rank's ``n`` rows of a batch of ``n * size`` rows drawn alike on every rank.

        >>> class Two(DataParallel):
        ...     def __init__(self): self.rank, self.size = 1, 2
        >>> Two().rows(4)
        slice(4, 8, None)
        """
        return slice(self.rank * n, (self.rank + 1) * n)

    # ---- the gradient ------------------------------------------------------------------------
    def average_gradients(self, params: Sequence[Tensor], loss: float) -> float:
        """Average every parameter's ``.grad`` and ``loss`` over the ranks, in one Allreduce
        (on CuPy with NCCL: the gradients' on the GPUs, the flags' and the loss's over MPI);
        returns the mean loss.

        A parameter the loss did not reach on some rank counts as a zero gradient there; one
        the loss reached on no rank keeps ``.grad = None`` (the optimiser skips it, as it
        would in one process).
        """
        sizes = [p.data.size for p in params]
        total = sum(sizes)
        nccl = self._device_comm(params)
        # (gradients | one flag per parameter | loss) in one host buffer; with NCCL the
        # gradients in a device buffer and the rest in a small host buffer of its own
        length = total if nccl is not None else total + len(params) + 1
        if self._grads is None or len(self._grads) != length:
            xp = xp_of(params[0].data) if nccl is not None else np
            self._grads = xp.empty(length, dtype=params[0].dtype)
        grads = self._grads[:total]
        tail = (
            np.empty(len(params) + 1, dtype=params[0].dtype)
            if nccl is not None
            else self._grads[total:]
        )
        offset = 0
        for i, (p, n) in enumerate(zip(params, sizes, strict=True)):
            present = p.grad is not None
            grads[offset : offset + n] = self._staged(p.grad).ravel() if present else 0.0
            tail[i] = present
            offset += n
        tail[-1] = loss
        start = time.perf_counter()
        if nccl is not None:  # sums over the ranks
            self._nccl_collective("allReduce", grads, grads)
            self.comm.Allreduce(self.mpi.IN_PLACE, tail)
        else:
            self.comm.Allreduce(self.mpi.IN_PLACE, self._grads)
        self.comm_time += time.perf_counter() - start
        grads /= self.size
        tail /= self.size
        offset = 0
        for i, (p, n) in enumerate(zip(params, sizes, strict=True)):
            grad = grads[offset : offset + n].reshape(p.shape)  # a view: no copy
            p.grad = xp_of(p.data).asarray(grad) if tail[i] > 0 else None
            offset += n
        return float(tail[-1])

    # ---- the optimiser's step ----------------------------------------------------------------
    def step(self, optimizer: Optimizer, grad_scale: float = 1.0) -> None:
        """The optimiser's step: whole on every rank, or under ZeRO-1 this rank's slice of the
        flat parameters, then an Allgather of the slices. ``grad_scale``: as ``Optimizer.step``'s
        (clipping's factor).

        ZeRO stage 1 (Rajbhandari et al. 2020): the parameters, flattened and padded to a
        multiple of N, are cut into N equal slices; each rank updates only its slice (so it keeps
        the moments of only its slice: a 1/N share of the optimiser's memory) and an
        ``Allgather`` hands every rank the others' slices. The update is elementwise, so the
        weights equal the unsharded run's. A checkpoint gathers the slices into the optimiser's
        ordinary state dict (``optimizer_state``), so a run resumes with any number of ranks,
        sharded or not.
        """
        if not self.zero:
            optimizer.step(grad_scale=grad_scale)
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
        nccl = self._device_comm(params)
        if self._params is None:
            shard = -(-sum(p.data.size for p in params) // self.size)  # ceil: equal slices
            xp = xp_of(params[0].data) if nccl is not None else np
            self._params = xp.zeros(shard * self.size, dtype=params[0].dtype)
        for i, p, group, (start, stop), (lo, hi) in self._pieces(optimizer):
            self._params[start:stop] = self._staged(p.data).ravel()[lo:hi]
            if p.grad is None:
                continue
            grad = self._staged(p.grad).ravel()[lo:hi]
            # subtle: the state of parameter i holds only this rank's piece of its moments
            piece, state = self._params[start:stop], optimizer.state.setdefault(i, {})
            if grad_scale == 1.0:
                optimizer.update(piece, grad, group, state)
            else:
                optimizer.update_scaled(piece, grad, grad_scale, group, state)
        start = time.perf_counter()
        if nccl is not None:
            shard = len(self._params) // self.size
            mine = self._params[self.rank * shard : (self.rank + 1) * shard]
            self._nccl_collective("allGather", mine, self._params)  # in place, as NCCL allows
        else:
            self.comm.Allgather(self.mpi.IN_PLACE, self._params)
        self.comm_time += time.perf_counter() - start
        offset = 0
        for p in params:
            n = p.data.size
            p.data[...] = xp_of(p.data).asarray(self._params[offset : offset + n].reshape(p.shape))
            offset += n

    # ---- NCCL --------------------------------------------------------------------------------
    def _device_comm(self, params: Sequence[Tensor]) -> Any:
        """The NCCL communicator where the parameters are on CuPy and NCCL can serve every
        rank, else None (host memory over MPI). The first call on CuPy is a collective that
        every rank makes alike (it comes with the first gradient, step or resume).

        On CuPy each rank takes a GPU of its own (``use_local_gpu``), and the gradients'
        Allreduce and ZeRO's Allgather run on the GPUs through NCCL (``cupy.cuda.nccl``, set up
        over MPI here), with no copy to the host; MPI still carries the control plane (the
        has-a-gradient flags and the loss, stop flags, errors). Where NCCL is missing, or ranks
        share a GPU (NCCL refuses that), the gradients travel through host memory over MPI
        instead (the MPI wheels are not CUDA-aware), after a one-line note.
        """
        if xp_of(params[0].data) is np:
            return None
        if not self._transport_chosen:
            import cupy

            nccl = importlib.import_module("cupy.cuda.nccl")
            here = (self.mpi.Get_processor_name(), cupy.cuda.runtime.getDevice(), nccl.available)
            everyone = self.comm.allgather(here)
            gpus = [(host, gpu) for host, gpu, _ in everyone]
            if not all(available for _, _, available in everyone):
                why = "NCCL is not available to CuPy (cupy.cuda.nccl.available is false)"
            elif len(set(gpus)) < len(gpus):
                why = "ranks share a GPU, which NCCL refuses (launch one rank per GPU)"
            else:
                why = None
                uid = self.comm.bcast(nccl.get_unique_id() if self.is_main else None, root=0)
                self._nccl = nccl.NcclCommunicator(self.size, uid, self.rank)
            if why is not None and self.is_main:
                print(f"note: gradients go through host memory over MPI: {why}", file=sys.stderr)
            self._transport_chosen = True
        return self._nccl

    def _staged(self, array: Any) -> Any:
        """``array`` where the collectives read it: on the device with NCCL, else the host."""
        return array if self._nccl is not None else to_numpy(array)

    def _nccl_collective(self, name: str, send: Any, recv: Any) -> None:
        """NCCL's ``allReduce`` (a sum) or ``allGather`` of ``send``'s elements into ``recv``,
        on the device pointers, on the current stream (so ordered with the kernels around it).
        """
        import cupy

        nccl = importlib.import_module("cupy.cuda.nccl")
        dtype = getattr(nccl, f"NCCL_{send.dtype.name.upper()}")  # NCCL_FLOAT64 and so on
        stream = cupy.cuda.get_current_stream().ptr
        if name == "allReduce":
            self._nccl.allReduce(
                send.data.ptr, recv.data.ptr, send.size, dtype, nccl.NCCL_SUM, stream
            )
        else:
            self._nccl.allGather(send.data.ptr, recv.data.ptr, send.size, dtype, stream)

    def _pieces(self, optimizer: Optimizer) -> Iterator[tuple]:
        """For each parameter that overlaps this rank's slice of the flat parameters: its
        index, itself, its group, the overlap's place in the flat buffer and in the parameter.
        """
        params = [(p, g) for g in optimizer.param_groups for p in g["params"]]
        shard = -(-sum(p.data.size for p, _ in params) // self.size)
        mine_lo, mine_hi = self.rank * shard, (self.rank + 1) * shard
        offset = 0
        for i, (p, group) in enumerate(params):
            lo, hi = max(offset, mine_lo), min(offset + p.data.size, mine_hi)
            if lo < hi:
                yield i, p, group, (lo, hi), (lo - offset, hi - offset)
            offset += p.data.size

    # ---- the optimiser's state in a checkpoint -----------------------------------------------
    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any] | None:
        """``optimizer.state_dict()`` as one process would hold it, on rank 0 (None on the
        others). Under ZeRO-1 a collective: every rank must call it, and the slices of the
        moments are gathered and joined."""
        if not self.zero:
            return optimizer.state_dict() if self.is_main else None
        mine = optimizer.state_dict()["state"]
        pieces = {
            i: (lo, hi, mine[i]) for i, _, _, _, (lo, hi) in self._pieces(optimizer) if i in mine
        }
        gathered = self.comm.gather(pieces, root=0)
        if not self.is_main:
            return None
        full = optimizer.state_dict()
        params = [p for group in optimizer.param_groups for p in group["params"]]
        state: dict[int, dict[str, Any]] = {}
        for rank_pieces in gathered:
            for i, (lo, hi, piece) in rank_pieces.items():
                joined = state.setdefault(i, {})
                for name, value in piece.items():
                    if hasattr(value, "shape"):
                        flat = joined.setdefault(name, np.zeros(params[i].data.size, value.dtype))
                        flat[lo:hi] = value
                    else:  # the step count, the same in every piece
                        joined[name] = value
        for i, joined in state.items():
            for name, value in joined.items():
                if hasattr(value, "shape"):
                    joined[name] = value.reshape(params[i].shape)
        full["state"] = state
        return full

    def load_optimizer_state(self, optimizer: Optimizer, state_dict: dict[str, Any]) -> None:
        """Load a whole (one-process) state dict; under ZeRO-1 keep only this rank's slices."""
        optimizer.load_state_dict(state_dict)
        if not self.zero:
            return
        kept = {}
        self._device_comm([p for g in optimizer.param_groups for p in g["params"]])
        for i, _, _, _, (lo, hi) in self._pieces(optimizer):
            if i in optimizer.state:
                kept[i] = {
                    name: self._staged(value).ravel()[lo:hi].copy()
                    if hasattr(value, "shape")
                    else value
                    for name, value in optimizer.state[i].items()
                }
        optimizer.state = kept

    def agree(self, what: str, values: dict[str, Any], fix: str) -> None:
        """Refuse, on every rank alike, a run whose ranks hold different ``values`` (settings,
        the start step, a checksum of the weights): a collective that every rank calls at the
        start, before any other, so ranks that disagree get this error instead of a collective
        that never completes, or replicas that drift apart in silence.

        decoder.training.run.start_run calls it twice: on every rank's configuration,
        ``--resume``, ``--zero``, data hash and start step, then on a SHA-256 of its weights. The
        refusal names each field and the ranks that hold each value.
        """
        found = disagreements(self.comm.allgather({k: repr(v) for k, v in values.items()}))
        if found:
            raise ValueError(f"the ranks disagree on {what}: {'; '.join(found)}; {fix}")

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (a Ctrl-C seen by one rank stops them all at
        the same step: a rank that stopped alone would leave the others in a collective)."""
        return bool(self.comm.allreduce(bool(flag), op=self.mpi.LOR))

    # ---- failure -----------------------------------------------------------------------------
    def abort(self, code: int) -> None:
        """End every rank of the job with ``code``: a rank that stops alone leaves the others
        waiting in the next collective for ever."""
        sys.stdout.flush()
        sys.stderr.flush()
        # subtle: mpirun forwards each rank's output while the abort tears the job down, and
        # has lost a whole error message that was already written: give it a moment to read
        time.sleep(ABORT_GRACE_S)
        self.comm.Abort(code)

    @contextlib.contextmanager
    def abort_on_failure(self) -> Iterator[None]:
        """Turn an exception on any rank into the end of the whole job, naming the rank."""
        try:
            yield
        except BaseException as e:
            if isinstance(e, SystemExit) and e.code in (0, None):
                raise
            # subtle: the error first and in one write: mpirun forwards a rank's output while
            # the abort tears the job down, and has dropped the tail of a many-line traceback
            summary = "".join(traceback.format_exception_only(e)).strip()
            sys.stderr.write(
                f"rank {self.rank} of {self.size} failed ({summary}); ending the job:\n"
                + traceback.format_exc()
            )
            self.abort(1)
            raise  # Abort ends the process; this only keeps the exception if it returns


def disagreements(everyone: Sequence[dict[str, str]]) -> list[str]:
    """The names on which the ranks' ``everyone[rank]`` differ, each with its values by rank.

    >>> disagreements([{"lr": "0.001", "seed": "1"}, {"lr": "0.01", "seed": "1"}])
    ['lr: 0.001 on rank 0, 0.01 on rank 1']
    >>> disagreements([{"zero": "True"}, {"zero": "False"}, {"zero": "True"}])
    ['zero: True on ranks 0, 2, False on rank 1']
    """
    found = []
    for name in dict.fromkeys(k for values in everyone for k in values):  # in the ranks' order
        ranks: dict[str, list[int]] = {}
        for rank, values in enumerate(everyone):
            ranks.setdefault(values.get(name, "(none)"), []).append(rank)
        if len(ranks) > 1:
            where = (
                f"{v} on rank{'s' * (len(r) > 1)} {', '.join(map(str, r))}"
                for v, r in ranks.items()
            )
            found.append(f"{name}: {', '.join(where)}")
    return found


def weights_digest(state: dict[str, Any]) -> str:
    """A SHA-256 of a state dict's names, shapes, dtypes and values, in order.

    >>> weights_digest({"w": np.zeros(2)}) == weights_digest({"w": np.ones(2)})
    False
    """
    digest = hashlib.sha256()
    for name, value in state.items():
        array = np.ascontiguousarray(to_numpy(value))
        digest.update(f"{name}{array.shape}{array.dtype}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()
