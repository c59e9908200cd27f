"""Several adapters live in one model at once, each row of a batch under its own.

Every linear layer some resident adapter targets is wrapped in an `AdaptedLinear`: the
base layer runs over the whole batch as it always does (its weights are never fused or
copied), then each row gets its own adapter's low-rank update:

- LoRA updates are stacked per layer (one entry per resident adapter, entry 0 all zeros
  for rows on the base, ranks padded with zeros to the largest), and one `gather_mm`
  pair applies every row's own, whatever the mix: a handful of operations per layer
  however many adapters the batch holds;
- DoRA rescales the whole output row, so its rows are gathered by adapter and computed
  apart (as mlx-lm's DoRALinear does).

The arithmetic per row is mlx-lm's (`tuner/lora.py`'s LoRALinear: y + scale * (x @ A) @ B;
`tuner/dora.py`'s DoRALinear), so a row's output equals mlx-lm's `load(base,
adapter_path=...)` for that adapter alone, within the rounding of a batch.

Which rows use which adapter is the model's `Routing`, set for the length of one forward
pass by whoever calls the model (engine/continuous/adapter_rows.py, from the rows' caches).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from mlxserve.adapters.folder import AdapterError, AdapterWeights, ModuleUpdate

BASE = 0  # the slot of rows that use no adapter


@dataclass(frozen=True)
class Group:
    """The rows (indices into the batch; None: all of them) that use one slot."""

    slot: int
    rows: mx.array | None


@dataclass(frozen=True)
class Pass:
    """One forward pass's rows: each row's entry in the LoRA stacks (None: no row uses
    a LoRA adapter), and the rows of each DoRA adapter."""

    rows: mx.array  # 0 .. rows - 1
    entries: mx.array | None
    dora: tuple[Group, ...] = ()


@dataclass
class Routing:
    """Each row's adapter in the forward pass under way (none outside one); `entries`
    and `dora` say where each resident adapter's updates are (ModelAdapters keeps them)."""

    entries: dict[int, int] = field(default_factory=dict)  # LoRA slot -> stack entry
    dora: set[int] = field(default_factory=set)  # DoRA slots
    current: Pass | None = None

    @contextmanager
    def rows(self, slots: list[int]) -> Iterator[None]:
        """Route the next forward pass: row i of its batch uses `slots[i]`."""
        if all(s == BASE for s in slots):
            yield
            return
        entries = [self.entries.get(s, 0) for s in slots]
        dora = tuple(
            Group(
                slot,
                None
                if all(s == slot for s in slots)
                else mx.array([i for i, s in enumerate(slots) if s == slot]),
            )
            for slot in sorted(set(slots) & self.dora)
        )
        self.current = Pass(
            mx.arange(len(slots)), mx.array(entries) if any(entries) else None, dora
        )
        try:
            yield
        finally:
            self.current = None


@dataclass(frozen=True)
class _Dora:
    """A DoRA update as the forward pass applies it; `norm_scale` is mlx-lm's
    m / ||W + scale * B^T A^T||, constant at inference, so computed once."""

    a: mx.array
    b: mx.array
    scale: float
    norm_scale: mx.array


class _Updates:
    """An AdaptedLinear's updates (a plain object: not the module's parameters): the
    LoRA stack (entry e of `a`, `b`, `scales` is the adapter at stack entry e) and the
    DoRA updates by slot."""

    def __init__(self, routing: Routing, in_dims: int, out_dims: int):
        self.routing = routing
        self.a = mx.zeros((1, in_dims, 1))
        self.b = mx.zeros((1, 1, out_dims))
        self.scales = mx.zeros((1,))
        self.dora: dict[int, _Dora] = {}

    def append(self, update: ModuleUpdate | None, rank: int) -> None:
        """Stack one more entry (zeros where the adapter leaves this layer alone)."""
        in_dims, out_dims = self.a.shape[1], self.b.shape[2]
        rank = max(rank, self.a.shape[2])
        if update is not None and self.a.shape[0] == 1:  # the zeros take the first's type
            self.a, self.b = self.a.astype(update.a.dtype), self.b.astype(update.b.dtype)
        a = update.a if update is not None else mx.zeros((in_dims, rank), self.a.dtype)
        b = update.b if update is not None else mx.zeros((rank, out_dims), self.b.dtype)
        scale = update.scale if update is not None else 0.0
        self.a = mx.concatenate([_ranked(self.a, rank, 2), _ranked(a, rank, 1)[None]])
        self.b = mx.concatenate([_ranked(self.b, rank, 1), _ranked(b, rank, 0)[None]])
        self.scales = mx.concatenate([self.scales, mx.array([scale])])
        mx.eval(self.a, self.b, self.scales)

    def drop(self, entry: int) -> None:
        keep = mx.array([e for e in range(self.a.shape[0]) if e != entry])
        self.a, self.b, self.scales = self.a[keep], self.b[keep], self.scales[keep]
        mx.eval(self.a, self.b, self.scales)


