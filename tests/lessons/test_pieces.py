"""The capstone's pieces: what ``check`` records, what ``pieces.load`` gives back, and the model
and optimiser built from them.

A notebook cell is imitated by ``notebook``: source run as module ``__main__`` from a file, so
``inspect`` reads it back as it does a Jupyter cell.
"""

from __future__ import annotations

import doctest
import os
import sys
import textwrap

import numpy as np
import pieces
import pytest
from exercises import check, run_check, solution

import minigrad as mg
from decoder.model.config import ModelConfig
from decoder.model.model import Decoder
from minigrad.optim import AdamW, clip_grad_norm_


@pytest.fixture(autouse=True)
def mine(tmp_path, monkeypatch):
    """Recorded answers go to a fresh folder, and nothing is remembered between tests."""
    folder = tmp_path / "mine"
    monkeypatch.setattr(pieces, "MINE", folder)
    monkeypatch.setattr(pieces, "WHOSE", {})
    monkeypatch.setattr(pieces, "_LOADED", {})
    return folder


def notebook(tmp_path, source: str) -> dict:
    """Run ``source`` as a notebook cell runs: in module ``__main__``, from a readable file."""
    path = tmp_path / f"cell{len(list(tmp_path.glob('cell*.py')))}.py"
    source = textwrap.dedent(source)
    path.write_text(source)
    namespace = {"__name__": "__main__"}
    exec(compile(source, str(path), "exec"), namespace)
    return namespace


MY_BACKWARDS = """
    import numpy as np
    from exercises import check

    SCALE = 1.0  # a constant the answer reads


    def _row_sums(a):  # a helper the answer calls
        return a.sum(axis=-1, keepdims=True)


    def softmax_backward(p, grad_p):
        # mine, not the solution's
        return SCALE * p * (grad_p - _row_sums(p * grad_p))


    def matmul_backward(x, w, grad_out):
        # mine, not the solution's
        return grad_out @ w.T, x.T @ grad_out


    check("lesson02", "softmax_backward", softmax_backward)
    check("lesson01", "matmul_backward", matmul_backward)
"""


def calls_into(folder, fn):
    """How many calls ``fn()`` makes into functions whose source is under ``folder``."""
    count = 0
    previous = sys.getprofile()

    def profile(frame, event, arg):
        nonlocal count
        if event == "call" and frame.f_code.co_filename.startswith(str(folder)):
            count += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(previous)
    return count


def test_an_answer_that_passes_is_recorded_loaded_and_used(tmp_path, mine, capsys):
    notebook(tmp_path, MY_BACKWARDS)
    assert "Saved to mine/lesson02_softmax_backward.py" in capsys.readouterr().out
    recorded = (mine / "lesson02_softmax_backward.py").read_text()
    assert "# mine" in recorded and "def _row_sums" in recorded and "SCALE = 1.0" in recorded

    loaded = pieces.load("lesson02", "softmax_backward")
    assert loaded is not solution("lesson02", "softmax_backward")
    assert loaded.__code__.co_filename == str(mine / "lesson02_softmax_backward.py")
    assert pieces.WHOSE["lesson02", "softmax_backward"] == "yours"
    run_check("lesson02", "softmax_backward", loaded)  # it works outside its notebook

    mg.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
    pieces.assemble(model, quiet=True)
    assert model.lm_head.matmul_backward is pieces.load("lesson01", "matmul_backward")
    ids = np.arange(16).reshape(2, 8) % 11

    def step():
        _, loss = model(ids, (ids + 1) % 11)
        loss.backward()

    assert calls_into(mine, step) > 0, "the model's backward never ran the recorded answers"
    assert pieces.WHOSE["lesson05", "causal_attention"] == "solution: not written yet"
    pieces.report()
    table = capsys.readouterr().out
    assert "lesson01 matmul_backward" in table and "2 of 5 pieces are yours" in table


def test_a_stub_is_not_recorded(tmp_path, mine, capsys):
    notebook(
        tmp_path,
        """
        from exercises import check, todo

        def softmax_backward(p, grad_p):
            todo()

        check("lesson02", "softmax_backward", softmax_backward)
        """,
    )
    assert "not attempted" in capsys.readouterr().out
    assert not mine.exists() or not list(mine.iterdir())
    assert pieces.load("lesson02", "softmax_backward") is solution("lesson02", "softmax_backward")
    assert pieces.WHOSE["lesson02", "softmax_backward"] == "solution: not written yet"


def test_a_wrong_answer_is_not_recorded(tmp_path, mine):
    with pytest.raises(AssertionError):
        notebook(
            tmp_path,
            """
            from exercises import check

            def softmax_backward(p, grad_p):
                return p * grad_p  # the diagonal only

            check("lesson02", "softmax_backward", softmax_backward)
            """,
        )
    assert not (mine / "lesson02_softmax_backward.py").exists()


