"""The image kind: text-to-image pipelines (a diffusers-style folder with model_index.json
that mlx-vlm's image generation recognises), served by /v1/images/*."""

from __future__ import annotations

from pathlib import Path

from mlxserve.images.render import ImageModel
from mlxserve.models.capabilities import is_pipeline_folder
from mlxserve.models.kinds import LoadRequest, ModelKind


def is_image_model(path: Path) -> bool:
    if not is_pipeline_folder(path):
        return False
    from mlx_vlm.generate.image import image_generation_model_class

    return image_generation_model_class(str(path)) is not None


def _load(request: LoadRequest) -> ImageModel:
    return ImageModel.load(request.path)


IMAGE = ModelKind(
    "image",
    is_image_model,
    order=50,
    load=_load,
    tokenizer=False,
    endpoint="/v1/images/generations",
)
