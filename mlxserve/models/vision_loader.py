"""Loading vision-language models and their processors with mlx-vlm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlxserve.models.capabilities import read_config


def load_vision_model(path: Path, adapter_path: str | None) -> Any:
    """The mlx-vlm model (vision tower and language model), its weights not read yet:
    the caller reads them, after a distributed server has split the model."""
    from mlx_vlm.trainer.peft.utils import apply_lora_layers
    from mlx_vlm.utils import load_model

    from mlxserve.models.vision_mends import mend

    model = load_model(path, lazy=True)
    mend(model)
    if adapter_path:
        model = apply_lora_layers(model, adapter_path)
        model.eval()
    return model


def load_vision_processor(path: Path, trust_remote_code: bool) -> Any:
    """The processor mlx-vlm pairs with the model, as `mlx_vlm.load` builds it: image
    preprocessing and the prompt's image-token expansion. No MLX work happens here."""
    from mlx_vlm.utils import get_model_and_args, load_image_processor, load_processor

    from mlxserve.models.vision_mends import mend_processor

    config = read_config(path)
    # Importing the model's package registers mlx-vlm's processor for it (numpy instead
    # of the torch-based processors transformers would pick).
    get_model_and_args(dict(config))
    extra = {"trust_remote_code": True} if trust_remote_code else {}
    processor = load_processor(path, True, eos_token_ids=config.get("eos_token_id"), **extra)
    image_processor = load_image_processor(path, **extra)
    if image_processor is not None:
        processor.image_processor = image_processor
    mend_processor(processor)
    return processor
