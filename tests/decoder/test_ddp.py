"""Data parallelism over MPI (decoder.training.dist), with 2 ranks launched by ``mpirun`` in a
subprocess under a timeout: 2 ranks x b rows take the step of one process with 2b (gradients and new
weights, float64, to 1e-10 of their scale: see RTOL), with accumulation and with ZeRO-1 too; ZeRO-1
keeps half the optimiser state per rank; a 2-rank run resumed by one process repeats a one-process
run; a failing rank ends the job with its error instead of hanging. On the CuPy stand-in with two
pretended GPUs, NCCL's path (and its host fallbacks) take the same steps, NCCL's without a
device-to-host copy; real NCCL needs several GPUs and is not run here.

Run as a script, this file is the ranks' side: ``mpirun -n 2 python test_ddp.py CASE OUT``.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

if __name__ != "__main__":  # the ranks run this file as a script: no tests package there
    from tests.support.numerics import assert_close

ROOT = Path(__file__).resolve().parents[2]
FAKE_CUPY = ROOT / "tests" / "support" / "fake_cupy.py"
TIMEOUT_S = 120  # far above a normal run's few seconds: only a hang gets near it
B, K = 4, 2  # rows per rank and micro-batches per step in the step cases
# Ranks against one process: the same math summed in another order (B rows a rank, in other
# BLAS kernels than 2B rows, then the ranks' sum), so float64 rounding, which three AdamW steps
# amplify: Adam divides each gradient by its own RMS, so the rounding noise of a gradient that
# is zero in exact arithmetic becomes an update of its own. The key bias holds only such noise
# (softmax ignores a shift of a query's scores by q . b_k): its copies differ by as much as
# they are large (1.4e-15 on AVX2 kernels), and weights of about 0.02 by up to 1e-14. So the
# tolerance is RTOL of the largest value of its kind (the weights, the gradients, or one entry
# of the optimiser's state, exp_avg say, over every parameter), not of each array's own; a wrong
# row, rank or average moves a gradient by its own size and a weight by about lr (1e-2).
RTOL = 1e-10


def mpirun() -> str | None:
    """The launcher beside this Python (the mpich wheel's), or one on the PATH."""
    beside = Path(sys.executable).parent / "mpirun"
    return str(beside) if beside.exists() else shutil.which("mpirun")


needs_mpi = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or mpirun() is None,
    reason="MPI is not installed: pip install -e '.[dist]' (or make dist) to run these",
)


def launch(
    args: list[str], tmp_path: Path, ranks: int = 2, each: list[list[str]] | None = None
) -> subprocess.CompletedProcess:
    """``args`` on ``ranks`` ranks; with ``each``, one rank per item, given ``args`` and then its
    own item (MPMD: ``mpirun -n 1 A : -n 1 B``)."""
    env = {
        **os.environ,
        "OPENBLAS_NUM_THREADS": "1",  # two ranks on two cores: one BLAS thread each
        "OMP_NUM_THREADS": "1",
        "MINIGRAD_DATA_DIR": str(tmp_path / "cache"),
    }
    command = [mpirun(), "-n", str(ranks), sys.executable, *args]
    if each is not None:
        apps = [["-n", "1", sys.executable, *args, *extra] for extra in each]
        command = [mpirun(), *[a for i, app in enumerate(apps) for a in [":"] * (i > 0) + app]]
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )


# ---- the ranks' side ----------------------------------------------------------------------------
def _model_and_optimizer():
    import minigrad as mg
    from decoder.model.config import ModelConfig
    from decoder.model.model import Decoder
    from minigrad.optim import AdamW, param_groups_for_decay

    mg.manual_seed(0)
    cfg = ModelConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, bias=True)
    model = Decoder(cfg).double()
    return model, AdamW(param_groups_for_decay(model, 0.1), lr=1e-2, weight_decay=0.1)


def _state_bytes(optimizer) -> int:
    return sum(
        v.nbytes for s in optimizer.state.values() for v in s.values() if hasattr(v, "nbytes")
    )


