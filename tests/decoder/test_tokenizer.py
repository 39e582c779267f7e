"""Tokenizers: known answers, round trips, and agreement with tiktoken on splits and ids."""

import hashlib
import json

import numpy as np
import pytest
import requests
import tiktoken
import tiktoken.load
import tiktoken.registry
from hypothesis import given, settings
from hypothesis import strategies as st

from decoder.text.bpe import (
    ENDOFTEXT,
    GPT2_SPLIT_PATTERN,
    GPT4_SPLIT_PATTERN,
    BPETokenizer,
    split_text,
)
from decoder.text.tokenizer import (
    TIKTOKEN_FILES,
    CharTokenizer,
    TiktokenTokenizer,
    get_tokenizer,
    tokenizer_from_dict,
)

SHAKESPEARE = """First Citizen:
Before we proceed any further, hear me speak.

All:
Speak, speak.

First Citizen:
You are all resolved rather to die than to famish?

All:
Resolved. resolved.

First Citizen:
First, you know Caius Marcius is chief enemy to the people.

All:
We know't, we know't.

First Citizen:
Let us kill him, and we'll have corn at our own price.
Is't a verdict?

All:
No more talking on't; let it be done: away, away!

Second Citizen:
One word, good citizens.

First Citizen:
We are accounted poor citizens, the patricians good.
What authority surfeits on would relieve us: if they
would yield us but the superfluity, while it were
wholesome, we might guess they relieved us humanely;
but they think we are too dear: the leanness that
afflicts us, the object of our misery, is as an
inventory to particularise their abundance; our
sufferance is a gain to them. Let us revenge this with
our pikes, ere we become rakes: for the gods know I
speak this in hunger for bread, not in thirst for revenge.
"""
UNICODE = "naïve café, Ελληνικά κείμενα, русский текст, 日本語のテキスト, 안녕하세요 🙂🙂👍 x² ½"
CORPUS = (SHAKESPEARE + "\n" + UNICODE + "\n") * 3

TEST_STRINGS = [
    "",
    "?",
    "hello world!!!? (안녕하세요!) lol123 😉",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    "We know't, we know't. You're I'LL we'VE he'd they'Re",
    "naïve café Ελληνικά русский 日本語",
    "e\u0301 a\u0300 combining marks",
    "1234567890 3.14159 2024-01-01 x²½Ⅻ",
    "   \n\n\t\t  x  \r\n  y    ",
    "trailing spaces   ",
    "snake_case __init__ _private",
    "emoji 👨‍👩‍👧‍👦 🏳️‍🌈 flags 🇫🇷",
    "separators \x1c\x1d\x1e\x1f and no-break\xa0space\u3000ideographic\u2003em",
    "long s ſ and Kelvin \u212a: 'ſ 'K",
    "symbols !@#$%^&*()[]{}<>~`|\\/ -- ... ;;",
]


