"""Rewriting tiktoken's split patterns, written for Rust's ``regex`` crate, for Python's ``re``.

GPT-2's and GPT-4's split patterns (decoder/text/tokenizer.py) use ``\\p{L}`` (letters) and
``\\p{N}`` (numbers), which Python's ``re`` lacks, and possessive quantifiers (``++``), which
``re`` lacks before 3.11. ``to_python_pattern`` rewrites such a pattern for ``re``: each
``\\p{..}`` becomes an explicit character class built from ``unicodedata``, ``\\s`` becomes
Unicode's White_Space set (what tiktoken's Rust engine means by it; Python's ``\\s`` also
takes the separators U+001C..U+001F), ``$`` becomes ``\\Z`` (Python's ``$`` also matches before
a final newline), and possessive quantifiers become greedy ones, which matches the same text
for GPT-2's and GPT-4's patterns because giving characters back never lets the rest of their
alternative match.

Left out on purpose: the rest of Rust's syntax (``\\P{..}``, scripts such as ``\\p{Greek}``,
``\\S`` inside a class raise), and the ``regex`` package, which would be one more dependency.
Known differences from tiktoken: characters assigned after this Python's Unicode version
(``unicodedata.unidata_version``) are neither letters nor numbers here, and a lone surrogate in
the text raises UnicodeEncodeError where tiktoken replaces it. Follows the syntax of Rust's
``regex`` crate, as tiktoken uses it (tiktoken_ext/openai_public.py).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable

# Unicode's White_Space property, which is what Rust's regex means by \s.
_WHITESPACE = r"\t-\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


def _escape_ranges(codepoints: Iterable[int]) -> str:
    """The body of a character class holding exactly ``codepoints`` (sorted), as ranges.

    >>> _escape_ranges([ord("a"), ord("b"), ord("c"), ord("x"), ord("-")])
    '\\\\-a-cx'
    """
    ranges: list[list[int]] = []
    for c in sorted(codepoints):
        if ranges and c == ranges[-1][1] + 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    parts = []
    for lo, hi in ranges:
        lo_s, hi_s = re.escape(chr(lo)), re.escape(chr(hi))
        parts.append(lo_s if lo == hi else lo_s + hi_s if hi == lo + 1 else f"{lo_s}-{hi_s}")
    return "".join(parts)


@functools.cache
def _unicode_class(name: str) -> str:
    """Character-class body for ``\\p{name}``: a general category (``Lu``) or its group (``L``).

    Built once per name by scanning every code point (about 0.15 s).

    >>> bool(re.fullmatch(f"[{_unicode_class('L')}]+", "naïveΣλ字"))
    True
    >>> re.fullmatch(f"[{_unicode_class('N')}]+", "12²½Ⅻ") is not None
    True
    """
    if not re.fullmatch(r"[A-Z][a-z]?", name):
        raise ValueError(f"unsupported Unicode property \\p{{{name}}}: only general categories")
    return _escape_ranges(
        c for c in range(0x110000) if unicodedata.category(chr(c)).startswith(name)
    )


def to_python_pattern(pattern: str) -> str:
    """Rewrite a tiktoken (Rust regex) split pattern into one Python's ``re`` accepts.

    Handles what GPT-2's and GPT-4's patterns use: ``\\p{..}``, ``\\s``, ``\\S``, ``$`` and
    possessive quantifiers (see the module docstring for why each rewrite keeps the meaning).

    >>> to_python_pattern(r"'s|a++|[^b]?+c{1,3}+|d$")
    "'s|a+|[^b]?c{1,3}|d\\\\Z"
    >>> to_python_pattern(r"\\S") == "[^" + _WHITESPACE + "]"
    True
    """
    out = []
    in_class = False  # inside [...], where \p{L} and \s add their members without brackets
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            esc = pattern[i : i + 2]
            if esc in (r"\p", r"\P"):
                end = pattern.find("}", i)
                if esc == r"\P" or pattern[i + 2 : i + 3] != "{" or end < 0:
                    raise ValueError(f"unsupported escape at {pattern[i : i + 8]!r}: use \\p{{..}}")
                body = _unicode_class(pattern[i + 3 : end])
                out.append(body if in_class else f"[{body}]")
                i = end + 1
                continue
            if esc == r"\s":
                out.append(_WHITESPACE if in_class else f"[{_WHITESPACE}]")
            elif esc == r"\S":
                if in_class:
                    raise ValueError(r"\S inside a character class is not supported")
                out.append(f"[^{_WHITESPACE}]")
            else:
                out.append(esc)
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c in "+*?}" and pattern[i + 1 : i + 2] == "+":
            out.append(c)  # possessive -> greedy: drop the second '+'
            i += 2
            continue
        elif c == "$":
            c = r"\Z"
        out.append(c)
        i += 1
    return "".join(out)