def test_solutions_and_answers_outside_a_notebook_are_never_recorded(mine, capsys):
    check("lesson08", "warmup_cosine", solution("lesson08", "warmup_cosine"))

    def clip_by_global_norm(grads, max_norm):  # right, but written in this test file
        norm = float(np.sqrt(sum(np.sum(g * g) for g in grads)))
        return [g * min(1.0, max_norm / (norm + 1e-6)) for g in grads], norm

    check("lesson08", "clip_by_global_norm", clip_by_global_norm)
    assert capsys.readouterr().out.count("correct.") == 2
    assert not mine.exists() or not list(mine.iterdir())


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("def softmax_backward(p, grad_p)\n    return p\n", "SyntaxError"),
        ("ANSWER = undefined_name\n", "NameError"),
        (
            "def softmax_backward(p, grad_p):\n    return p * grad_p\n\n"
            "ANSWER = softmax_backward\n",
            "AssertionError",
        ),
    ],
    ids=["syntax", "name", "fails its check"],
)
def test_a_piece_that_fails_to_load_falls_back_with_a_note(mine, capsys, text, why):
    mine.mkdir()
    (mine / "lesson02_softmax_backward.py").write_text("import numpy as np\n\n" + text)
    assert pieces.load("lesson02", "softmax_backward") is solution("lesson02", "softmax_backward")
    assert pieces.WHOSE["lesson02", "softmax_backward"].startswith("solution: yours did not load")
    assert why in pieces.WHOSE["lesson02", "softmax_backward"]
    assert "did not load" in capsys.readouterr().out


def test_an_answer_may_not_reach_the_solutions_through_pieces(tmp_path):
    with pytest.raises(AssertionError, match=r"called pieces\.load, which is off limits"):
        notebook(
            tmp_path,
            """
            import pieces
            from exercises import check

            def warmup_cosine(step, max_lr, min_lr, warmup_steps, decay_steps):
                return pieces.load("lesson08", "warmup_cosine")(
                    step, max_lr, min_lr, warmup_steps, decay_steps
                )

            check("lesson08", "warmup_cosine", warmup_cosine)
            """,
        )


def test_the_assembled_model_equals_the_library():
    g = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))
    n_head = int(g.choice([1, 2, 4]))
    config = ModelConfig(
        vocab_size=int(g.integers(5, 40)),
        block_size=16,
        n_layer=int(g.integers(1, 3)),
        n_head=n_head,
        n_embd=8 * n_head * int(g.integers(1, 3)),
    )
    B, T = int(g.integers(1, 4)), int(g.integers(1, 17))
    ids = g.integers(0, config.vocab_size, size=(B, T))
    seed = int(g.integers(1000))
    mg.manual_seed(seed)
    library = Decoder(config)
    mg.manual_seed(seed)
    model = Decoder(config)
    pieces.assemble(model, quiet=True)
    want, want_loss = library(ids, np.roll(ids, -1, 1))
    got, loss = model(ids, np.roll(ids, -1, 1))
    where = f"{config}, batch {(B, T)}"
    assert np.allclose(got.numpy(), want.numpy(), atol=1e-5), f"logits differ: {where}"
    want_loss.backward()
    loss.backward()
    for (name, p), q in zip(library.named_parameters(), model.parameters(), strict=True):
        assert np.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), f"{name} grad differs: {where}"


def test_pieces_adamw_equals_adamw_after_clipping():
    g = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))
    shapes = [tuple(int(n) for n in g.integers(1, 5, size=g.integers(1, 3))) for _ in range(3)]
    start = [g.standard_normal(s).astype(np.float32) for s in shapes]
    mine = [mg.tensor(a.copy(), requires_grad=True) for a in start]
    library = [mg.tensor(a.copy(), requires_grad=True) for a in start]
    settings = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    opt_mine = pieces.PiecesAdamW(mine, grad_clip=0.5, **settings)
    opt_library = AdamW(library, **settings)
    for step in range(4):
        grads = [(3.0 * g.standard_normal(s)).astype(np.float32) for s in shapes]
        for p, q, grad in zip(mine, library, grads, strict=True):
            p.grad, q.grad = grad.copy(), grad.copy()
        opt_mine.step()
        clip_grad_norm_(library, 0.5)
        opt_library.step()
        for p, q in zip(mine, library, strict=True):
            assert np.allclose(p.numpy(), q.numpy(), atol=1e-6), f"step {step}, shapes {shapes}"


def test_the_examples_in_pieces_run():
    result = doctest.testmod(pieces, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def test_an_attribute_named_like_a_notebook_global_is_not_recorded_as_one(tmp_path, mine):
    """``layer.base`` reads an attribute, not the notebook's global ``base`` (a model there):
    only the names an answer loads as globals travel with it."""
    namespace = notebook(
        tmp_path,
        """
        import numpy as np
        from exercises import check

        base = object()  # lesson 15's notebook holds its base model under this name


        def merged_weight(layer):
            W = layer.base.weight.numpy()
            return W + layer.scale * (layer.A.numpy() @ layer.B.numpy()).T


        check("lesson15", "merged_weight", merged_weight)
        """,
    )
    assert (mine / "lesson15_merged_weight.py").is_file()
    assert "base" not in (mine / "lesson15_merged_weight.py").read_text().split("def ")[0]
    assert pieces.load("lesson15", "merged_weight").__name__ == namespace["merged_weight"].__name__
