"""Tests for multi-head latent attention (decoder/model/mla.py): against a PyTorch reference written
here from DeepSeek-V2's equations (forward and backward), the absorbed form against the
explicit one, the latent cache (what it holds; cached logits equal to a full forward),
gradchecks, the cache's size per token, and the errors."""

import math

import numpy as np
import pytest

import minigrad as mg
from decoder.model.config import ModelConfig
from decoder.model.mla import MultiHeadLatentAttention, cache_floats_per_token
from decoder.model.model import Decoder

C, NH = 24, 3  # n_embd and n_head (head size 8)


def layer(q_lora_rank=6, **kw) -> MultiHeadLatentAttention:
    mg.manual_seed(0)
    settings = dict(kv_lora_rank=5, rope_head_dim=4, nope_head_dim=6, v_head_dim=7, block_size=16)
    mla = MultiHeadLatentAttention(C, NH, q_lora_rank=q_lora_rank, **{**settings, **kw})
    mla.double().eval()
    for p in mla.parameters():
        p.data *= 20  # std 0.4, not 0.02: scores far from 0, so the softmax is far from uniform
    return mla


def paper_reference(torch, mla, x, theta=10000.0):
    """DeepSeek-V2 sec. 2.1, eqs. 9-19, one head at a time, with ``mla``'s weights; RoPE in
    the rotate-half layout. Returns the output and the torch leaves (x, then the weights)."""
    W = {n: torch.tensor(p.numpy(), requires_grad=True) for n, p in mla.named_parameters()}
    h = torch.tensor(x, requires_grad=True)
    B, T, _ = h.shape
    nh, dn, dr, dc = mla.n_head, mla.nope_head_dim, mla.rope_head_dim, mla.kv_lora_rank

    def rope(t):  # (..., T, dr): pair (i, i + dr/2) turned by pos * theta^(-2i / dr)
        angles = torch.arange(T, dtype=torch.float64)[:, None] * theta ** (
            -torch.arange(0, dr, 2, dtype=torch.float64) / dr
        )
        cos, sin = torch.cos(angles), torch.sin(angles)  # (T, dr/2)
        t1, t2 = t[..., : dr // 2], t[..., dr // 2 :]
        return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], dim=-1)

    c_q = h @ W["wq_a.weight"].T if "wq_a.weight" in W else h  # eq. 12: c^Q = W^DQ h
    q_all = (c_q @ W["wq_b.weight"].T).reshape(B, T, nh, dn + dr)  # eqs. 13-14: W^UQ, W^QR
    down = h @ W["wkv_a.weight"].T
    c_kv, k_rope = down[..., :dc], rope(down[..., dc:])  # eq. 9: c^KV = W^DKV h; eq. 15
    kv = (c_kv @ W["wkv_b.weight"].T).reshape(B, T, nh, -1)  # eqs. 10-11: W^UK, W^UV
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    heads = []
    for i in range(nh):
        q = torch.cat([q_all[:, :, i, :dn], rope(q_all[:, :, i, dn:])], dim=-1)  # eq. 16
        k = torch.cat([kv[:, :, i, :dn], k_rope], dim=-1)  # eq. 17: k^R shared by the heads
        scores = (q @ k.transpose(1, 2)) / math.sqrt(dn + dr)  # (B, T, T)
        p = torch.softmax(scores.masked_fill(~causal, -math.inf), dim=-1)
        heads.append(p @ kv[:, :, i, dn:])  # eq. 18
    out = torch.cat(heads, dim=-1) @ W["wo.weight"].T  # eq. 19
    return out, [h, *W.values()]