def tiktoken_split(text: str, pattern: str, max_len: int = 64) -> list[str]:
    """tiktoken's own chunks of ``text``: give it every substring (up to ``max_len`` bytes) as
    a token, so each chunk merges into exactly one token, and read the tokens back. A chunk
    longer than ``max_len`` would come back in pieces and fail the comparison, never pass it."""
    data = text.encode("utf-8")
    ranks = {bytes([b]): b for b in range(256)}
    for i in range(len(data)):
        for j in range(i + 2, min(i + max_len, len(data)) + 1):
            ranks.setdefault(data[i:j], len(ranks))
    enc = tiktoken.Encoding("split", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    return [t.decode("utf-8") for t in enc.decode_tokens_bytes(enc.encode_ordinary(text))]


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.train(CORPUS, vocab_size=400, special_tokens=[ENDOFTEXT, "<|pad|>"])


# ---- CharTokenizer ------------------------------------------------------------------------------
def test_char_round_trip_and_sorted_vocabulary():
    tok = CharTokenizer.from_text(SHAKESPEARE)
    assert tok.chars == sorted(set(SHAKESPEARE))
    assert tok.vocab_size == len(set(SHAKESPEARE))
    ids = tok.encode(SHAKESPEARE)
    assert tok.decode(ids) == SHAKESPEARE
    assert ids[:3] == [tok.chars.index(c) for c in "Fir"]


def test_char_unknown_characters_name_them_and_the_corpus():
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(ValueError, match="the corpus it was built from") as info:
        tok.encode("abzz\n")
    assert "'\\n'" in str(info.value) and "'z'" in str(info.value)
    assert "2 character(s)" in str(info.value)


def test_char_decode_rejects_out_of_range_ids():
    tok = CharTokenizer.from_text("abc")
    for bad in ([3], [-1]):  # -1 must not wrap around to the last character
        with pytest.raises(ValueError, match="out of range"):
            tok.decode(bad)


def test_char_to_dict_survives_json():
    tok = CharTokenizer.from_text(UNICODE)
    again = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    assert isinstance(again, CharTokenizer)
    assert again.chars == tok.chars
    assert again.encode(UNICODE) == tok.encode(UNICODE)


def test_char_needs_a_nonempty_corpus():
    with pytest.raises(ValueError, match="at least one"):
        CharTokenizer.from_text("")


# ---- splitting ----------------------------------------------------------------------------------
def test_gpt2_pattern_is_tiktokens():
    from tiktoken_ext import openai_public

    assert GPT2_SPLIT_PATTERN == openai_public.r50k_pat_str


@pytest.mark.parametrize("pattern", [GPT2_SPLIT_PATTERN, GPT4_SPLIT_PATTERN], ids=["gpt2", "gpt4"])
@pytest.mark.parametrize("text", TEST_STRINGS + [SHAKESPEARE, UNICODE])
def test_split_matches_tiktoken(text, pattern):
    assert split_text(text, pattern) == tiktoken_split(text, pattern)


# Characters unassigned in this Python's Unicode tables (category Cn) may be letters in
# tiktoken's newer ones: that is the documented difference, so they are left out here.
@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(exclude_categories=("Cs", "Cn")), max_size=24))
def test_split_matches_tiktoken_on_random_unicode(text):
    for pattern in (GPT2_SPLIT_PATTERN, GPT4_SPLIT_PATTERN):
        assert split_text(text, pattern) == tiktoken_split(text, pattern), pattern


# ---- BPE training -------------------------------------------------------------------------------
def test_bpe_known_answer():
    # minbpe's Wikipedia example. (a, a) is the most frequent pair; then (aa, a) and (a, b)
    # tie at 2 and the smaller ids win, so the third merge joins aa + ab.
    tok = BPETokenizer.train("aaabdaaabac", vocab_size=256 + 3)
    assert tok.merges == [(97, 97), (97, 98), (256, 257)]
    assert tok.vocab[256:] == [b"aa", b"ab", b"aaab"]
    assert tok.encode("aaabdaaabac") == [258, 100, 258, 97, 99]
    assert tok.decode([258, 100, 258, 97, 99]) == "aaabdaaabac"


def test_bpe_first_merge_is_the_most_frequent_pair():
    # chunks 'the', ' cat', ' the', ' hat', ' the', ' mat': (t, h), (h, e) and (a, t) occur
    # 3 times each, more than any other pair; ties go to the smallest pair, (a, t)
    tok = BPETokenizer.train("the cat the hat the mat", vocab_size=257)
    assert tok.merges == [(ord("a"), ord("t"))]


def test_bpe_never_merges_across_chunks():
    tok = BPETokenizer.train("ab ab ab ab", vocab_size=256 + 2)  # chunks 'ab', ' ab', ...
    assert b"b " not in tok.vocab and all(not t.endswith(b" ") for t in tok.vocab[256:])
    assert tok.vocab[256:] == [b"ab", b" ab"]


def test_bpe_vocab_size_counts_bytes_merges_and_special_tokens(bpe):
    assert bpe.vocab_size == 400
    assert len(bpe.merges) == 400 - 256 - 2
    assert bpe.special_tokens == {ENDOFTEXT: 398, "<|pad|>": 399}  # ids after the merges


def test_bpe_vocab_size_errors():
    with pytest.raises(ValueError, match="less than the 256 bytes"):
        BPETokenizer.train("abc", vocab_size=256, special_tokens=[ENDOFTEXT])
    with pytest.raises(ValueError, match="at most 258"):
        BPETokenizer.train("abc", vocab_size=300)  # 'abc' allows two merges only


def test_bpe_training_is_deterministic():
    a = BPETokenizer.train(CORPUS, vocab_size=320)
    b = BPETokenizer.train(CORPUS, vocab_size=320)
    assert a.merges == b.merges


