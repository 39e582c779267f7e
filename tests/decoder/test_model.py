"""Tests of decoder.model and decoder.model.block: shapes, initialisation, causality, gradients of
the whole model, weight tying, the parameter count, errors, sampling settings, and that a
tiny model overfits one batch."""

import dataclasses
import math

import numpy as np
import pytest

import minigrad as mg
from decoder.model.config import ModelConfig
from decoder.model.decoding import check_sampling, sample_token
from decoder.model.model import Decoder
from decoder.model.positional import LearnedPositions
from decoder.training.config import PRESETS

POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "none")


def tiny(**overrides) -> ModelConfig:
    settings = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, ffn_hidden=16)
    return ModelConfig(**{**settings, **overrides})


def build(config: ModelConfig, seed: int = 0, double: bool = True) -> Decoder:
    mg.manual_seed(seed)
    model = Decoder(config)
    return model.double() if double else model


def random_ids(rng, B, T, V=11):
    return rng.integers(0, V, size=(B, T))


# ---- shapes and initialisation -------------------------------------------------------------
@pytest.mark.parametrize("pos", POSITIONS)
def test_forward_shapes_and_loss_at_init(pos, rng):
    model = build(tiny(pos=pos))
    ids, targets = random_ids(rng, 3, 8), random_ids(rng, 3, 8)
    logits, loss = model(ids, targets)
    assert logits.shape == (3, 8, 11)
    # GPT-2's small init gives nearly uniform predictions: loss ~ ln(V)
    assert abs(loss.item() - math.log(11)) < 0.05
    assert model(ids)[1] is None


def test_init_follows_gpt2():
    config = ModelConfig(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=64, bias=True)
    model = build(config, double=False)
    residual_std = 0.02 / math.sqrt(2 * config.n_layer)
    for name, p in model.named_parameters():
        w = p.numpy()
        if name.endswith("bias"):
            assert np.all(w == 0), name
        elif ".norm" in name or name.startswith("norm_f"):
            assert np.all(w == 1), name
        elif name.endswith(("attn.wo.weight", "ffn.w2.weight")):
            assert abs(w.std() / residual_std - 1) < 0.05, name
        else:
            assert abs(w.std() / 0.02 - 1) < 0.05, name


def test_same_seed_same_model_and_blocks_are_independent():
    a, b = build(tiny(), seed=3), build(tiny(), seed=3)
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)
    w0, w1 = (blk.attn.wq.weight.numpy() for blk in a.blocks)
    assert not np.allclose(w0, w1)


def test_post_norm_has_no_final_norm_and_parallel_has_no_norm2():
    assert build(tiny(norm_position="post")).norm_f is None
    model = build(tiny(parallel_block=True))
    assert not hasattr(model.blocks[0], "norm2")
    assert model.norm_f is not None


# ---- causality -------------------------------------------------------------------------------
@pytest.mark.parametrize("pos", POSITIONS)
@pytest.mark.parametrize("layout", ["pre", "post", "parallel"])
def test_changing_a_token_never_changes_earlier_logits(pos, layout, rng):
    extra = dict(norm_position="post") if layout == "post" else {}
    if layout == "parallel":
        extra = dict(parallel_block=True)
    model = build(tiny(pos=pos, n_kv_head=1, **extra))
    ids = random_ids(rng, 1, 8)
    base = model(ids)[0].numpy()
    for t in (0, 3, 7):
        changed = ids.copy()
        changed[0, t] = (changed[0, t] + 1) % 11
        out = model(changed)[0].numpy()
        np.testing.assert_allclose(out[:, :t], base[:, :t], rtol=0, atol=1e-12)
        assert not np.allclose(out[:, t], base[:, t])  # the token itself does matter


