"""ModelConfig and TrainConfig: every field checked at construction, with errors that name it."""

from __future__ import annotations

import math

import pytest

from decoder.model.attention import CausalSelfAttention
from decoder.model.config import ModelConfig
from decoder.model.positional import RoPE
from decoder.training.config import PRESETS, TrainConfig, build_configs

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize(
    "settings, match",
    [
        (dict(rope_theta=0.0), r"ModelConfig.rope_theta must be a finite float in \(0, inf\)"),
        (dict(rope_theta=INF), r"ModelConfig.rope_theta .*got inf"),
        (dict(ffn_hidden=0), r"ModelConfig.ffn_hidden must be a finite int in \[1, inf\)"),
        (dict(dropout=NAN), r"ModelConfig.dropout must be a finite float in \[0, 1\), got nan"),
        (dict(dropout=1.0), r"ModelConfig.dropout .*\[0, 1\), got 1.0"),
        (dict(n_layer=2.5), r"ModelConfig.n_layer must be of type int, got 2.5"),
        (dict(n_embd=True), r"ModelConfig.n_embd must be of type int, got True"),
        (dict(bias="yes"), r"ModelConfig.bias must be of type bool, got 'yes'"),
        (dict(n_head=4, n_kv_head=3), r"n_head \(4\) must be a multiple of n_kv_head \(3\)"),
        (dict(pos="relative"), "unknown position scheme pos='relative'"),
        (dict(attn_impl="fast"), "unknown attention impl='fast'"),
    ],
)
def test_model_config_rejects(settings, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**settings)


@pytest.mark.parametrize(
    "settings, match",
    [
        (dict(lr=NAN), r"TrainConfig.lr must be a finite float in \[0, inf\), got nan"),
        (dict(lr=INF), r"TrainConfig.lr .*got inf"),
        (dict(min_lr=NAN), r"TrainConfig.min_lr .*got nan"),
        (dict(min_lr=-1e-4), r"TrainConfig.min_lr .*got -0.0001"),
        (dict(weight_decay=NAN), r"TrainConfig.weight_decay .*got nan"),
        (dict(weight_decay=INF), r"TrainConfig.weight_decay .*got inf"),
        (dict(grad_clip=NAN), r"TrainConfig.grad_clip .*got nan"),  # nan silently disabled it
        (dict(seed=-1), r"TrainConfig.seed must be a finite int in \[0, 9223372036854775808\)"),
        (dict(beta2=1.0), r"TrainConfig.beta2 .*\[0, 1\), got 1.0"),
        (dict(warmup_iters=-1), r"TrainConfig.warmup_iters .*got -1"),
        (dict(bpe_vocab_size=100), r"TrainConfig.bpe_vocab_size .*\[256, inf\), got 100"),
        (dict(sample_tokens=-1), r"TrainConfig.sample_tokens .*got -1"),
        (dict(lr=1e-4, min_lr=1e-3), r"min_lr=0.001 is above lr=0.0001"),
        (dict(device="tpu"), r"device='tpu' is not one of \('cpu', 'cuda'\)"),
    ],
)
def test_train_config_rejects(settings, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**settings)


def test_command_line_values_are_checked_at_parse():
    with pytest.raises(ValueError, match=r"TrainConfig.lr .*got nan"):
        build_configs("tiny", {"lr": "nan"})
    with pytest.raises(ValueError, match=r"warmup_iters=10 is longer than lr_decay_iters=5"):
        build_configs("tiny", {"max_iters": "5"})  # tiny warms up for 10 steps
    with pytest.raises(ValueError, match=r"ModelConfig.rope_theta .*got 0.0"):
        build_configs("tiny", {"rope_theta": "0"})


def test_presets_and_edges_of_each_range_are_accepted():
    for preset in PRESETS:
        build_configs(preset)
    TrainConfig(lr=0.0, min_lr=0.0, weight_decay=0.0, grad_clip=0.0, seed=0, beta1=0.0)
    ModelConfig(dropout=0.0, ffn_hidden=1, rope_theta=1e-3, n_embd=2, n_head=1, vocab_size=1)


def test_the_layer_and_the_config_share_one_rule():
    """A library user building the layer directly gets the config's message, word for word."""
    messages = []
    for make in (
        lambda: ModelConfig(n_embd=16, n_head=4, n_kv_head=3),
        lambda: CausalSelfAttention(n_embd=16, n_head=4, n_kv_head=3),
    ):
        with pytest.raises(ValueError) as info:
            make()
        messages.append(str(info.value))
    assert messages[0] == messages[1]


def test_rope_rejects_a_theta_that_makes_nan_angles():
    with pytest.raises(ValueError, match=r"theta .*finite number > 0.*got 0.0"):
        RoPE(head_size=4, block_size=8, theta=0.0)