def _steps_case(out: Path) -> None:
    """Three steps of: one process on 2B rows; 2 ranks x B rows (k = 1 and k = 2); ZeRO-1.
    Rank 0 saves every variant's gradients and weights, and the optimiser state's sizes."""
    from decoder.training.config import TrainConfig
    from decoder.training.dist import DataParallel
    from decoder.training.step import train_step

    dist = DataParallel.from_mpi()
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, 11, size=(2, 2 * B, 8)) for _ in range(3)]  # (x|y, 2B, T)
    rows = dist.rows(B)
    results = {}
    variants = {  # name: (rows of each batch, k, dist)
        "one": (slice(None), 1, None),
        "ddp": (rows, 1, dist),
        "ddp_accum": (rows, K, dist),
        "zero": (rows, K, DataParallel(dist.comm, zero=True)),
    }
    for name, (rows_of, k, variant_dist) in variants.items():
        model, optimizer = _model_and_optimizer()
        cfg = TrainConfig(grad_accum_steps=k, grad_clip=0.05, dtype="float64")
        losses = [
            train_step(model, optimizer, x[rows_of], y[rows_of], cfg, i + 1, variant_dist)
            for i, (x, y) in enumerate(batches)
        ]
        results[f"{name}.losses"] = np.array(losses)
        for pname, p in model.named_parameters():
            results[f"{name}.grad.{pname}"] = p.grad
            results[f"{name}.data.{pname}"] = p.data
        results[f"{name}.state_bytes"] = np.array(_state_bytes(optimizer))
        if name == "zero":  # the gathered state is the one a single process holds
            gathered = variant_dist.optimizer_state(optimizer)
            if dist.is_main:
                for i, s in gathered["state"].items():
                    for sname, value in s.items():
                        results[f"zero.gathered.{i}.{sname}"] = np.asarray(value)
        if name == "one":
            for i, s in optimizer.state_dict()["state"].items():
                for sname, value in s.items():
                    results[f"one.state.{i}.{sname}"] = np.asarray(value)
    # a Ctrl-C seen by rank 1 alone must stop rank 0 too
    results["any"] = np.array([dist.any(dist.rank == 1), dist.any(False)])
    if dist.is_main:
        np.savez(out / "steps.npz", **results)


def _fail_case(out: Path) -> None:
    """Rank 1 raises while rank 0 waits for it in a collective."""
    from decoder.training.dist import DataParallel

    dist = DataParallel.from_mpi()
    with dist.abort_on_failure():
        if dist.rank == 1:
            raise RuntimeError("rank 1 lost its data")
        dist.comm.Barrier()  # never completed: rank 1 does not come


def _count_transfers(cupy, dist, method: str, counts: list[int]) -> None:
    """Make ``dist.method`` append the device-to-host transfers of each call to ``counts``."""
    call = getattr(dist, method)

    def counted(*args):
        before = cupy.device_to_host
        value = call(*args)
        counts.append(cupy.device_to_host - before)
        return value

    setattr(dist, method, counted)


