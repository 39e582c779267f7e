"""Tests for decoder/model/positional.py: the tables' known values, RoPE's relative-position
property and pairing convention, ALiBi's slopes, offsets and errors."""

import numpy as np
import pytest

import minigrad as mg
from decoder.model.positional import (
    LearnedPositions,
    RoPE,
    SinusoidalPositions,
    alibi_bias,
    alibi_slopes,
    rope_tables,
    sinusoidal_table,
)


# ---- sinusoidal -------------------------------------------------------------------------------
def test_sinusoidal_table_known_values():
    table = sinusoidal_table(50, 6)
    assert table.shape == (50, 6) and table.dtype == np.float32
    pos = 37
    for i in range(3):  # pair i: sin and cos of pos / 10000^(2i / 6)
        angle = pos / 10000 ** (2 * i / 6)
        np.testing.assert_allclose(table[pos, 2 * i], np.sin(angle), atol=1e-6)
        np.testing.assert_allclose(table[pos, 2 * i + 1], np.cos(angle), atol=1e-6)
    np.testing.assert_array_equal(table[0], [0, 1, 0, 1, 0, 1])


def test_sinusoidal_table_odd_width():
    table = sinusoidal_table(4, 5)  # three sines, two cosines
    np.testing.assert_allclose(table[2, 4], np.sin(2 / 10000 ** (4 / 5)), atol=1e-6)
    assert table.shape == (4, 5)


def test_sinusoidal_positions_module():
    pos = SinusoidalPositions(16, 8)
    np.testing.assert_array_equal(pos(4, offset=3).numpy(), sinusoidal_table(16, 8)[3:7])
    assert pos.num_parameters() == 0
    assert pos.state_dict() == {}  # a function of the config: not saved
    pos.double()
    assert pos(2).dtype == np.float64


# ---- learned ----------------------------------------------------------------------------------
def test_learned_positions_rows_and_gradient():
    pos = LearnedPositions(16, 8)
    assert [n for n, _ in pos.named_parameters()] == ["weight"]
    assert 0.01 < pos.weight.numpy().std() < 0.03  # normal with std 0.02
    rows = pos(3, offset=5)
    np.testing.assert_array_equal(rows.numpy(), pos.weight.numpy()[5:8])
    rows.sum().backward()
    used = np.zeros(16, bool)
    used[5:8] = True
    np.testing.assert_array_equal(pos.weight.grad[used], 1.0)
    np.testing.assert_array_equal(pos.weight.grad[~used], 0.0)


@pytest.mark.parametrize("module", [LearnedPositions(8, 4), SinusoidalPositions(8, 4)])
def test_positions_past_block_size_raise(module):
    module(8)  # exactly block_size rows is fine
    with pytest.raises(ValueError, match="positions 5..8 do not fit block_size=8"):
        module(4, offset=5)


# ---- RoPE -------------------------------------------------------------------------------------
def rotate(rope, x, pos):
    """x (hs,) rotated as if it sat at absolute position pos."""
    return rope(mg.tensor(x[None, None, None, :]), offset=pos).numpy()[0, 0, 0]


def test_rope_score_depends_only_on_the_distance(rng):
    hs = 16
    rope = RoPE(hs, block_size=64).double()
    q, k = rng.standard_normal(hs), rng.standard_normal(hs)
    for diff in (0, 3, 11):
        scores = [rotate(rope, q, i) @ rotate(rope, k, i - diff) for i in (diff, diff + 5, 40, 63)]
        np.testing.assert_allclose(scores, scores[0], rtol=1e-6)
    # ... and it does depend on the distance (so the test above can fail)
    assert (
        abs(rotate(rope, q, 5) @ rotate(rope, k, 2) - rotate(rope, q, 5) @ rotate(rope, k, 4))
        > 1e-3
    )


