"""Hugging Face checkpoints (decoder/hf/pretrained.py, decoder/hf/tokenizer.py), offline.

Tiny random models are built with ``transformers`` from configs and saved to tmp_path: no
weights are downloaded, and the hub is simulated. Tests that need ``transformers`` (or its
``tokenizers``) skip, saying so, where they are not installed.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import types

import numpy as np
import pytest

import minigrad as mg
from decoder import finetune as finetune_cli
from decoder import generate as generate_cli
from decoder.hf.config import PretrainedError, config_from_hf, config_to_hf
from decoder.hf.pretrained import from_pretrained, load_pretrained, resolve_source, save_pretrained
from decoder.hf.tokenizer import HFTokenizer
from decoder.model.config import ModelConfig
from decoder.model.model import Decoder
from decoder.text.stream import stream_decode
from decoder.training.config import build_configs
from minigrad.nn.lora import apply_lora
from minigrad.optim import AdamW
from minigrad.serialization import open_safetensors, save_safetensors

V, T_PROMPT, N_NEW = 97, 8, 30


@pytest.fixture(scope="module")
def tf():
    """transformers (with torch), told never to reach the hub, or a skip saying why."""
    pytest.importorskip("torch", reason="torch (the oracle extra) is not installed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield pytest.importorskip(
            "transformers", reason="transformers (the oracle extra) is not installed"
        )


def hf_model(tf, kind: str, **overrides):
    """A tiny random transformers model of ``kind``, seeded, in eval mode."""
    import torch

    torch.manual_seed(0)
    # no bos/eos: HF's generate would stop at a random model's eos, and ours never stops
    ids = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    llama = dict(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=16,
        intermediate_size=24,
        vocab_size=V,
        max_position_embeddings=64,
        **ids,
    )
    configs = {
        "gpt2": lambda: tf.GPT2Config(
            n_layer=2, n_head=2, n_embd=16, vocab_size=V, n_positions=64, **ids
        ),
        "gpt2-untied": lambda: tf.GPT2Config(
            n_layer=1, n_head=2, n_embd=16, vocab_size=V, n_positions=64,
            tie_word_embeddings=False, **ids
        ),
        "llama": lambda: tf.LlamaConfig(**llama, rope_theta=500.0),  # GQA, untied
        "llama-tied": lambda: tf.LlamaConfig(**{**llama, "num_key_value_heads": 1},
                                             tie_word_embeddings=True),
        "mistral": lambda: tf.MistralConfig(**llama, head_dim=4, sliding_window=None),
        "mistral-window": lambda: tf.MistralConfig(**llama, head_dim=4, sliding_window=4),
        "qwen2-window": lambda: tf.Qwen2Config(  # layer 0 full, layer 1 windowed
            **llama, use_sliding_window=True, sliding_window=4, max_window_layers=1
        ),
        "qwen2": lambda: tf.Qwen2Config(**llama, tie_word_embeddings=True),
    }  # fmt: skip
    classes = {
        "gpt2": tf.GPT2LMHeadModel,
        "gpt2-untied": tf.GPT2LMHeadModel,
        "llama": tf.LlamaForCausalLM,
        "llama-tied": tf.LlamaForCausalLM,
        "mistral": tf.MistralForCausalLM,
        "mistral-window": tf.MistralForCausalLM,
        "qwen2-window": tf.Qwen2ForCausalLM,
        "qwen2": tf.Qwen2ForCausalLM,
    }
    config = configs[kind]()
    for key, value in overrides.items():
        setattr(config, key, value)
    model = classes[kind](config).eval()
    if kind.startswith("qwen2"):  # transformers initialises biases to zero: make them count
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                    proj.bias.normal_()
    return model


def hf_logits(model, ids: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.as_tensor(ids)).logits.float().numpy()


def hf_greedy(model, prompt: np.ndarray) -> list[int]:
    import torch

    out = model.generate(
        torch.as_tensor(prompt[None]), max_new_tokens=N_NEW, do_sample=False, pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()


# the windowed kinds' window of 4 is shorter than the 12 ids and the 38 generated positions
KINDS = ["gpt2", "llama", "llama-tied", "mistral", "mistral-window", "qwen2", "qwen2-window"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.oracle
def test_logits_and_greedy_generation_match_transformers(tf, tmp_path, kind, dtype):
    import torch

    model = hf_model(tf, kind)
    if dtype == "bfloat16":  # saved in bfloat16; the reference is those values in float32
        model = model.to(torch.bfloat16)
        model.save_pretrained(tmp_path)
        model = model.float()
    else:
        model.save_pretrained(tmp_path)
    with open_safetensors(tmp_path / "model.safetensors") as f:
        assert {f.dtype(n) for n in f} == {"BF16" if dtype == "bfloat16" else "F32"}
    ours = from_pretrained(tmp_path)
    ids = np.random.default_rng(0).integers(0, V, size=(2, 12))
    got, _ = ours(ids)
    np.testing.assert_allclose(got.data, hf_logits(model, ids), atol=2e-5, rtol=1e-5)

    prompt = ids[0, :T_PROMPT]
    expected = hf_greedy(model, prompt)
    assert list(ours.generate(prompt, N_NEW, temperature=0)) == expected
    assert list(ours.generate(prompt, N_NEW, temperature=0, use_cache=False)) == expected


@pytest.mark.oracle
def test_float16_weights_load_as_float32(tf, tmp_path):
    import torch

    model = hf_model(tf, "llama").to(torch.float16)
    model.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    assert ours.tok_emb.weight.dtype == np.float32
    ids = np.arange(12)[None]
    np.testing.assert_allclose(ours(ids)[0].data, hf_logits(model.float(), ids), atol=2e-5)


@pytest.mark.parametrize("kind", ["gpt2", "gpt2-untied", "llama", "mistral-window", "qwen2"])
@pytest.mark.oracle
def test_a_model_we_save_loads_in_transformers(tf, tmp_path, kind):
    model = hf_model(tf, kind)
    model.save_pretrained(tmp_path / "theirs")
    ours = from_pretrained(tmp_path / "theirs")
    assert ours.config.tie_weights == model.config.tie_word_embeddings
    save_pretrained(ours, tmp_path / "ours")
    back = type(model).from_pretrained(tmp_path / "ours").eval()
    ids = np.arange(10)[None] % V
    np.testing.assert_allclose(hf_logits(back, ids), hf_logits(model, ids), atol=1e-6)


@pytest.mark.oracle
def test_our_own_llama_config_saves_and_loads(tf, tmp_path):
    """A model trained here (the modern preset's shape) is a LlamaForCausalLM to transformers."""
    config = ModelConfig(
        vocab_size=V, block_size=16, n_layer=1, n_head=4, n_kv_head=2, n_embd=16,
        pos="rope", norm="rms", ffn="swiglu",
    )  # fmt: skip
    ours = Decoder(config)
    save_pretrained(ours, tmp_path)
    theirs = tf.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(theirs).__name__ == "LlamaForCausalLM"
    ids = np.arange(16)[None] % V
    np.testing.assert_allclose(ours(ids)[0].data, hf_logits(theirs, ids), atol=2e-5)


@pytest.mark.oracle
def test_the_mistral_preset_saves_as_a_mistral_model(tf, tmp_path):
    """Every layer windowed: transformers' MistralForCausalLM, with the same band mask."""
    config, _ = build_configs("mistral", vocab_size=V, n_layer=2, n_embd=32, window=4)
    ours = Decoder(config)
    save_pretrained(ours, tmp_path)
    theirs = tf.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(theirs).__name__ == "MistralForCausalLM"
    assert theirs.config.sliding_window == 4
    ids = np.arange(20)[None] % V  # 20 positions: a window of 4 hides most of them
    np.testing.assert_allclose(ours(ids)[0].data, hf_logits(theirs, ids), atol=2e-5)
    alternating = Decoder(dataclasses.replace(config, window_pattern="WF"))
    with pytest.raises(PretrainedError, match="cannot express.*window_pattern"):
        save_pretrained(alternating, tmp_path / "alternating")


def test_save_refuses_what_the_format_cannot_express(tmp_path):
    alibi = Decoder(ModelConfig(vocab_size=11, n_layer=1, n_head=2, n_embd=8, pos="alibi"))
    with pytest.raises(PretrainedError, match="no Hugging Face architecture here has pos='alibi'"):
        save_pretrained(alibi, tmp_path)
    gpt2_layout = dict(vocab_size=11, n_layer=1, n_head=2, n_embd=8, bias=True)
    eps = Decoder(ModelConfig(**gpt2_layout, parallel_block=True))
    with pytest.raises(PretrainedError, match="parallel_block=True"):
        save_pretrained(eps, tmp_path)
    lora = Decoder(ModelConfig(**gpt2_layout))
    apply_lora(lora, ("wq",), r=2)
    with pytest.raises(PretrainedError, match="merge it first"):
        save_pretrained(lora, tmp_path)
    assert not (tmp_path / "config.json").exists()


# ---- the GELU's two forms: activation_function <-> gelu_approximate -----------------------------
# transformers' names: gelu_new (GPT-2's checkpoints) and gelu_pytorch_tanh are the tanh form,
# gelu the exact erf form (nanoGPT's nn.GELU(), our shakespeare-char preset)
GELU_NAMES = [("gelu_new", "tanh"), ("gelu_pytorch_tanh", "tanh"), ("gelu", "none")]


@pytest.mark.parametrize("name, form", GELU_NAMES)
def test_gpt2_activation_function_picks_the_gelu_form(name, form):
    config, _ = config_from_hf({**GPT2_CONFIG, "activation_function": name})
    assert config.gelu_approximate == form
    assert config_from_hf(GPT2_CONFIG)[0].gelu_approximate == "tanh"  # GPT2Config's default
    # saving writes the name transformers gives that form in GPT-2's own configs
    written = config_to_hf(config)[0]["activation_function"]
    assert written == {"tanh": "gelu_new", "none": "gelu"}[form]


def _wide_gelu_inputs(linear_weight) -> None:
    """Scale an MLP's first weight so its GELU sees inputs of order 1 to 10, where the two
    forms differ by up to 5e-4 (around 0.02-scale init they agree to far below the tolerance)."""
    linear_weight *= 100


@pytest.mark.parametrize("name, form", GELU_NAMES)
@pytest.mark.oracle
def test_a_gpt2_of_either_gelu_loads_with_that_gelu(tf, tmp_path, name, form):
    import torch

    model = hf_model(tf, "gpt2", activation_function=name)
    with torch.no_grad():
        for block in model.transformer.h:
            _wide_gelu_inputs(block.mlp.c_fc.weight)
    model.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    assert {b.ffn.act.approximate for b in ours.blocks} == {form}
    x = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32)
    with torch.no_grad():
        want = model.transformer.h[0].mlp(torch.from_numpy(x)).numpy()
    got = ours.blocks[0].ffn(mg.tensor(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    ours.blocks[0].ffn.act.approximate = {"tanh": "none", "none": "tanh"}[form]
    other = ours.blocks[0].ffn(mg.tensor(x)).numpy()
    assert np.abs(other - want).max() > 1e-5  # the test tells the two forms apart


@pytest.mark.summation_order
@pytest.mark.oracle
def test_our_exact_gelu_model_saves_as_a_gpt2_with_exact_gelu(tf, tmp_path):
    """The classic preset (nanoGPT's exact GELU), with GPT-2's biases, round-trips through
    transformers as activation_function="gelu"."""
    config, _ = build_configs("shakespeare-char", vocab_size=V, n_layer=1, n_embd=16, bias=True)
    assert config.gelu_approximate == "none"
    ours = Decoder(config)
    _wide_gelu_inputs(ours.blocks[0].ffn.w1.weight.data)
    save_pretrained(ours, tmp_path)
    theirs = tf.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert theirs.config.activation_function == "gelu"
    ids = np.arange(16)[None] % V
    # measured: 6e-8 apart with transformers' exact gelu, 8e-6 had it built gelu_new
    np.testing.assert_allclose(ours(ids)[0].data, hf_logits(theirs, ids), rtol=0, atol=1e-6)
    back = from_pretrained(tmp_path)
    assert back.config == config


@pytest.mark.oracle
def test_a_lora_step_runs_on_a_loaded_model(tf, tmp_path):
    hf_model(tf, "llama").save_pretrained(tmp_path)
    model = from_pretrained(tmp_path)
    base = model.blocks[0].attn.wq.weight.data.copy()
    apply_lora(model, ("wq", "wv"), r=2)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = AdamW(params, lr=1e-2)
    ids = np.random.default_rng(1).integers(0, V, size=(2, 9))
    _, loss = model(ids[:, :-1], ids[:, 1:])
    loss.backward()
    optimizer.step()
    assert all(p.grad is not None for p in params)
    np.testing.assert_array_equal(model.blocks[0].attn.wq.base.weight.data, base)


# ---- sharded and broken files ----------------------------------------------------------------
@pytest.mark.oracle
def test_sharded_weights_load_and_a_missing_shard_is_named(tf, tmp_path):
    model = hf_model(tf, "llama")
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "model.safetensors.index.json").is_file()
    ids = np.arange(6)[None]
    np.testing.assert_allclose(
        from_pretrained(tmp_path)(ids)[0].data, hf_logits(model, ids), atol=2e-5
    )
    shards[-1].unlink()
    with pytest.raises(PretrainedError, match=f"lists the shards \\['{shards[-1].name}'\\]"):
        from_pretrained(tmp_path)


@pytest.mark.oracle
def test_a_truncated_file_is_refused(tf, tmp_path):
    hf_model(tf, "gpt2").save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(
        ValueError, match="model.safetensors is not a valid safetensors file.*trunc"
    ):
        from_pretrained(tmp_path)


def write_model(tmp_path, config: dict, arrays: dict) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_safetensors(tmp_path / "model.safetensors", arrays)


GPT2_CONFIG = {
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 5,
    "n_positions": 4, "n_layer": 1, "n_head": 1, "n_embd": 2,
}  # fmt: skip


def gpt2_arrays(C: int = 2, V: int = 5, T: int = 4, prefix: str = "") -> dict:
    """A one-layer GPT-2's tensors, named as the hub's gpt2 file (no prefix) names them."""
    a = {"wte.weight": np.ones((V, C)), "wpe.weight": np.ones((T, C))}
    a |= {f"ln_{i}.{w}": np.ones(C) for i in "12" for w in ("weight", "bias")}
    a |= {"attn.c_attn.weight": np.ones((C, 3 * C)), "attn.c_attn.bias": np.ones(3 * C)}
    a |= {"attn.c_proj.weight": np.ones((C, C)), "attn.c_proj.bias": np.ones(C)}
    a |= {"mlp.c_fc.weight": np.ones((C, 4 * C)), "mlp.c_fc.bias": np.ones(4 * C)}
    a |= {"mlp.c_proj.weight": np.ones((4 * C, C)), "mlp.c_proj.bias": np.ones(C)}
    a = {(k if k.startswith(("wte", "wpe")) else f"h.0.{k}"): v for k, v in a.items()}
    a |= {"ln_f.weight": np.ones(C), "ln_f.bias": np.ones(C)}
    a["h.0.attn.bias"] = np.tril(np.ones((1, 1, T, T)))  # the causal mask old files carry
    return {prefix + k: v.astype(np.float32) for k, v in a.items()}


def test_the_hub_gpt2_layout_loads_with_conv1d_transposed_and_c_attn_split(tmp_path):
    arrays = gpt2_arrays()
    arrays["h.0.attn.c_attn.weight"] = np.arange(12, dtype=np.float32).reshape(2, 6)
    write_model(tmp_path, GPT2_CONFIG, arrays)
    attn = from_pretrained(tmp_path).blocks[0].attn
    # c_attn is x @ W with W (C, 3C) = [W_Q | W_K | W_V]; ours hold each as (out, in)
    np.testing.assert_array_equal(attn.wq.weight.data, [[0, 6], [1, 7]])
    np.testing.assert_array_equal(attn.wv.weight.data, [[4, 10], [5, 11]])


def test_gpt2_uses_tiktokens_gpt2_encoding_and_offline_says_what_to_download(
    tmp_path, monkeypatch, capsys
):
    import decoder.hf.pretrained

    write_model(tmp_path, GPT2_CONFIG, gpt2_arrays())
    names = []

    class FakeTiktoken:  # stands in for tiktoken's gpt2 files, which tests never download
        vocab_size = 5

        def __init__(self, name):
            names.append(name)

    monkeypatch.setattr(decoder.hf.pretrained, "TiktokenTokenizer", FakeTiktoken)
    assert isinstance(load_pretrained(tmp_path)[1], FakeTiktoken) and names == ["gpt2"]

    def offline(name):
        raise RuntimeError("could not download the files of tiktoken's 'gpt2' encoding")

    monkeypatch.setattr(decoder.hf.pretrained, "TiktokenTokenizer", offline)
    assert generate_cli.main(["--from-pretrained", str(tmp_path), "--max-new-tokens", "1"]) == 2
    assert "could not download the files of tiktoken's 'gpt2'" in capsys.readouterr().err


def test_a_shape_that_does_not_match_the_config_is_refused(tmp_path):
    write_model(tmp_path, {**GPT2_CONFIG, "vocab_size": 6}, gpt2_arrays())
    with pytest.raises(PretrainedError, match=r"wte.weight has shape \(5, 2\).*makes it \(6, 2\)"):
        from_pretrained(tmp_path)


def test_missing_and_unexpected_tensors_are_named(tmp_path):
    arrays = gpt2_arrays()
    del arrays["ln_f.bias"]
    arrays["extra.weight"] = np.ones(1, dtype=np.float32)
    write_model(tmp_path, GPT2_CONFIG, arrays)
    with pytest.raises(PretrainedError, match=r"missing \['ln_f.bias'\], unexpected \['extra"):
        from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"architectures": ["BertForMaskedLM"]}, r"architectures \['BertForMaskedLM'\]"),
        ({"activation_function": "relu"}, "activation_function='relu'"),
        ({"attn_pdrop": 0.0, "resid_pdrop": 0.1}, "different dropouts"),
        ({"some_new_option": 1}, r"sets \['some_new_option'\], which this loader cannot honour"),
        ({"n_embd": None}, "config.json lacks n_embd"),
    ],
)
def test_config_fields_we_cannot_honour_are_named(change, message):
    with pytest.raises(PretrainedError, match=message):
        config_from_hf({**GPT2_CONFIG, **change})


