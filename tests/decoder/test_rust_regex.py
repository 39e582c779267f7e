"""The rewrite of tiktoken's Rust-regex split patterns for Python's re (decoder/text/rust_regex.py);
tests/decoder/test_tokenizer.py checks the resulting splits against tiktoken itself."""

import re

import pytest

from decoder.text.rust_regex import to_python_pattern


def test_python_pattern_classes_follow_unicode():
    letters = re.compile(to_python_pattern(r"\p{L}+"))
    numbers = re.compile(to_python_pattern(r"\p{N}+"))
    space = re.compile(to_python_pattern(r"\s"))
    assert letters.fullmatch("naïveΣλ字ſ")
    assert not letters.search("_1²\u0301")  # underscore, digits, numbers, combining marks
    assert numbers.fullmatch("0123²½Ⅻ٣")  # Nd, No, Nl: Python's \d knows only the first
    assert space.fullmatch("\u3000") and not space.fullmatch("\x1c")  # unlike Python's \s


def test_python_pattern_rejects_what_it_cannot_translate():
    with pytest.raises(ValueError, match="unsupported"):
        to_python_pattern(r"\P{L}")
    with pytest.raises(ValueError, match="unsupported"):
        to_python_pattern(r"\p{Greek}")