# ---- gradients of the whole model --------------------------------------------------------------
GRADCHECK_CONFIGS = {
    **{f"pos={p}": dict(pos=p) for p in POSITIONS},
    "rms": dict(norm="rms"),
    "swiglu": dict(ffn="swiglu"),
    "gqa": dict(n_head=4, n_kv_head=2, pos="rope"),
    "post-norm": dict(norm_position="post"),
    "parallel": dict(parallel_block=True),
    "bias-untied": dict(bias=True, tie_weights=False),
}


@pytest.mark.parametrize("overrides", GRADCHECK_CONFIGS.values(), ids=GRADCHECK_CONFIGS.keys())
def test_whole_model_gradcheck(overrides, rng):
    model = build(tiny(**overrides))
    ids, targets = random_ids(rng, 2, 5), random_ids(rng, 2, 5)
    last_norm = model.norm_f if model.norm_f is not None else model.blocks[-1].norm2
    params = [
        model.tok_emb.weight,
        model.blocks[0].attn.wq.weight,
        model.blocks[-1].ffn.w2.weight,
        last_norm.weight,
    ]
    if isinstance(model.pos_emb, LearnedPositions):
        params.append(model.pos_emb.weight)

    def loss(*_):  # gradcheck perturbs the parameters in place; the model reads them
        return model(ids, targets)[1]

    mg.gradcheck(loss, *params, eps=1e-6, atol=1e-7, rtol=1e-5, name=str(overrides))


# ---- weight tying -----------------------------------------------------------------------------
def test_tied_weights_share_one_parameter_counted_once():
    tied, untied = build(tiny()), build(tiny(tie_weights=False))
    assert tied.lm_head.weight is tied.tok_emb.weight
    assert untied.lm_head.weight is not untied.tok_emb.weight
    assert untied.num_parameters() - tied.num_parameters() == 11 * 8
    assert "lm_head.weight" not in tied.state_dict()
    assert "lm_head.weight" in untied.state_dict()


def test_tied_gradient_is_the_sum_of_both_uses(rng):
    tied, untied = build(tiny()), build(tiny(tie_weights=False))
    state = tied.state_dict()
    untied.load_state_dict({**state, "lm_head.weight": state["tok_emb.weight"]})
    ids, targets = random_ids(rng, 2, 6), random_ids(rng, 2, 6)
    tied(ids, targets)[1].backward()
    untied(ids, targets)[1].backward()
    both = untied.tok_emb.weight.grad + untied.lm_head.weight.grad
    assert np.abs(untied.tok_emb.weight.grad).max() > 0  # both uses really contribute
    assert np.abs(untied.lm_head.weight.grad).max() > 0
    np.testing.assert_allclose(tied.tok_emb.weight.grad, both, rtol=1e-12, atol=1e-15)


def test_state_dict_round_trip_keeps_the_tie(rng):
    source, target = build(tiny(), seed=1), build(tiny(), seed=2)
    target.load_state_dict(source.state_dict())
    assert target.lm_head.weight is target.tok_emb.weight
    ids = random_ids(rng, 2, 8)
    np.testing.assert_array_equal(target(ids)[0].numpy(), source(ids)[0].numpy())
    target.float().double()  # casts in place: still one Parameter
    assert target.lm_head.weight is target.tok_emb.weight
    target.tok_emb.weight.data[0, 0] += 1.0
    assert target.lm_head.weight.data[0, 0] == target.tok_emb.weight.data[0, 0]


# ---- parameter count ---------------------------------------------------------------------------
def test_parameter_count_of_the_shakespeare_char_config():
    config = ModelConfig(**PRESETS["shakespeare-char"].model)
    model = build(config, double=False)
    V, S, L, C = config.vocab_size, config.block_size, config.n_layer, config.n_embd
    per_block = 2 * C + 4 * C * C + 2 * C * 4 * C  # two LayerNorm gains, attention, MLP
    assert model.num_parameters() == V * C + S * C + L * per_block + C == 804_096
    # Kaplan et al.'s non-embedding count: 12 L C^2 plus the norms' gains
    assert model.num_parameters(exclude_embeddings=True) == 12 * L * C * C + (2 * L + 1) * C
    # nanoGPT prints 0.80M for this config (its count leaves out the position table only)
    assert round((model.num_parameters() - S * C) / 1e6, 2) == 0.80