LLAMA_CONFIG = {
    "architectures": ["MistralForCausalLM"], "vocab_size": 5, "max_position_embeddings": 64,
    "num_hidden_layers": 1, "num_attention_heads": 2, "hidden_size": 4,
    "intermediate_size": 8, "rms_norm_eps": 1e-5,
}  # fmt: skip


@pytest.mark.parametrize(
    "change, message",
    [
        ({"layer_types": ["chunked_attention"]}, r"layer_types \['chunked_attention'\]"),
        ({"layer_types": ["sliding_attention"]}, "sliding ones needing a window"),
        (
            {
                "rope_scaling": {
                    "rope_type": "dynamic",
                    "factor": 2.0,
                    "original_max_position_embeddings": 32,
                }
            },
            "dynamic RoPE scaling starts at original_max_position_embeddings=32",
        ),
        ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "RoPE scaling 'longrope'"),
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0}},
            r"'llama3' sets \{'low_freq_factor': 2.0\}",
        ),
        (
            {
                "rope_parameters": {
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "beta_fast": 16.0,
                    "original_max_position_embeddings": 16,
                    "rope_theta": 1e4,
                }
            },
            r"'yarn' sets \{'beta_fast': 16.0\}",
        ),
        ({"head_dim": 4}, "head_dim=4"),
        ({"attention_bias": True}, "attention_bias=True but mlp_bias=False"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ],
)
def test_llama_family_settings_we_cannot_honour_are_named(change, message):
    with pytest.raises(PretrainedError, match=message):
        config_from_hf({**LLAMA_CONFIG, **change})


