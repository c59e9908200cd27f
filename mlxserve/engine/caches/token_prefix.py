"""How much of a prompt a cached token sequence can stand for."""

from __future__ import annotations

import numpy as np


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def usable_prefix(cached: np.ndarray, prompt: np.ndarray, trimmable: bool) -> int:
    """Prompt tokens a cache holding `cached` can stand for: all of `cached` if it is a
    prefix of the prompt, else the shared part if the cache can be trimmed back to it."""
    return usable_share(common_prefix(cached, prompt), len(cached), len(prompt), trimmable)


def usable_share(shared: int, cached: int, prompt: int, trimmable: bool) -> int:
    """usable_prefix from the lengths: `shared` tokens in common, a cache of `cached`
    tokens, a prompt of `prompt`. At least one prompt token is always left to run, for
    the first generated token's logits."""
    want = min(shared, prompt - 1)
    if want == cached or trimmable:
        return want
    return 0