@pytest.mark.oracle
@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("q_lora_rank", [6, None])
def test_equals_the_paper_forward_and_backward(torch, absorb, q_lora_rank, rng):
    mla = layer(q_lora_rank)
    x = rng.standard_normal((2, 9, C))
    grad = rng.standard_normal((2, 9, C))
    want, leaves = paper_reference(torch, mla, x)
    want.backward(torch.tensor(grad))
    xt = mg.tensor(x, requires_grad=True)
    got = mla(xt, absorb=absorb)
    got.backward(mg.tensor(grad))
    # subtle: RoPE's tables are float32 (as the model keeps them), the reference's float64
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    grads = [xt.grad, *(p.grad for _, p in mla.named_parameters())]
    for g, leaf in zip(grads, leaves, strict=True):
        np.testing.assert_allclose(g, leaf.grad.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.summation_order
def test_absorbed_equals_explicit_in_float32(rng):
    mla = layer().float()
    x = mg.tensor(rng.standard_normal((2, 12, C)).astype(np.float32))
    explicit, absorbed = mla(x, absorb=False).numpy(), mla(x, absorb=True).numpy()
    np.testing.assert_allclose(absorbed, explicit, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("absorb", [False, True])
def test_gradcheck(absorb, rng):
    mla = layer(kv_lora_rank=3, rope_head_dim=2, nope_head_dim=2, v_head_dim=3)
    x = mg.tensor(rng.standard_normal((1, 4, C)), requires_grad=True)
    weights = [p for _, p in mla.named_parameters()]
    assert mg.gradcheck(lambda x, *w: mla(x, absorb=absorb), x, *weights, name="mla")


# ---- the latent cache ------------------------------------------------------------------------
def test_cache_holds_only_the_latent_and_the_rotary_key(rng):
    mla = layer()
    cache = mla.new_cache(2)
    assert cache.k.shape == (2, 1, 16, 5) and cache.v.shape == (2, 1, 16, 4)  # d_c, d_R
    x = rng.standard_normal((2, 6, C))
    mla(mg.tensor(x), cache)
    latent = (x @ mla.wkv_a.weight.numpy().T)[..., :5]  # c_KV = W^DKV h, unrotated
    np.testing.assert_allclose(cache.k[:, 0, :6], latent, atol=1e-12)


@pytest.mark.summation_order
@pytest.mark.parametrize("absorb", [False, True])
def test_cached_steps_equal_the_full_forward(absorb, rng):
    mla = layer()
    x = rng.standard_normal((2, 11, C))
    full = mla(mg.tensor(x)).numpy()
    cache, pieces, start = mla.new_cache(2), [], 0
    for size in (4, 1, 1, 3, 2):
        pieces.append(mla(mg.tensor(x[:, start : start + size]), cache, absorb=absorb).numpy())
        start += size
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=1e-12)


def test_model_generation_with_the_cache_equals_full_forwards():
    cfg = ModelConfig(
        vocab_size=13, block_size=10, n_layer=2, n_head=2, n_embd=16, pos="rope",
        attention="mla", kv_lora_rank=6, q_lora_rank=8, rope_head_dim=4,
    )  # fmt: skip
    mg.manual_seed(2)
    model = Decoder(cfg).double().eval()
    ids = [1, 4, 2]
    for _ in range(14):  # past block_size: the full cache falls back to recomputing
        logits = model([ids[-10:]])[0].numpy()
        ids.append(int(logits[0, -1].argmax()))
    assert list(model.generate([1, 4, 2], 14, temperature=0)) == ids[3:]


def test_cache_floats_per_token_against_mha_and_gqa():
    settings = dict(n_layer=4, n_head=8, n_embd=512, pos="rope")  # head size 64
    mha = cache_floats_per_token(ModelConfig(**settings))
    gqa = cache_floats_per_token(ModelConfig(**settings, n_kv_head=2))
    mla = cache_floats_per_token(
        ModelConfig(**settings, attention="mla", kv_lora_rank=128, rope_head_dim=32)
    )
    assert (mha, gqa, mla) == (4 * 2 * 8 * 64, 4 * 2 * 2 * 64, 4 * (128 + 32))
    model = Decoder(ModelConfig(**settings, attention="mla", kv_lora_rank=128, rope_head_dim=32))
    cache = model.new_caches(1)
    assert sum(c.k[0, :, 0].size + c.v[0, :, 0].size for c in cache) == mla


# ---- errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(rope_head_dim=5), r"rope_head_dim \(5\) must be even"),
        (dict(pos="alibi"), "pos must be 'rope', got pos='alibi'"),
        (dict(window=8), "does not take this window: set window=None"),
        (dict(bias=True), "does not take this bias"),
        (dict(n_kv_head=2), "does not take this n_kv_head"),
        (dict(attn_impl="flash"), "does not take this attn_impl"),
        (dict(attn_impl="dense"), "does not take this attn_impl"),
        (dict(kv_lora_rank=0), r"kv_lora_rank must be a finite int in \[1, inf\)"),
        (dict(attention="latent"), "attention='latent' is not one of"),
    ],
)
def test_impossible_settings_are_refused(kw, message):
    settings = dict(n_head=4, n_embd=32, pos="rope", attention="mla", kv_lora_rank=8)
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{**settings, **kw})