def _nccl_case(out: Path) -> None:
    """On the CuPy stand-in, with two pretended GPUs: three steps with NCCL (ZeRO-1 and not),
    and ZeRO-1 with the host fallbacks (NCCL missing; both ranks on one GPU). Rank 0 saves
    the gradients, weights, losses, and the device-to-host transfers the collectives made."""
    spec = importlib.util.spec_from_file_location("cupy", FAKE_CUPY)
    cupy = sys.modules["cupy"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cupy)
    sys.modules.update(cupy.MODULES)
    cupy.cuda.runtime.getDeviceCount = lambda: 2
    from decoder.training.config import TrainConfig
    from decoder.training.dist import DataParallel
    from decoder.training.step import train_step

    dist = DataParallel.from_mpi()  # rank r takes GPU r
    cupy.cuda.nccl.mpi_comm = dist.comm
    results = {"devices": np.array(dist.comm.allgather(cupy.cuda.runtime.getDevice()))}
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, 11, size=(2, 2 * B, 8)) for _ in range(3)]  # (x|y, 2B, T)
    for name in ("nccl", "nccl_unsharded", "no_nccl", "one_gpu"):
        cupy.cuda.nccl.available = name != "no_nccl"
        cupy.cuda.Device(0 if name == "one_gpu" else dist.rank).use()
        model, optimizer = _model_and_optimizer()
        model.to("cuda")
        variant = DataParallel(dist.comm, zero=name != "nccl_unsharded")
        transfers: list[int] = []
        for method in ("average_gradients", "step"):
            _count_transfers(cupy, variant, method, transfers)
        cfg = TrainConfig(grad_accum_steps=K, grad_clip=0.05, dtype="float64")
        losses = [
            train_step(model, optimizer, x[dist.rows(B)], y[dist.rows(B)], cfg, i + 1, variant)
            for i, (x, y) in enumerate(batches)
        ]
        results[f"{name}.losses"] = np.array(losses)
        results[f"{name}.transfers"] = np.array(transfers)
        for pname, p in model.named_parameters():
            results[f"{name}.grad.{pname}"] = p.grad.get()
            results[f"{name}.data.{pname}"] = p.data.get()
        if name == "nccl":  # a resume from the gathered state takes the same next step
            state = dist.comm.bcast(variant.optimizer_state(optimizer), root=0)
            again, again_optimizer = _model_and_optimizer()
            again.to("cuda")
            again.load_state_dict(model.state_dict())
            resumed = DataParallel(dist.comm, zero=True)
            resumed.load_optimizer_state(again_optimizer, state)
            x, y = batches[0]
            for m, o, d in ((model, optimizer, variant), (again, again_optimizer, resumed)):
                train_step(m, o, x[dist.rows(B)], y[dist.rows(B)], cfg, 4, d)
            for (pname, p), q in zip(model.named_parameters(), again.parameters(), strict=True):
                results[f"resumed.{pname}"] = q.data.get() - p.data.get()
    model, optimizer = _model_and_optimizer()  # one process, 2B rows, on the host
    cfg = TrainConfig(grad_accum_steps=K, grad_clip=0.05, dtype="float64")
    results["one.losses"] = np.array(
        [train_step(model, optimizer, x, y, cfg, i + 1) for i, (x, y) in enumerate(batches)]
    )
    for pname, p in model.named_parameters():
        results[f"one.grad.{pname}"] = p.grad
        results[f"one.data.{pname}"] = p.data
    if dist.is_main:
        np.savez(out / "nccl.npz", **results)


def _weights_case(out: Path) -> None:
    """decoder.train with the arguments after OUT, alike on every rank, but with rank 1's weights
    drawn from another seed (as another library version, or a stray draw, would)."""
    from mpi4py import MPI

    import minigrad as mg
    from decoder.train import main

    rank, manual_seed = MPI.COMM_WORLD.Get_rank(), mg.manual_seed
    mg.manual_seed = lambda seed: manual_seed(seed + rank)
    sys.exit(main(sys.argv[3:]))


if __name__ == "__main__":
    case, out = sys.argv[1], Path(sys.argv[2])
    cases = {"steps": _steps_case, "fail": _fail_case, "nccl": _nccl_case}
    {**cases, "weights": _weights_case}[case](out)


# ---- the tests ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> dict[str, np.ndarray]:
    if importlib.util.find_spec("mpi4py") is None or mpirun() is None:
        pytest.skip("MPI is not installed: pip install -e '.[dist]' (or make dist) to run these")
    tmp_path = tmp_path_factory.mktemp("ddp")
    done = launch([__file__, "steps", str(tmp_path)], tmp_path)
    assert done.returncode == 0, done.stderr
    with np.load(tmp_path / "steps.npz") as f:
        return dict(f)


def _scale(steps, keys) -> float:
    """The largest magnitude among ``keys``' arrays: what the rounding is relative to."""
    return max(float(np.abs(steps[key]).max(initial=0.0)) for key in keys)


def _compare(steps, name, what):
    keys = [k for k in steps if k.startswith(f"one.{what}.")]
    assert keys
    atol = RTOL * _scale(steps, keys)
    for key in keys:
        other = key.replace("one.", f"{name}.", 1)
        assert_close(steps[other], steps[key], rtol=RTOL, atol=atol, err_msg=other)