def _ranked(matrix: mx.array, rank: int, axis: int) -> mx.array:
    """`matrix` padded with zeros along `axis` to `rank`."""
    missing = rank - matrix.shape[axis]
    if missing == 0:
        return matrix
    widths = [(0, 0)] * matrix.ndim
    widths[axis] = (0, missing)
    return mx.pad(matrix, widths)


class AdaptedLinear(nn.Module):
    """A linear (or quantized linear) layer plus the updates of the adapters that target
    it, each applied to its own rows."""

    def __init__(self, linear: nn.Module, routing: Routing):
        super().__init__()
        self.linear = linear
        self.updates = _Updates(routing, *_dims(linear))

    def __call__(self, x: mx.array) -> mx.array:
        y = self.linear(x)
        current = self.updates.routing.current
        if current is None:
            return y
        if current.entries is not None:  # LoRA: y + scale * (x @ A) @ B, each row its own
            updates = self.updates
            z = mx.gather_mm(x, updates.a, current.rows, current.entries)
            z = mx.gather_mm(z, updates.b, current.rows, current.entries)
            scales = updates.scales[current.entries].astype(z.dtype)[:, None, None]
            y = y + (scales * z).astype(x.dtype)
        for group in current.dora:
            y = self._dora(x, y, group)
        return y

    def _dora(self, x: mx.array, y: mx.array, group: Group) -> mx.array:
        """DoRA's rows: (x W^T + scale * z) * m / ||W + scale B^T A^T||, then the bias."""
        update = self.updates.dora.get(group.slot)
        if update is None:
            return y
        rows = x if group.rows is None else x[group.rows]
        z = (rows @ update.a) @ update.b
        out = rows @ dequantized(self.linear).T + (update.scale * z).astype(x.dtype)
        out = out * update.norm_scale.astype(x.dtype)
        if "bias" in self.linear:
            out = out + self.linear.bias
        if group.rows is None:
            return out
        y[group.rows] = out
        return y


def dequantized(linear: nn.Module) -> mx.array:
    """A linear layer's weight (out x in), dequantized as mlx-lm's DoRALinear does."""
    if not isinstance(linear, nn.QuantizedLinear):
        return linear.weight
    return mx.dequantize(
        linear.weight,
        linear.scales,
        linear.biases,
        group_size=linear.group_size,
        bits=linear.bits,
        mode=linear.mode,
    )


def _dims(linear: nn.Module) -> tuple[int, int]:
    """(in, out) of a linear or quantized linear layer."""
    out_dims, in_dims = linear.weight.shape
    if isinstance(linear, nn.QuantizedLinear):
        in_dims = in_dims * 32 // linear.bits
    return in_dims, out_dims


@dataclass(frozen=True)
class Resident:
    """An adapter in a model's memory."""

    name: str
    path: Path
    slot: int
    kind: str  # lora, dora
    fingerprint: str
    nbytes: int

    @property
    def cache_key(self) -> str:
        """What the prompt cache adds to the model's key for rows under it."""
        return f"|adapter:{self.name}:{self.fingerprint}"


