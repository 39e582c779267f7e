"""Instruction and preference data: made from tiny Shakespeare, or read from JSONL files.

Two tasks are generated from the speeches of the text (``NAME:`` then its lines):

- ``speaker``: "Who speaks the line: Is't a verdict?" -> "First Citizen". One right answer,
  scored by exact match. The speakers are the text's most frequent (MAX_SPEAKERS of them), so
  the answer is a choice among a few names, told apart by what each says (whom they address,
  their words), the cues a small character-level model has already half learned while
  pretraining on the same text; and the format (a name, then ``<|end|>``) is learned at once.
- ``continue``: "Continue the speech of ROMEO: But soft," -> the rest of that line. Open-ended
  (many continuations are good), scored by loss, not exact match; it teaches the model to
  follow the instruction's speaker and opening words, which it already models as text.

Preference pairs ask the ``continue`` question; the chosen response is the true rest of the
line and the rejected one a plausible wrong one: alternately the rest of another speaker's
line, or the true rest with its words shuffled. Both are told apart by local coherence with
the opening words, which a model trained on the text scores already: DPO sharpens that.

Every example fits a context of ``context`` tokens for a character-level model (its text
and the chat template's three markers: decoder/post/chat.py), so the default suits
shakespeare-char's 64. Generation is deterministic in (text, n, seed, context) and cached as
JSONL under ``cache_dir() / "instruct"``, with the token cache's record of its count and SHA-256
beside it (decoder.text.data.read_cache_record): a cache cut short or edited is rebuilt.
Examples come grouped by speech, the speeches in a seeded random order, and the datasets hold
out the last VAL_FRACTION: so a held-out line is never trained on (but in the one speech the
boundary may cut), and every speaker is in both splits (the end of the text, as TokenDataset
holds out, is one play's cast alone).

Users bring their own data as JSONL, one object per line: ``{"instruction", "response"}`` for
SFT, ``{"prompt", "chosen", "rejected"}`` for DPO (the formats of Alpaca and of Anthropic's
HH / TRL); other keys are ignored, and a bad line is an error naming its line number.
Left out on purpose: multi-turn chats and system prompts (decoder/post/chat.py says why).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from decoder.post.chat import END, encode_pair, pad_batch
from decoder.text.data import VAL_FRACTION, cache_dir, read_cache_record, write_cache_record
from minigrad.fileio import atomic_write

FIELDS = {"sft": ("instruction", "response"), "dpo": ("prompt", "chosen", "rejected")}
MAX_SPEAKERS = 12  # the speaker task chooses among this many of the most frequent speakers
CHAT_MARKERS = 3  # <|user|>, <|assistant|>, <|end|>: one token each
INSTRUCT_CACHE_VERSION = 1  # part of the cache key: bump it when the generators change
SPEAKER_TASK = "speaker"
MAX_DRAWS = 20  # tries at another speaker's line that fits, before a pair is skipped


# ---- the speeches -------------------------------------------------------------------------------
def speeches(text: str) -> list[tuple[str, list[str]]]:
    """The (speaker, lines) of each speech: a block of lines whose first is "NAME:".

    >>> speeches("ROMEO:\\nBut soft,\\nwhat light.\\n\\nJULIET:\\nAy me!\\n")
    [('ROMEO', ['But soft,', 'what light.']), ('JULIET', ['Ay me!'])]
    """
    found = []
    for block in text.split("\n\n"):
        lines = [line.strip() for line in block.strip().split("\n")]
        if len(lines) > 1 and lines[0].endswith(":") and lines[0][:-1].strip():
            found.append((lines[0][:-1], [line for line in lines[1:] if line]))
    return found


def _fits(context: int, *texts: str) -> bool:
    """Whether the texts and the chat markers fit a context of ``context`` characters (a turn
    of L tokens is L - 1 inputs)."""
    return sum(map(len, texts)) + CHAT_MARKERS <= context + 1


def _continue_prompt(speaker: str, line: str) -> tuple[str, str] | None:
    """The continue-instruction for ``line`` and its answer, or None for a line too short."""
    words = line.split()
    if len(words) < 4:
        return None
    k = len(words) // 3  # the opening third of the words is given
    return f"Continue the speech of {speaker}: {' '.join(words[:k])}", " ".join(words[k:])


def make_instructions(text: str, n: int, seed: int, context: int) -> list[dict[str, str]]:
    """About ``n`` instruction pairs of the two tasks, half each where the text has them."""
    rng = np.random.default_rng(seed)
    talks = speeches(text)
    top = {s for s, _ in Counter(s for s, _ in talks).most_common(MAX_SPEAKERS)}
    speaker, cont = [], []
    for position, (who, lines) in enumerate(talks):
        for line in lines:
            question = f"Who speaks the line: {line}"
            if who in top and _fits(context, question, who):
                speaker.append((position, SPEAKER_TASK, question, who))
            pair = _continue_prompt(who, line)
            if pair and _fits(context, *pair):
                cont.append((position, "continue", *pair))
    chosen = _pick(rng, speaker, n // 2) + _pick(rng, cont, n - n // 2)
    rank = rng.permutation(len(talks))  # the speeches' order: the last ones are held out
    chosen.sort(key=lambda e: rank[e[0]])
    return [{"task": t, "instruction": q, "response": a} for _, t, q, a in chosen]


def make_preferences(text: str, n: int, seed: int, context: int) -> list[dict[str, str]]:
    """About ``n`` preference pairs: the continue-question, the true rest of the line, and
    a wrong rest (another speaker's, or the true words shuffled), alternately."""
    rng = np.random.default_rng(seed)
    items = []  # (position, speaker, prompt, rest)
    talks = speeches(text)
    for position, (who, lines) in enumerate(talks):
        for line in lines:
            pair = _continue_prompt(who, line)
            if pair:
                items.append((position, who, *pair))
    pairs = []
    for i, (position, who, prompt, rest) in enumerate(_pick(rng, items, len(items))):
        if i % 2:
            words = rest.split()
            order = rng.permutation(len(words))
            if (order == np.arange(len(words))).all():
                order = order[::-1]  # a shuffle that changed nothing: reverse instead
            rejected = " ".join(words[j] for j in order)
        else:  # another speaker's rest of a line, of a length that fits where one is drawn
            rejected = rest
            for j in rng.integers(0, len(items), size=MAX_DRAWS):
                if items[j][1] != who and _fits(context, prompt, items[j][3]):
                    rejected = items[j][3]
                    break
        if rejected != rest and _fits(context, prompt, max(rest, rejected, key=len)):
            pairs.append((position, prompt, rest, rejected))
        if len(pairs) == n:
            break
    rank = rng.permutation(len(talks))  # as in make_instructions
    pairs.sort(key=lambda p: rank[p[0]])
    return [{"prompt": p, "chosen": c, "rejected": r} for _, p, c, r in pairs]


def _pick(rng: np.random.Generator, items: list, n: int) -> list:
    """``n`` of ``items`` (all if fewer) without replacement, in a seeded random order."""
    return [items[i] for i in rng.permutation(len(items))[:n]]


GENERATORS = {"sft": make_instructions, "dpo": make_preferences}


def generated(
    kind: str, text: str, n: int, seed: int, context: int, cache: str | os.PathLike | None = None
) -> list[dict[str, str]]:
    """The examples of ``kind`` ("sft" or "dpo") made from ``text``; made once, then read
    from the JSONL cache (``cache`` or ``cache_dir() / "instruct"``)."""
    key = json.dumps([kind, n, seed, context, INSTRUCT_CACHE_VERSION]) + text
    key = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
    path = Path(cache) if cache is not None else cache_dir() / "instruct"
    path /= f"{kind}-{key}.jsonl"
    count, problem = read_cache_record(path, key)
    if count is not None:
        examples = read_jsonl(path, kind)
        if len(examples) == count:
            return examples
        problem = f"it holds {len(examples)} examples, but its record says {count}"
    if problem:
        warnings.warn(f"instruction cache {path}: {problem}; rebuilding it", stacklevel=2)
    examples = GENERATORS[kind](text, n, seed, context)
    if not examples:
        raise ValueError(
            f"no {kind} examples can be made from this text: it needs speeches (a line "
            f"'NAME:', then lines of 4 words or more) short enough for a context of {context}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, text=True) as f:  # a reader never sees half a file
        f.write("".join(json.dumps(e) + "\n" for e in examples))
    write_cache_record(path, key, len(examples))
    return examples


# ---- JSONL ---------------------------------------------------------------------------------------
def read_jsonl(path: str | os.PathLike, kind: str) -> list[dict[str, Any]]:
    """The examples of a JSONL file of ``kind`` ("sft" or "dpo"), each checked to hold its
    FIELDS as strings (the response, chosen and rejected ones not empty)."""
    if kind not in FIELDS:
        raise ValueError(f"unknown kind of data {kind!r}: use one of {sorted(FIELDS)}")
    fields = FIELDS[kind]
    try:
        # subtle: "\n" only: str.splitlines also breaks at U+2028 and U+0085, which a JSON
        # string may hold raw (json.dumps(ensure_ascii=False) writes them so)
        lines = Path(path).read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read it as UTF-8 text: {e}") from None
    examples = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e}); each line holds one object") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: a {type(row).__name__}, not an object {_shape(fields)}")
        missing = [f for f in fields if f not in row]
        if missing:
            raise ValueError(f"{where}: no {missing}; {kind} data has lines {_shape(fields)}")
        for f in fields:
            if not isinstance(row[f], str) or (f != fields[0] and not row[f]):
                raise ValueError(f"{where}: {f!r} must be a non-empty string, got {row[f]!r}")
        examples.append(row)
    if not examples:
        raise ValueError(f"{path}: no examples; {kind} data has lines {_shape(fields)}")
    return examples


