"""Tests of LoRA: gradients, the zero start, frozen bases, merging, the per-head form's rank,
adapter-only state dicts, and apply_lora's errors."""

import numpy as np
import pytest

import minigrad as mg
from minigrad import nn
from minigrad.nn import LoRAHeadLinear, LoRALinear, apply_lora
from minigrad.optim import AdamW
from minigrad.serialization import load_safetensors, save_safetensors
from tests.support.numerics import assert_close


class Attn(nn.Module):
    """Four projections named as in the decoder; grouped-query sized: wk, wv have 2 heads."""

    def __init__(self, n_embd=8, n_head=4, n_kv_head=2):
        super().__init__()
        hs, std = n_embd // n_head, 0.3  # not GPT-2's 0.02: signals of order 1 in this toy
        self.wq = nn.Linear(n_embd, n_head * hs, bias=False, init_std=std)
        self.wk = nn.Linear(n_embd, n_kv_head * hs, bias=False, init_std=std)
        self.wv = nn.Linear(n_embd, n_kv_head * hs, bias=True, init_std=std)
        self.wo = nn.Linear(n_head * hs, n_embd, bias=False, init_std=std)
        self.n_kv_head, self.hs = n_kv_head, hs

    def forward(self, x):  # a stand-in for attention that uses every projection
        k = self.wk(x) * self.wv(x)  # (B, T, n_kv * hs)
        k = mg.concatenate([k, k], axis=-1)  # repeat the kv heads for the query heads
        return self.wo(self.wq(x) * k)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.blocks = nn.ModuleList([Attn(), Attn()])

    def forward(self, x):
        x = self.norm(x)
        for block in self.blocks:
            x = x + block(x)
        return x


def build(seed=0):
    mg.manual_seed(seed)
    return Model()


def randomize_b(model, rng):
    """A trained-looking adapter: B away from its zero start."""
    for m in model.modules():
        if isinstance(m, LoRALinear):
            m.B.data[...] = rng.standard_normal(m.B.shape).astype(m.B.dtype) * 0.1


# ---- gradients ----------------------------------------------------------------------------------
@pytest.mark.parametrize("per_head", [False, True])
def test_lora_gradcheck(rng, per_head):
    base = nn.Linear(5, 6, rng=rng)
    lora = LoRAHeadLinear(base, 3, r=2, alpha=3) if per_head else LoRALinear(base, r=2, alpha=3)
    lora.double()
    # subtle: with B = 0 the gradient of A is 0, and a wrong one would pass: make B nonzero
    lora.B.data[...] = rng.standard_normal(lora.B.shape)
    x = mg.tensor(rng.standard_normal((2, 3, 5)), requires_grad=True)
    base.requires_grad_(True)  # check the base's gradients too, though LoRA freezes them
    params = [lora.A, lora.B, base.weight, base.bias]
    assert mg.gradcheck(lambda x, *ps: lora(x), x, *params, name=repr(lora))


@pytest.mark.summation_order
def test_per_head_adapter_matches_a_loop_over_heads(rng):
    base = nn.Linear(5, 6)
    lora = LoRAHeadLinear(base, n_head=3, r=2, alpha=4).double()
    lora.B.data[...] = rng.standard_normal(lora.B.shape)
    x = rng.standard_normal((2, 4, 5))
    A, B = lora.A.numpy(), lora.B.numpy()
    want = np.concatenate([x @ A[:, 2 * i : 2 * i + 2] @ B[i] for i in range(3)], axis=-1)
    # products of other shapes than the adapter's (a head at a time): equal to rounding, in
    # float64 of values about 1, so an absolute 1e-12 beside the relative one (a sum that
    # cancels to near 0 has no relative precision)
    assert_close(lora.adapter(mg.tensor(x)).numpy(), want, rtol=1e-12, atol=1e-12)
    delta = np.concatenate([A[:, 2 * i : 2 * i + 2] @ B[i] for i in range(3)], axis=1) * 2.0
    assert_close(lora.delta_weight(), delta, rtol=1e-12, atol=1e-12)


# ---- the zero start, frozen bases, trainable counts ---------------------------------------------
@pytest.mark.parametrize("per_head", [False, True])
def test_wrapped_model_starts_equal_to_base(rng, per_head):
    model = build()
    x = mg.tensor(rng.standard_normal((2, 3, 8)).astype(np.float32))
    before = model(x).numpy()
    apply_lora(model, r=2, alpha=4, per_head=per_head, n_head={"wq": 4, "wv": 2})
    np.testing.assert_array_equal(model(x).numpy(), before)  # B = 0: exactly the base


