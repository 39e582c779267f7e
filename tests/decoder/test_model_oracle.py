"""The whole Decoder against a PyTorch model written here, loaded with the same weights:
equal logits, loss and every parameter's gradient, in float64.

The PyTorch model is our own code (not a library's GPT), written in the plainest PyTorch so
that it is easy to check by eye: GPT-2's layout with learned or sinusoidal positions, and
Llama's choices (RoPE in the rotate-half convention, RMSNorm, SwiGLU, grouped-query heads
where query head h reads key/value head h // (n_head / n_kv_head)), plus ALiBi, post-norm and
parallel blocks. Parameter names match ours, so the state dicts map one to one.
"""

import math

import numpy as np
import pytest

import minigrad as mg
from decoder.model.config import ModelConfig
from decoder.model.model import Decoder
from decoder.model.positional import alibi_slopes, rope_tables, sinusoidal_table

pytestmark = pytest.mark.oracle


def torch_decoder(torch, config: ModelConfig):
    """A PyTorch twin of decoder.model.model.Decoder for ``config`` (float64)."""
    nn, F = torch.nn, torch.nn.functional
    C, nh, n_kv, hs = config.n_embd, config.n_head, config.n_kv_head, config.head_size
    # subtle: ours keeps the RoPE and sinusoidal tables in float32 (also in a .double() model),
    # so the twin uses the same rounded tables; test_position_tables checks their values.
    rope_tables_f32 = rope_tables(hs, config.block_size, config.rope_theta)

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(C))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    def norm():
        return nn.LayerNorm(C, eps=1e-5, bias=config.bias) if config.norm == "layer" else RMSNorm()

    def rope(x):  # x (B, h, T, hs), rotate-half pairs (i, i + hs/2)
        cos, sin = (torch.tensor(t[: x.shape[2]], dtype=x.dtype) for t in rope_tables_f32)
        x1, x2 = x[..., : hs // 2], x[..., hs // 2 :]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.wq = nn.Linear(C, nh * hs, bias=config.bias)
            self.wk = nn.Linear(C, n_kv * hs, bias=config.bias)
            self.wv = nn.Linear(C, n_kv * hs, bias=config.bias)
            self.wo = nn.Linear(nh * hs, C, bias=config.bias)

        def forward(self, x):
            B, T, _ = x.shape
            q = self.wq(x).view(B, T, nh, hs).transpose(1, 2)
            k = self.wk(x).view(B, T, n_kv, hs).transpose(1, 2)
            v = self.wv(x).view(B, T, n_kv, hs).transpose(1, 2)
            if config.pos == "rope":
                q, k = rope(q), rope(k)
            k = k.repeat_interleave(nh // n_kv, dim=1)  # query head h reads kv head h // group
            v = v.repeat_interleave(nh // n_kv, dim=1)
            i = torch.arange(T)
            mask = torch.zeros(T, T, dtype=x.dtype).masked_fill(i[None] > i[:, None], -math.inf)
            if config.pos == "alibi":
                slopes = torch.tensor(alibi_slopes(nh))
                mask = mask - slopes[:, None, None] * (i[:, None] - i[None]).clamp(min=0)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return self.wo(y.transpose(1, 2).reshape(B, T, C))

    class FFN(nn.Module):
        def __init__(self):
            super().__init__()
            H = config.ffn_hidden
            self.w1 = nn.Linear(C, H, bias=config.bias)
            if config.ffn == "swiglu":
                self.w3 = nn.Linear(C, H, bias=config.bias)
            self.w2 = nn.Linear(H, C, bias=config.bias)

        def forward(self, x):
            if config.ffn == "swiglu":
                return self.w2(F.silu(self.w1(x)) * self.w3(x))
            return self.w2(F.gelu(self.w1(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.attn = norm(), Attention()
            if not config.parallel_block:
                self.norm2 = norm()
            self.ffn = FFN()

        def forward(self, x):
            if config.parallel_block:
                h = self.norm1(x)
                return x + self.attn(h) + self.ffn(h)
            if config.norm_position == "pre":
                x = x + self.attn(self.norm1(x))
                return x + self.ffn(self.norm2(x))
            x = self.norm1(x + self.attn(x))
            return self.norm2(x + self.ffn(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_emb = nn.Embedding(config.vocab_size, C)
            if config.pos == "learned":
                self.pos_emb = nn.Embedding(config.block_size, C)
            self.blocks = nn.ModuleList(Block() for _ in range(config.n_layer))
            if config.norm_position == "pre":
                self.norm_f = norm()
            self.lm_head = nn.Linear(C, config.vocab_size, bias=False)
            if config.tie_weights:
                self.lm_head.weight = self.tok_emb.weight

        def forward(self, ids, targets):
            T = ids.shape[1]
            x = self.tok_emb(ids)
            if config.pos == "learned":
                x = x + self.pos_emb(torch.arange(T))
            if config.pos == "sinusoidal":
                x = x + torch.tensor(sinusoidal_table(config.block_size, C)[:T], dtype=x.dtype)
            for block in self.blocks:
                x = block(x)
            if config.norm_position == "pre":
                x = self.norm_f(x)
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            return logits, loss

    return GPT().double()


CONFIGS = {
    "gpt2": dict(pos="learned", norm="layer", ffn="gelu", bias=True),
    "gpt2-nobias": dict(pos="learned", norm="layer", ffn="gelu"),
    "llama-gqa": dict(pos="rope", norm="rms", ffn="swiglu", n_kv_head=2, tie_weights=False),
    "mqa-rope": dict(pos="rope", n_kv_head=1),
    "sinusoidal": dict(pos="sinusoidal"),
    "alibi": dict(pos="alibi", norm="rms", n_kv_head=2),
    "none": dict(pos="none", ffn="swiglu"),
    "post-norm": dict(norm_position="post", bias=True),
    "parallel": dict(parallel_block=True, pos="rope", norm="rms"),
}


@pytest.mark.summation_order
@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_logits_loss_and_gradients_match_pytorch(overrides, torch, rng):
    config = ModelConfig(
        vocab_size=17, block_size=12, n_layer=2, n_head=4, n_embd=16, ffn_hidden=40, **overrides
    )
    mg.manual_seed(0)
    model = Decoder(config).double()
    for p in model.parameters():  # move the norms off 1 and the biases off 0
        p.data += 0.1 * rng.standard_normal(p.shape)
    reference = torch_decoder(torch, config)
    state = {k: torch.from_numpy(v) for k, v in model.state_dict().items()}
    missing, unexpected = reference.load_state_dict(state, strict=False)
    assert unexpected == [] and missing == (["lm_head.weight"] if config.tie_weights else [])
    # ours lists every trainable tensor the reference has (the tied one once)
    assert len(model.parameters()) == len(list(reference.parameters()))

    ids, targets = rng.integers(0, 17, size=(3, 12)), rng.integers(0, 17, size=(3, 12))
    logits, loss = model(ids, targets)
    loss.backward()
    t_logits, t_loss = reference(torch.from_numpy(ids), torch.from_numpy(targets))
    t_loss.backward()

    np.testing.assert_allclose(logits.numpy(), t_logits.detach().numpy(), rtol=0, atol=1e-12)
    assert loss.item() == pytest.approx(t_loss.item(), rel=1e-12)
    t_params = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(
            p.grad, t_params[name].grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=name
        )


def test_position_tables(torch):
    """The tables both models share, against the papers' formulas in float64."""
    hs, T, theta = 8, 12, 10000.0
    freqs = theta ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * freqs  # (T, hs/2)
    cos, sin = rope_tables(hs, T, theta)
    np.testing.assert_allclose(cos, torch.cat([angles.cos()] * 2, -1).numpy(), atol=1e-7)
    np.testing.assert_allclose(sin, torch.cat([angles.sin()] * 2, -1).numpy(), atol=1e-7)
    C = 16
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    div = 10000.0 ** (torch.arange(0, C, 2, dtype=torch.float64) / C)
    table = torch.zeros(T, C, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(pos / div), torch.cos(pos / div)
    np.testing.assert_allclose(sinusoidal_table(T, C), table.numpy(), atol=1e-6)
