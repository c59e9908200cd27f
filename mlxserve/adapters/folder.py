"""An adapter folder read into per-module low-rank updates, from either layout people
train with:

- mlx-lm's (`mlx_lm.lora`): `adapter_config.json` (`fine_tune_type` lora or dora,
  `lora_parameters.scale`) and `adapters.safetensors`, keyed by module path as the
  mlx-lm model names it (`model.layers.1.self_attn.q_proj.lora_a`, shaped in x rank;
  `lora_b` rank x out; DoRA's magnitude `m`);
- PEFT's (`save_pretrained`): `adapter_config.json` (`peft_type` LORA, `r`,
  `lora_alpha`, `use_rslora`, `use_dora`) and `adapter_model.safetensors`, keyed
  `base_model.model.<path>.lora_A.weight` (rank x in), `lora_B.weight` (out x rank) and
  `lora_magnitude_vector` (DoRA), scaled by alpha / rank (alpha / sqrt(rank) with
  rsLoRA).

Both become `ModuleUpdate`s in mlx-lm's orientation: y += scale * (x @ a) @ b. Whether
they fit a model is `layers.py`'s question; here only the folder itself is checked.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import mlx.core as mx

MLX_WEIGHTS = "adapters.safetensors"
PEFT_WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
PEFT_PREFIX = "base_model.model."


class AdapterError(ValueError):
    """An adapter that cannot be served: the message says what and why."""


@dataclass(frozen=True)
class ModuleUpdate:
    """One linear layer's low-rank update: `a` in x rank, `b` rank x out, and for DoRA
    the learned magnitude of each output row."""

    a: mx.array
    b: mx.array
    scale: float
    magnitude: mx.array | None = None


@dataclass(frozen=True)
class AdapterWeights:
    """An adapter as read: its updates by module path (mlx-lm's names), what it is
    (lora, dora) and a fingerprint of its files (prompt-cache entries computed under it
    are keyed by it, so a retrained adapter under the same name never meets them)."""

    kind: str
    updates: dict[str, ModuleUpdate]
    fingerprint: str

    @property
    def nbytes(self) -> int:
        arrays = [
            a for u in self.updates.values() for a in (u.a, u.b, u.magnitude) if a is not None
        ]
        return sum(a.nbytes for a in arrays)


def adapter_files(folder: Path) -> tuple[dict, Path]:
    """The folder's config and weights file (either layout); an AdapterError says what is
    missing or unreadable. Reads no weights: the HTTP threads and start-up check with it."""
    if not folder.is_dir():
        raise AdapterError(f"{folder} is not a folder")
    try:
        config = json.loads((folder / CONFIG).read_text())
    except FileNotFoundError:
        raise AdapterError(f"{folder} has no {CONFIG}") from None
    except (OSError, ValueError) as e:
        raise AdapterError(f"{folder / CONFIG} is not readable JSON: {e}") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{folder / CONFIG} is not a JSON object")
    name = PEFT_WEIGHTS if "peft_type" in config else MLX_WEIGHTS
    if not (folder / name).is_file():
        raise AdapterError(f"{folder} has no {name}")
    _kind(config)  # a layout or kind we do not serve is said now
    return config, folder / name


def read_adapter(folder: Path) -> AdapterWeights:
    """Read an adapter folder's weights (generation thread: MLX)."""
    config, weights_file = adapter_files(folder)
    try:
        tensors = cast(dict[str, mx.array], mx.load(str(weights_file)))
    except Exception as e:
        raise AdapterError(f"{weights_file} is not a readable safetensors file: {e}") from None
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    digest.update(weights_file.read_bytes())
    kind = _kind(config)
    updates = (
        _peft_updates(config, tensors) if "peft_type" in config else _mlx_updates(config, tensors)
    )
    if not updates:
        raise AdapterError(f"{weights_file} holds no low-rank updates")
    return AdapterWeights(kind, updates, digest.hexdigest()[:16])


def _kind(config: dict) -> str:
    if "peft_type" in config:
        if config["peft_type"] != "LORA":
            raise AdapterError(
                f"a PEFT {config['peft_type']} adapter is not served (LoRA and DoRA are)"
            )
        if config.get("modules_to_save"):
            raise AdapterError(
                "this adapter also saves whole modules (modules_to_save); serve it merged "
                "into its base as a model of its own"
            )
        return "dora" if config.get("use_dora") else "lora"
    kind = config.get("fine_tune_type", "lora")
    if kind == "full":
        raise AdapterError("a full fine-tune is a model of its own: serve it with --model")
    if kind not in ("lora", "dora"):
        raise AdapterError(f"fine_tune_type {kind!r} is not served (lora and dora are)")
    return kind


def _mlx_updates(config: dict, tensors: dict[str, mx.array]) -> dict[str, ModuleUpdate]:
    params = config.get("lora_parameters") or {}
    scale = float(params.get("scale", 20.0))  # mlx_lm.lora's default
    modules = _grouped(tensors, {"lora_a": "a", "lora_b": "b", "m": "magnitude"})
    updates = {}
    for path, parts in modules.items():
        a, b = _pair(path, parts)
        updates[path] = ModuleUpdate(a, b, scale, parts.get("magnitude"))
    return updates


def _peft_updates(config: dict, tensors: dict[str, mx.array]) -> dict[str, ModuleUpdate]:
    if any(".lora_embedding_" in key for key in tensors):
        raise AdapterError("adapters on embedding layers are not served")
    renamed = {key.removeprefix(PEFT_PREFIX): value for key, value in tensors.items()}
    modules = _grouped(
        renamed,
        {"lora_A.weight": "a", "lora_B.weight": "b", "lora_magnitude_vector": "magnitude"},
    )
    alpha = float(config.get("lora_alpha", config.get("r", 8)))
    patterns = config.get("alpha_pattern") or {}
    updates = {}
    for path, parts in modules.items():
        oriented = {k: v.T if k in ("a", "b") else v for k, v in parts.items()}
        a, b = _pair(path, oriented)
        rank = a.shape[1]
        module_alpha = next(
            (float(v) for k, v in patterns.items() if re.fullmatch(rf"(.*\.)?{k}", path)), alpha
        )
        scale = module_alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
        updates[path] = ModuleUpdate(a, b, scale, parts.get("magnitude"))
    return updates


def _grouped(
    tensors: dict[str, mx.array], leaves: dict[str, str]
) -> dict[str, dict[str, mx.array]]:
    """{module path: {"a"|"b"|"magnitude": array}}; a tensor of no known leaf is an error."""
    modules: dict[str, dict[str, mx.array]] = {}
    for key, value in tensors.items():
        for leaf, part in leaves.items():
            if key.endswith("." + leaf):
                modules.setdefault(key[: -len(leaf) - 1], {})[part] = value
                break
        else:
            raise AdapterError(f"the tensor {key} is not a LoRA or DoRA weight")
    return modules


def _pair(path: str, parts: dict[str, mx.array]) -> tuple[mx.array, mx.array]:
    """The module's (a, b), checked to be matrices of one rank."""
    a, b = parts.get("a"), parts.get("b")
    if a is None or b is None:
        raise AdapterError(f"{path} has {'no B' if b is None else 'no A'} matrix")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise AdapterError(
            f"{path}: A {tuple(a.shape)} and B {tuple(b.shape)} are not the two halves of "
            "one low-rank update (their ranks differ)"
        )
    return a, b