def test_llama_family_config_translation():
    config, family = config_from_hf(
        {**LLAMA_CONFIG, "sliding_window": 64, "rope_parameters": {"rope_theta": 1e6}}
    )
    assert family == "llama"
    assert (config.pos, config.norm, config.ffn, config.n_kv_head) == ("rope", "rms", "swiglu", 2)
    assert (config.rope_theta, config.norm_eps, config.tie_weights) == (1e6, 1e-5, False)
    qwen = {**LLAMA_CONFIG, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 4}
    assert config_from_hf(qwen)[0].qkv_bias  # its window is off without use_sliding_window
    windowed = config_from_hf({**qwen, "use_sliding_window": True, "max_window_layers": 0})[0]
    assert (windowed.window, windowed.window_pattern) == (4, "W")
    mistral = config_from_hf({**LLAMA_CONFIG, "sliding_window": 16, "num_hidden_layers": 3})[0]
    assert (mistral.window, mistral.window_pattern) == (16, "W")  # "WWW" written as a preset
    kinds = ["full_attention", "sliding_attention"] * 2
    gemma_like = {**LLAMA_CONFIG, "sliding_window": 4, "num_hidden_layers": 4, "layer_types": kinds}
    assert config_from_hf(gemma_like)[0].window_pattern == "FW"
    late = {**qwen, "use_sliding_window": True, "num_hidden_layers": 3, "max_window_layers": 2}
    assert config_from_hf(late)[0].window_pattern == "FFW"  # Qwen2: the last layer windowed


