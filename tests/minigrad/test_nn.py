"""Tests of minigrad.nn: gradchecks of every layer, and how Module walks, names, freezes,
prints, moves and (de)serialises a model."""

import numpy as np
import pytest

import minigrad as mg
from minigrad import nn
from minigrad.optim import param_groups_for_decay
from minigrad.serialization import load_safetensors, save_safetensors


# ---- a small model with the decoder's names ------------------------------------------------
class Attn(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.wq = nn.Linear(n_embd, n_embd, bias=False)
        self.wk = nn.Linear(n_embd, n_embd, bias=False)
        self.wv = nn.Linear(n_embd, n_embd, bias=False)
        self.wo = nn.Linear(n_embd, n_embd, bias=False)

    def forward(self, x):  # not attention: a stand-in that uses every projection
        return self.wo(self.wq(x) * self.wk(x) + self.wv(x))


class Block(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.norm1 = nn.LayerNorm(n_embd)
        self.attn = Attn(n_embd)
        self.norm2 = nn.RMSNorm(n_embd)
        self.ffn = nn.MLP(n_embd, 4 * n_embd)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab=11, n_embd=8, n_layer=2, tie=True):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, n_embd)
        self.blocks = nn.ModuleList([Block(n_embd) for _ in range(n_layer)])
        self.norm_f = nn.LayerNorm(n_embd, bias=False)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        if tie:
            self.lm_head.weight = self.tok_emb.weight  # tied, as GPT-2

    def forward(self, ids):
        x = self.tok_emb(ids)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm_f(x))


BLOCK_NAMES = [
    "norm1.weight",
    "norm1.bias",
    "attn.wq.weight",
    "attn.wk.weight",
    "attn.wv.weight",
    "attn.wo.weight",
    "norm2.weight",
    "ffn.w1.weight",
    "ffn.w1.bias",
    "ffn.w2.weight",
    "ffn.w2.bias",
]


# ---- gradchecks: every layer, w.r.t. its input and every parameter ----------------------------
def check_module(module, x, name):
    """Gradcheck ``module`` in float64 w.r.t. x (if it requires grad) and all its parameters."""
    module.double()
    params = module.parameters()
    assert params, f"{name} has no parameters to check"
    assert mg.gradcheck(lambda x, *ps: module(x), x, *params, name=name)


def randn64(rng, *shape, requires_grad=True):
    return mg.tensor(rng.standard_normal(shape), requires_grad=requires_grad)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(4,), (3, 4), (2, 3, 4)])
def test_linear_gradcheck(rng, bias, shape):
    layer = nn.Linear(4, 3, bias=bias, rng=rng)
    check_module(layer, randn64(rng, *shape), f"Linear(bias={bias}) on {shape}")


def test_embedding_gradcheck(rng):
    layer = nn.Embedding(5, 3, rng=rng)
    ids = mg.tensor(np.array([[0, 4, 4], [2, 0, 1]]))  # repeated ids: their gradients add
    check_module(layer, ids, "Embedding")


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_gradcheck(rng, bias):
    layer = nn.LayerNorm(5, bias=bias)
    layer.weight.data[:] = rng.standard_normal(5)  # not ones: a gain that matters
    if bias:
        layer.bias.data[:] = rng.standard_normal(5)
    check_module(layer, randn64(rng, 2, 3, 5), f"LayerNorm(bias={bias})")


def test_rms_norm_gradcheck(rng):
    layer = nn.RMSNorm(5)
    layer.weight.data[:] = rng.standard_normal(5)
    check_module(layer, randn64(rng, 2, 3, 5), "RMSNorm")


def test_mlp_gradcheck(rng):
    check_module(nn.MLP(4, 6, rng=rng), randn64(rng, 2, 3, 4), "MLP")


def test_swiglu_gradcheck(rng):
    check_module(nn.SwiGLU(4, 6, bias=True, rng=rng), randn64(rng, 2, 3, 4), "SwiGLU")


@pytest.mark.parametrize("layer", [nn.GELU("tanh"), nn.GELU("none"), nn.SiLU()], ids=repr)
def test_activation_gradcheck(rng, layer):
    assert mg.gradcheck(layer, randn64(rng, 3, 4), name=repr(layer))


