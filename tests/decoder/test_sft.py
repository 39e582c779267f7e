"""Supervised fine-tuning: the chat template and its tokens, the masked loss and padding, the
generated and imported data, exact resume of decoder.sft, and its command-line errors."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import minigrad as mg
from decoder.model.config import ModelConfig
from decoder.model.model import IGNORE_INDEX, Decoder
from decoder.post.chat import (
    CHAT_TOKENS,
    END,
    add_chat_tokens,
    chat_tokenizer,
    encode_pair,
    pad_batch,
)
from decoder.post.instruct_data import (
    ChatDataset,
    generated,
    make_instructions,
    make_preferences,
    read_jsonl,
    speeches,
)
from decoder.post.sft import sft
from decoder.sft import main
from decoder.text.bpe import BPETokenizer
from decoder.text.tokenizer import CharTokenizer, tokenizer_from_dict
from decoder.training.checkpoint import save_checkpoint
from decoder.training.config import TrainConfig
from decoder.training.log import read_log
from decoder.training.step import lm_loss
from tests.support.numerics import assert_close

SPEAKERS = ("ROMEO", "JULIET", "NURSE", "TYBALT")
LINES = (
    "but soft what light now",
    "it is the east now",
    "ay me good night now",
    "o speak again now",
    "the nurse is here now",
    "good morrow cousin now",
)
# the letters of the templates ("Who speaks the line", "Continue the speech of") and more
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz:?,.'\n\n"


def play_text(n_speeches: int = 160) -> str:
    """A small play in tiny Shakespeare's layout: "NAME:", then two lines, then a blank."""
    parts = [ALPHABET]
    for i in range(n_speeches):
        first, second = LINES[(3 * i + i // 4) % 6], LINES[(5 * i + 1) % 6]
        parts.append(f"{SPEAKERS[i % 4]}:\n{first}\n{second}.\n\n")
    return "".join(parts)


TEXT = play_text()
SHORT = {"max_iters": "6", "warmup_iters": "1", "eval_interval": "3", "eval_iters": "2"}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(tmp_path / "cache"))  # keep files out of ~


def make_base(path, text: str = TEXT, dropout: float = 0.1) -> None:
    """A small untrained checkpoint with a char tokenizer of ``text`` (no training: seconds)."""
    tokenizer = CharTokenizer.from_text(text)
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size, block_size=64, n_layer=1, n_head=2, n_embd=16,
        dropout=dropout,
    )  # fmt: skip
    mg.manual_seed(0)
    model = Decoder(config)
    save_checkpoint(
        path,
        step=0,
        model_state=model.state_dict(),
        model_config=config,
        train_config=TrainConfig(batch_size=4, max_iters=1, warmup_iters=0),
        tokenizer=tokenizer.to_dict(),
    )


@pytest.fixture
def base(tmp_path):
    make_base(tmp_path / "base")
    return tmp_path / "base"


# ---- the template and its tokens ----------------------------------------------------------------
def test_char_tokenizer_gains_the_chat_tokens_after_its_ids():
    tok = CharTokenizer.from_text("abc")
    chat = chat_tokenizer(tok)
    assert [chat.special_tokens[t] for t in CHAT_TOKENS] == [3, 4, 5]
    assert chat.encode("cab") == tok.encode("cab") and chat.vocab_size == 6
    assert chat_tokenizer(chat) is chat  # once
    again = tokenizer_from_dict(json.loads(json.dumps(chat.to_dict())))
    assert again.special_tokens == chat.special_tokens and again.decode([0, 5]) == "a<|end|>"


def test_bpe_chat_tokens_stay_servable_by_tiktoken():
    tok = chat_tokenizer(BPETokenizer.train("to be or not to be " * 20, vocab_size=262))
    ids, n_prompt = encode_pair(tok, "to be", "or not")
    text = tok.decode(ids)
    assert text == "<|user|>to be<|assistant|>or not<|end|>"
    assert tok.to_tiktoken().encode(text, allowed_special="all") == ids
    assert tok.encode(text, allowed_special="all") == ids
    assert ids[n_prompt - 1] == tok.special_tokens["<|assistant|>"]


def test_gpt2_tokenizer_is_refused_with_the_fix():
    class Pretrained:
        special_tokens = {"<|endoftext|>": 50256}

        def to_dict(self):
            return {"type": "tiktoken", "name": "gpt2"}

    with pytest.raises(ValueError, match="--tokenizer=char or --tokenizer=bpe"):
        chat_tokenizer(Pretrained())