def test_bpe_compresses_the_training_text(bpe):
    ids = bpe.encode(CORPUS)
    assert len(ids) < 0.5 * len(CORPUS.encode("utf-8"))


# ---- BPE encoding against tiktoken --------------------------------------------------------------
@pytest.mark.parametrize("text", TEST_STRINGS + [SHAKESPEARE, UNICODE, CORPUS])
def test_bpe_encode_matches_tiktoken_and_round_trips(bpe, text):
    ids = bpe.encode(text)
    assert ids == bpe.to_tiktoken().encode(text)
    assert bpe.decode(ids) == text


@settings(max_examples=200, deadline=None)
@given(
    st.text(
        st.one_of(
            st.sampled_from(sorted(set(CORPUS))),
            st.characters(exclude_categories=("Cs", "Cn")),  # as in the split test above
        ),
        max_size=60,
    )
)
def test_bpe_encode_matches_tiktoken_on_random_text(bpe, text):
    assert bpe.encode(text) == bpe.to_tiktoken().encode(text)


def test_bpe_encode_on_a_large_vocabulary_matches_tiktoken():
    # ~85 KB of Shakespeare-like text, its lines shuffled, and a 512-token vocabulary
    lines = (SHAKESPEARE + UNICODE).splitlines(keepends=True)
    rng = np.random.default_rng(0)
    text = "".join(rng.choice(lines, size=2500))
    tok = BPETokenizer.train(text, vocab_size=512)
    assert tok.vocab_size == 512
    assert tok.encode(text) == tok.to_tiktoken().encode(text)


def test_bpe_special_tokens(bpe):
    enc = bpe.to_tiktoken()
    text = f"Speak, speak.{ENDOFTEXT}All:<|pad|>"
    ids = bpe.encode(text, allowed_special="all")
    assert ids == enc.encode(text, allowed_special="all")
    assert ids.count(398) == 1 and ids.count(399) == 1
    assert bpe.decode(ids) == text
    # Only the named ones become ids; another one in the text raises, as in tiktoken.
    only_eot = bpe.encode(f"a{ENDOFTEXT}b", allowed_special={ENDOFTEXT})
    assert only_eot == enc.encode(f"a{ENDOFTEXT}b", allowed_special={ENDOFTEXT})
    with pytest.raises(ValueError, match="<|pad|>"):
        bpe.encode(text, allowed_special={ENDOFTEXT})
    with pytest.raises(ValueError, match="special token"):
        bpe.encode(text)  # "none_raise"
    # "none": plain text, many ids, none of them special
    plain = bpe.encode(text, allowed_special="none")
    assert plain == enc.encode_ordinary(text) and not {398, 399} & set(plain)
    with pytest.raises(ValueError, match="not special tokens"):
        bpe.encode(text, allowed_special={"<|nope|>"})


def test_bpe_decode_of_a_partial_character_matches_tiktoken(bpe):
    first_byte = [0xF0]  # the first of the four bytes of an emoji
    assert bpe.decode(first_byte) == bpe.to_tiktoken().decode(first_byte) == "\ufffd"
    with pytest.raises(ValueError, match="out of range"):
        bpe.decode([bpe.vocab_size])


# ---- BPE persistence ----------------------------------------------------------------------------
def test_bpe_save_load_round_trip(bpe, tmp_path):
    path = tmp_path / "tok.json"
    bpe.save(path)
    json.loads(path.read_text(encoding="utf-8"))  # plain JSON, never pickle
    assert [p.name for p in tmp_path.iterdir()] == ["tok.json"]  # no temporary file left
    again = BPETokenizer.load(path)
    assert again.merges == bpe.merges
    assert again.pattern == bpe.pattern
    assert again.special_tokens == bpe.special_tokens
    assert again.encode(CORPUS, allowed_special="all") == bpe.encode(CORPUS, allowed_special="all")


def test_bpe_to_dict_rebuilds_through_tokenizer_from_dict(bpe):
    again = tokenizer_from_dict(json.loads(json.dumps(bpe.to_dict())))
    assert isinstance(again, BPETokenizer)
    assert again.vocab == bpe.vocab and again.vocab_size == bpe.vocab_size


def test_bpe_rejects_inconsistent_merges():
    with pytest.raises(ValueError, match="not made yet"):
        BPETokenizer([(97, 300)])
    with pytest.raises(ValueError, match="same bytes"):
        BPETokenizer([(97, 98), (97, 98)])


