"""A verify pass that keeps a hybrid model's recurrent state at every position it takes.

A recurrent layer folds each token into one state, so a row that rejects part of its
draft cannot cut the state back as an attention cache is cut. The pass records, for each
gated delta-net layer (Qwen3-Next, Qwen3.5), the state after each position and its short
convolution's whole input; a row then takes the state after its last kept token and the
convolution window that ends there (`keep`), in place of running its kept tokens a second
time (`verify.SpeculativeBatch._replay`, still the way for recurrent layers not
covered here: Mamba, LFM2, Kimi Linear, ...).

The recurrence runs one position at a time through mlx-lm's own `gated_delta_update`, as a
decode step runs it (one kernel call a position instead of one for the pass; the layer's
projections still take the whole pass at once), and the convolution's input is read where
the layer hands it to its `conv1d` (`RecordingConv1d`). mlx-vlm's layers (Qwen3.5's vision
checkpoints) record their own: their caches open a speculation transaction for the pass
(`ArraysCache.start_speculation`) and commit each row's kept length
(`commit_speculation`), the same states and windows, taken by mlx-vlm's code.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache

from mlxserve.compat import gated_delta_layers, route_gated_delta_updates
from mlxserve.engine.speculation.rewind import Snapshot, snapshot, vision_arrays


@dataclass
class LayerSteps:
    """One recurrent layer's pass: its convolution's input (the window before the pass,
    then the pass's positions) and its state after each position."""

    conv_input: mx.array
    states: list[mx.array] = field(default_factory=list)


@dataclass
class PassSteps:
    """What one verify pass recorded, a `LayerSteps` per recurrent layer in the order the
    model ran them, and each cache as the pass found it (`rewind.snapshot`, for a replay)."""

    snapshots: list[Snapshot]
    layers: list[LayerSteps] = field(default_factory=list)
    # mlx-vlm's recurrent caches with a transaction open for the pass (none where the
    # pass is not recorded)
    transactions: list[Any] = field(default_factory=list)


_recording: ContextVar[PassSteps | None] = ContextVar("recurrent_steps", default=None)
# The most a pass's recorded states may hold (Qwen3-Next-80B's, 36 layers of 32 heads of
# 128 x 128 in float32, are 75 MB a row and position: a pass of 5 tokens over 8 rows, 3 GB)
RECORDED_MAX_BYTES = 1 << 30


class RecordingConv1d(nn.Conv1d):
    """A gated delta-net layer's `conv1d` (its class swapped in place: same weights, same
    parameter names) that shows its input to the pass being recorded."""

    def __call__(self, x: mx.array) -> mx.array:
        steps = _recording.get()
        if steps is not None:
            steps.layers.append(LayerSteps(conv_input=x))
        return super().__call__(x)


def _stepwise(update: Callable[..., tuple[mx.array, mx.array]]) -> Callable[..., Any]:
    """mlx-lm's `gated_delta_update`, run a position at a time while a pass is recorded
    (each state kept), else unchanged."""

    @functools.wraps(update)
    def stepwise(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, **kwargs):
        steps = _recording.get()
        if steps is None or not steps.layers or steps.layers[-1].states:
            return update(q, k, v, a, b, A_log, dt_bias, state, mask, **kwargs)
        layer = steps.layers[-1]
        outputs = []
        for t in range(q.shape[1]):
            at = slice(t, t + 1)
            position_mask = None if mask is None else mask[:, at]
            out, state = update(
                q[:, at], k[:, at], v[:, at], a[:, at], b[:, at], A_log, dt_bias, state,
                position_mask, **kwargs,
            )  # fmt: skip
            outputs.append(out)
            layer.states.append(state)
        return mx.concatenate(outputs, axis=1), state

    return stepwise


def records_steps(model: Any) -> bool:
    """Make `model`'s gated delta-net layers show their convolution's input to a recorded
    pass; whether it has any (idempotent)."""
    route_gated_delta_updates(_stepwise)
    layers: list[Any] = [m for m in model.modules() if isinstance(m, gated_delta_layers())]
    for layer in layers:
        if type(layer.conv1d) is nn.Conv1d:
            layer.conv1d.__class__ = RecordingConv1d
    return bool(layers)


@contextmanager
def recorded(caches: list[Any], width: int) -> Iterator[PassSteps | None]:
    """Record the model's pass over `width` tokens of `caches` (None: no recurrent layer,
    nothing to keep). The states of every position are held until the step settles:
    where they would pass RECORDED_MAX_BYTES the pass is not recorded, and rows that reject
    part of their draft take their kept tokens again (`keep` declines)."""
    ours = [c for c in caches if isinstance(c, ArraysCache)]
    theirs = [c for c in caches if isinstance(c, vision_arrays())]
    if not ours and not theirs:
        yield None
        return
    steps = PassSteps(snapshots=[snapshot(c) for c in caches])
    recurrent: list[Any] = [*ours, *theirs]
    states = [c.cache[1] for c in recurrent]
    held = width * sum(state.nbytes for state in states if state is not None)
    recording = held <= RECORDED_MAX_BYTES
    if recording:
        for cache in theirs:
            cache.start_speculation(width)
        steps.transactions = theirs
    token = _recording.set(steps if recording else None)
    try:
        yield steps
    except BaseException:
        for cache in steps.transactions:
            cache.abort_speculation()
        raise
    finally:
        _recording.reset(token)


def keep(caches: list[Any], steps: PassSteps, kept: list[int]) -> bool:
    """Leave each recurrent cache as if row i had taken only its first `kept[i]` positions
    of the pass (at least one); False (nothing changed) where the pass was not recorded
    for every recurrent cache, or a row's caches are being filled to given lengths."""
    if steps.transactions:
        for cache in steps.transactions:
            cache.commit_speculation(kept)
        return True
    recurrent = [c for c in caches if isinstance(c, ArraysCache)]
    if not _covers(recurrent, steps):
        return False
    width = len(steps.layers[0].states)
    if all(n == width for n in kept):
        return True  # every row took the whole pass: the caches hold it already
    rows = mx.array(kept, dtype=mx.int32)
    for cache, layer in zip(recurrent, steps.layers, strict=True):
        window = cache[0].shape[1]
        positions = (rows[:, None] + mx.arange(window))[..., None]
        cache[0] = mx.take_along_axis(layer.conv_input, positions, axis=1)
        # each row's own state, not a stack of all of them (see RECORDED_MAX_BYTES)
        states = [layer.states[n - 1][i : i + 1] for i, n in enumerate(kept)]
        cache[1] = mx.concatenate(states)
    return True


def _covers(recurrent: list[ArraysCache], steps: PassSteps) -> bool:
    """Whether every recurrent cache was recorded as `keep` reads it: one convolution
    and one state a position per layer, in the caches' order and shapes."""
    if len(steps.layers) != len(recurrent):
        return False
    widths = {len(layer.states) for layer in steps.layers}
    if len(widths) != 1 or 0 in widths:
        return False
    width = widths.pop()
    for cache, layer in zip(recurrent, steps.layers, strict=True):
        if cache.lengths is not None or len(cache.cache) != 2:
            return False
        window, state = cache[0], cache[1]
        if window is None or layer.conv_input.shape[1] != window.shape[1] + width:
            return False
        if state is None or layer.states[-1].shape != state.shape:
            return False
    return True