def test_parameter_count_modern_and_untied():
    config = ModelConfig(**PRESETS["shakespeare-char-modern"].model, tie_weights=False)
    model = build(config, double=False)
    V, L, C, H = config.vocab_size, config.n_layer, config.n_embd, config.ffn_hidden
    kv = config.n_kv_head * config.head_size
    per_block = 2 * C + 2 * C * C + 2 * C * kv + 3 * C * H  # RMS gains, GQA attention, SwiGLU
    assert H == 344  # 8/3 * 128 rounded up to a multiple of 8
    assert model.num_parameters() == 2 * V * C + L * per_block + C
    assert model.num_parameters(exclude_embeddings=True) == V * C + L * per_block + C


# ---- errors ------------------------------------------------------------------------------------
def test_errors_name_the_problem():
    model = build(tiny())
    with pytest.raises(ValueError, match="token id 11 .*vocab_size=11"):
        model([[1, 11, 2]])
    with pytest.raises(ValueError, match="token id -1 .*vocab_size=11"):
        model([[-1, 0]])
    with pytest.raises(ValueError, match="T=9 .*block_size=8"):
        model(np.zeros((1, 9), dtype=np.int64))
    caches = model.new_caches(1)
    model([[1, 2, 3, 4, 5, 6]], caches=caches)
    with pytest.raises(ValueError, match="cache holds 6 tokens.*T=3 .*block_size=8"):
        model([[1, 2, 3]], caches=caches)
    with pytest.raises(TypeError, match="integer token ids"):
        model(np.zeros((1, 3)))
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        model([1, 2, 3])
    with pytest.raises(ValueError, match="targets have shape"):
        model([[1, 2, 3]], [[1, 2]])


@pytest.mark.parametrize(
    "field, value, message",
    [
        # ffn was a silent SwiGLU for any other name
        ("ffn", "relu", r"ffn='relu' is not one of \('gelu', 'swiglu', 'moe'\)"),
        ("norm", "batch", r"norm='batch' is not one of"),  # was a silent RMSNorm
        ("dropout", float("nan"), r"ModelConfig.dropout .*got nan"),
    ],
)
def test_a_config_cannot_be_edited_past_its_checks(field, value, message):
    """The config checks itself once, when it is made, and the model trusts it: it is frozen,
    so an edit is a new config (dataclasses.replace), checked again."""
    config = tiny()
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(config, field, value)
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(config, **{field: value})


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(temperature=-0.5), "temperature must be >= 0"),
        (dict(top_k=0), "top_k must be a positive integer"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(max_new_tokens=-1), "max_new_tokens must be >= 0"),
        (dict(ids=[]), "at least one token"),
        (dict(ids=[[1, 2], [3, 4]]), "one sequence"),
        (dict(ids=[1, 99]), "token id 99"),
    ],
)
def test_invalid_generate_settings_raise_at_the_call(settings, message):
    model = build(tiny())
    args = {"ids": [1, 2], "max_new_tokens": 3, **settings}
    with pytest.raises(ValueError, match=message):
        model.generate(**args)  # no next(): the check runs before the first token


# ---- sampling ----------------------------------------------------------------------------------
def greedy_by_hand(model, prompt, n):
    """Argmax decoding written out with full forward passes, for comparison."""
    ids = list(prompt)
    for _ in range(n):
        logits = model([ids[-model.config.block_size :]])[0].numpy()
        ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_temperature_zero_top_k_one_and_tiny_top_p_are_greedy():
    model = build(tiny(), seed=4)
    prompt = [1, 5, 2]
    expected = greedy_by_hand(model, prompt, 12)  # crosses block_size: cropping is exercised
    assert list(model.generate(prompt, 12, temperature=0)) == expected
    assert list(model.generate(prompt, 12, top_k=1, seed=0)) == expected
    assert list(model.generate(prompt, 12, top_p=1e-9, seed=0)) == expected
    assert list(model.generate([prompt], 12, temperature=0, use_cache=False)) == expected


