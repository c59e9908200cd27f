"""Python values out of MLX arrays, typed: mlx's stubs give `item()` and `tolist()` as
any scalar or nested list."""

from __future__ import annotations

from typing import cast

import mlx.core as mx


def as_int(array: mx.array) -> int:
    return cast(int, array.item())


def as_float(array: mx.array) -> float:
    return cast(float, array.item())


def int_rows(array: mx.array) -> list[list[int]]:
    return cast(list[list[int]], array.tolist())


def ints(array: mx.array) -> list[int]:
    return cast(list[int], array.tolist())


def floats(array: mx.array) -> list[float]:
    return cast(list[float], array.tolist())