@needs_mpi
@pytest.mark.summation_order
@pytest.mark.parametrize("name", ["ddp", "ddp_accum", "zero"])
def test_two_ranks_take_the_steps_of_one_process_with_twice_the_rows(steps, name):
    assert_close(steps[f"{name}.losses"], steps["one.losses"], rtol=RTOL, atol=0.0)
    _compare(steps, name, "grad")
    _compare(steps, name, "data")
    assert len(set(steps["one.losses"].tolist())) == 3  # three different steps were taken


@needs_mpi
@pytest.mark.summation_order
def test_zero_keeps_half_the_optimiser_state_per_rank_and_gathers_it_whole(steps):
    whole, sharded = int(steps["one.state_bytes"]), int(steps["zero.state_bytes"])
    assert whole == int(steps["ddp.state_bytes"])
    # a parameter cut by the boundary between the slices costs a few bytes on each side
    assert abs(sharded - whole / 2) <= 16, (sharded, whole)
    gathered = [k for k in steps if k.startswith("zero.gathered.")]
    assert len(gathered) == len([k for k in steps if k.startswith("one.state.")])
    one_state = [k for k in steps if k.startswith("one.state.")]
    for key in gathered:
        reference = key.replace("zero.gathered.", "one.state.")
        kind = reference.rsplit(".", 1)[1]  # exp_avg, exp_avg_sq or step: scales far apart
        atol = RTOL * _scale(steps, [k for k in one_state if k.endswith(f".{kind}")])
        assert_close(steps[key], steps[reference], rtol=RTOL, atol=atol, err_msg=key)


@needs_mpi
def test_a_flag_raised_on_one_rank_is_seen_on_every_rank(steps):
    assert steps["any"].tolist() == [True, False]


@needs_mpi
@pytest.mark.summation_order
def test_nccl_on_two_pretended_gpus_takes_the_steps_of_one_process_without_host_copies(tmp_path):
    """What runs here: decoder.training.dist's NCCL path on the CuPy stand-in, whose NCCL sums
    through MPI. What does not: real NCCL on two real GPUs (this machine has none)."""
    done = launch([__file__, "nccl", str(tmp_path)], tmp_path)
    assert done.returncode == 0, done.stderr
    with np.load(tmp_path / "nccl.npz") as f:
        got = dict(f)
    assert got["devices"].tolist() == [0, 1]  # one GPU per rank
    for name in ("nccl", "nccl_unsharded", "no_nccl", "one_gpu"):
        assert_close(got[f"{name}.losses"], got["one.losses"], rtol=RTOL, atol=0.0)
        _compare(got, name, "grad")
        _compare(got, name, "data")
    assert got["nccl.transfers"].tolist() == [0] * 6  # 3 x (gradients, ZeRO step): none
    assert got["nccl_unsharded.transfers"].tolist() == [0] * 6
    assert got["no_nccl.transfers"].min() > 0  # through the host: the count can see them
    assert got["one_gpu.transfers"].min() > 0
    assert "NCCL is not available to CuPy" in done.stderr
    resumed = [k for k in got if k.startswith("resumed.")]
    assert resumed and all(not got[k].any() for k in resumed)  # the same weights after step 4
    assert "ranks share a GPU, which NCCL refuses" in done.stderr


@needs_mpi
def test_a_failing_rank_ends_the_job_with_its_error(tmp_path):
    done = launch([__file__, "fail", str(tmp_path)], tmp_path)  # a hang fails by the timeout
    assert done.returncode != 0
    # one line names the rank and the error, ahead of the traceback (which mpirun's teardown
    # may cut short)
    lines = done.stderr.splitlines()
    assert any("rank 1 of 2 failed" in line and "rank 1 lost its data" in line for line in lines)


def make_text(n_lines: int = 300) -> str:
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "me"]
    rng = np.random.default_rng(0)
    return "\n".join(" ".join(rng.choice(words, size=rng.integers(3, 8))) for _ in range(n_lines))