@pytest.mark.summation_order
def test_new_rows_leave_the_old_logits_unchanged():
    mg.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=7, block_size=8, n_layer=1, n_head=2, n_embd=8))
    grown = add_chat_tokens(model, 10, seed=1)
    grown_state = grown.state_dict()
    for name, value in model.state_dict().items():  # copied: the old rows to the bit
        np.testing.assert_array_equal(grown_state[name][: len(value)], value, err_msg=name)
    ids = np.array([[1, 2, 6, 0]])
    old, _ = model(ids)
    new, _ = grown(ids)
    assert new.shape == (1, 4, 10)
    # a (4, 8) @ (8, 10) product against a (4, 8) @ (8, 7) one: BLAS may sum them otherwise
    assert_close(new.numpy()[..., :7], old.numpy())
    assert grown.lm_head.weight is grown.tok_emb.weight  # still tied


# ---- the masked loss and padding ----------------------------------------------------------------
def test_pad_batch_ignores_the_prompt_and_the_padding():
    x, y = pad_batch([([1, 2, 3, 4, 5], 3), ([1, 2, 3], 2)], pad_id=9)
    assert x.tolist() == [[1, 2, 3, 4], [1, 2, 9, 9]]
    assert y.tolist() == [[-100, -100, 4, 5], [-100, 3, -100, -100]]


def test_loss_is_the_mean_over_response_tokens_only(rng):
    mg.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=12, block_size=16, n_layer=1, n_head=2, n_embd=8))
    turns = [(list(rng.integers(0, 12, 9)), 4), (list(rng.integers(0, 12, 6)), 3)]
    x, y = pad_batch(turns, pad_id=0)
    loss = lm_loss(model, x, y).item()
    logits, _ = model(x)
    logp = logits.numpy() - np.log(np.exp(logits.numpy()).sum(-1, keepdims=True))
    picked = [-logp[b, t, y[b, t]] for b in range(2) for t in range(x.shape[1]) if y[b, t] >= 0]
    assert len(picked) == (9 - 4) + (6 - 3)  # the responses' tokens, <|end|> included
    np.testing.assert_allclose(loss, np.mean(picked), rtol=1e-5)
    # the prompt's targets take no part: changing them changes nothing
    x2 = x.copy()
    x2[0, 5:] = (x2[0, 5:] + 1) % 12  # what comes after the last kept target of row 1 ...
    assert lm_loss(model, x2[1:], y[1:]).item() == lm_loss(model, x[1:], y[1:]).item()


@pytest.mark.summation_order
def test_right_padding_changes_no_logit_of_a_row():
    """The causal mask is the attention mask: no real position sees a later pad (up to
    rounding: 2 rows of 8 tokens run other BLAS kernels than 1 row of 3)."""
    mg.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=12, block_size=16, n_layer=2, n_head=2, n_embd=8))
    short, long = ([3, 4, 5, 6], 2), ([1, 2, 3, 4, 5, 6, 7, 8, 9], 3)
    alone, _ = pad_batch([short], pad_id=0)
    padded, _ = pad_batch([short, long], pad_id=11)
    assert_close(model(padded)[0].numpy()[0, :3], model(alone)[0].numpy()[0])


# ---- the data -----------------------------------------------------------------------------------
def test_speeches_are_read_as_tiny_shakespeare_lays_them_out():
    assert speeches("A:\nx y\n\nnot a speech\n\nB C:\nz\n")[::1] == [("A", ["x y"]), ("B C", ["z"])]


def test_generated_examples_are_seeded_fit_and_are_cached(tmp_path):
    a = make_instructions(TEXT, 60, seed=3, context=64)
    assert a == make_instructions(TEXT, 60, seed=3, context=64)
    assert a != make_instructions(TEXT, 60, seed=4, context=64)
    assert {e["task"] for e in a} == {"speaker", "continue"}
    assert all(len(e["instruction"]) + len(e["response"]) + 3 <= 65 for e in a)
    speaker = [e for e in a if e["task"] == "speaker"]
    assert all(e["response"] in SPEAKERS and e["instruction"] in _questions() for e in speaker)
    cached = generated("sft", TEXT, 60, 3, 64, cache=tmp_path)
    assert cached == a
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".jsonl"]  # + its record


