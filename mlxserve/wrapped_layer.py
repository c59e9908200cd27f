"""A model's layer wrapped in place, in its model's list of layers, to do something
around its call (drafters/hidden.py keeps its output; engine/continuous/vision_model.py
evaluates a vision tower's blocks one at a time)."""

from __future__ import annotations

from typing import Any

import mlx.nn as nn


class WrappedLayer(nn.Module):
    """`layer`, called as subclasses say; anything else asked of it is the layer's
    (families read attributes of their layers, such as `is_linear`). Its parameters sit
    under `layer.`: wrap a model only once its weights are loaded."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if "layer" not in self:  # still being built
                raise
            return getattr(self["layer"], name)
