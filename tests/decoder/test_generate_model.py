"""Tests that the KV cache changes nothing but the speed: incremental logits equal a full
forward pass, and cached generation equals uncached generation, for every position scheme and
grouped-query ratio (including past the context length, where the cache falls back)."""

import numpy as np
import pytest

import minigrad as mg
from decoder.model.config import ModelConfig
from decoder.model.model import Decoder

POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "none")
KV_HEADS = {"mha": 4, "gqa2": 2, "mqa": 1}  # 4 query heads: group ratios 1, 2 and 4


def build(pos: str, n_kv_head: int, seed: int = 0, **overrides) -> Decoder:
    mg.manual_seed(seed)
    config = ModelConfig(
        vocab_size=13,
        block_size=10,
        n_layer=2,
        n_head=4,
        n_kv_head=n_kv_head,
        n_embd=16,
        ffn_hidden=32,
        pos=pos,
        **overrides,
    )
    return Decoder(config).double()


@pytest.mark.summation_order
@pytest.mark.parametrize("n_kv_head", KV_HEADS.values(), ids=KV_HEADS.keys())
@pytest.mark.parametrize("pos", POSITIONS)
def test_incremental_logits_equal_the_full_forward(pos, n_kv_head, rng):
    model = build(pos, n_kv_head)
    ids = rng.integers(0, 13, size=(2, 10))  # B = 2: the cache is batched too
    full = model(ids)[0].numpy()
    caches = model.new_caches(2)
    pieces = [model(ids[:, :4], caches=caches)[0].numpy()]  # a prefill of 4 tokens
    for t in range(4, 10):  # then one token at a time
        pieces.append(model(ids[:, t : t + 1], caches=caches)[0].numpy())
    assert caches[0].length == 10
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, rtol=1e-10, atol=1e-12)


@pytest.mark.summation_order
@pytest.mark.parametrize("n_kv_head", KV_HEADS.values(), ids=KV_HEADS.keys())
@pytest.mark.parametrize("pos", POSITIONS)
def test_cached_and_uncached_generation_agree(pos, n_kv_head):
    model = build(pos, n_kv_head, seed=1)
    prompt = [3, 1, 4]
    # 15 new tokens run past block_size = 10: the full cache falls back to recomputing
    for settings in (dict(temperature=0), dict(temperature=1.5, top_k=8, top_p=0.95, seed=3)):
        cached = list(model.generate(prompt, 15, use_cache=True, **settings))
        uncached = list(model.generate(prompt, 15, use_cache=False, **settings))
        assert cached == uncached, settings
        assert len(cached) == 15


def test_a_prompt_longer_than_the_context_is_cropped():
    model = build("rope", 2, seed=2)
    long_prompt = list(np.random.default_rng(0).integers(0, 13, size=25))
    tail = long_prompt[-10:]
    for use_cache in (True, False):
        got = list(model.generate(long_prompt, 5, temperature=0, use_cache=use_cache))
        assert got == list(model.generate(tail, 5, temperature=0, use_cache=use_cache))


def test_generation_works_in_float32():
    mg.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=13, block_size=10, n_layer=1, n_head=2, n_embd=8))
    tokens = list(model.generate(np.array([[1, 2]]), 4, temperature=0.8, seed=0))
    assert len(tokens) == 4 and all(0 <= t < 13 for t in tokens)
    caches = model.new_caches(1)
    assert caches[0].k.dtype == np.float32


@pytest.mark.summation_order
def test_the_model_runs_on_the_device(device, rng):
    model = build("rope", 2, seed=4)
    ids, targets = rng.integers(0, 13, size=(2, 10)), rng.integers(0, 13, size=(2, 10))
    logits, loss = model(ids, targets)
    loss.backward()
    tokens = list(model.generate([1, 2], 12, temperature=0))
    grad = model.blocks[0].attn.wq.weight.grad
    model.zero_grad()
    model.to(device)
    assert model.device == device and model.new_caches(1)[0].k.dtype == np.float64
    logits_here, loss_here = model(mg.Tensor(ids, device=device), targets)
    loss_here.backward()
    np.testing.assert_allclose(logits_here.numpy(), logits.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(
        mg.Tensor(model.blocks[0].attn.wq.weight.grad).numpy(), grad, rtol=1e-8, atol=1e-10
    )
    assert list(model.generate([1, 2], 12, temperature=0)) == tokens
    assert list(model.generate([1, 2], 12, temperature=0, use_cache=False)) == tokens