def test_apply_lora_wraps_targets_and_freezes_the_rest():
    model = build()
    wrapped = apply_lora(model, targets=("wq", "wv"), r=2, alpha=4)
    assert wrapped == ["blocks.0.wq", "blocks.0.wv", "blocks.1.wq", "blocks.1.wv"]
    assert isinstance(model.blocks[1].wv, LoRALinear) and isinstance(model.blocks[1].wk, nn.Linear)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable == [
        f"blocks.{i}.{w}.{ab}" for i in (0, 1) for w in ("wq", "wv") for ab in "AB"
    ]
    # wq: 8 -> 8, wv: 8 -> 4; a rank-2 adapter trains 2 * (in + out) numbers
    assert model.num_parameters(trainable_only=True) == 2 * (2 * (8 + 8) + 2 * (8 + 4))


def test_per_head_trainable_count():
    model = build()
    apply_lora(model, r=2, alpha=4, per_head=True, n_head={"wq": 4, "wv": 2})
    # per head: h * r * (in + d) with d = out / h; wq: h=4, d=2; wv: h=2, d=2
    assert model.num_parameters(trainable_only=True) == 2 * (4 * 2 * (8 + 2) + 2 * 2 * (8 + 2))
    assert model.blocks[0].wv.B.shape == (2, 2, 2)