class ModelAdapters:
    """The adapters resident in one loaded model, least recently used first. Changed on
    the generation thread only (it changes the model's layers); `resident` and `in`
    may be read anywhere."""

    def __init__(self, model: Any):
        self._model = model
        self.routing = Routing()
        self._lock = threading.Lock()
        self._resident: OrderedDict[str, Resident] = OrderedDict()
        self._layers: dict[str, AdaptedLinear] = {}
        self._next_slot = BASE + 1

    def get(self, name: str) -> Resident | None:
        """The resident adapter `name` (now the most recently used), or None."""
        with self._lock:
            resident = self._resident.get(name)
            if resident is not None:
                self._resident.move_to_end(name)
            return resident

    @property
    def resident(self) -> list[Resident]:
        """Least recently used first."""
        with self._lock:
            return list(self._resident.values())

    def add(self, name: str, path: Path, weights: AdapterWeights) -> Resident:
        """Make an adapter resident: every module it targets is checked first (an
        AdapterError names the first that does not fit), then wrapped if it is not yet."""
        targets = {p: self._target(p, u, weights.kind) for p, u in weights.updates.items()}
        slot, self._next_slot = self._next_slot, self._next_slot + 1
        for path_in_model, module in targets.items():
            if path_in_model not in self._layers:
                self._wrap(path_in_model, module)
        if weights.kind == "dora":
            for path_in_model, update in weights.updates.items():
                layer = self._layers[path_in_model]
                layer.updates.dora[slot] = _dora(layer.linear, update)
            self.routing.dora.add(slot)
        else:
            rank = max(u.a.shape[1] for u in weights.updates.values())
            for path_in_model, layer in self._layers.items():
                layer.updates.append(weights.updates.get(path_in_model), rank)
            self.routing.entries[slot] = len(self.routing.entries) + 1
        resident = Resident(name, path, slot, weights.kind, weights.fingerprint, weights.nbytes)
        with self._lock:
            self._resident[name] = resident
        return resident

    def remove(self, name: str) -> Resident | None:
        """Drop an adapter's updates (its wrapped layers stay, idle for it)."""
        with self._lock:
            resident = self._resident.pop(name, None)
        if resident is None:
            return None
        slot = resident.slot
        if slot in self.routing.dora:
            self.routing.dora.discard(slot)
            for layer in self._layers.values():
                layer.updates.dora.pop(slot, None)
            return resident
        entry = self.routing.entries.pop(slot)
        for layer in self._layers.values():
            layer.updates.drop(entry)
        self.routing.entries = {
            s: e - 1 if e > entry else e for s, e in self.routing.entries.items()
        }
        return resident

    def _target(self, path: str, update: ModuleUpdate, kind: str) -> nn.Module:
        """The base layer at `path`, checked against the update's shapes."""
        if (update.magnitude is not None) != (kind == "dora"):
            has = "has" if update.magnitude is not None else "lacks"
            raise AdapterError(f"its config says {kind}, but {path} {has} a DoRA magnitude")
        layer = self._layers.get(path)
        module = layer.linear if layer is not None else _module_at(self._model, path)
        if module is None:
            raise AdapterError(
                f"it targets {path}, which this model does not have (an adapter for another "
                "architecture or size?)"
            )
        if not isinstance(module, nn.Linear | nn.QuantizedLinear):
            raise AdapterError(
                f"it targets {path}, a {type(module).__name__}: adapters are served on "
                "linear layers"
            )
        in_dims, out_dims = _dims(module)
        a, b, m = update.a, update.b, update.magnitude
        if (
            a.shape[0] != in_dims
            or b.shape[1] != out_dims
            or (m is not None and m.shape != (out_dims,))
        ):
            raise AdapterError(
                f"{path} is {in_dims} -> {out_dims} in this model, but the adapter's update "
                f"is {a.shape[0]} -> {b.shape[1]} (an adapter for another base model?)"
            )
        return module

    def _wrap(self, path: str, module: nn.Module) -> AdaptedLinear:
        """Wrap a base layer, its LoRA stack holding zeros for the adapters already in."""
        layer = AdaptedLinear(module, self.routing)
        for _ in self.routing.entries:
            layer.updates.append(None, 1)
        self._model.update_modules(tree_unflatten([(path, layer)]))
        self._layers[path] = layer
        return layer


def _module_at(model: Any, path: str) -> nn.Module | None:
    node: Any = model
    for part in path.split("."):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return node if isinstance(node, nn.Module) else None


def _dora(linear: nn.Module, update: ModuleUpdate) -> _Dora:
    """A DoRA update with its norm scale, as mlx-lm's DoRALinear computes it."""
    a, b, magnitude = update.a, update.b, cast(mx.array, update.magnitude)
    adapted = dequantized(linear) + (update.scale * b.T) @ a.T
    prepared = _Dora(a, b, update.scale, magnitude / mx.linalg.norm(adapted, axis=1))
    mx.eval(prepared.a, prepared.b, prepared.norm_scale)
    return prepared
