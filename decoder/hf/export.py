"""What ``save_pretrained`` adds so that a model trained here loads in ``transformers``: the
zero biases of GPT-2's layout, and a ``tokenizer.json`` for the model's tokenizer.

- GPT-2 (``GPT2LMHeadModel``) has a bias in every Linear and LayerNorm; a model of GPT-2's
  layout without them (``bias=False``: the default ``shakespeare-char``) is the same function
  as GPT-2 with those biases at zero, so it is written as that (``with_zero_biases``).
- A character tokenizer (decoder.text.tokenizer.CharTokenizer) is written in the format of
  Hugging Face's ``tokenizers`` as a BPE model without merges (``char_tokenizer_json``): its
  vocabulary is the characters, its special tokens are added tokens, and with no normaliser or
  pre-tokenizer the text splits into characters; the ``Fuse`` decoder joins them back without
  spaces. ``PreTrainedTokenizerFast`` gives our ids; ``read_char_tokenizer`` reads it back.
- A byte-level BPE (ours, decoder.text.bpe.BPETokenizer, or a tiktoken encoding beside a
  Llama-family model) is written as Llama 3 ships its own (``byte_bpe_tokenizer_json``): the
  split pattern as a ``Split`` pre-tokenizer, then ``ByteLevel`` writing each byte as GPT-2's
  printable character, a vocabulary of those strings, and the merges recovered from the ranks.
  ``ignore_merges`` keeps a chunk that is a token whole, as tiktoken does.
- A tokenizer read from a ``tokenizer.json`` (a loaded Llama-family model) is copied as it is.

A GPT-2 with tiktoken's ``gpt2`` is saved without a tokenizer.json: ``load_pretrained`` uses
tiktoken's, as transformers uses the hub's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from decoder.hf.config import PretrainedError
from decoder.hf.tokenizer import BYTE_CHARS
from decoder.model.config import ModelConfig
from decoder.text.tokenizer import CharTokenizer
from minigrad.fileio import parse_json

GPT2_LAYOUT = ("learned", "layer", "gelu")  # pos, norm, ffn
# what no architecture written here has (decoder.hf.config): the field, its value, whose it is
NOT_EXPORTED = [("attention", "mla", "DeepSeek-V2's latent attention"), ("ffn", "moe", "experts")]


def check_exportable(config: ModelConfig) -> None:
    """Refuse, naming the field, a model that no Hugging Face class written here can hold."""
    for field, value, what in NOT_EXPORTED:
        if getattr(config, field) == value:
            raise PretrainedError(
                f"{field}={value!r} ({what}): GPT-2 and the Llama family (Mistral, Qwen2), the "
                f"architectures written here, have no such layer, so the model cannot be saved "
                f"in the Hugging Face format; keep it as one of our checkpoints"
            )


def with_zero_biases(
    config: ModelConfig, arrays: dict[str, np.ndarray]
) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """``config`` and its weights as GPT-2 writes them: where a GPT-2-shaped model has no
    biases, ``bias=True`` and a zero bias beside every weight of a Linear or LayerNorm.

    >>> c = ModelConfig(n_layer=1, n_embd=8, n_head=2, vocab_size=5, block_size=4)
    >>> c2, a = with_zero_biases(c, {"norm_f.weight": np.ones(8, np.float32)})
    >>> c2.bias, a["norm_f.bias"].tolist() == [0.0] * 8
    (True, True)
    """
    if config.bias or (config.pos, config.norm, config.ffn) != GPT2_LAYOUT:
        return config, arrays
    biases = {
        name[: -len("weight")] + "bias": np.zeros(array.shape[0], array.dtype)
        for name, array in arrays.items()
        if name.endswith(".weight") and not name.endswith(("_emb.weight", "lm_head.weight"))
    }
    return dataclasses.replace(config, bias=True), {**arrays, **biases}


def char_tokenizer_json(tokenizer: CharTokenizer) -> dict[str, Any]:
    """The ``tokenizer.json`` of a character tokenizer (the module docstring says how).

    >>> spec = char_tokenizer_json(CharTokenizer.from_text("ab"))
    >>> spec["model"]["vocab"], spec["decoder"]
    ({'a': 0, 'b': 1}, {'type': 'Fuse'})
    """
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(tokenizer.special_tokens),
        "normalizer": None,
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Fuse"},
        # subtle: no merges, so every character stays a token of its own
        "model": _bpe_model(tokenizer.stoi, []),
    }


def _added_tokens(special_tokens: dict[str, int]) -> list[dict[str, Any]]:
    """tokenizer.json's ``added_tokens``: each special token, matched whole, never split."""
    return [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for t, i in special_tokens.items()
    ]  # fmt: skip


