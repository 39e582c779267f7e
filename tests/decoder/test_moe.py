"""The mixture-of-experts feed-forward (decoder/model/moe.py) and its place in the model.

The layer against a dense PyTorch reference that runs every token through every expert and
weights it by its routing (zero where it was not routed), forward and backward, in float64;
a float64 gradcheck; the edge cases: an empty batch, ties in the router, an expert that gets
no token; and the model's training loss, parameter counts and routing statistics.
"""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg
from decoder.model.config import ModelConfig
from decoder.model.model import Decoder
from decoder.model.moe import MoE
from decoder.training.config import build_configs
from tests.support.numerics import assert_close

torch = pytest.importorskip("torch")


def _moe(n_shared: int = 0, n_experts: int = 4, top_k: int = 2) -> MoE:
    mg.manual_seed(0)
    moe = MoE(n_embd=6, n_experts=n_experts, top_k=top_k, hidden=5, n_shared=n_shared)
    for p in moe.parameters():  # float64, and larger than GPT-2's init so routing is decisive
        p.data = p.data.astype(np.float64) * 10
    return moe


def _swiglu(x, ffn: dict):
    return (torch.nn.functional.silu(x @ ffn["w1"].T) * (x @ ffn["w3"].T)) @ ffn["w2"].T


def torch_moe(moe: MoE, x: np.ndarray, upstream: np.ndarray, aux_weight: float):
    """The dense reference: every expert on every token; (output, aux, gradients by name)."""
    params = {name: torch.tensor(p.data, requires_grad=True) for name, p in moe.named_parameters()}
    xt = torch.tensor(x, requires_grad=True)
    flat = xt.reshape(-1, x.shape[-1])
    probs = torch.softmax(flat @ params["router.weight"].T, -1)
    top, chosen = torch.topk(probs, moe.top_k, -1)
    weights = top / top.sum(-1, keepdim=True)
    out = torch.zeros_like(flat)
    E = len(moe.experts)
    for e in range(E):
        ffn = {w: params[f"experts.{e}.{w}.weight"] for w in ("w1", "w2", "w3")}
        routed = (weights * (chosen == e)).sum(-1, keepdim=True)  # (N, 1), 0 if not routed
        out = out + routed * _swiglu(flat, ffn)
    if moe.shared is not None:
        out = out + _swiglu(flat, {w: params[f"shared.{w}.weight"] for w in ("w1", "w2", "w3")})
    share = torch.bincount(chosen.reshape(-1), minlength=E).double() / chosen.numel()
    aux = E * (share * probs.mean(0)).sum()
    out = out.reshape(x.shape)
    ((out * torch.tensor(upstream)).sum() + aux_weight * aux).backward()
    grads = {name: t.grad for name, t in params.items()}
    return out.detach().numpy(), aux.item(), xt.grad.numpy(), grads


def _ours(moe: MoE, x: np.ndarray, upstream: np.ndarray, aux_weight: float):
    xm = mg.tensor(x, requires_grad=True)
    out = moe(xm)
    ((out * mg.tensor(upstream)).sum() + aux_weight * moe.aux_loss).backward()
    return out.numpy(), moe.aux_loss.item(), xm.grad


