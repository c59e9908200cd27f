"""What a model folder holds, read from its config.json (a diffusion pipeline's
model_index.json) without loading any weights."""

from __future__ import annotations

import importlib.util
import json
from functools import lru_cache
from pathlib import Path

PIPELINE_INDEX = "model_index.json"  # a diffusers-style pipeline: a folder per component


def is_pipeline_folder(path: Path) -> bool:
    return (path / PIPELINE_INDEX).is_file()


def weight_files(path: Path) -> list[Path]:
    """A model's weights: beside its config, or in its components' folders (a pipeline)."""
    found = sorted(path.glob("*.safetensors"))
    if is_pipeline_folder(path):
        found += sorted(path.glob("*/*.safetensors"))
    return found


def is_model_folder(path: Path) -> bool:
    """A folder holding a model: a config (or a pipeline's index) and weights."""
    has_config = (path / "config.json").is_file() or is_pipeline_folder(path)
    return has_config and bool(weight_files(path))


def read_config(path: Path) -> dict:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


@lru_cache(maxsize=64)
def is_vision_model(path: Path) -> bool:
    """A vision-language model: loaded with mlx-vlm rather than mlx-lm. Its config has a
    `vision_config`, or names an architecture only mlx-vlm implements."""
    config = read_config(path)
    if isinstance(config.get("vision_config"), dict):
        return True
    model_type = str(config.get("model_type", "")).lower()
    return (
        bool(model_type)
        and not has_module("mlx_lm.models", model_type)
        and has_module("mlx_vlm.models", model_type)
    )


# What a vision-language model takes, in the order /v1/models lists them.
MEDIA = ("image", "video", "audio")


@lru_cache(maxsize=64)
def media_modalities(path: Path) -> frozenset[str]:
    """The media a vision-language model's prompts take: images, video where its config
    names a video placeholder (Qwen-VL, Gemma 4), audio where it also has an audio tower
    (Gemma 3n and 4, the Omni models). Its processor is asked again per request."""
    config = read_config(path)
    sections = [config, *(v for v in config.values() if isinstance(v, dict))]
    named = {name for section in sections for name in section if section.get(name) is not None}
    found = {"image"}
    if named & {"video_token_id", "video_token_index"}:
        found.add("video")
    if isinstance(config.get("audio_config"), dict) and named & {
        "audio_token_id",
        "audio_token_index",
    }:
        found.add("audio")
    return frozenset(found)


def loads_as_text(path: Path) -> bool:
    """A vision-language checkpoint that mlx-lm also loads, as a text model (its sanitize
    drops the vision tower): Qwen3.5 and 3.6 are published this way, MTP head included."""
    config = read_config(path)
    model_type = str(config.get("model_type", "")).lower()
    return (
        isinstance(config.get("vision_config"), dict)
        and bool(model_type)
        and has_module("mlx_lm.models", model_type)
    )


# config.json fields that hold the longest sequence a model was trained for, by family.
CONTEXT_FIELDS = ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions")


@lru_cache(maxsize=64)
def trained_context(path: Path) -> int | None:
    """The context length the model declares (a vision model's in its text_config), or
    None when its config names none."""
    config = read_config(path)
    for section in (config, config.get("text_config")):
        if isinstance(section, dict):
            for name in CONTEXT_FIELDS:
                value = section.get(name)
                if isinstance(value, int) and value > 0:
                    return value
    return None


def sentence_transformers_modules(path: Path) -> list[dict]:
    """The modules a sentence-transformers folder lists (modules.json); [] for others."""
    try:
        modules = json.loads((path / "modules.json").read_text())
    except (OSError, ValueError):
        return []
    return [m for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []


@lru_cache(maxsize=64)
def is_embedding_model(path: Path) -> bool:
    """An embedding model: a sentence-transformers folder whose modules include Pooling."""
    modules = sentence_transformers_modules(path)
    return any(str(m.get("type", "")).endswith("Pooling") for m in modules)


def is_text_model(path: Path) -> bool:
    model_type = str(read_config(path).get("model_type", "")).lower()
    return bool(model_type) and has_module("mlx_lm.models", model_type)


def has_module(package: str, name: str) -> bool:
    try:
        return importlib.util.find_spec(f"{package}.{name}") is not None
    except (ImportError, ValueError):
        return False


# Encoders whose sequence-classification checkpoints serve as rerankers (mlx-vlm's loader)
CROSS_ENCODER_TYPES = ("bert", "modernbert", "xlm_roberta")


def is_cross_encoder(path: Path) -> bool:
    """A reranker that reads (query, document) together: an encoder checkpoint with a
    one-label sequence-classification head (ms-marco MiniLM, bge-reranker, ...)."""
    config = read_config(path)
    model_type = str(config.get("model_type", "")).lower().replace("-", "_")
    heads = [str(a) for a in config.get("architectures") or []]
    labels = config.get("num_labels", len(config.get("id2label") or {}) or 1)
    return (
        model_type in CROSS_ENCODER_TYPES
        and any(a.endswith("ForSequenceClassification") for a in heads)
        and labels == 1
    )


def is_decoder_reranker(path: Path) -> bool:
    """A Qwen3-Reranker-style model: a causal LM that answers "yes" or "no" to a
    query-document pair. Its checkpoint is an ordinary chat model's, so only its name
    tells it apart ("reranker" in its folder or repo name)."""
    return is_text_model(path) and any("reranker" in part.lower() for part in path.parts[-3:])


def is_transcription_model(path: Path) -> bool:
    """A Whisper-family speech-to-text model (mlx-audio's Whisper): its config says
    whisper, or has Whisper's dimensions (MLX conversions often name no model_type)."""
    config = read_config(path)
    model_type = str(config.get("model_type", "")).lower()
    return model_type == "whisper" or ("n_audio_ctx" in config and "n_text_ctx" in config)


def is_speech_model(path: Path) -> bool:
    """A text-to-speech model of a family mlx-audio implements (and no LM mlx-lm runs)."""
    from mlx_audio.tts.utils import MODEL_REMAPPING

    model_type = str(read_config(path).get("model_type", "")).lower()
    model_type = MODEL_REMAPPING.get(model_type, model_type)
    return (
        bool(model_type)
        and has_module("mlx_audio.tts.models", model_type)
        and not is_text_model(path)
    )