@pytest.mark.oracle
def test_block_size_crops_the_context(tf, tmp_path):
    model = hf_model(tf, "gpt2")
    model.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path, block_size=16)
    assert ours.config.block_size == 16 and ours.pos_emb.weight.shape == (16, 16)
    ids = np.arange(16)[None]
    np.testing.assert_allclose(ours(ids)[0].data, hf_logits(model, ids), atol=2e-5)
    with pytest.raises(PretrainedError, match="block_size=65: .* at most 64 tokens"):
        from_pretrained(tmp_path, block_size=65)


# The config.json files of released models (as their hub repositories hold them).
RELEASED = {
    "gpt2": {
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
        "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
        "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
        "resid_pdrop": 0.1, "summary_activation": None, "summary_first_dropout": 0.1,
        "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
        "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
        "vocab_size": 50257,
    },
    "TinyLlama-1.1B": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 1,
        "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 2048,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 22,
        "num_key_value_heads": 4, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": None, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.35.0", "use_cache": True,
        "vocab_size": 32000,
    },
    "Qwen2-0.5B": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu",
        "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
        "max_position_embeddings": 131072, "max_window_layers": 24, "model_type": "qwen2",
        "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 151936,
    },
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(RELEASED))
def test_released_configs_translate(name):
    config, _ = config_from_hf(RELEASED[name])
    hf = RELEASED[name]
    assert config.n_embd == hf.get("n_embd", hf.get("hidden_size"))
    assert config.tie_weights == hf.get("tie_word_embeddings", True)