def _bpe_model(vocab: dict[str, int], merges: list[str], ignore_merges: bool = False) -> dict:
    """tokenizer.json's ``model``: a BPE of this vocabulary and these merges, nothing else on."""
    return {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        **({"ignore_merges": True} if ignore_merges else {}),
        "vocab": vocab,
        "merges": merges,
    }


def _merge_of(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two tokens byte-level BPE joins last to make ``token``: merge its bytes by rank,
    lowest first, using only tokens ranked below it, until two are left.

    >>> _merge_of(b"aab", 258, {b"a": 97, b"b": 98, b"aa": 256, b"ab": 257})  # "aa" first
    (b'aa', b'b')
    """
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        merged = [ranks.get(a + b, rank) for a, b in zip(parts, parts[1:], strict=False)]
        i = min(range(len(merged)), key=merged.__getitem__)  # min keeps the leftmost of ties
        if merged[i] >= rank:
            break
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    if len(parts) != 2:
        raise PretrainedError(
            f"token {token!r} (rank {rank}) is not made by merging two lower-ranked tokens, so "
            f"it has no merge in the tokenizer.json format; save the model with tokenizer=None"
        )
    return parts[0], parts[1]


def byte_bpe_tokenizer_json(
    ranks: dict[bytes, int], pattern: str, special_tokens: dict[str, int]
) -> dict[str, Any]:
    r"""The ``tokenizer.json`` of a byte-level BPE given as tiktoken gives it: each token's
    bytes and rank (its id), the split pattern, the special tokens (the module docstring says
    how).

    >>> spec = byte_bpe_tokenizer_json({bytes([b]): b for b in range(256)} | {b" a": 256},
    ...                                r"\s?\p{L}+", {})
    >>> spec["model"]["vocab"]["Ġa"], spec["model"]["merges"]
    (256, ['Ġ a'])
    """

    def chars(token: bytes) -> str:
        return "".join(BYTE_CHARS[b] for b in token)

    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise PretrainedError(
            f"byte {missing[0]} has no token: a byte-level BPE needs all 256 bytes; save the "
            f"model with tokenizer=None"
        )
    merges = [
        " ".join(chars(part) for part in _merge_of(token, rank, ranks))
        for token, rank in sorted(ranks.items(), key=lambda item: item[1])
        if len(token) > 1
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(special_tokens),
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": pattern},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {**byte_level, "use_regex": False},  # the Split above has cut the chunks
            ],
        },
        "post_processor": None,
        "decoder": {**byte_level, "use_regex": True},
        # ignore_merges: a chunk that is a token whole stays whole, as in tiktoken
        "model": _bpe_model({chars(t): rank for t, rank in ranks.items()}, merges, True),
    }


def read_char_tokenizer(path: Path) -> CharTokenizer | None:
    """The CharTokenizer of a ``tokenizer.json`` that ``char_tokenizer_json`` wrote; None for
    any other file (decoder.hf.tokenizer reads those, and names what is wrong with them)."""
    try:
        spec = parse_json(path.read_bytes())
    except (OSError, ValueError):
        return None
    return char_tokenizer(spec)


def char_tokenizer(spec: Any) -> CharTokenizer | None:
    """The CharTokenizer of a parsed ``tokenizer.json`` in ``char_tokenizer_json``'s form.

    >>> char_tokenizer(char_tokenizer_json(CharTokenizer.from_text("ba"))).chars
    ['a', 'b']
    """
    model = spec.get("model") if isinstance(spec, dict) else None
    if not isinstance(model, dict) or spec.get("decoder") != {"type": "Fuse"}:
        return None
    vocab = model.get("vocab")
    if model.get("merges") != [] or spec.get("pre_tokenizer") or not isinstance(vocab, dict):
        return None
    try:
        chars = sorted(vocab, key=vocab.get)
        specials = sorted((t["id"], t["content"]) for t in spec.get("added_tokens", []))
        tokenizer = CharTokenizer(chars, [t for _, t in specials])
    except (ValueError, TypeError, KeyError):
        return None
    ids = [vocab[c] for c in chars] + [i for i, _ in specials]
    return tokenizer if ids == list(range(tokenizer.vocab_size)) else None