def _shape(fields: Sequence[str]) -> str:
    return "{" + ", ".join(f'"{f}": "..."' for f in fields) + "}"


# ---- batches -------------------------------------------------------------------------------------
def _encode(tokenizer: Any, examples: Sequence[dict], fields: Sequence[str]) -> list:
    """``encode_pair`` of (``fields[0]``, each other field) of every example, with errors that
    name the example."""
    turns = []
    for i, e in enumerate(examples):
        try:
            turns.append(tuple(encode_pair(tokenizer, e[fields[0]], e[f]) for f in fields[1:]))
        except ValueError as error:
            raise ValueError(
                f"example {i} ({e[fields[0]][:40]!r}...): {error}; write the examples in the "
                f"base model's vocabulary"
            ) from None
    return turns


class ChatDataset:
    """Instruction pairs as chat turns (decoder/post/chat.py), split into ``train`` and ``val``
    (the last VAL_FRACTION), served as padded batches with the prompt's targets ignored.

    ``get_batch`` has TokenDataset's signature, so decoder.training.step's ``train_step`` and
    ``estimate_loss`` take these batches unchanged. A turn longer than the context is left
    out, and ``dropped`` says how many were.
    """

    def __init__(self, examples: Sequence[dict], tokenizer: Any, block_size: int):
        turns = [turn for (turn,) in _encode(tokenizer, examples, FIELDS["sft"])]
        keep = [len(ids) <= block_size + 1 for ids, _ in turns]
        self.dropped = keep.count(False)
        kept = [t for t, k in zip(turns, keep, strict=True) if k]
        kept_examples = [e for e, k in zip(examples, keep, strict=True) if k]
        n_train = _n_train(len(kept), self.dropped, block_size)
        self.turns = {"train": kept[:n_train], "val": kept[n_train:]}
        self.examples = {"train": kept_examples[:n_train], "val": kept_examples[n_train:]}
        self.pad_id = tokenizer.special_tokens[END]  # any id: its targets are ignored

    def get_batch(
        self, split: str, batch_size: int, block_size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """``batch_size`` random turns of ``split``: x and y (B, T), T the longest less one."""
        turns = _split(self.turns, split)
        return pad_batch([turns[i] for i in rng.integers(0, len(turns), batch_size)], self.pad_id)


class PreferenceDataset:
    """Preference pairs as two chat turns each, split as ChatDataset; ``get_batch`` gives
    x and y of shape (B, 2, T): row b's chosen turn at [b, 0], its rejected one at [b, 1]
    (so that splitting a batch into micro-batches keeps each pair together)."""

    def __init__(self, examples: Sequence[dict], tokenizer: Any, block_size: int):
        pairs = _encode(tokenizer, examples, FIELDS["dpo"])  # (chosen turn, rejected turn)
        keep = [max(len(c[0]), len(r[0])) <= block_size + 1 for c, r in pairs]
        self.dropped = keep.count(False)
        kept = [p for p, k in zip(pairs, keep, strict=True) if k]
        n_train = _n_train(len(kept), self.dropped, block_size)
        self.pairs = {"train": kept[:n_train], "val": kept[n_train:]}
        self.pad_id = tokenizer.special_tokens[END]

    def get_batch(
        self, split: str, batch_size: int, block_size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        pairs = _split(self.pairs, split)
        chosen = [pairs[i] for i in rng.integers(0, len(pairs), batch_size)]
        x, y = pad_batch([turn for pair in chosen for turn in pair], self.pad_id)  # (2B, T)
        return x.reshape(batch_size, 2, -1), y.reshape(batch_size, 2, -1)  # -> (B, 2, T)


def _split(splits: dict[str, list], name: str) -> list:
    if name not in splits:
        raise ValueError(f"unknown split {name!r}: use 'train' or 'val'")
    return splits[name]


def _n_train(n: int, dropped: int, block_size: int) -> int:
    """How many of ``n`` examples train (the rest validate); refuses too few to split."""
    n_train = int(n * (1 - VAL_FRACTION))
    if n_train < 1 or n_train == n:
        raise ValueError(
            f"{n} examples fit a context of block_size={block_size} ({dropped} were longer): "
            f"at least 2 are needed, some to train and some held out; "
            f"give more (or shorter) examples"
        )
    return n_train