# ---- layer behaviour --------------------------------------------------------------------------
def test_linear_init_follows_gpt2():
    mg.manual_seed(0)
    layer = nn.Linear(256, 512)
    assert layer.weight.shape == (512, 256) and layer.weight.dtype == np.float32
    assert abs(layer.weight.numpy().std() - 0.02) < 1e-3
    assert not layer.bias.numpy().any()
    assert abs(nn.Linear(256, 512, init_std=0.1).weight.numpy().std() - 0.1) < 5e-3


def test_linear_computes_x_wt_plus_b(rng):
    layer = nn.Linear(4, 3)
    layer.bias.data[:] = rng.standard_normal(3)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    want = x @ layer.weight.numpy().T + layer.bias.numpy()
    np.testing.assert_allclose(layer(mg.tensor(x)).numpy(), want, rtol=1e-6)


def test_seed_rebuilds_the_same_model():
    mg.manual_seed(3)
    a = TinyLM().state_dict()
    mg.manual_seed(3)
    b = TinyLM().state_dict()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    mg.manual_seed(4)
    assert not np.array_equal(TinyLM().state_dict()["tok_emb.weight"], a["tok_emb.weight"])


def test_dropout_train_and_eval(rng):
    drop = nn.Dropout(0.5)
    x = mg.ones(100, 100)
    y = drop(x).numpy()
    assert 0.45 < (y == 0).mean() < 0.55  # about half dropped
    assert set(np.unique(y)) == {0.0, 2.0}  # survivors scaled by 1 / (1 - p)
    assert drop.eval()(x) is x  # the identity in eval mode
    assert (nn.Dropout(1.0)(x).numpy() == 0).all()  # every element dropped, as torch
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        nn.Dropout(1.5)


def test_dropout_masks_follow_the_global_seed():
    x = mg.ones(50)
    mg.manual_seed(7)
    a = nn.Dropout(0.5)(x).numpy()
    mg.manual_seed(7)
    b = nn.Dropout(0.5)(x).numpy()
    np.testing.assert_array_equal(a, b)


# ---- walking the tree -------------------------------------------------------------------------
def test_named_parameters_dotted_and_ordered():
    names = [name for name, _ in TinyLM(tie=False).named_parameters()]
    want = (
        ["tok_emb.weight"]
        + [f"blocks.{i}.{n}" for i in range(2) for n in BLOCK_NAMES]
        + ["norm_f.weight", "lm_head.weight"]
    )
    assert names == want


def test_order_is_assignment_order_not_alphabetical():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.z = nn.Linear(2, 2)
            self.a = nn.Linear(2, 2)

    assert [n for n, _ in M().named_parameters()] == ["z.weight", "z.bias", "a.weight", "a.bias"]


def test_tied_parameter_listed_and_counted_once():
    model = TinyLM(vocab=11, n_embd=8)
    names = [name for name, _ in model.named_parameters()]
    assert "tok_emb.weight" in names and "lm_head.weight" not in names
    untied = TinyLM(vocab=11, n_embd=8, tie=False)
    assert untied.num_parameters() - model.num_parameters() == 11 * 8


def test_named_modules_and_children():
    model = TinyLM()
    names = [name for name, _ in model.named_modules()]
    assert names[:4] == ["", "tok_emb", "blocks", "blocks.0"]
    assert "blocks.1.attn.wq" in names and "blocks.1.ffn.dropout" in names
    assert [type(m).__name__ for m in model.children()] == [
        "Embedding",
        "ModuleList",
        "LayerNorm",
        "Linear",
    ]


def test_plain_list_of_modules_is_refused():
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = [nn.Linear(2, 2), nn.Linear(2, 2)]

    with pytest.raises(TypeError, match=r"self.layers = ModuleList\(...\)"):
        Bad()
    with pytest.raises(TypeError, match="ModuleDict"):
        nn.Module().__setattr__("heads", {"a": nn.Linear(2, 2)})


def test_forgetting_super_init_is_explained():
    class Bad(nn.Module):
        def __init__(self):
            self.w = nn.Linear(2, 2)

    with pytest.raises(AttributeError, match=r"call super\(\).__init__\(\) first in Bad"):
        Bad()


