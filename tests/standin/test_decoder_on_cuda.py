"""The decoder's CUDA path, run on the CuPy stand-in, equals its CPU path.

Each test runs the same thing twice, on "cpu" and on "cuda" with the stand-in
(tests/support/fake_cupy.py) in place of CuPy, and compares: a training run of every preset
(tiny sizes, with its evaluation and its checkpoint written from device arrays), a resume
that loads that checkpoint onto the device, generation with and without the KV cache, LoRA
fine-tuning and merging. The stand-in refuses every implicit move to the host, so a missing
``xp`` branch or device transfer fails here with a TypeError, and it counts the explicit
moves: a training step or a generated token may make only the few it needs (the loss and
the gradient norm out, the ids and targets in).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F
from decoder.model.model import Decoder
from decoder.training.checkpoint import load_checkpoint
from decoder.training.config import PRESETS, build_configs
from decoder.training.loop import train
from decoder.training.step import lm_loss, train_step
from minigrad.kernels import emulator
from minigrad.nn.lora import apply_lora, lora_state_dict, merge_lora
from minigrad.optim import AdamW
from tests.support.numerics import assert_close

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "me"]
TEXT = "\n".join(" ".join(np.random.default_rng(i).choice(WORDS, size=5)) + "." for i in range(120))
# Small enough for seconds. Head sizes: 8 where a preset has 4 heads (attention from array
# ops on both devices), 16 for tiny's 2 heads (on "cuda" the flash kernel, emulated).
TINY = dict(
    n_layer=1,
    n_embd=32,
    block_size=16,
    batch_size=2,
    max_iters=2,
    warmup_iters=1,
    eval_interval=2,
    eval_iters=1,
    dropout=0.0,  # the device draws its dropout masks its own way: equal only without it
    matmul_precision="highest",  # baby-gpt's TF32 rounds on the device only (see the tf32 test)
    sample_tokens=0,
)
N_HEAD = {"baby-gpt": 4}  # 6 heads do not divide 32


@pytest.fixture(autouse=True)
def _token_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(tmp_path / "cache"))  # keep ids out of ~/.cache


# tiny's attention through the flash kernel on "cuda" (and its NumPy twin on the CPU): auto
# would take the naive path on the device, whose arrays fit (minigrad.functional.attention)
KERNEL = {"tiny": dict(attn_impl="flash")}


def configs(preset: str, device: str, **extra):
    n_head = N_HEAD.get(preset, PRESETS[preset].model.get("n_head", 4))
    kernel = KERNEL.get(preset, {})
    return build_configs(preset, **{**TINY, **kernel, "n_head": n_head, "device": device, **extra})


def run(preset: str, device: str, out, **extra) -> dict:
    model_cfg, train_cfg = configs(preset, device, **extra)
    return train(model_cfg, train_cfg, TEXT, out, progress=False)


def assert_same_weights(cuda_dir, cpu_dir, exact: bool = False):
    """The two checkpoints' weights: bitwise with ``exact`` (the same steps on the same device),
    else up to the rounding that training amplifies (two devices, two orders of summation).

    Adam divides each gradient by its own running RMS, so the rounding in a gradient is not
    scaled down with the gradient: where the true gradient is zero the update is noise. The key
    bias is such a weight (softmax ignores a shift of all of a query's scores by q . b, so
    dloss/db_k is zero up to rounding): it holds lr * g / (|g| + eps) of noise, about 1e-6, and
    the devices' copies differ by as much as they are large (1.7e-6 seen on AVX2 kernels). So
    the absolute tolerance follows the scale of the model's weights, max |w| over every tensor
    (the norms' gains, 1), not each tensor's own: 1e-5 of it, a hundredth of the step (lr, 1e-3
    or more in every preset) by which a wrong gradient or update would move a weight.
    """
    cuda, cpu = load_checkpoint(cuda_dir), load_checkpoint(cpu_dir)
    assert cuda.weights.keys() == cpu.weights.keys()
    scale = max(float(np.abs(w).max(initial=0.0)) for w in cpu.weights.values())
    for name, w in cpu.weights.items():
        if exact:
            np.testing.assert_array_equal(cuda.weights[name], w, err_msg=name)
        else:
            assert_close(cuda.weights[name], w, rtol=1e-5, atol=1e-5 * scale, err_msg=name)


@pytest.mark.summation_order
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_training_on_cuda_equals_cpu(preset, tmp_path, fake_cupy):
    # the CPU's row shards (decoder/training/shards.py) sum in another order: compare with one
    # shard, as the device runs (sharding against one shard is tests/decoder/test_shards.py's)
    cpu = run(preset, "cpu", tmp_path / "cpu", shards=1)
    cuda = run(preset, "cuda", tmp_path / "cuda")
    # two float32 steps: the losses agree to rounding amplified by one update (rtol 1e-5)
    assert_close(cuda["losses"], cpu["losses"], rtol=1e-5, atol=0)
    assert_close(cuda["val_loss"], cpu["val_loss"], rtol=1e-5, atol=0)
    assert_same_weights(tmp_path / "cuda", tmp_path / "cpu")  # saved from device arrays


def test_a_resume_on_cuda_loads_the_checkpoint_onto_the_device(tmp_path, fake_cupy):
    model_cfg, train_cfg = configs("tiny", "cuda", max_iters=4)
    whole = train(model_cfg, train_cfg, TEXT, tmp_path / "whole", progress=False)
    train(model_cfg, train_cfg, TEXT, tmp_path / "split", progress=False, until=2)
    rest = train(model_cfg, train_cfg, TEXT, tmp_path / "split", resume=True, progress=False)
    assert rest["losses"] == whole["losses"][2:]
    assert_same_weights(tmp_path / "split", tmp_path / "whole", exact=True)  # the same steps


def test_one_training_step_copies_only_the_batch_in_and_two_numbers_out(fake_cupy):
    model_cfg, train_cfg = configs("tiny", "cuda")  # hs = 16: the flash kernel, emulated
    model = Decoder(model_cfg).to("cuda")
    optimizer = AdamW(model.parameters(), lr=1e-3)
    x = np.random.default_rng(0).integers(0, model_cfg.vocab_size, (2, model_cfg.block_size))
    out, into = fake_cupy.device_to_host, fake_cupy.host_to_device
    train_step(model, optimizer, x, np.roll(x, -1, axis=1), train_cfg, step=1)
    # Out: the loss, read once for the progress bar and the divergence check, and the global
    # gradient norm that clipping returns. In: the ids and the targets, whose range is checked
    # on the host before they move.
    assert (fake_cupy.device_to_host - out, fake_cupy.host_to_device - into) == (2, 2)


def test_the_loss_is_read_after_the_backward_is_queued(fake_cupy, monkeypatch):
    # On a GPU the host must not wait for the forward's result before it queues the backward:
    # the first device-to-host read of the step comes after the backward's kernels.
    model = tiny_model("cuda")
    _, train_cfg = configs("shakespeare-char-modern", "cuda")
    x = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 8))
    forward_end, reads = [], []

    def loss_fn(m, xb, yb):
        loss = lm_loss(m, xb, yb)
        forward_end.append(fake_cupy.kernel_launches)
        return loss

    real = fake_cupy._to_host
    monkeypatch.setattr(
        fake_cupy, "_to_host", lambda a: reads.append(fake_cupy.kernel_launches) or real(a)
    )
    optimizer = AdamW(model.parameters(), lr=1e-3)
    train_step(model, optimizer, x, np.roll(x, -1, axis=1), train_cfg, 1, loss_fn=loss_fn)
    n_params = len(list(model.parameters()))
    assert reads[0] >= forward_end[0] + n_params  # a gradient kernel per parameter at least


def test_each_generated_token_copies_one_id_in_and_one_row_of_logits_out(fake_cupy):
    model = tiny_model("cuda")
    counts = []
    for n_tokens in (4, 8):  # the difference is four tokens fed one at a time to the cache
        out, into = fake_cupy.device_to_host, fake_cupy.host_to_device
        list(model.generate([1, 2, 3], n_tokens, seed=0))
        counts.append((fake_cupy.device_to_host - out, fake_cupy.host_to_device - into))
    assert (counts[1][0] - counts[0][0], counts[1][1] - counts[0][1]) == (4, 4)


def tiny_model(device: str) -> Decoder:
    model_cfg, _ = configs("shakespeare-char-modern", device)
    mg.manual_seed(0)
    return Decoder(model_cfg).to(device)


@pytest.mark.parametrize("use_cache", [True, False], ids=["kv-cache", "no-cache"])
def test_generation_on_cuda_equals_cpu(use_cache, fake_cupy):
    settings = dict(temperature=0.8, top_k=10, seed=3, use_cache=use_cache)
    prompt = [1, 2, 3]
    cpu = list(tiny_model("cpu").generate(prompt, 20, **settings))  # past block_size: crops
    cuda = list(tiny_model("cuda").generate(mg.tensor(prompt, device="cuda"), 20, **settings))
    assert cuda == cpu


@pytest.mark.summation_order
def test_lora_fine_tuning_and_merge_on_cuda_equal_cpu(tmp_path, fake_cupy):
    from decoder.post.lora import finetune

    run("tiny", "cpu", tmp_path / "base")
    results = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        results[device] = finetune(
            tmp_path / "base", TEXT[::-1], out, r=2, max_iters=2, device=device, progress=False
        )
    assert results["cuda"]["val_loss_after"] == pytest.approx(
        results["cpu"]["val_loss_after"], rel=1e-5
    )
    merged = {}
    for device in ("cpu", "cuda"):
        model = tiny_model(device)
        apply_lora(model, ("wq", "wv"), r=2)
        mg.manual_seed(1)
        for p in lora_state_dict(model):  # the B factors start at zero: make the update real
            param = dict(model.named_parameters())[p]
            param.data[...] = param.data + 0.1
        merge_lora(model)
        merged[device] = model.state_dict()  # on the host, whichever device it came from
    for name, w in merged["cpu"].items():
        np.testing.assert_allclose(merged["cuda"][name], w, rtol=1e-6, err_msg=name)


@pytest.mark.summation_order
@pytest.mark.parametrize(
    "overrides",
    [
        dict(pos="sinusoidal", norm_position="post", bias=True),
        dict(pos="alibi", parallel_block=True, tie_weights=False),
        dict(pos="none", ffn="swiglu", norm="rms", n_kv_head=1),
        dict(pos="rope", attn_impl="flash"),
    ],
    ids=["sinusoidal-post-bias", "alibi-parallel", "nopos-swiglu-rms-mqa", "rope-flash-twin"],
)
def test_each_architecture_choice_on_cuda_equals_cpu(overrides, fake_cupy):
    ids = np.random.default_rng(0).integers(0, 65, (2, 16))
    out = {}
    for device in ("cpu", "cuda"):
        model_cfg, _ = configs("tiny", device, n_head=4, **overrides)
        mg.manual_seed(0)
        model = Decoder(model_cfg).to(device)
        logits, loss = model(ids, np.roll(ids, -1, axis=1))
        loss.backward()
        grads = {n: mg.Tensor(p.grad).numpy() for n, p in model.named_parameters()}
        out[device] = logits.numpy(), grads
    np.testing.assert_allclose(out["cuda"][0], out["cpu"][0], rtol=1e-5, atol=1e-6)
    for name, g in out["cpu"][1].items():
        np.testing.assert_allclose(out["cuda"][1][name], g, rtol=1e-4, atol=1e-6, err_msg=name)


def test_dropout_and_exact_gelu_run_on_the_device(fake_cupy):
    # the device draws dropout masks its own way and computes erf with cupyx: the numbers
    # differ from the CPU's, so this checks that both stay on the device and train (attention
    # dropout: the naive path, which auto picks)
    model_cfg, train_cfg = configs("tiny", "cuda", dropout=0.2, attn_impl="auto")
    mg.manual_seed(0)
    model = Decoder(model_cfg).to("cuda")
    optimizer = AdamW(model.parameters(), lr=1e-3)
    x = np.random.default_rng(0).integers(0, 65, (2, 16))
    loss = train_step(model, optimizer, x, np.roll(x, -1, axis=1), train_cfg, step=1)
    assert np.isfinite(loss)
    y = F.gelu(mg.tensor([-1.0, 0.0, 2.0], device="cuda"), approximate="none")
    np.testing.assert_allclose(y.numpy(), [-0.158655, 0.0, 1.954500], atol=1e-6)


@pytest.mark.summation_order
@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++: the emulator builds the kernel")
@pytest.mark.parametrize(
    "precision, tol", [("highest", 1e-4), ("high", 1e-2)], ids=["fmaf", "tf32-mma"]
)
def test_a_training_step_with_attention_dropout_in_the_kernel_equals_the_naive_one(
    precision, tol, fake_cupy, matmul_precision
):
    """What make gpu-check's flash training row runs, on the stand-in: a model in training mode
    with dropout everywhere, one step through the emulated kernel (hs 16) and one through the
    naive path, from the same weights and generator. Each layer draws its attention seed where
    the naive path draws its mask, and both drop by the same hash (issue 26), so the two steps
    drop the same weights: the same loss, gradients and generator state, to float32 rounding;
    under "high" (baby-gpt's) the kernel is the tensor cores' in TF32, and so are the naive
    path's products, each rounding in its own places."""
    matmul_precision(precision)
    ids = np.random.default_rng(3).integers(0, 65, (2, 16))
    out = {}
    for impl in ("naive", "flash"):
        model_cfg, _ = configs("tiny", "cuda", n_layer=2, dropout=0.2, attn_impl=impl)
        mg.manual_seed(0)
        model = Decoder(model_cfg).to("cuda")
        model.train()
        with emulator.count_launches() as launches:
            _, loss = model(ids, np.roll(ids, -1, axis=1))
            loss.backward()
        grads = {n: mg.Tensor(p.grad).numpy() for n, p in model.named_parameters()}
        out[impl] = loss.item(), grads, mg.randn(3).numpy()  # the generator's next draws
        kernels = {(x.name, "-DDROPOUT=1" in x.options) for x in launches if "flash" in x.name}
        if impl == "flash":  # forward and backward in the kernels built with dropout
            prefix = "flash_mma_" if precision == "high" else "flash_attn_"
            assert {(prefix + "fwd", True), (prefix + "bwd_dq", True)} <= kernels
        else:
            assert not kernels
    assert_close(out["flash"][0], out["naive"][0], rtol=tol / 10, atol=0)
    for name, g in out["naive"][1].items():  # float32 sums in other orders
        assert_close(out["flash"][1][name], g, rtol=tol, atol=tol / 100, err_msg=name)
    np.testing.assert_array_equal(out["flash"][2], out["naive"][2])  # the same draws made
    model_cfg, _ = configs("tiny", "cuda", n_layer=2, dropout=0.0, attn_impl="flash")
    mg.manual_seed(0)
    model = Decoder(model_cfg).to("cuda")
    model.train()
    assert not np.isclose(model(ids, np.roll(ids, -1, axis=1))[1].item(), out["flash"][0])


def test_tf32_training_is_the_run_s_choice_and_ends_with_it(tmp_path, fake_cupy):
    short = dict(max_iters=3, attn_impl="auto")  # the naive path: no emulated kernel to wait on
    highest = run("tiny", "cuda", tmp_path / "highest", **short)
    high = run("tiny", "cuda", tmp_path / "high", **short, matmul_precision="high")
    assert mg.get_float32_matmul_precision() == "highest"  # put back when the run ends
    diff = np.abs(np.subtract(high["losses"], highest["losses"])).max()
    assert 0 < diff < 1e-2  # TF32's 2^-11 input rounding: seen in the losses, and small
    assert PRESETS["baby-gpt"].train["matmul_precision"] == "high"  # as nanoGPT allows TF32
    with pytest.raises(ValueError, match="matmul_precision='medium' is not one of"):
        configs("tiny", "cuda", matmul_precision="medium")


def test_a_run_too_large_for_the_gpu_is_refused_before_allocating(tmp_path, fake_cupy, monkeypatch):
    """The memory check reads the device's memory (cupy.cuda.runtime.memGetInfo), not the
    machine's: a model that fits in RAM but not on a 1 GiB GPU is refused by name."""
    from decoder.model.memory import device_memory

    monkeypatch.setattr(fake_cupy.cuda.runtime, "memGetInfo", lambda: (2**30, 2**30))
    assert device_memory("cuda") == 2**30
    with pytest.raises(ValueError, match=r"more than the 1\.0 GiB the cuda device has: lower"):
        run("tiny", "cuda", tmp_path / "big", max_iters=1, n_embd=4096, n_layer=6, n_head=8)
    assert not (tmp_path / "big").exists()  # refused before the run wrote anything