def test_sampling_is_seeded_and_not_greedy():
    model = build(tiny(), seed=4)
    a = list(model.generate([3], 20, temperature=2.0, seed=7))
    b = list(model.generate([3], 20, temperature=2.0, seed=7))
    c = list(model.generate([3], 20, temperature=2.0, seed=8))
    assert a == b and a != c
    assert a != list(model.generate([3], 20, temperature=0))
    assert all(isinstance(t, int) and 0 <= t < 11 for t in a)
    assert list(model.generate([3], 0)) == []


def test_sample_token_cuts():
    logits = np.log(np.array([0.05, 0.5, 0.1, 0.3, 0.05]))
    draws = lambda **kw: {  # noqa: E731
        sample_token(logits, rng=np.random.default_rng(s), **kw) for s in range(300)
    }
    assert draws(top_k=2) == {1, 3}
    assert draws(top_k=100) == {0, 1, 2, 3, 4}  # k above V keeps everything
    assert draws(top_p=0.5) == {1}  # the top token alone has mass 0.5
    assert draws(top_p=0.79) == {1, 3}  # 0.5 + 0.3 reaches 0.79
    assert draws(top_p=0.81) == {1, 2, 3}
    assert draws(top_k=3, top_p=0.6) == {1, 3}
    assert sample_token(logits, temperature=0) == 1


def test_sample_token_frequencies_follow_temperature():
    logits = np.log(np.array([0.2, 0.8]))
    rng = np.random.default_rng(0)
    n = 4000
    hot = np.mean([sample_token(logits, temperature=1.0, rng=rng) for _ in range(n)])
    cold = np.mean([sample_token(logits, temperature=0.5, rng=rng) for _ in range(n)])
    assert abs(hot - 0.8) < 0.03  # temperature 1 keeps the model's distribution
    assert abs(cold - 0.8**2 / (0.8**2 + 0.2**2)) < 0.03  # T = 1/2 squares the odds


def test_check_sampling_accepts_valid_settings():
    check_sampling(0.0, None, None)
    check_sampling(1.5, 1, 1.0)
    with pytest.raises(ValueError, match="temperature"):
        check_sampling(float("nan"), None, None)


def test_generate_uses_eval_mode_and_no_graph_only_while_it_computes():
    model = build(tiny(dropout=0.5), seed=5)
    model.train()
    model.blocks[0].eval()  # a mixed state must come back as it was
    tokens = model.generate([1, 2], 6, temperature=0)
    first = next(tokens)
    assert mg.is_grad_enabled()  # not left off while the generator waits
    assert model.training and not model.blocks[0].training and model.blocks[1].training
    rest = list(tokens)
    model.eval()
    assert [first, *rest] == greedy_by_hand(model, [1, 2], 6)  # dropout was off


def test_dropout_only_in_training(rng):
    model = build(tiny(dropout=0.3), seed=6)
    ids = random_ids(rng, 2, 8)
    model.train()
    a, b = model(ids)[0].numpy(), model(ids)[0].numpy()
    assert not np.allclose(a, b)
    model.eval()
    np.testing.assert_array_equal(model(ids)[0].numpy(), model(ids)[0].numpy())


# ---- learning ----------------------------------------------------------------------------------
def test_overfits_one_batch(rng):
    from minigrad.optim import AdamW

    config = tiny(block_size=16, n_layer=2, n_head=4, n_embd=32, ffn_hidden=None)
    model = build(config, seed=0, double=False)
    data = random_ids(rng, 4, 17)
    x, y = data[:, :-1], data[:, 1:]
    opt = AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    first = model(x, y)[1].item()
    for _ in range(150):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    final = model(x, y)[1].item()
    assert first > 2.0 and final < 0.05, (first, final)
