"""Byte counts as people read them. One formatter for every screen (the start-up screen,
the log, error messages, `mlxserve ls`; the web app's formatBytes in app.js follows the
same rule), in the unit the --*-gb flags take: a GB is 2**30 bytes, an MB 2**20, so
`--memory-budget-gb 18.83` is the budget the screens call 18.83 GB."""

from __future__ import annotations

GB = 2**30
MB = 2**20
KB = 2**10


def format_bytes(count: float) -> str:
    if count >= GB:
        return f"{count / GB:.2f} GB"
    if count >= MB:
        return f"{count / MB:.1f} MB"
    return f"{count / KB:.0f} kB"