@pytest.mark.parametrize(
    "damage",
    [
        lambda lines: lines[: len(lines) // 3],  # cut at a line end: still valid JSONL
        lambda lines: [line.replace('"response": "', '"response": "x') for line in lines],
    ],
    ids=["cut", "edited"],
)
def test_a_damaged_instruction_cache_is_rebuilt(tmp_path, damage):
    made = generated("sft", TEXT, 60, 3, 64, cache=tmp_path)
    (path,) = tmp_path.glob("*.jsonl")
    path.write_text("".join(damage(path.read_text().splitlines(keepends=True))))
    with pytest.warns(UserWarning, match="instruction cache .*truncated or overwritten"):
        assert generated("sft", TEXT, 60, 3, 64, cache=tmp_path) == made
    assert generated("sft", TEXT, 60, 3, 64, cache=tmp_path) == made  # rebuilt, trusted again


def test_jsonl_strings_may_hold_unicode_line_separators(tmp_path):
    rows = [
        {"instruction": "a\u2028b", "response": "c\x85d"},
        {"instruction": "e", "response": "f"},
    ]
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    assert read_jsonl(path, "sft") == rows


def _questions() -> set[str]:
    return {f"Who speaks the line: {line}" for line in LINES} | {
        f"Who speaks the line: {line}." for line in LINES
    }


def test_preference_pairs_reject_a_wrong_continuation():
    pairs = make_preferences(TEXT, 40, seed=0, context=64)
    assert len(pairs) == 40
    for p in pairs:
        assert p["chosen"] != p["rejected"]
        assert p["prompt"].startswith("Continue the speech of ")
        shuffled = sorted(p["chosen"].split()) == sorted(p["rejected"].split())
        assert shuffled or any(line.endswith(p["rejected"]) for line in TEXT.splitlines())


def test_a_text_without_speeches_is_refused(tmp_path):
    with pytest.raises(ValueError, match="needs speeches"):
        generated("sft", "no speeches here", 10, 0, 64, cache=tmp_path)


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("{not json", "line 2: not JSON"),
        ("[1, 2]", "line 2: a list, not an object"),
        ('{"instruction": "q"}', r"line 2: no \['response'\]"),
        ('{"instruction": "q", "response": ""}', "line 2: 'response' must be a non-empty"),
        ('{"instruction": 3, "response": "a"}', "line 2: 'instruction' must be a non-empty"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path, line, match):
    path = tmp_path / "data.jsonl"
    path.write_text('{"instruction": "q", "response": "a", "extra": 1}\n' + line + "\n")
    with pytest.raises(ValueError, match=match):
        read_jsonl(path, "sft")


def test_jsonl_reads_both_formats(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n\n')
    assert read_jsonl(path, "dpo") == [{"prompt": "p", "chosen": "a", "rejected": "b"}]
    with pytest.raises(ValueError, match=r"no \['instruction', 'response'\]"):
        read_jsonl(path, "sft")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no examples"):
        read_jsonl(tmp_path / "empty.jsonl", "sft")


def test_dataset_holds_out_the_end_and_drops_what_does_not_fit():
    tok = chat_tokenizer(CharTokenizer.from_text(ALPHABET))
    examples = [{"instruction": "ab", "response": "c" * n} for n in range(1, 22)]
    data = ChatDataset(examples, tok, block_size=16)  # a turn holds n + 5 tokens
    assert data.dropped == 9  # n = 13..21
    assert [len(e["response"]) for e in data.examples["val"]] == [11, 12]
    x, y = data.get_batch("val", 3, 16, np.random.default_rng(0))
    assert x.shape == y.shape and x.shape[1] <= 16
    assert (
        (y[y >= 0] == np.array(tok.encode("c") + [tok.special_tokens[END]])[:, None]).any(0).all()
    )
    assert (y == IGNORE_INDEX).sum() > 0


def test_vocabulary_errors_name_the_example():
    tok = chat_tokenizer(CharTokenizer.from_text("abc"))
    with pytest.raises(ValueError, match="example 1 .*'z'.*base model's vocabulary"):
        ChatDataset(
            [{"instruction": "a", "response": "b"}, {"instruction": "z", "response": "a"}], tok, 16
        )


# ---- the run ------------------------------------------------------------------------------------
def test_resume_repeats_the_uninterrupted_run(base, tmp_path, monkeypatch):
    monkeypatch.setattr("decoder.training.loop.plot_losses", lambda *a, **k: None)  # seconds each
    kw = dict(n_examples=120, overrides={**SHORT, "batch_size": "4"}, text=TEXT, progress=False)
    whole = sft(base, tmp_path / "whole", **kw)
    sft(base, tmp_path / "split", until=4, **kw)
    rest = sft(None, tmp_path / "split", resume=True, **kw)
    assert whole["step"] == rest["step"] == 6
    log_whole, log_split = read_log(tmp_path / "whole"), read_log(tmp_path / "split")
    assert [r["step"] for r in log_whole] == [0, 3, 6]
    for a, b in zip(log_whole, log_split, strict=True):
        assert (a["train_loss"], a["val_loss"], a["exact_match"]) == (
            b["train_loss"], b["val_loss"], b["exact_match"]
        )  # fmt: skip


def test_lora_trains_adapters_and_the_embedding(base, tmp_path):
    out = sft(
        base, tmp_path / "lora", n_examples=120, overrides={**SHORT, "max_iters": "2"},
        lora={"r": 2, "alpha": 4.0, "targets": ["wq", "wv"]}, text=TEXT, progress=False,
    )  # fmt: skip
    assert out["step"] == 2
    assert (tmp_path / "lora" / "loss.png").stat().st_size > 0
    from decoder.post.posttrain import load_post_model

    model, tok, _ = load_post_model(tmp_path / "lora")  # merged back into a plain Decoder
    assert model.config.vocab_size == tok.vocab_size == CharTokenizer.from_text(TEXT).vocab_size + 3


def test_cli_errors(base, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "x")])  # no --checkpoint
    assert "--checkpoint" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "a"}\n')
    assert main(["--checkpoint", str(base), "--out", str(tmp_path / "y"), "--data", str(bad)]) == 2
    assert "line 1: no ['response']" in capsys.readouterr().err
    assert main(["--checkpoint", str(base), "--out", str(tmp_path / "z"), "--n_layer=3"]) == 2
    assert "keeps its base model's shape" in capsys.readouterr().err
    assert main(["--out", str(tmp_path / "none"), "--resume"]) == 2
    assert "no checkpoint to resume from" in capsys.readouterr().err