@needs_mpi
@pytest.mark.summation_order
def test_a_two_rank_run_resumed_by_one_process_repeats_the_one_process_run(tmp_path, monkeypatch):
    from decoder.training.checkpoint import load_checkpoint
    from decoder.training.config import build_configs
    from decoder.training.loop import train

    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(tmp_path / "cache"))
    (tmp_path / "text.txt").write_text(make_text())
    settings = dict(max_iters=8, lr_decay_iters=8, warmup_iters=2, eval_interval=4, eval_iters=1)
    settings.update(block_size=16, dtype="float64", sample_tokens=0)
    flags = [f"--{k}={v}" for k, v in settings.items()]
    ddp_dir = tmp_path / "ddp"
    args = ["-m", "decoder.train", "--ddp", "--zero", "--preset", "tiny", "--out", str(ddp_dir)]
    args += ["--data", str(tmp_path / "text.txt"), "--batch_size=2", "--max_iters=4", *flags[1:]]
    done = launch(args, tmp_path)
    assert done.returncode == 0, done.stderr
    assert load_checkpoint(ddp_dir).step == 4

    cfgs = build_configs("tiny", **{**settings, "batch_size": 4})
    text = make_text()
    one = train(*cfgs, text, tmp_path / "one", progress=False)
    rest = train(*cfgs, text, ddp_dir, resume=True, progress=False)
    # the same losses after step 4: the 2-rank run left the weights, the optimiser's state and
    # the batches' generator where the one-process run had them
    assert_close(rest["losses"], one["losses"][4:], rtol=RTOL, atol=0.0)  # ranks: see RTOL
    log = [json.loads(line) for line in (ddp_dir / "log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in log] == [0, 4, 8]


def _tiny_ddp_run(tmp_path: Path) -> list[str]:
    (tmp_path / "text.txt").write_text(make_text())
    args = ["-m", "decoder.train", "--ddp", "--preset", "tiny", "--out", str(tmp_path / "run")]
    args += ["--data", str(tmp_path / "text.txt"), "--batch_size=2", "--max_iters=2"]
    args += ["--block_size=16", "--warmup_iters=1", "--eval_interval=2", "--eval_iters=1"]
    return [*args, "--sample_tokens=0"]


@needs_mpi
@pytest.mark.parametrize(
    "rank1, field",
    [
        (["--seed=2"], "seed: 1337 on rank 0, 2 on rank 1"),
        (["--lr=2e-3"], "lr: 0.003 on rank 0, 0.002 on rank 1"),
        (["--max_iters=3"], "max_iters: 2 on rank 0, 3 on rank 1"),
        (["--zero"], "--zero: False on rank 0, True on rank 1"),
    ],
)
def test_ranks_launched_with_other_settings_are_refused_naming_the_field(tmp_path, rank1, field):
    done = launch(_tiny_ddp_run(tmp_path), tmp_path, each=[[], rank1])  # a hang: the timeout
    assert done.returncode != 0
    assert f"the ranks disagree on the run: {field}" in done.stderr, done.stderr


@needs_mpi
def test_a_resume_on_one_rank_only_is_refused_naming_it(tmp_path):
    args = _tiny_ddp_run(tmp_path)
    assert launch(args, tmp_path).returncode == 0
    done = launch([*args, "--max_iters=4"], tmp_path, each=[["--resume"], []])
    assert done.returncode != 0
    assert "start step: 2 on rank 0, 0 on rank 1" in done.stderr, done.stderr
    assert "--resume: True on rank 0, False on rank 1" in done.stderr


@needs_mpi
def test_ranks_whose_initial_weights_differ_are_refused(tmp_path):
    done = launch([__file__, "weights", str(tmp_path), *_tiny_ddp_run(tmp_path)[2:]], tmp_path)
    assert done.returncode != 0
    assert "the ranks disagree on the initial weights: the weights' sha256: " in done.stderr


def test_a_run_without_ddp_never_imports_mpi():
    code = "import sys, decoder.train; assert 'mpi4py' not in sys.modules, 'imported'"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_ddp_without_mpi_says_how_to_install_it(monkeypatch, capsys):
    from decoder.train import main

    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py now fails
    assert main(["--ddp", "--preset", "tiny"]) == 2
    assert "pip install -e '.[dist]'" in capsys.readouterr().err


def test_zero_without_ddp_is_refused(capsys):
    from decoder.train import main

    with pytest.raises(SystemExit):
        main(["--zero", "--preset", "tiny"])
    assert "add --ddp" in capsys.readouterr().err