@pytest.mark.parametrize("per_head", [False, True])
def test_training_moves_only_the_adapters(rng, per_head):
    model = build()
    apply_lora(model, r=2, alpha=4, per_head=per_head, n_head=2)
    before = model.state_dict()
    opt = AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)  # frozen ones: grad None, skipped
    x = mg.tensor(rng.standard_normal((4, 3, 8)).astype(np.float32))
    target = mg.tensor(rng.standard_normal((4, 3, 8)).astype(np.float32))
    losses = []
    for _ in range(5):
        loss = ((model(x) - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    after = model.state_dict()
    for name in before:
        moved = not np.array_equal(before[name], after[name])
        assert moved == name.endswith((".A", ".B")), name  # bases bit-identical, adapters moved


# ---- merging ----------------------------------------------------------------------------------
@pytest.mark.summation_order
@pytest.mark.parametrize("per_head", [False, True])
def test_merge_and_unmerge(rng, per_head):
    model = build()
    model.double()
    apply_lora(model, r=2, alpha=4, per_head=per_head, n_head=2)
    randomize_b(model, rng)
    x = mg.tensor(rng.standard_normal((2, 3, 8)))
    unmerged = model(x).numpy()
    weight = model.blocks[0].wq.weight.numpy().copy()
    for m in model.modules():
        if isinstance(m, LoRALinear):
            m.merge()
    assert not np.allclose(model.blocks[0].wq.weight.numpy(), weight)  # the update went in
    np.testing.assert_allclose(model(x).numpy(), unmerged, rtol=1e-10, atol=1e-12)
    with pytest.raises(RuntimeError, match="already merged"):
        model.blocks[0].wq.merge()
    for m in model.modules():
        if isinstance(m, LoRALinear):
            m.unmerge()
    np.testing.assert_allclose(model.blocks[0].wq.weight.numpy(), weight, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(model(x).numpy(), unmerged, rtol=1e-10, atol=1e-12)


@pytest.mark.summation_order
def test_merge_lora_gives_back_the_plain_architecture(rng):
    plain_keys = list(build().state_dict())
    model = build()
    apply_lora(model, r=2, alpha=4)
    randomize_b(model, rng)
    x = mg.tensor(rng.standard_normal((2, 3, 8)).astype(np.float32))
    with_adapters = model(x).numpy()
    assert nn.merge_lora(model) == ["blocks.0.wq", "blocks.0.wv", "blocks.1.wq", "blocks.1.wv"]
    assert type(model.blocks[0].wq) is nn.Linear
    assert list(model.state_dict()) == plain_keys
    np.testing.assert_allclose(model(x).numpy(), with_adapters, rtol=1e-5, atol=1e-6)


# ---- the per-head form's rank -----------------------------------------------------------------
def test_per_head_update_has_rank_h_times_r(rng):
    n_head, r = 4, 3
    lora = LoRAHeadLinear(nn.Linear(32, 24), n_head=n_head, r=r, alpha=3).double()
    lora.B.data[...] = rng.standard_normal(lora.B.shape)
    delta = lora.delta_weight()
    assert delta.shape == (32, 24)
    assert np.linalg.matrix_rank(delta) == n_head * r  # generic: exactly h * r
    # and never more: with 2 heads' B set to zero, the rank drops by 2 * r
    lora.B.data[:2] = 0
    assert np.linalg.matrix_rank(lora.delta_weight()) == (n_head - 2) * r
    # each head's block only touches its own d = 6 output columns
    assert not lora.delta_weight()[:, :12].any()


# ---- adapter-only state dicts -----------------------------------------------------------------
def test_lora_state_dict_round_trip(tmp_path, rng):
    model = build()
    apply_lora(model, r=2, alpha=4)
    randomize_b(model, rng)
    state = nn.lora_state_dict(model)
    assert sorted(state) == sorted(
        f"blocks.{i}.{w}.{ab}" for i in (0, 1) for w in ("wq", "wv") for ab in "AB"
    )
    save_safetensors(tmp_path / "lora.safetensors", state)

    fresh = build()  # the same base weights (same seed), new adapters
    apply_lora(fresh, r=2, alpha=4)
    x = mg.tensor(rng.standard_normal((2, 3, 8)).astype(np.float32))
    assert not np.allclose(fresh(x).numpy(), model(x).numpy())
    arrays, _ = load_safetensors(tmp_path / "lora.safetensors")
    nn.load_lora_state_dict(fresh, arrays)
    np.testing.assert_array_equal(fresh(x).numpy(), model(x).numpy())


def test_load_lora_state_dict_errors():
    model = build()
    apply_lora(model, r=2, alpha=4)
    other = build()
    apply_lora(other, r=3, alpha=4)
    with pytest.raises(ValueError, match=r"'blocks.0.wq.A' has shape \(8, 3\) in the state dict"):
        nn.load_lora_state_dict(model, nn.lora_state_dict(other))
    state = nn.lora_state_dict(model)
    del state["blocks.1.wv.B"]
    with pytest.raises(KeyError, match=r"missing keys \['blocks.1.wv.B'\]"):
        nn.load_lora_state_dict(model, state)


# ---- apply_lora's errors ----------------------------------------------------------------------
def test_apply_lora_errors():
    with pytest.raises(ValueError, match=r"Linear layers are named \['wk', 'wo', 'wq', 'wv'\]"):
        apply_lora(build(), targets=("q_proj",))
    model = build()
    apply_lora(model)
    with pytest.raises(ValueError, match="already has LoRA layers"):
        apply_lora(model)
    with pytest.raises(ValueError, match="needs n_head"):
        apply_lora(build(), per_head=True)
    model = build()
    with pytest.raises(ValueError, match="blocks.0.wv has 4 outputs, which n_head 3 does not"):
        apply_lora(model, per_head=True, n_head=3, targets=("wv",))
    assert model.num_parameters(trainable_only=True) == model.num_parameters()  # untouched
    with pytest.raises(ValueError, match="out_features 4 is not divisible by n_head 3"):
        LoRAHeadLinear(nn.Linear(2, 4), n_head=3, r=1, alpha=1)
    with pytest.raises(ValueError, match="n_head None does not divide"):
        apply_lora(build(), per_head=True, n_head={"wq": 4})
    with pytest.raises(ValueError, match="rank r must be a positive integer"):
        LoRALinear(nn.Linear(2, 2), r=0, alpha=1)
    with pytest.raises(ValueError, match="LoRA alpha must be a finite number"):
        LoRALinear(nn.Linear(2, 2), r=1, alpha=float("nan"))
    for bad, match in [
        (dict(r=0), "rank r must be a positive integer"),
        (dict(r=True), "rank r must be a positive integer"),
        (dict(alpha=float("inf")), "LoRA alpha must be a finite number"),
        (dict(dropout=float("nan")), r"LoRA: dropout must be in \[0, 1\], got nan"),
    ]:
        model = build()
        with pytest.raises(ValueError, match=match):
            apply_lora(model, **bad)
        assert model.num_parameters(trainable_only=True) == model.num_parameters()  # untouched