@pytest.mark.parametrize(
    "lora, options, named",
    [
        (None, ["--lora-r", "4"], r"r: 0 -> 4"),
        (
            {"r": 2, "alpha": 4.0, "targets": ["wq", "wv"]},
            ["--targets", "wq"],
            r"targets: \['wq', 'wv'\] -> \['wq'\]",
        ),
        ({"r": 2, "alpha": 4.0, "targets": ["wq", "wv"]}, ["--lora-r", "3"], "r: 2 -> 3"),
    ],
)
def test_a_resume_refuses_other_adapters_by_name(base, tmp_path, capsys, lora, options, named):
    kw = dict(n_examples=120, overrides={**SHORT, "max_iters": "4"}, text=TEXT, progress=False)
    sft(base, tmp_path / "run", lora=lora, until=2, **kw)
    capsys.readouterr()
    assert main(["--out", str(tmp_path / "run"), "--resume", *options]) == 2
    err = capsys.readouterr().err
    assert "a resume cannot change the LoRA adapters" in err
    assert re.search(named, err), err


class _Oracle:
    """A model that predicts, after any prefix of one of ``turns``, that turn's next token (its
    logits one-hot): it answers every question of ``turns`` perfectly, however long the answer."""

    def __init__(self, turns, vocab_size):
        self.next = {tuple(t[: i + 1]): t[i + 1] for t in turns for i in range(len(t) - 1)}
        self.V, self.calls = vocab_size, 0

    def __call__(self, x):
        self.calls += 1
        B, T = x.shape
        logits = np.zeros((B, T, self.V))
        for b, t in np.ndindex(B, T):
            logits[b, t, self.next.get(tuple(x[b, : t + 1].tolist()), 0)] = 1.0
        return mg.Tensor(logits), None

    def generate(self, prompt, max_new_tokens, temperature, stop_token):  # greedy, as respond's
        ids = list(prompt)
        while len(ids) - len(prompt) < max_new_tokens and tuple(ids) in self.next:
            ids.append(self.next[tuple(ids)])
            if ids[-1] == stop_token:
                break
        return ids[len(prompt) :]


def test_exact_match_scores_long_answers_in_a_pass_per_batch():
    from decoder.post.sft import EXACT_BATCH, exact_match

    tok = chat_tokenizer(CharTokenizer.from_text("abcdefgh "))
    answers = ["abc " * 10, "h", "gfe dcba " * 5] * 20  # 40 and 45 characters: past 24
    examples = [
        {"instruction": "ab"[i % 2] * (1 + i), "response": r} for i, r in enumerate(answers)
    ]
    oracle = _Oracle([encode_pair(tok, e["instruction"], e["response"])[0] for e in examples], 12)
    assert exact_match(oracle, tok, examples) == 1.0
    assert oracle.calls == -(-len(examples) // EXACT_BATCH)  # not a pass per answer token
    wrong = [{**examples[0], "response": examples[0]["response"][:-1] + "a"}, examples[1]]
    assert exact_match(oracle, tok, wrong) == 0.5  # the last character of the first is wrong


def test_a_resume_names_a_new_lr_and_the_schedule_it_gives(base, tmp_path, capsys):
    kw = dict(n_examples=120, text=TEXT)
    sft(base, tmp_path / "run", overrides=SHORT, until=2, progress=False, **kw)
    longer = {**SHORT, "lr": "1e-3", "max_iters": "8"}
    assert sft(None, tmp_path / "run", overrides=longer, resume=True, **kw)["step"] == 8
    out = capsys.readouterr().out
    assert "resuming with changed settings: max_iters: 6 -> 8; lr: 0.0003 -> 0.001" in out
    assert "at step 3, cosine decay to min_lr=3e-05 at step 8, to step 8" in out
