"""Models as Ollama describes them: `NAME:TAG` names, a digest from the weights, `details`
and `model_info` from the config and the safetensors headers."""

from __future__ import annotations

import functools
import hashlib
import json
import struct
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from mlxserve.models.capabilities import read_config, weight_files

LATEST = ":latest"
FORMAT = "mlx"
HEAD_BYTES = 64 * 1024  # of each weight file, with its header, in the digest
# A safetensors dtype's bytes per element, for counting parameters
DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "U32": 4, "U8": 1}
DTYPE_LEVELS = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def ollama_name(name: str) -> str:
    """A model's name as Ollama lists it: with a tag (`:latest` where it has none)."""
    return name if ":" in name.rsplit("/", 1)[-1] else name + LATEST


def served_name(name: str) -> str:
    """The name a request gives, as the provider knows it: NAME:latest is NAME."""
    return name.removesuffix(LATEST)


def timestamp(moment: datetime | None = None) -> str:
    """RFC 3339 in UTC with a Z, as Ollama writes `created_at`."""
    moment = moment or datetime.now(timezone.utc)
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def modified_at(path: Path) -> str:
    files = weight_files(path) or [path]
    return timestamp(datetime.fromtimestamp(max(f.stat().st_mtime for f in files), timezone.utc))


@dataclass(frozen=True)
class Weights:
    """What the safetensors headers tell without reading a tensor."""

    digest: str  # 64 hex digits, as Ollama's (no sha256: prefix)
    parameters: int


def weights(path: Path) -> Weights:
    files = weight_files(path)
    key = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return _weights(key, _bits(read_config(path)))


@functools.lru_cache(maxsize=64)
def _weights(files: tuple[tuple[str, int, int], ...], bits: int | None) -> Weights:
    """The digest hashes each file's name, size, header and first bytes: it changes with
    the weights, and costs no read of a multi-gigabyte file."""
    digest = hashlib.sha256()
    parameters = 0
    for name, size, _ in files:
        path = Path(name)
        digest.update(f"{path.name}:{size}".encode())
        with path.open("rb") as f:
            digest.update(f.read(HEAD_BYTES))
        if path.suffix == ".safetensors":
            parameters += _parameters(path, bits)
    return Weights(digest.hexdigest(), parameters)


def _parameters(path: Path, bits: int | None) -> int:
    """Parameters stored in a safetensors file; a quantized matrix (packed into 32-bit
    words beside its scales) counts as its unpacked size."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    names = set(header)
    count = 0
    for name, tensor in header.items():
        if name == "__metadata__" or name.endswith((".scales", ".biases")):
            continue
        elements = 1
        for dim in tensor["shape"]:
            elements *= dim
        base = name.rsplit(".", 1)[0]
        if bits and tensor["dtype"] == "U32" and f"{base}.scales" in names:
            elements = elements * 32 // bits
        count += elements
    return count


def _bits(config: dict) -> int | None:
    quantization = config.get("quantization") or config.get("quantization_config") or {}
    return quantization.get("bits") if isinstance(quantization, dict) else None


def parameter_size(count: int) -> str:
    """As Ollama writes it: 135M, 3.2B."""
    if count >= 1e9:
        return f"{count / 1e9:.1f}B"
    if count >= 1e6:
        return f"{count / 1e6:.0f}M"
    return f"{count / 1e3:.0f}K"


def _text_config(config: dict) -> dict:
    """A multimodal config's language model's (where its sizes are), else the config."""
    return {**config, **config.get("text_config", {})}


def family(config: dict) -> str:
    return str(_text_config(config).get("model_type") or config.get("model_type") or "unknown")


def details(path: Path) -> dict:
    config = read_config(path)
    families = [family(config)]
    vision = config.get("vision_config", {}).get("model_type")
    if vision and vision not in families:
        families.append(str(vision))
    bits = _bits(config)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "")
    return {
        "parent_model": "",
        "format": FORMAT,
        "family": families[0],
        "families": families,
        "parameter_size": parameter_size(weights(path).parameters),
        "quantization_level": f"Q{bits}" if bits else DTYPE_LEVELS.get(dtype, dtype.upper()),
    }


# config.json's names of what Ollama's model_info says under <family>.*
MODEL_INFO = {
    "embedding_length": "hidden_size",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
}


def model_info(path: Path, context_length: int | None) -> dict:
    config = read_config(path)
    text = _text_config(config)
    arch = family(config)
    info: dict = {
        "general.architecture": arch,
        "general.parameter_count": weights(path).parameters,
        "general.basename": path.name,
    }
    if context_length is not None:
        info[f"{arch}.context_length"] = context_length
    for key, name in MODEL_INFO.items():
        if isinstance(text.get(name), int | float) and not isinstance(text.get(name), bool):
            info[f"{arch}.{key}"] = text[name]
    return info
