"""Tests for RoPE scaling (decoder/model/positional.py): linear position interpolation, NTK-aware
base change and YaRN, against references written here from the papers one pair at a time;
the temperature; the model built with each; gradchecks; and the errors."""

import math

import numpy as np
import pytest

import minigrad as mg
from decoder.model.attention import CausalSelfAttention
from decoder.model.config import ModelConfig
from decoder.model.model import Decoder
from decoder.model.positional import RoPE, rope_frequencies, rope_tables


def paper_frequencies(head_size, base, scaling, s, L):
    """theta_d for d = 0 .. |D|/2 - 1 and sqrt(1/t), one pair at a time, as the papers write:
    PI (Chen et al. 2023, eq. 2): theta_d / s.  NTK-aware (bloc97; YaRN sec. 3.1):
    b' = b * s^(|D| / (|D| - 2)).  YaRN (Peng et al. 2023, eqs. 17-20): lambda_d = 2 pi /
    theta_d, r(d) = L / lambda_d, gamma(r) = 0 below alpha = 1, 1 above beta = 32, linear
    between; h(theta_d) = (1 - gamma) theta_d / s + gamma theta_d; sqrt(1/t) = 0.1 ln s + 1."""
    D = head_size
    if scaling == "ntk":
        base = base * s ** (D / (D - 2))
    thetas, alpha, beta = [], 1.0, 32.0
    for d in range(D // 2):
        theta = base ** (-2 * d / D)
        if scaling == "linear":
            theta = theta / s
        elif scaling == "yarn":
            r = L / (2 * math.pi / theta)
            gamma = 0.0 if r < alpha else 1.0 if r > beta else (r - alpha) / (beta - alpha)
            theta = (1 - gamma) * theta / s + gamma * theta
        thetas.append(theta)
    temperature = 0.1 * math.log(s) + 1 if scaling == "yarn" else 1.0
    return np.array(thetas), temperature


@pytest.mark.parametrize("scaling", [None, "linear", "ntk", "yarn"])
@pytest.mark.parametrize("head_size, base, s, L", [(64, 10000.0, 4.0, 64), (128, 1e4, 40, 4096)])
def test_frequencies_equal_the_papers(scaling, head_size, base, s, L):
    s = 1.0 if scaling is None else s
    got, temperature = rope_frequencies(head_size, base, scaling, s, L)
    want, want_temperature = paper_frequencies(head_size, base, scaling, s, L)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert temperature == pytest.approx(want_temperature, rel=1e-12)


def test_each_scaling_moves_the_pairs_it_should():
    freqs, _ = rope_frequencies(64, 10000.0)
    linear, _ = rope_frequencies(64, 10000.0, "linear", 8.0)
    ntk, _ = rope_frequencies(64, 10000.0, "ntk", 8.0)
    yarn, temperature = rope_frequencies(64, 10000.0, "yarn", 8.0, original_context=256)
    np.testing.assert_allclose(linear, freqs / 8)  # every pair slowed 8x
    assert ntk[0] == freqs[0] and ntk[-1] == pytest.approx(freqs[-1] / 8)  # fast kept, slow / s
    turns = 256 * freqs / (2 * np.pi)  # each pair's turns over the training context
    np.testing.assert_allclose(yarn[turns > 32], freqs[turns > 32])  # many turns: kept
    np.testing.assert_allclose(yarn[turns < 1], freqs[turns < 1] / 8)  # under one: interpolated
    between = (turns > 1) & (turns < 32)
    assert between.any() and np.all(yarn[between] < freqs[between])
    assert np.all(yarn[between] > freqs[between] / 8)
    assert temperature == pytest.approx(1 + 0.1 * math.log(8))


@pytest.mark.parametrize("scaling", ["linear", "ntk", "yarn"])
def test_a_factor_of_one_changes_nothing(scaling):
    cos, sin = rope_tables(16, 32, scaling=scaling, factor=1.0, original_context=32)
    plain_cos, plain_sin = rope_tables(16, 32)
    np.testing.assert_allclose(cos, plain_cos, atol=1e-7)
    np.testing.assert_allclose(sin, plain_sin, atol=1e-7)


def test_yarn_tables_carry_the_temperature_and_stay_relative(rng):
    """cos^2 + sin^2 = (0.1 ln s + 1)^2, and q_i . k_j still depends on i - j only."""
    rope = RoPE(8, 64, scaling="yarn", factor=4.0, original_context=16).double()
    cos, sin = rope.cos.numpy(), rope.sin.numpy()
    np.testing.assert_allclose(cos**2 + sin**2, (0.1 * math.log(4) + 1) ** 2, rtol=1e-6)
    q, k = (mg.tensor(rng.standard_normal((1, 1, 1, 8))) for _ in range(2))
    scores = [float((rope(q, offset=i) * rope(k, offset=i - 5)).sum().item()) for i in (5, 20, 50)]
    np.testing.assert_allclose(scores, scores[0], rtol=1e-5)


# ---- in the model ----------------------------------------------------------------------------
@pytest.mark.summation_order
def test_a_model_trained_short_runs_long_with_each_scaling(rng):
    """The experiment's mechanism: weights trained at block_size 16 load into a model of
    block_size 64 with any scaling (the tables are not saved), and its logits differ."""
    settings = dict(vocab_size=11, n_layer=2, n_head=2, n_embd=16, pos="rope")
    mg.manual_seed(0)
    short = Decoder(ModelConfig(block_size=16, **settings)).double()
    ids = rng.integers(0, 11, (1, 64))
    logits = {}
    for scaling in (None, "linear", "ntk", "yarn"):
        kw = dict(rope_scaling=scaling, rope_factor=1.0 if scaling is None else 4.0)
        long = Decoder(ModelConfig(block_size=64, rope_original_context=16, **settings, **kw))
        long.double().load_state_dict(short.state_dict())
        logits[scaling] = long(ids)[0].numpy()
    np.testing.assert_allclose(logits[None][:, :16], short(ids[:, :16])[0].numpy(), atol=1e-12)
    for scaling in ("linear", "ntk", "yarn"):
        assert not np.allclose(logits[scaling], logits[None])


@pytest.mark.parametrize("scaling", ["linear", "ntk", "yarn"])
def test_scaled_attention_gradcheck(scaling, rng):
    mg.manual_seed(1)
    attn = CausalSelfAttention(
        8, 2, 1, pos="rope", block_size=8, rope_scaling=scaling, rope_factor=2.0,
        rope_original_context=4,
    ).double()  # fmt: skip
    x = mg.tensor(rng.standard_normal((1, 6, 8)), requires_grad=True)
    weights = [attn.wq.weight, attn.wk.weight]
    assert mg.gradcheck(lambda x, *w: attn(x), x, *weights, name=f"attention[{scaling}]")


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(rope_scaling="yarn", rope_factor=4.0), "'yarn' needs rope_original_context"),
        (dict(rope_scaling="linear", rope_factor=0.5), "rope_factor=0.5 must be .* >= 1"),
        (dict(rope_scaling="ntk", rope_factor=math.inf), "rope_factor=inf must be a finite"),
        (dict(rope_factor=2.0), "rope_factor=2.0 has no effect without rope_scaling"),
        (dict(rope_scaling="dynamic"), "unknown rope_scaling='dynamic'"),
        (dict(pos="learned", rope_scaling="linear"), "stretches RoPE, but pos='learned'"),
        (dict(rope_original_context=0), r"rope_original_context must be .* \[1, inf\)"),
    ],
)
def test_impossible_settings_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{"pos": "rope", **kw})
