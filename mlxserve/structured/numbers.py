"""Bounded JSON numbers. A JSON grammar allows a number of any length, and a model that
loops on a digit (`3e5711111...`) then never finishes; no JSON parser keeps more than an
int64 or a float64 of it anyway. So, wherever a grammar writes JSON, a number is held to
what those hold, on top of the grammar's own mask:

- an integer (where the grammar allows no fraction or exponent): what an int64 holds;
- any other number: at most 17 significant digits (and 17 zeros before them), an
  exponent of at most 3 digits, and a value a float64 holds (finite).

A schema's own bounds narrower than these are the grammar's to enforce. Where the grammar
wants more than these allow (a schema whose bound needs more digits), the grammar wins.

A digit run is a number only where the grammar allows no letter next: inside a JSON
string, a thought or markup, letters are allowed and digits run free. (A string whose
pattern allows only digits is held to an int64's 19 digits as if it were a number.)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

INT64 = (-(2**63), 2**63 - 1)
SIGNIFICANT_DIGITS = 17  # a float64 round-trips through 17 significant digits
EXPONENT_DIGITS = 3
TAIL_BYTES = 64  # more than the longest number these bounds allow
NUMBER_BYTES = b"0123456789.eE+-"
# A number's text so far: sign, integer part, fraction, exponent (each possibly unfinished).
NUMBER_SO_FAR = re.compile(
    rb"(?P<sign>-?)(?P<int>0|[1-9][0-9]*)(?:\.(?P<frac>[0-9]*))?"
    rb"(?:[eE](?P<esign>[+-]?)(?P<exp>[0-9]*))?"
)
# The number the text ends in, behind a character a number can follow in JSON.
TRAILING_NUMBER = re.compile(rb"(?:^|(?<=[\s\[{:,=(>]))-?[0-9][0-9.eE+-]*\Z")
DIGITS = re.compile(rb"-?[0-9]+")
LETTERS = set(b"ABCDFGHIJKLMNOPQRSTUVWXYZabcdfghijklmnopqrstuvwxyz")  # all but e and E


def fits(text: bytes, integer: bool) -> bool:
    """Whether `text` is the start of a number the bounds allow (or not a number's start at
    all, which is the grammar's business)."""
    match = NUMBER_SO_FAR.fullmatch(text)
    if match is None:
        return True
    if text[-1:] in (b".", b"e", b"E", b"+", b"-"):  # unfinished: a digit must fit after it
        return fits(text + b"1", integer)
    if integer and match["frac"] is None and match["exp"] is None:
        return INT64[0] <= int(text) <= INT64[1]
    mantissa = match["int"] + (match["frac"] or b"")
    significant = mantissa.lstrip(b"0")
    zeros = len(mantissa) - len(significant) - (match["int"] == b"0")
    if len(significant) > SIGNIFICANT_DIGITS or zeros > SIGNIFICANT_DIGITS:
        return False
    if match["exp"] is None:
        return True
    return len(match["exp"]) <= EXPONENT_DIGITS and math.isfinite(float(text))


def room(text: bytes, longest: int) -> bool:
    """Whether any text up to `longest` bytes longer than `text` still fits the bounds, so
    that no token needs a look: the common case, a number far from its bounds."""
    match = NUMBER_SO_FAR.fullmatch(text)
    if match is None:
        return False
    if match["exp"] is None:  # a token may start the exponent: at most longest - 1 digits
        mantissa = len(match["int"]) + len(match["frac"] or b"")
        return mantissa + longest <= SIGNIFICANT_DIGITS and longest <= EXPONENT_DIGITS
    return len(match["exp"]) + longest < EXPONENT_DIGITS  # 2 digits: finite, whatever before


@dataclass(frozen=True)
class NumberTable:
    """What the bounds need to know of one tokenizer's tokens. Its arrays are small, so that
    a step looks at a few hundred tokens, never the whole vocabulary."""

    tokens: list[bytes]
    numeric: np.ndarray  # ids of the tokens that can continue a number
    prefix: np.ndarray  # for each of those, its leading bytes that can: an index in `prefixes`
    length: np.ndarray  # and their length
    prefixes: list[bytes]
    letters: np.ndarray  # ids of one-letter tokens (no e or E): allowed in text, never in a number
    fractions: np.ndarray  # ids of ".", "e" and "E": what a float allows after a digit

    @classmethod
    def of(cls, tokens: list[bytes]) -> NumberTable:
        numeric = {i: p for i, p in ((i, _number_prefix(t)) for i, t in enumerate(tokens)) if p}
        prefixes = sorted(set(numeric.values()))
        index = {p: i for i, p in enumerate(prefixes)}
        letters = [i for i, t in enumerate(tokens) if len(t) == 1 and t[0] in LETTERS] or [
            i for i, t in enumerate(tokens) if t[:1] and t[0] in LETTERS
        ]  # a vocabulary without one-letter tokens: any token that starts with a letter
        return cls(
            tokens=tokens,
            numeric=np.array(list(numeric), dtype=np.int64),
            prefix=np.array([index[p] for p in numeric.values()], dtype=np.int64),
            length=np.array([len(p) for p in numeric.values()], dtype=np.int64),
            prefixes=prefixes,
            letters=np.array(letters, dtype=np.int64),
            fractions=np.array(
                [i for i, t in enumerate(tokens) if t in (b".", b"e", b"E")], dtype=np.int64
            ),
        )

    def within(self, vocabulary: int) -> NumberTable:
        """The table for a mask of `vocabulary` tokens (a model's may be padded or cut)."""
        numeric = self.numeric < vocabulary
        return NumberTable(
            tokens=self.tokens,
            numeric=self.numeric[numeric],
            prefix=self.prefix[numeric],
            length=self.length[numeric],
            prefixes=self.prefixes,
            letters=self.letters[self.letters < vocabulary],
            fractions=self.fractions[self.fractions < vocabulary],
        )


def _number_prefix(token: bytes) -> bytes:
    end = 0
    while end < len(token) and token[end] in NUMBER_BYTES:
        end += 1
    return token[:end]


class NumberBounds:
    """One sequence's view: the text it has written lately, and the bounds it puts on the
    grammar's mask for the next token."""

    def __init__(self, table: NumberTable):
        self._table = table
        self._within: NumberTable | None = None
        self._text = bytearray()  # all written (a reply's bytes: small beside its KV cache)
        self._ends: list[int] = []  # where each token's bytes end in it

    @property
    def _tail(self) -> bytes:
        return bytes(self._text[-TAIL_BYTES:])

    def written(self, token: int) -> None:
        if token < len(self._table.tokens):
            self._text += self._table.tokens[token]
        self._ends.append(len(self._text))

    def rollback(self, tokens: int) -> None:
        """Forget the last `tokens` written (drafted tokens a verify pass did not keep)."""
        if tokens:
            del self._ends[-tokens:]
            del self._text[self._ends[-1] if self._ends else 0 :]

    def restrict(self, allowed: np.ndarray) -> None:
        """Clears, in `allowed` (the grammar's mask), the tokens that would carry the number
        being written past its bounds, unless that leaves nothing."""
        tail = self._tail
        if not tail or tail[-1] not in NUMBER_BYTES:
            return
        match = TRAILING_NUMBER.search(tail)
        if self._within is None:
            self._within = self._table.within(len(allowed))
        table = self._within
        if match is None or allowed[table.letters].any():  # text, not a number
            return
        number = match.group()
        candidates = np.flatnonzero(allowed[table.numeric])
        if not candidates.size or room(number, int(table.length[candidates].max())):
            return
        integer = DIGITS.fullmatch(number) is not None and not allowed[table.fractions].any()
        verdicts: dict[int, bool] = {}  # many tokens share a prefix ("9", "9,", "9}")
        refused = []
        for token, prefix in zip(
            table.numeric[candidates].tolist(), table.prefix[candidates].tolist(), strict=True
        ):
            if prefix not in verdicts:
                verdicts[prefix] = fits(number + table.prefixes[prefix], integer)
            if not verdicts[prefix]:
                refused.append(token)
        if refused and np.count_nonzero(allowed) > len(refused):
            allowed[refused] = False