def test_containers():
    layers = nn.ModuleList([nn.Linear(2, 3), nn.Linear(3, 4)])
    assert len(layers) == 2 and layers[1].out_features == 4
    assert isinstance(layers[:1], nn.ModuleList) and len(layers[:1]) == 1
    seq = nn.Sequential(nn.Linear(2, 3), nn.GELU(), nn.Linear(3, 4))
    x = mg.randn(5, 2)
    np.testing.assert_array_equal(seq(x).numpy(), seq[2](seq[1](seq[0](x))).numpy())
    heads = nn.ModuleDict({"a": nn.Linear(2, 2)})
    heads["b"] = nn.Linear(2, 3)
    assert heads.keys() == ["a", "b"] and "b" in heads
    assert [n for n, _ in heads.named_parameters()] == ["a.weight", "a.bias", "b.weight", "b.bias"]
    with pytest.raises(KeyError, match="without '.'"):
        heads["x.y"] = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="expected a Module, got int"):
        layers.append(3)


def test_parameter():
    p = nn.Parameter(np.zeros((2, 2), dtype=np.float32))
    assert p.requires_grad and isinstance(p, mg.Tensor)
    assert repr(p).startswith("Parameter([[0., 0.],")
    with pytest.raises(TypeError, match="must be floating point"):
        nn.Parameter(np.zeros(3, dtype=np.int64))


def test_train_and_eval_recurse():
    model = TinyLM()
    assert all(m.training for m in model.modules())
    assert model.eval() is model
    assert not any(m.training for m in model.modules())
    model.train()
    assert all(m.training for m in model.modules())


def test_repr_is_nested_and_readable():
    block = Block(8)
    want = """Block(
  (norm1): LayerNorm(8, eps=1e-05, bias=True)
  (attn): Attn(
    (wq): Linear(in=8, out=8, bias=False)
    (wk): Linear(in=8, out=8, bias=False)
    (wv): Linear(in=8, out=8, bias=False)
    (wo): Linear(in=8, out=8, bias=False)
  )
  (norm2): RMSNorm(8, eps=1e-06)
  (ffn): MLP(
    (w1): Linear(in=8, out=32, bias=True)
    (act): GELU(approximate='tanh')
    (w2): Linear(in=32, out=8, bias=True)
    (dropout): Dropout(p=0.0)
  )
)"""
    assert repr(block) == want


def test_freezing_excludes_from_training_groups():
    model = TinyLM(tie=False)
    model.blocks[0].requires_grad_(False)
    frozen = {id(p) for p in model.blocks[0].parameters()}
    groups = param_groups_for_decay(model, 0.1)
    in_groups = [p for g in groups for p in g["params"]]
    assert not frozen & {id(p) for p in in_groups}
    assert len(in_groups) == len(model.parameters()) - len(frozen)
    assert model.num_parameters(trainable_only=True) == model.num_parameters() - sum(
        p.size for p in model.blocks[0].parameters()
    )
    # a frozen parameter gets no gradient, so an optimiser skips it
    model(mg.tensor(np.array([[1, 2, 3]]))).sum().backward()
    assert all(p.grad is None for p in model.blocks[0].parameters())
    assert model.blocks[1].attn.wq.weight.grad is not None


def test_zero_grad():
    model = TinyLM()
    model(mg.tensor(np.array([[1, 2]]))).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_double_converts_parameters_and_float_buffers():
    model = TinyLM()
    model.register_buffer("table", np.ones(3, dtype=np.float32))
    model.register_buffer("ids", np.arange(3))
    model.double()
    assert all(p.dtype == np.float64 for p in model.parameters())
    assert model.table.dtype == np.float64 and model.ids.dtype == np.int64
    assert model(mg.tensor(np.array([[1, 2]]))).dtype == np.float64
    assert model.float().tok_emb.weight.dtype == np.float32


def test_to_cpu_and_bad_device():
    model = TinyLM()
    weight = model.tok_emb.weight
    assert model.to("cpu") is model and model.tok_emb.weight is weight
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        model.to("tpu")