@pytest.mark.parametrize("n_shared", [0, 2])
def test_moe_equals_a_dense_torch_reference(rng, n_shared):
    moe = _moe(n_shared)
    x, upstream = rng.standard_normal((2, 5, 6)), rng.standard_normal((2, 5, 6))
    out, aux, grad_x = _ours(moe, x, upstream, 0.3)
    ref_out, ref_aux, ref_grad_x, ref_grads = torch_moe(moe, x, upstream, 0.3)
    np.testing.assert_allclose(out, ref_out, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(aux, ref_aux, rtol=1e-12)
    np.testing.assert_allclose(grad_x, ref_grad_x, rtol=1e-10, atol=1e-10)
    for name, p in moe.named_parameters():
        grad = np.zeros_like(p.data) if p.grad is None else p.grad
        np.testing.assert_allclose(grad, ref_grads[name].numpy(), atol=1e-10, err_msg=name)


def test_moe_gradcheck(rng):
    moe = _moe(n_shared=1)
    x = mg.tensor(rng.standard_normal((3, 6)), dtype=np.float64, requires_grad=True)
    assert mg.gradcheck(lambda t: moe(t), x, name="MoE")
    assert mg.gradcheck(lambda t: (moe(t), moe.aux_loss)[1], x, name="MoE aux loss")


def test_an_expert_without_tokens_gets_no_gradient(rng):
    moe = _moe()
    x, upstream = rng.standard_normal((4, 6)), rng.standard_normal((4, 6))
    x[:, 0] = 1.0  # a constant feature: the router's weight on it acts as a bias
    moe.router.weight.data[3, 0] = -1e3  # expert 3's logit is hopeless for every token
    out, _, grad_x = _ours(moe, x, upstream, 1.0)
    assert moe.expert_share[3] == 0
    assert all(p.grad is None for p in moe.experts[3].parameters())
    ref_out, _, ref_grad_x, _ = torch_moe(moe, x, upstream, 1.0)
    np.testing.assert_allclose(out, ref_out, atol=1e-10)
    np.testing.assert_allclose(grad_x, ref_grad_x, atol=1e-10)


def test_router_ties_go_to_the_lower_experts(rng):
    moe = _moe(n_experts=4, top_k=2)
    moe.router.weight.data[:] = 0.0  # every logit equal: a four-way tie for every token
    x = mg.tensor(rng.standard_normal((3, 6)))
    out = moe(x).numpy()
    both = (moe.experts[0](x) + moe.experts[1](x)).numpy() / 2  # weights 1/2 and 1/2
    np.testing.assert_allclose(out, both, atol=1e-12)
    np.testing.assert_array_equal(moe.expert_share, [0.5, 0.5, 0.0, 0.0])
    assert moe.aux_loss.item() == pytest.approx(1.0)  # E * sum(f * 1/E) = sum(f) = 1


@pytest.mark.parametrize("shape", [(0, 6), (2, 0, 6)])
def test_an_empty_batch(shape):
    moe = _moe(n_shared=1)
    x = mg.zeros(*shape, dtype=np.float64, requires_grad=True)
    out = moe(x)
    assert out.shape == shape
    (out.sum() + moe.aux_loss).backward()
    assert x.grad.shape == shape and moe.aux_loss.item() == 0.0
    np.testing.assert_array_equal(moe.expert_share, np.zeros(4))


def test_aux_loss_is_one_when_balanced_and_grows_with_imbalance(rng):
    moe = _moe(n_experts=2, top_k=1)
    x = rng.standard_normal((64, 6))
    x[:, 0] = 1.0  # a constant feature: the router's weight on it acts as a bias
    moe.router.weight.data[:] = 0.0
    moe.router.weight.data[0, 1] = 0.01  # x[1] > 0 to expert 0, else 1, probabilities ~1/2
    moe(mg.tensor(x))
    assert moe.aux_loss.item() == pytest.approx(1.0, abs=0.05)
    moe.router.weight.data[0, 0] = 10.0  # every token to expert 0, with probability ~1
    moe(mg.tensor(x))
    assert moe.aux_loss.item() == pytest.approx(2.0, abs=0.01)  # E * f_0 * P_0 = 2 * 1 * 1


def _tiny_moe(**overrides) -> Decoder:
    kw = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, ffn="moe")
    experts = dict(n_experts=4, top_k=2) if overrides.get("ffn", "moe") == "moe" else {}
    mg.manual_seed(0)
    return Decoder(ModelConfig(**{**kw, **experts, **overrides}))


def test_the_training_loss_adds_the_weighted_aux_loss_and_eval_does_not(rng):
    model = _tiny_moe(moe_aux_weight=0.5)
    ids, targets = rng.integers(0, 11, (2, 8)), rng.integers(0, 11, (2, 8))
    _, train_loss = model(ids, targets)
    stats = model.router_stats()
    model.eval()
    _, eval_loss = model(ids, targets)
    assert train_loss.item() == pytest.approx(eval_loss.item() + stats["aux_loss"])
    assert stats["aux_loss"] == pytest.approx(
        0.5 * sum(b.ffn.aux_loss.item() for b in model.blocks)
    )
    assert np.sum(stats["expert_share"]) == pytest.approx(1.0)


def test_parameters_and_active_parameters():
    model = _tiny_moe(n_shared_experts=1, moe_hidden=4)
    expert = 3 * 8 * 4  # one SwiGLU expert: w1, w3 (8 -> 4) and w2 (4 -> 8)
    dense = model.num_parameters() - 2 * (4 * 8 + 5 * expert)  # less router and experts
    assert model.num_active_parameters() == dense + 2 * (4 * 8 + 3 * expert)  # 2 routed + 1
    assert (
        _tiny_moe(ffn="swiglu").num_active_parameters() == _tiny_moe(ffn="swiglu").num_parameters()
    )
    assert _tiny_moe(ffn="swiglu").router_stats() is None


