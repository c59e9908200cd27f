"""Random-weight qwen3 models for the benchmark, with a real BPE tokenizer and chat
template (the demo model's), built locally once: speed does not depend on the weights."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
# Which file holds each weight: mlx-lm's pipeline loading (mlx_lm.server --pipeline) reads it
WEIGHT_INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class BenchModel:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    model_type: str = "qwen3"
    extra: tuple[tuple[str, object], ...] = ()  # more config fields for the architecture

    def config(self, vocab_size: int, eos_token_id: int) -> dict:
        return {
            **dict(self.extra),
            "model_type": self.model_type,
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "intermediate_size": self.intermediate,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.hidden // self.heads,
            "vocab_size": vocab_size,
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
            "eos_token_id": eos_token_id,
        }


# qwen3_next: gated delta-net layers (recurrent state) with full attention every 4th layer
_HYBRID = (
    ("linear_num_value_heads", 8),
    ("linear_num_key_heads", 4),
    ("linear_key_head_dim", 64),
    ("linear_value_head_dim", 64),
    ("linear_conv_kernel_dim", 4),
    ("full_attention_interval", 4),
    ("partial_rotary_factor", 0.25),
    ("num_experts", 4),
    ("num_experts_per_tok", 2),
    ("decoder_sparse_step", 1),
    ("shared_expert_intermediate_size", 704),
    ("moe_intermediate_size", 352),
    ("norm_topk_prob", True),
    ("mlp_only_layers", []),
    ("attention_bias", False),
)
MODELS = {
    "7m": BenchModel("qwen3-7m", hidden=128, layers=2, heads=4, kv_heads=2, intermediate=384),
    "50m": BenchModel("qwen3-50m", hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1408),
    "hybrid-50m": BenchModel(
        "qwen3-next-50m", 512, 8, 8, 4, 1408, model_type="qwen3_next", extra=_HYBRID
    ),
}


def device_dtype() -> str:
    """The benches' weights: float32 on the CPU backend (bfloat16 prefill is ~6x slower
    there), bfloat16 on a GPU."""
    import mlx.core as mx

    return "bfloat16" if mx.default_device() == mx.gpu else "float32"


def _write_index(folder: Path, names: list[str]) -> None:
    weight_map = dict.fromkeys(sorted(names), "model.safetensors")
    (folder / WEIGHT_INDEX).write_text(json.dumps({"weight_map": weight_map}))


def build(spec: BenchModel, dtype: str | None = None) -> Path:
    """The model folder (built on first use under the mlxserve cache); `dtype`: the
    device's (`device_dtype`) unless given."""
    dtype = dtype or device_dtype()
    import importlib

    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlxserve.models.demo import cache_root, ensure_demo_model

    out = cache_root() / "bench" / f"{spec.name}-{dtype}"
    if (out / "model.safetensors").is_file():
        if not (out / WEIGHT_INDEX).is_file():  # built before the index was written
            _write_index(out, list(mx.load(str(out / "model.safetensors"))))
        return out
    tokenizer_source = ensure_demo_model()
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_source / name, partial / name)
    source_config = json.loads((tokenizer_source / "config.json").read_text())
    config = spec.config(source_config["vocab_size"], source_config["eos_token_id"])
    (partial / "config.json").write_text(json.dumps(config, indent=2))
    mx.random.seed(0)
    architecture = importlib.import_module(f"mlx_lm.models.{spec.model_type}")
    model = architecture.Model(architecture.ModelArgs.from_dict(config))
    model.set_dtype(getattr(mx, dtype))
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(partial / "model.safetensors"), weights)
    _write_index(partial, list(weights))
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    params = sum(w.size for w in weights.values())
    print(f"built {out.name}: {params / 1e6:.1f}M parameters", flush=True)
    return out
