"""Tests for decoder/model/attention.py: CausalSelfAttention against a per-head NumPy reference,
causality for every position scheme, the KV cache, gradchecks and errors."""

import numpy as np
import pytest

import minigrad as mg
from decoder.model.attention import CausalSelfAttention, KVCache
from decoder.model.positional import POSITIONS, LearnedPositions, SinusoidalPositions, alibi_slopes

C, NH = 16, 4  # n_embd and n_head of most layers here (head size 4)


def layer(pos="none", n_kv_head=None, impl="naive", block_size=32, **kw) -> CausalSelfAttention:
    mg.manual_seed(0)
    attn = CausalSelfAttention(
        C, NH, n_kv_head, pos=pos, block_size=block_size, impl=impl, **kw
    ).double()
    return attn.eval()


def inputs(rng, B=2, T=10):
    return mg.tensor(rng.standard_normal((B, T, C)))


def added_positions(pos, T=32):
    """The rows the model adds to the embeddings for learned and sinusoidal positions."""
    if pos == "learned":
        return LearnedPositions(T, C).double()
    if pos == "sinusoidal":
        return SinusoidalPositions(T, C).double()
    return None


def reference(attn: CausalSelfAttention, x: np.ndarray) -> np.ndarray:
    """The layer head by head in NumPy; RoPE as complex rotations of pairs (d, d + hs/2)."""
    B, T, _ = x.shape
    nh, n_kv, hs = attn.n_head, attn.n_kv_head, attn.head_size
    q, k, v = (x @ lin.weight.numpy().T for lin in (attn.wq, attn.wk, attn.wv))
    pos = np.arange(T)
    heads = []
    for h in range(nh):
        kv = h // (nh // n_kv)
        qh, kh = q[..., h * hs : (h + 1) * hs], k[..., kv * hs : (kv + 1) * hs]
        vh = v[..., kv * hs : (kv + 1) * hs]
        if attn.pos == "rope":
            turn = np.exp(1j * pos[:, None] * attn.rope.theta ** (-np.arange(0, hs, 2) / hs))

            def rot(a, turn=turn):
                z = (a[..., : hs // 2] + 1j * a[..., hs // 2 :]) * turn
                return np.concatenate([z.real, z.imag], axis=-1)

            qh, kh = rot(qh), rot(kh)
        scores = qh @ kh.swapaxes(-1, -2) / np.sqrt(hs)  # (B, T, T)
        if attn.pos == "alibi":
            scores = scores - alibi_slopes(nh)[h] * np.abs(pos[:, None] - pos[None, :])
        scores = np.where(pos[None, :] > pos[:, None], -np.inf, scores)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        heads.append((p / p.sum(-1, keepdims=True)) @ vh)
    return np.concatenate(heads, axis=-1) @ attn.wo.weight.numpy().T


@pytest.mark.parametrize("impl", ["naive", "dense", "flash"])
@pytest.mark.parametrize("pos", ["none", "rope", "alibi"])
@pytest.mark.parametrize("n_kv", [4, 2, 1])
def test_layer_equals_per_head_reference(pos, n_kv, impl, rng):
    attn = layer(pos, n_kv, impl)
    x = inputs(rng)
    np.testing.assert_allclose(attn(x).numpy(), reference(attn, x.numpy()), atol=1e-6)


def test_projections_are_named_linears_sized_for_gqa():
    attn = CausalSelfAttention(32, n_head=8, n_kv_head=2, bias=True)
    names = [n for n, _ in attn.named_parameters()]
    assert names == [f"{w}.{p}" for w in ("wq", "wk", "wv", "wo") for p in ("weight", "bias")]
    assert attn.wq.weight.shape == (32, 32) and attn.wo.weight.shape == (32, 32)
    assert attn.wk.weight.shape == attn.wv.weight.shape == (8, 32)  # 2 kv heads of size 4
    assert CausalSelfAttention(32, n_head=8).n_kv_head == 8  # default: multi-head


# ---- causality --------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", ["naive", "dense", "flash"])
@pytest.mark.parametrize("pos", POSITIONS)
def test_changing_a_token_never_changes_earlier_outputs(pos, impl, rng):
    attn, table = layer(pos, 2, impl), added_positions(pos)
    x = rng.standard_normal((2, 12, C))

    def outputs(x):
        x = mg.tensor(x)
        if table is not None:
            x = x + table(12)
        return attn(x).numpy()

    before = outputs(x)
    for t in (0, 5, 11):
        changed = x.copy()
        changed[:, t] = rng.standard_normal((2, C))
        after = outputs(changed)
        np.testing.assert_allclose(after[:, :t], before[:, :t], atol=1e-12)
        assert np.abs(after[:, t:] - before[:, t:]).min(axis=-1).min() > 0  # later ones move


# ---- the KV cache ------------------------------------------------------------------------------
@pytest.mark.summation_order
@pytest.mark.parametrize("pos", POSITIONS)
@pytest.mark.parametrize("n_kv", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_incremental_decoding_equals_full_forward(pos, n_kv, rng):
    attn, table = layer(pos, n_kv), added_positions(pos)
    B, T, prefill = 2, 11, 4
    x = inputs(rng, B, T)

    def with_positions(x, offset=0):
        return x if table is None else x + table(x.shape[1], offset)  # rows offset .. offset+T

    full = attn(with_positions(x)).numpy()
    cache = attn.new_cache(B)
    steps = [attn(with_positions(x[:, :prefill]), cache).numpy()]
    for t in range(prefill, T):
        steps.append(attn(with_positions(x[:, t : t + 1], offset=t), cache).numpy())
    assert cache.length == T
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-10)

    cache.reset()  # after a reset the cache serves a new sequence from position 0
    np.testing.assert_allclose(
        attn(with_positions(x[:, :6]), cache).numpy(), full[:, :6], atol=1e-10
    )
    assert cache.length == 6


@pytest.mark.summation_order
@pytest.mark.parametrize("impl", ["naive", "dense", "flash"])
def test_cached_decoding_with_either_impl(impl, rng):
    attn = layer("rope", 2, impl)
    x = inputs(rng, 1, 7)
    full = attn(x).numpy()
    cache = attn.new_cache(1)
    steps = [attn(x[:, t : t + 1], cache).numpy() for t in range(7)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-10)


@pytest.mark.parametrize("pos", ["rope", "none"])
def test_cache_overflow_raises(pos, rng):
    attn = layer(pos, block_size=8)
    cache = attn.new_cache(2)
    attn(inputs(rng, 2, 6), cache)
    with pytest.raises(ValueError, match="block_size=8"):
        attn(inputs(rng, 2, 3), cache)
    cache = KVCache(1, 2, block_size=4, head_size=3)
    cache.append(mg.zeros(1, 2, 4, 3), mg.zeros(1, 2, 4, 3))
    with pytest.raises(ValueError, match="KVCache overflow: it holds 4 of block_size=4 tokens"):
        cache.append(mg.zeros(1, 2, 1, 3), mg.zeros(1, 2, 1, 3))


def test_cache_checks_shapes_and_sizes_itself_for_the_layer():
    cache = KVCache(2, 2, block_size=8, head_size=4)
    with pytest.raises(ValueError, match=r"expected k and v of shape .* \(2, 2, 3, 4\)"):
        cache.append(mg.zeros(2, 4, 3, 4), mg.zeros(2, 4, 3, 4))
    attn = CausalSelfAttention(16, 4, 2, block_size=12).double()
    made = attn.new_cache(3)
    assert made.k.shape == (3, 2, 12, 4) and made.k.dtype == np.float64 and made.length == 0


# ---- gradients, dropout, errors ---------------------------------------------------------------
@pytest.mark.parametrize("impl", ["naive", "dense", "flash"])
@pytest.mark.parametrize("pos", ["rope", "alibi"])
def test_layer_gradcheck(pos, impl, rng):
    mg.manual_seed(1)
    attn = CausalSelfAttention(8, 2, 1, bias=True, pos=pos, block_size=8, impl=impl).double()
    x = mg.tensor(rng.standard_normal((1, 4, 8)), requires_grad=True)
    weights = [attn.wq.weight, attn.wk.weight, attn.wv.weight, attn.wo.weight, attn.wk.bias]
    assert mg.gradcheck(lambda x, *w: attn(x), x, *weights, name=f"attention[{pos}, {impl}]")


def test_dropout_in_training_uses_the_naive_path(rng):
    attn = layer("none", dropout=0.5, impl="auto").train()
    x = inputs(rng)
    trained = attn(x).numpy()
    attn.eval()
    assert not np.allclose(trained, attn(x).numpy())


def test_dense_with_dropout_refuses_to_train_but_evaluates(rng):
    attn = layer("none", dropout=0.1, impl="dense").train()
    with pytest.raises(ValueError, match="no attention dropout"):
        attn(inputs(rng))
    attn.eval()
    assert attn(inputs(rng)).shape == (2, 10, C)


def test_flash_with_dropout_trains(rng):
    attn = layer("none", dropout=0.5, impl="flash").train()
    attn.resid_dropout.p = 0.0  # only the attention weights' dropout here
    x = mg.tensor(rng.standard_normal((2, 10, C)), requires_grad=True)
    y = attn(x)
    y.backward(mg.tensor(rng.standard_normal(y.shape)))
    assert np.isfinite(x.grad).all()
    attn.eval()
    assert not np.allclose(y.numpy(), attn(x).numpy())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_embd=18, n_head=4), r"n_embd \(18\) must be divisible by n_head \(4\)"),
        (dict(n_embd=16, n_head=4, n_kv_head=3), r"n_head \(4\) must be a multiple of n_kv_head"),
        (dict(n_embd=16, n_head=4, pos="relative"), "unknown position scheme pos='relative'"),
        (dict(n_embd=12, n_head=4, pos="rope"), r"head size .* \(3\) must be even"),
        (dict(n_embd=16, n_head=4, impl="cuda"), "unknown attention impl='cuda'"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CausalSelfAttention(**kwargs)


def test_input_width_must_match():
    with pytest.raises(ValueError, match=r"expected x \(B, T, 16\)"):
        CausalSelfAttention(16, 4)(mg.zeros(1, 3, 8))