def test_every_experts_down_projection_gets_the_scaled_init():
    model = _tiny_moe(n_layer=8, n_experts=2, top_k=1, n_shared_experts=1, n_embd=64)
    stds = [model.blocks[0].ffn.experts[1].w2.weight.data.std()]
    stds.append(model.blocks[0].ffn.shared.w2.weight.data.std())
    np.testing.assert_allclose(stds, 0.02 / 4, rtol=0.1)  # 0.02 / sqrt(2 * 8)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"top_k": "40"}, "top_k=40"),  # sampling's top_k belongs to generate, not training
        ({"n_experts": "4", "moe_aux_weight": "0.1"}, "n_experts=4, moe_aux_weight=0.1"),
        ({"moe_hidden": "64"}, "moe_hidden=64"),
    ],
)
def test_config_refuses_experts_settings_without_experts(overrides, named):
    with pytest.raises(ValueError, match=f"{named} is for the experts of ffn='moe', but ffn="):
        build_configs("tiny", overrides)
    build_configs("tiny", {**overrides, "ffn": "moe", "n_experts": "64"})  # with experts: fine


def test_config_refuses_top_k_above_the_experts():
    with pytest.raises(ValueError, match="top_k=3 routes each token to more experts"):
        build_configs("tiny", {"ffn": "moe", "n_experts": "2", "top_k": "3"})


def test_training_logs_the_routing_plots_it_and_resumes_exactly(tmp_path, monkeypatch):
    from decoder.training.log import PLOT, read_log
    from decoder.training.loop import train
    from tests.decoder.test_train import TEXT

    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(tmp_path / "cache"))
    overrides = dict(ffn="moe", n_experts=4, top_k=2, n_shared_experts=1, moe_hidden=16)
    model_cfg, train_cfg = build_configs(
        "tiny", max_iters=4, eval_interval=2, eval_iters=1, batch_size=2, block_size=8,
        warmup_iters=2, sample_tokens=0, **overrides,
    )  # fmt: skip
    whole = train(model_cfg, train_cfg, TEXT, tmp_path / "whole", progress=False)
    train(model_cfg, train_cfg, TEXT, tmp_path / "split", progress=False, until=2)
    rest = train(model_cfg, train_cfg, TEXT, tmp_path / "split", resume=True, progress=False)
    assert rest["losses"] == whole["losses"][2:]  # bitwise: routing is deterministic
    rows = read_log(tmp_path / "whole")
    assert [r["step"] for r in rows] == [0, 2, 4] and "expert_share" not in rows[0]
    for r in rows[1:]:
        assert len(r["expert_share"]) == 4 and sum(r["expert_share"]) == pytest.approx(1.0)
        assert r["aux_loss"] > 0
    assert (tmp_path / "whole" / PLOT).stat().st_size > 0


@pytest.mark.summation_order
def test_moe_on_the_cuda_stand_in_equals_the_cpu(rng, fake_cupy):
    """The CuPy stand-in refuses implicit host copies: the routing's one explicit copy (the
    experts' token counts, which size their matmuls) is the only one a layer makes."""
    from decoder.training.step import train_step
    from minigrad.optim import AdamW

    x = rng.integers(0, 11, (2, 8))
    results = {}
    for device in ("cpu", "cuda"):
        model = _tiny_moe(n_shared_experts=1).to(device)
        _, cfg = build_configs("tiny")
        before = fake_cupy.device_to_host
        loss = train_step(model, AdamW(model.parameters()), x, np.roll(x, -1, 1), cfg, step=1)
        copies = fake_cupy.device_to_host - before
        results[device] = loss, model.router_stats()["expert_share"]
    # a float32 model's loss (a Python float here), summed in another order on the device
    assert_close(np.float32(results["cuda"][0]), np.float32(results["cpu"][0]))
    np.testing.assert_allclose(results["cuda"][1], results["cpu"][1])
    # the loss and the gradient norm, then per layer: the experts' token counts (they size
    # the matmuls) and top-k's range check of its index (take_along_axis's)
    assert copies == 2 + 2 * 3


def test_the_run_reports_active_parameters_with_experts_only():
    from decoder.training.log import parameters_text

    moe = _tiny_moe()
    assert parameters_text(moe) == (
        f"{moe.num_parameters():,} parameters ({moe.num_active_parameters():,} active per token)"
    )
    dense = _tiny_moe(ffn="swiglu")
    assert parameters_text(dense) == f"{dense.num_parameters():,} parameters"
