"""Ollama's `options` and `keep_alive`, read as Ollama reads them: each option of its own
type (a wrong one is a 400 naming it), unknown ones logged and ignored, null ones skipped."""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlxserve.protocol.errors import bad_request
from mlxserve.protocol.request import Sampling

log = logging.getLogger(__name__)

INTEGERS = ("num_ctx", "num_predict", "top_k", "repeat_last_n", "seed")
FLOATS = (
    "temperature",
    "top_p",
    "min_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
)
# Options Ollama (or its clients) know that change nothing in a reply here: the runner's
# threads, GPU layers, memory mapping, batch size, the tokens a shifted context keeps (a
# context is never shifted here), and mirostat's settings (mirostat is off, below).
IGNORED = (
    "num_keep",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "num_thread",
    "use_mmap",
    "use_mlock",
    "numa",
    "low_vram",
    "f16_kv",
    "logits_all",
    "vocab_only",
    "embedding_only",
    "draft_num_predict",
    "mirostat_tau",
    "mirostat_eta",
    "penalize_newline",  # Ollama's own runners accept it and ignore it (deprecated)
)
# Samplers of Ollama's runner that MLX has not: each served at the value that turns it off
# (what the server does), any other value a 400 naming it: (is it off?, what to send).
NOT_SERVED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "mirostat": (lambda v: v == 0, "MLX has no mirostat sampler; leave it 0 (off)"),
    "typical_p": (lambda v: v >= 1, "MLX has no locally typical sampler; leave it 1 (off)"),
    "tfs_z": (lambda v: v >= 1, "MLX has no tail-free sampler; leave it 1 (off)"),
}
REPEAT_LAST_N = 64  # Ollama's default window for repeat_penalty
WHOLE_CONTEXT = 1 << 20  # repeat_last_n -1: the whole context (far longer than any here)


@dataclass(frozen=True)
class Options:
    """The options as the neutral request takes them."""

    sampling: Sampling = field(default_factory=Sampling)
    max_tokens: int | None = None  # None: the server's default (num_predict -1, -2 or 0)
    stop: tuple[str, ...] = ()
    num_ctx: int | None = None


def read_options(given: dict | None, where: str = "options") -> Options:
    """`where`: the field the options came in (a created name's are its `parameters`)."""
    values = {k: v for k, v in (given or {}).items() if v is not None}
    for key in values:
        if key not in (*INTEGERS, *FLOATS, *IGNORED, *NOT_SERVED, "stop"):
            log.info("Ollama option %r is not one this server knows; ignored", key)
    _check_not_served(values, where)
    numbers = {key: _number(values, key, int, where) for key in INTEGERS if key in values}
    numbers |= {key: _number(values, key, float, where) for key in FLOATS if key in values}
    _check_ranges(numbers, where)
    penalty = numbers.get("repeat_penalty")
    window = int(numbers.get("repeat_last_n", REPEAT_LAST_N))
    if window == 0:  # Ollama's "off"
        penalty = None
    seed = numbers.get("seed")
    predict = numbers.get("num_predict")
    sampling = Sampling(
        temperature=numbers.get("temperature"),
        top_p=numbers.get("top_p"),
        top_k=_int_or_none(numbers.get("top_k")),
        min_p=numbers.get("min_p"),
        repetition_penalty=penalty,
        repetition_context_size=WHOLE_CONTEXT if window < 0 else window,
        presence_penalty=numbers.get("presence_penalty"),
        frequency_penalty=numbers.get("frequency_penalty"),
        seed=None if seed is None or seed < 0 else int(seed),
    )
    return Options(
        sampling,
        max_tokens=int(predict) if predict is not None and predict > 0 else None,
        stop=_stop(values.get("stop"), where),
        num_ctx=_int_or_none(numbers.get("num_ctx")),
    )


def _check_not_served(values: dict, where: str) -> None:
    for key, (off, advice) in NOT_SERVED.items():
        if key not in values:
            continue
        value = _number(values, key, int if key == "mirostat" else float, where)
        if not off(value):
            raise bad_request(
                f"option {key!r} {json.dumps(value)} is not served: {advice}.", f"{where}.{key}"
            )


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)


def _number(values: dict, key: str, kind: type, where: str) -> float:
    """A JSON number (Ollama truncates a float where it wants an integer)."""
    value = values[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        wanted = "an integer" if kind is int else "a number"
        raise bad_request(f"option {key!r} must be {wanted}.", param=f"{where}.{key}")
    return int(value) if kind is int else float(value)


_RANGES = {
    "temperature": (0.0, math.inf),
    "top_p": (0.0, 1.0),
    "min_p": (0.0, 1.0),
    "top_k": (0, math.inf),
    "num_ctx": (1, math.inf),
    "repeat_penalty": (0.0, math.inf),
    "repeat_last_n": (-1, math.inf),
    "num_predict": (-2, math.inf),
}


def _check_ranges(numbers: dict[str, float], where: str) -> None:
    for key, (low, high) in _RANGES.items():
        value = numbers.get(key)
        if value is not None and not low <= value <= high:
            span = f"at least {low:g}" if high == math.inf else f"between {low:g} and {high:g}"
            raise bad_request(f"option {key!r} must be {span}.", param=f"{where}.{key}")


def _stop(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):  # one stop string, as some clients send it
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise bad_request("option 'stop' must be an array of strings.", param=f"{where}.stop")
    return tuple(value)


# keep_alive -------------------------------------------------------------------------------

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def keep_alive_seconds(value: float | str | None) -> float | None:
    """Seconds a model stays once idle (math.inf: forever; None: not said): a number of
    seconds (also in a string), or a Go duration ("5m", "1h30m", "-1m"); negative means
    forever."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return math.inf if value < 0 else float(value)
    text = value.strip()
    try:  # a number in a string: seconds (Ollama itself takes only "0" so; served anyway)
        return keep_alive_seconds(float(text))
    except ValueError:
        pass
    negative = text.startswith("-")
    body = text.lstrip("+-")
    parts = _DURATION.findall(body)
    if not parts or "".join(n + u for n, u in parts) != body:
        raise bad_request(
            f"keep_alive {value!r} is not a duration: give seconds (a number; negative for "
            'ever) or a duration such as "5m" or "1h30m".',
            param="keep_alive",
        )
    seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    return math.inf if negative else seconds
