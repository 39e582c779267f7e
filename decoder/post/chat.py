"""The chat template: how an instruction and its response become one sequence of token ids.

    <|user|> instruction <|assistant|> response <|end|>

The three markers are special tokens, one id each, added after a tokenizer's own ids (a char
or BPE tokenizer; the BPE one stays servable by tiktoken, which knows them as special
tokens: ``BPETokenizer.to_tiktoken``). Text never turns into them: the template places their
ids, so an instruction that happens to contain "<|end|>" cannot end a turn. A base model
gains them with ``add_chat_tokens``: its embedding and output tables get three new rows, and
every old weight is kept.

Training on a pair: the inputs are the sequence but its last id and the targets are the
sequence shifted by one, with the targets of the prompt (every position up to and including
``<|assistant|>``) set to IGNORE_INDEX, so the loss is only on the response and its
``<|end|>`` (the model learns to answer, and to stop, not to write instructions). A batch
pads each row on the right to the longest with IGNORE_INDEX targets: under the causal mask no
real position attends to a later pad, so right padding needs no attention mask of its own,
and a padded row's loss equals the row's alone (tests/decoder/test_sft.py).

Left out on purpose: system prompts and multi-turn dialogues (one turn is what SFT here
trains), and packing several pairs into one row (it needs a block-diagonal mask; rows here
are short). Follows the shape of ChatML (OpenAI) and Ouyang et al. 2022 (InstructGPT's SFT).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

import minigrad as mg
from decoder.model.model import IGNORE_INDEX, Decoder, build_model

USER, ASSISTANT, END = "<|user|>", "<|assistant|>", "<|end|>"
CHAT_TOKENS = (USER, ASSISTANT, END)


def has_chat_tokens(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` already holds the template's three special tokens."""
    return set(CHAT_TOKENS) <= set(getattr(tokenizer, "special_tokens", {}))


def chat_tokenizer(tokenizer: Any) -> Any:
    """``tokenizer`` with the chat tokens (itself if it has them): char and BPE tokenizers.

    >>> from decoder.text.tokenizer import CharTokenizer
    >>> chat_tokenizer(CharTokenizer.from_text("ab")).special_tokens
    {'<|user|>': 2, '<|assistant|>': 3, '<|end|>': 4}
    """
    if has_chat_tokens(tokenizer):
        return tokenizer
    if not hasattr(tokenizer, "with_special_tokens"):
        raise ValueError(
            f"the {tokenizer.to_dict()['type']!r} tokenizer cannot take new special tokens: "
            f"fine-tune a model trained with --tokenizer=char or --tokenizer=bpe"
        )
    missing = [t for t in CHAT_TOKENS if t not in tokenizer.special_tokens]
    return tokenizer.with_special_tokens(missing)


def encode_prompt(tokenizer: Any, instruction: str) -> list[int]:
    """``<|user|> instruction <|assistant|>`` as ids: what a model is given to answer.

    >>> from decoder.text.tokenizer import CharTokenizer
    >>> encode_prompt(chat_tokenizer(CharTokenizer.from_text("ab")), "ba")
    [2, 1, 0, 3]
    """
    special = tokenizer.special_tokens
    return [special[USER], *tokenizer.encode(instruction), special[ASSISTANT]]


def encode_pair(tokenizer: Any, instruction: str, response: str) -> tuple[list[int], int]:
    """The whole turn as ids, and how many of them are the prompt.

    >>> from decoder.text.tokenizer import CharTokenizer
    >>> encode_pair(chat_tokenizer(CharTokenizer.from_text("ab")), "a", "bb")
    ([2, 0, 3, 1, 1, 4], 3)
    """
    prompt = encode_prompt(tokenizer, instruction)
    return [*prompt, *tokenizer.encode(response), tokenizer.special_tokens[END]], len(prompt)


def pad_batch(rows: Sequence[tuple[list[int], int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs x and targets y (B, T) int64 of turns from ``encode_pair``, T the longest turn
    less one: the prompt's targets and the right padding's are IGNORE_INDEX.

    >>> x, y = pad_batch([([5, 6, 7, 8], 2), ([5, 6, 7], 2)], pad_id=0)
    >>> x.tolist(), y.tolist()
    ([[5, 6, 7], [5, 6, 0]], [[-100, 7, 8], [-100, 7, -100]])
    """
    T = max(len(ids) for ids, _ in rows) - 1
    x = np.full((len(rows), T), pad_id, dtype=np.int64)
    y = np.full((len(rows), T), IGNORE_INDEX, dtype=np.int64)
    for b, (ids, n_prompt) in enumerate(rows):
        x[b, : len(ids) - 1] = ids[:-1]
        # subtle: target t is token t + 1, so the first response token is target n_prompt - 1
        y[b, n_prompt - 1 : len(ids) - 1] = ids[n_prompt:]
    return x, y


def add_chat_tokens(model: Decoder, vocab_size: int, seed: int) -> Decoder:
    """A copy of ``model`` whose vocabulary grows to ``vocab_size``: the embedding (and, if
    untied, the output) table keeps its rows and gains new ones at the model's own init
    (drawn from ``seed``); every other weight is copied. The model itself if it is that size.
    """
    old = model.config.vocab_size
    if vocab_size == old:
        return model
    if vocab_size < old:
        raise ValueError(f"add_chat_tokens: vocab_size={vocab_size} is below the model's {old}")
    mg.manual_seed(seed)  # the new rows' init
    dtype = "float64" if model.tok_emb.weight.dtype == np.float64 else "float32"
    grown = build_model(dataclasses.replace(model.config, vocab_size=vocab_size), dtype)
    state = grown.state_dict()
    for name, value in model.state_dict().items():  # NumPy copies
        if value.shape != state[name].shape:  # tok_emb.weight, lm_head.weight: (V, C)
            value = np.concatenate([value, state[name][old:]])  # (old, C) -> (V, C)
        state[name] = value
    grown.load_state_dict(state)
    return grown.to(model.device)


def answer_tokens(
    model: Decoder, tokenizer: Any, instruction: str, max_new_tokens: int, **sampling: Any
) -> tuple[list[int], Iterator[int]]:
    """The prompt's ids and the answer's ids as the model makes them (Decoder.generate's
    ``sampling`` settings), up to ``<|end|>`` (not included), within the model's context."""
    end = tokenizer.special_tokens[END]
    prompt = encode_prompt(tokenizer, instruction)
    room = model.config.block_size - len(prompt)  # a prompt and its answer share the context
    if room < 1:
        raise ValueError(
            f"the instruction takes {len(prompt)} tokens with the template, and the model's "
            f"context is {model.config.block_size}: shorten it"
        )
    tokens = model.generate(prompt, min(max_new_tokens, room), stop_token=end, **sampling)
    return prompt, itertools.takewhile(lambda token: token != end, tokens)


def respond(model: Decoder, tokenizer: Any, instruction: str, max_new_tokens: int) -> str:
    """The model's greedy answer to ``instruction``, up to ``<|end|>`` (not included)."""
    _, tokens = answer_tokens(model, tokenizer, instruction, max_new_tokens, temperature=0.0)
    return tokenizer.decode(list(tokens))