def test_bpe_other_split_pattern_round_trips():
    tok = BPETokenizer.train(CORPUS, vocab_size=300, pattern=GPT2_SPLIT_PATTERN)
    assert tok.to_tiktoken().encode(CORPUS) == tok.encode(CORPUS)
    assert tokenizer_from_dict(tok.to_dict()).pattern == GPT2_SPLIT_PATTERN


# ---- choosing tokenizers ------------------------------------------------------------------------
def test_get_tokenizer_builds_char_and_bpe():
    char = get_tokenizer("char", text=SHAKESPEARE)
    assert isinstance(char, CharTokenizer) and char.decode(char.encode("speak")) == "speak"
    bpe = get_tokenizer("bpe", text=CORPUS, vocab_size=300)
    assert isinstance(bpe, BPETokenizer) and bpe.vocab_size == 300


def test_get_tokenizer_errors():
    with pytest.raises(ValueError, match="pass text="):
        get_tokenizer("char")
    with pytest.raises(ValueError, match="unknown tokenizer 'word'"):
        get_tokenizer("word", text="abc")
    with pytest.raises(ValueError, match="unknown tokenizer type"):
        tokenizer_from_dict({"type": "word"})


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No network for tiktoken, and an empty cache folder: the gpt2 files cannot be had."""

    def no_network(url):
        raise requests.exceptions.ConnectionError(f"network is unreachable: {url}")

    # subtle: tiktoken caches loaded encodings, and fetches through tiktoken.load.read_file
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, "gpt2", raising=False)
    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken"))
    return tmp_path / "tiktoken"


def test_gpt2_offline_says_what_to_download_and_where(offline):
    with pytest.raises(RuntimeError, match="could not download") as info:
        get_tokenizer("gpt2")
    message = str(info.value)
    assert "TIKTOKEN_CACHE_DIR" in message and "network access" in message
    for url in TIKTOKEN_FILES["gpt2"]:
        assert f"{url}\n    -> {offline / hashlib.sha1(url.encode()).hexdigest()}" in message


def test_gpt2_files_are_the_ones_tiktoken_fetches(offline, monkeypatch):
    from tiktoken_ext import openai_public

    asked = {}

    def record(**files):
        asked.update(files)
        raise OSError("offline")

    monkeypatch.setattr(openai_public, "data_gym_to_mergeable_bpe_ranks", record)
    with pytest.raises(RuntimeError):
        get_tokenizer("gpt2")
    urls = (asked["vocab_bpe_file"], asked["encoder_json_file"])
    assert urls == TIKTOKEN_FILES["gpt2"]


def test_train_with_gpt2_offline_is_an_error_not_a_traceback(offline, tmp_path, capsys):
    import decoder.train as tr

    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat.\n" * 20, encoding="utf-8")
    args = [
        "--preset",
        "tiny",
        "--tokenizer=gpt2",
        "--data",
        str(text),
        "--out",
        str(tmp_path / "run"),
    ]
    assert tr.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: could not download the files of tiktoken's 'gpt2'")
    assert TIKTOKEN_FILES["gpt2"][0] in err


def test_tiktoken_wrapper_interface(monkeypatch, bpe):
    # The real gpt2 files cannot be fetched here: stand our own encoding in for them.
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: bpe.to_tiktoken(name))
    tok = get_tokenizer("gpt2")
    assert isinstance(tok, TiktokenTokenizer)
    assert tok.vocab_size == bpe.vocab_size
    assert tok.encode(SHAKESPEARE) == bpe.encode(SHAKESPEARE)
    assert tok.decode(tok.encode(UNICODE)) == UNICODE
    assert tok.encode(ENDOFTEXT, allowed_special="all") == [398]
    assert tok.encode(ENDOFTEXT, allowed_special={ENDOFTEXT}) == [398]
    assert tok.encode(ENDOFTEXT, allowed_special="none") == bpe.encode_ordinary(ENDOFTEXT)
    with pytest.raises(ValueError):
        tok.encode(ENDOFTEXT)
    assert tok.to_dict() == {"type": "tiktoken", "name": "gpt2"}
    assert isinstance(tokenizer_from_dict(tok.to_dict()), TiktokenTokenizer)
