"""Tests for sliding-window attention in the decoder: the per-layer pattern, the rolling KV
cache (memory that stops growing; cached logits equal to a full forward at every position, also
past block_size), generation past block_size, the layer's gradcheck, and the errors."""

import numpy as np
import pytest

import minigrad as mg
from decoder.model.attention import CausalSelfAttention, KVCache
from decoder.model.config import ModelConfig
from decoder.model.model import Decoder
from decoder.model.positional import RoPE


def config(**kw) -> ModelConfig:
    settings = dict(vocab_size=13, block_size=12, n_layer=3, n_head=4, n_kv_head=2, n_embd=16)
    return ModelConfig(**{**settings, "pos": "rope", "window": 4, **kw})


def build(cfg: ModelConfig, seed: int = 0) -> Decoder:
    mg.manual_seed(seed)
    return Decoder(cfg).double().eval()


def cached_logits(model, ids, chunks):
    """Logits (T, V) of ids fed through the caches in pieces of the given sizes."""
    caches, out, start = model.new_caches(1), [], 0
    for size in chunks:
        logits, _ = model([ids[start : start + size]], caches=caches)
        out.append(logits.numpy()[0])
        start += size
    assert start == len(ids)
    return np.concatenate(out)


# ---- config ----------------------------------------------------------------------------------
def test_the_pattern_repeats_over_the_layers():
    cfg = config(n_layer=5, window_pattern="WWF")
    assert [cfg.layer_window(i) for i in range(5)] == [4, 4, None, 4, 4]
    model = build(cfg)
    assert [block.attn.window for block in model.blocks] == [4, 4, None, 4, 4]
    assert cfg.context_limit == 12  # a full layer keeps the limit
    assert config().context_limit is None  # every layer windowed, relative positions
    assert config(pos="learned").context_limit == 12  # a learned table ends at block_size
    assert config(window=None).context_limit == 12


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(window=0), r"window must be a finite int in \[1, inf\), got 0"),
        (dict(window=3.5), "window must be of type int"),
        (dict(window_pattern="WG"), "window_pattern='WG' must be a non-empty string of W"),
        (dict(window_pattern=""), "window_pattern='' must be a non-empty string of W"),
    ],
)
def test_impossible_settings_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        config(**kw)


def test_a_layer_refuses_a_window_of_zero():
    with pytest.raises(ValueError, match="window must be None .* or a whole number >= 1"):
        CausalSelfAttention(16, 4, window=0)


# ---- the rolling cache -----------------------------------------------------------------------
def test_rolling_cache_memory_stops_growing():
    cache = KVCache(1, 2, block_size=8, head_size=4, window=5)
    for step in range(1, 30):
        k = mg.full(1, 2, 1, 4, fill_value=float(step))
        keys, _ = cache.append(k, k)
        assert cache.k.shape == (1, 2, 4, 4)  # W - 1 slots, forever
        want = np.arange(max(1, step - 4), step + 1, dtype=np.float32)  # the last <= W
        np.testing.assert_array_equal(keys.numpy()[0, 0, :, 0], want)
    assert cache.length == 29


@pytest.mark.summation_order
@pytest.mark.parametrize("pos", ["rope", "alibi", "none"])
@pytest.mark.parametrize("impl", ["naive", "dense", "flash"])
def test_windowed_model_cached_equals_full_forward_past_block_size(pos, impl, rng):
    """40 tokens through a model of block_size 12: fed as a prefill of 7, single tokens and
    chunks of 5, the logits at every position equal one full forward over all 40."""
    model = build(config(pos=pos, attn_impl=impl))
    ids = rng.integers(0, 13, 40).tolist()
    full = model([ids])[0].numpy()[0]  # (40, V): allowed, no context limit
    got = cached_logits(model, ids, [7] + [1] * 13 + [5] * 4)
    np.testing.assert_allclose(got, full, atol=1e-10)
    assert all(block.attn.window == 4 for block in model.blocks)
    assert model.new_caches(1)[0].k.shape[2] == 3


def test_window_changes_the_answer(rng):
    """The check above can fail: the same weights without the window give other logits."""
    ids = rng.integers(0, 13, 12).tolist()
    windowed = build(config())([ids])[0].numpy()
    full = build(config(window=None))([ids])[0].numpy()
    np.testing.assert_allclose(windowed[0, :4], full[0, :4], atol=1e-12)  # within W: same
    assert not np.allclose(windowed[0, 4:], full[0, 4:])


@pytest.mark.summation_order
def test_alternating_layers_cached_equals_full_forward(rng):
    model = build(config(window_pattern="WF", window=3))
    ids = rng.integers(0, 13, 12).tolist()
    full = model([ids])[0].numpy()[0]
    np.testing.assert_allclose(cached_logits(model, ids, [5, 1, 1, 3, 2]), full, atol=1e-10)
    with pytest.raises(ValueError, match="exceed the context, block_size=12"):
        model([ids + [1]])


# ---- generation ------------------------------------------------------------------------------
def greedy_by_hand(model, prompt, n, limit):
    """Argmax decoding with full forward passes over (at most ``limit`` of) the tokens."""
    ids = list(prompt)
    for _ in range(n):
        logits = model([ids if limit is None else ids[-limit:]])[0].numpy()
        ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_generation_runs_past_block_size_with_rolling_caches():
    model = build(config(), seed=3)
    prompt = [1, 5, 2, 7]
    expected = greedy_by_hand(model, prompt, 30, limit=None)  # 34 tokens, block_size 12
    assert list(model.generate(prompt, 30, temperature=0)) == expected
    assert list(model.generate(prompt, 30, temperature=0, use_cache=False)) == expected


def test_a_bounded_windowed_model_falls_back_to_the_last_block_size_tokens():
    """Learned positions end at block_size: past it, generation crops as for full models."""
    model = build(config(pos="learned"), seed=3)
    expected = greedy_by_hand(model, [1, 5, 2], 20, limit=12)
    assert list(model.generate([1, 5, 2], 20, temperature=0)) == expected


# ---- gradients -------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", ["naive", "dense", "flash"])
def test_windowed_layer_gradcheck(impl, rng):
    mg.manual_seed(1)
    attn = CausalSelfAttention(8, 2, 1, pos="rope", block_size=8, impl=impl, window=2).double()
    x = mg.tensor(rng.standard_normal((1, 5, 8)), requires_grad=True)
    weights = [attn.wq.weight, attn.wk.weight, attn.wv.weight, attn.wo.weight]
    assert mg.gradcheck(lambda x, *w: attn(x), x, *weights, name=f"windowed attention[{impl}]")


def test_windowed_rope_computes_rows_past_its_table(rng):
    """A windowed layer's RoPE rotates positions past block_size as a longer table would; a
    full layer's still refuses them."""
    x = mg.tensor(rng.standard_normal((1, 2, 3, 8)))
    past = RoPE(8, block_size=16, extrapolate=True)(x, offset=30).numpy()
    np.testing.assert_allclose(past, RoPE(8, block_size=64)(x, offset=30).numpy(), atol=1e-6)
    with pytest.raises(ValueError, match="positions 30..32 do not fit block_size=16"):
        RoPE(8, block_size=16)(x, offset=30)