def test_mistral_7b_v01_loads_with_its_window():
    v01 = {**LLAMA_CONFIG, "max_position_embeddings": 32768, "sliding_window": 4096}
    config = config_from_hf(v01)[0]
    assert (config.window, config.block_size, config.context_limit) == (4096, 32768, None)


# ---- the hub, simulated ----------------------------------------------------------------------
def test_a_hub_name_without_huggingface_hub_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # makes the import fail
    with pytest.raises(PretrainedError, match=r"pip install -e '\.\[hub\]'.*huggingface.co/gpt2"):
        resolve_source("gpt2")


def test_a_hub_name_offline_says_what_to_download_and_where(monkeypatch):
    def offline(repo_id, **kwargs):
        raise OSError("Temporary failure in name resolution")

    fake = types.SimpleNamespace(snapshot_download=offline)
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
    with pytest.raises(PretrainedError) as e:
        resolve_source("gpt2")
    assert "could not download 'gpt2'" in str(e.value)
    assert "config.json, model.safetensors" in str(e.value)
    assert "https://huggingface.co/gpt2/tree/main" in str(e.value)


def test_a_hub_name_is_downloaded_through_huggingface_hub(monkeypatch, tmp_path):
    calls = []

    def download(repo_id, allow_patterns):
        calls.append((repo_id, allow_patterns))
        write_model(tmp_path, GPT2_CONFIG, gpt2_arrays(prefix="transformer."))
        return str(tmp_path)

    monkeypatch.setitem(
        sys.modules, "huggingface_hub", types.SimpleNamespace(snapshot_download=download)
    )
    model = from_pretrained("openai-community/gpt2")
    assert calls[0][0] == "openai-community/gpt2" and "config.json" in calls[0][1]
    assert model.config.n_embd == 2


