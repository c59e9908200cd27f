"""What the continuous batch calls for logits: a text model as it is, a vision model
wrapped (vision_model.py). The vision modules, and mlx-vlm with them, are imported when a
vision model is served: a text server starts most of a second sooner without them."""

from __future__ import annotations

from typing import Any


def batch_model(loaded_model: Any, vision: bool) -> Any:
    if not vision:
        return loaded_model
    from mlxserve.engine.continuous.vision_model import VisionBatchModel

    return VisionBatchModel(loaded_model)