def test_to_cuda_moves_parameters_and_buffers(device):
    model = TinyLM()
    model.register_buffer("table", np.ones(3, dtype=np.float32))
    weight = model.tok_emb.weight
    model.to(device)
    assert model.tok_emb.weight is weight  # in place: an optimiser's references stay valid
    assert {p.device for p in model.parameters()} == {device}
    assert model.table.device == device
    ids = mg.tensor(np.array([[1, 2]]), device=device)
    assert model(ids).device == device
    assert model.to("cpu").state_dict()["tok_emb.weight"].dtype == np.float32


# ---- buffers and state dicts ------------------------------------------------------------------
def test_buffers_persistent_and_not():
    model = TinyLM()
    model.blocks[0].register_buffer("cos", np.ones(4, dtype=np.float32))  # like a RoPE table
    model.blocks[1].register_buffer("step", np.zeros(1, dtype=np.float32), persistent=True)
    assert [n for n, _ in model.named_buffers()] == ["blocks.0.cos", "blocks.1.step"]
    state = model.state_dict()
    assert "blocks.1.step" in state and "blocks.0.cos" not in state
    assert "blocks.0.cos" not in [n for n, _ in model.named_parameters()]
    with pytest.raises(TypeError, match="a Parameter cannot also be a buffer"):
        model.register_buffer("w", nn.Parameter(np.ones(2, dtype=np.float32)))


def test_state_dict_is_a_copy():
    model = TinyLM()
    state = model.state_dict()
    state["tok_emb.weight"][:] = 0
    assert model.tok_emb.weight.numpy().any()


def test_state_dict_round_trip_through_safetensors(tmp_path):
    mg.manual_seed(0)
    model = TinyLM()
    path = tmp_path / "model.safetensors"
    save_safetensors(path, model.state_dict(), {"note": "tiny"})
    mg.manual_seed(1)
    other = TinyLM()
    ids = mg.tensor(np.array([[1, 5, 3, 2]]))
    assert not np.allclose(other(ids).numpy(), model(ids).numpy())
    arrays, meta = load_safetensors(path)
    weight = other.tok_emb.weight
    other.load_state_dict(arrays)
    assert other.tok_emb.weight is weight and other.lm_head.weight is weight  # still tied
    np.testing.assert_array_equal(other(ids).numpy(), model(ids).numpy())
    assert meta == {"note": "tiny"}


def test_load_state_dict_errors_name_the_keys_and_shapes():
    model = TinyLM()
    state = model.state_dict()
    before = model.state_dict()

    missing = {k: v for k, v in state.items() if k != "norm_f.weight"}
    with pytest.raises(KeyError, match=r"missing keys \['norm_f.weight'\]"):
        model.load_state_dict(missing)

    extra = {**state, "blocks.2.attn.wq.weight": np.zeros((8, 8))}
    with pytest.raises(KeyError, match=r"unexpected keys \['blocks.2.attn.wq.weight'\]"):
        model.load_state_dict(extra)

    wrong = {
        **state,
        "blocks.0.ffn.w1.weight": np.zeros((16, 8)),
        "tok_emb.weight": state["tok_emb.weight"] + 1,
    }
    msg = r"'blocks.0.ffn.w1.weight' has shape \(16, 8\) in the state dict but \(32, 8\) in the"
    with pytest.raises(ValueError, match=msg):
        model.load_state_dict(wrong)
    after = model.state_dict()  # checked before copying: a failed load changes nothing
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_load_state_dict_non_strict_reports_and_loads_the_rest():
    model = TinyLM()
    state = {"norm_f.weight": np.full(8, 3.0), "head.extra": np.zeros(2)}
    result = model.load_state_dict(state, strict=False)
    assert result.unexpected_keys == ["head.extra"]
    assert "tok_emb.weight" in result.missing_keys and "norm_f.weight" not in result.missing_keys
    np.testing.assert_array_equal(model.norm_f.weight.numpy(), np.full(8, 3.0, np.float32))


def test_load_accepts_a_tied_weight_under_either_name():
    model = TinyLM()
    state = model.state_dict()
    weight = state.pop("tok_emb.weight")
    state["lm_head.weight"] = weight * 2  # torch's state dicts list a tied weight twice
    model.load_state_dict(state)
    np.testing.assert_array_equal(model.tok_emb.weight.numpy(), weight * 2)