def test_a_path_that_is_not_there_is_not_sent_to_the_hub(tmp_path):
    with pytest.raises(PretrainedError, match="no such directory"):
        resolve_source(tmp_path / "nothing")


# ---- tokenizer.json --------------------------------------------------------------------------
TEXT = ["Hello world, héllo wörld! 123 4567 the cat's hat\n\n  spaces  here ünïcode 日本語"] * 20
SAMPLE = "Hello wörld, the hat's 日本 cat!!  🙂 x\n"


def byte_level_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is not installed")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet
    )
    tok.train_from_iterator(TEXT, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    return tok


def test_byte_level_tokenizer_json_matches_tokenizers_by_tiktoken_and_by_our_bpe(tmp_path):
    reference = byte_level_tokenizer(tmp_path)
    ours = HFTokenizer(tmp_path / "tokenizer.json")
    assert ours.encoding is not None  # the ids follow the merges: tiktoken can run it
    expected = reference.encode(SAMPLE).ids
    assert ours.encode(SAMPLE) == expected
    assert ours.decode(expected) == SAMPLE
    ours.encoding = None  # the plain-Python path must agree
    assert ours.encode(SAMPLE) == expected
    assert ours.encode("a<|endoftext|>", allowed_special="all")[-1] == 0
    with pytest.raises(ValueError, match="special token '<\\|endoftext\\|>'"):
        ours.encode("a<|endoftext|>")


@pytest.mark.parametrize("style", ["Prepend normaliser", "Metaspace first"])
def test_sentencepiece_style_tokenizer_json_with_byte_fallback(tmp_path, style):
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is not installed")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(byte_fallback=True))
    norm, dec = tokenizers.normalizers, tokenizers.decoders
    if style == "Prepend normaliser":  # Llama 2's file
        tok.normalizer = norm.Sequence([norm.Prepend("▁"), norm.Replace(" ", "▁")])
    else:  # what newer tokenizers versions write
        tok.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(prepend_scheme="first")
    tok.decoder = dec.Sequence(
        [dec.Replace("▁", " "), dec.ByteFallback(), dec.Fuse(), dec.Strip(" ", 1, 0)]
    )
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=200, special_tokens=["<s>"])
    tok.train_from_iterator(TEXT, trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    vocab.update({f"<0x{b:02X}>": len(vocab) + b for b in range(256)})  # as Llama 2's file
    reference = tokenizers.Tokenizer.from_str(json.dumps(spec))
    reference.save(str(tmp_path / "tokenizer.json"))
    ours = HFTokenizer(tmp_path / "tokenizer.json")
    expected = reference.encode(SAMPLE).ids
    assert ours.encode(SAMPLE) == expected  # 🙂 is not in the vocabulary: four byte tokens
    assert ours.decode(expected) == reference.decode(expected) == SAMPLE
    text = "the cat<s>the hat"  # where "▁" goes around a special token
    assert ours.encode(text, allowed_special="all") == reference.encode(text).ids
    # streamed one token at a time, the spaces stay (each "▁word" decodes after its neighbour)
    ids = ours.encode("the cat the hat")
    pieces = list(stream_decode(ours, ids[1:], context=ids[:1]))
    assert ours.decode(ids[:1]) + "".join(pieces) == "the cat the hat"


# ---- the command line ------------------------------------------------------------------------
@pytest.fixture
def llama_dir(tf, tmp_path):
    """A tiny Llama with a byte-level tokenizer.json of the same vocabulary size beside it."""
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    byte_level_tokenizer(tok_dir)
    n_vocab = HFTokenizer(tok_dir / "tokenizer.json").vocab_size
    model = hf_model(tf, "llama", vocab_size=n_vocab)
    model.resize_token_embeddings(n_vocab)
    model.save_pretrained(tmp_path / "llama")
    shutil.copy(tok_dir / "tokenizer.json", tmp_path / "llama")
    return tmp_path / "llama"


@pytest.mark.oracle
def test_generate_and_finetune_from_pretrained(llama_dir, tmp_path, capsys):
    model, tokenizer = load_pretrained(llama_dir)
    assert isinstance(tokenizer, HFTokenizer)
    argv = ["--from-pretrained", str(llama_dir), "--prompt", "Hello", "--max-new-tokens", "5"]
    assert generate_cli.main([*argv, "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("Hello")

    data = tmp_path / "data.txt"
    data.write_text("hello world, the cat's hat. " * 400)
    out = tmp_path / "lora"
    argv = ["--from-pretrained", str(llama_dir), "--data", str(data), "--out", str(out)]
    argv += ["--max-iters", "2", "--lora-r", "2", "--block-size", "32", "--merge"]
    assert finetune_cli.main(argv) == 0
    merged = out / "merged"
    assert (merged / "tokenizer.json").is_file()
    assert json.loads((merged / "config.json").read_text())["max_position_embeddings"] == 64
    assert generate_cli.main(["--from-pretrained", str(merged), "--max-new-tokens", "3"]) == 0
    assert generate_cli.main(["--from-pretrained", str(tmp_path / "none")]) == 2
    assert "no such directory" in capsys.readouterr().err


# ---- reading safetensors as these models ship them -------------------------------------------
@pytest.mark.oracle
def test_bfloat16_edge_values_read_as_torch_reads_them(tmp_path):
    torch = pytest.importorskip("torch", reason="torch (the oracle extra) is not installed")
    st = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")
    values = [0.0, -0.0, 1.0, -3.5, 1e-40, 3e38, float("inf"), -float("inf"), float("nan")]
    x = torch.tensor(values).to(torch.bfloat16).reshape(3, 3)
    st.save_file({"x": x, "empty": torch.zeros(0, 2, dtype=torch.bfloat16)}, tmp_path / "w.st")
    with open_safetensors(tmp_path / "w.st") as f:
        got = f["x"]
        assert got.dtype == np.float32 and f["empty"].shape == (0, 2)
    np.testing.assert_array_equal(got, x.float().numpy())  # NaN, -0.0 and subnormals too
    assert np.signbit(got[0, 1])


def test_open_safetensors_maps_the_file_and_release_drops_only_pages(tmp_path):
    arrays = {"a": np.arange(5000, dtype=np.float32), "b": np.ones((3, 2), dtype=np.float16)}
    save_safetensors(tmp_path / "w.st", arrays)
    with open_safetensors(tmp_path / "w.st") as f:
        a = f["a"]
        assert not a.flags.writeable and not a.flags.owndata  # a view of the map, no copy
        f.release("a")
        np.testing.assert_array_equal(a, arrays["a"])  # read from the file again
        np.testing.assert_array_equal(f["b"], arrays["b"])