def test_rope_pairs_d_with_d_plus_half_as_complex_rotation(rng):
    """rotate-half: (x[d], x[d + hs/2]) as one complex number, times exp(i pos theta^(-2d/hs))."""
    hs, theta, pos = 8, 100.0, 7
    rope = RoPE(hs, block_size=16, theta=theta).double()
    x = rng.standard_normal(hs)
    z = (x[: hs // 2] + 1j * x[hs // 2 :]) * np.exp(1j * pos * theta ** (-np.arange(0, hs, 2) / hs))
    np.testing.assert_allclose(rotate(rope, x, pos), np.concatenate([z.real, z.imag]), atol=1e-6)


def test_rope_is_a_rotation_and_position_zero_is_the_identity(rng):
    rope = RoPE(8, block_size=32)
    x = mg.tensor(rng.standard_normal((2, 3, 32, 8)).astype(np.float32))
    y = rope(x).numpy()
    np.testing.assert_allclose(
        np.linalg.norm(y, axis=-1), np.linalg.norm(x.numpy(), axis=-1), rtol=1e-5
    )
    np.testing.assert_allclose(y[:, :, 0], x.numpy()[:, :, 0], atol=0)


def test_rope_offset_equals_slicing_a_longer_sequence(rng):
    rope = RoPE(8, block_size=32)
    x = mg.tensor(rng.standard_normal((1, 2, 10, 8)).astype(np.float32))
    np.testing.assert_array_equal(rope(x[:, :, 4:], offset=4).numpy(), rope(x).numpy()[:, :, 4:])


def test_rope_gradcheck(rng):
    rope = RoPE(6, block_size=8).double()
    x = mg.tensor(rng.standard_normal((2, 2, 3, 6)), requires_grad=True)
    assert mg.gradcheck(lambda x: rope(x, offset=2), x, name="rope")


def test_rope_tables_and_errors():
    cos, sin = rope_tables(8, 10)
    assert cos.shape == sin.shape == (10, 8) and cos.dtype == np.float32
    np.testing.assert_allclose(cos**2 + sin**2, 1.0, rtol=1e-6)
    np.testing.assert_array_equal(cos[:, :4], cos[:, 4:])  # the two halves share angles
    with pytest.raises(ValueError, match="head_size must be even"):
        RoPE(5, block_size=8)
    rope = RoPE(4, block_size=8)
    with pytest.raises(ValueError, match="positions 6..8 do not fit block_size=8"):
        rope(mg.zeros(1, 1, 3, 4), offset=6)
    with pytest.raises(ValueError, match="head_size=4"):
        rope(mg.zeros(1, 1, 3, 6))
    assert rope.state_dict() == {}  # the tables are not saved


# ---- ALiBi ------------------------------------------------------------------------------------
def test_alibi_slopes_follow_the_paper():
    np.testing.assert_array_equal(alibi_slopes(8), [2.0**-k for k in range(1, 9)])
    np.testing.assert_array_equal(alibi_slopes(1), [2.0**-8])
    # not a power of two: 8's slopes, then every other one of 16's
    want = [2.0 ** (-k) for k in range(1, 9)] + [2.0**-0.5, 2.0**-1.5]
    np.testing.assert_allclose(alibi_slopes(10), want)
    assert np.all(np.diff(alibi_slopes(16)) < 0)
    with pytest.raises(ValueError, match="at least 1"):
        alibi_slopes(0)


def test_alibi_bias_is_aligned_to_the_end():
    bias = alibi_bias(4, T=3, S=5)
    slopes = alibi_slopes(4)
    assert bias.shape == (4, 3, 5)
    for h, i, j in [(0, 0, 2), (1, 2, 4), (3, 1, 0), (2, 0, 4)]:
        assert bias[h, i, j] == -slopes[h] * abs(5 - 3 + i - j)
    np.testing.assert_array_equal(alibi_bias(2, 4), alibi_bias(2, 4, 4))
    with pytest.raises(ValueError, match="S >= T"):
        alibi_bias(2, T=4, S=3)
