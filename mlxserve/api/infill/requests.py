"""llama.cpp's POST /infill body, as editor plugins (llama.vscode, llama.vim) send it, and
its translation into a neutral fill-in-the-middle completion. Fields llama.cpp has and
this server does not serve are a 400 naming them when they would change the reply."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from mlxserve.api.wire import Strict
from mlxserve.protocol import request as neutral

# Fields of llama.cpp's /completion that change the reply and are not served, with the
# value that changes nothing (sent as that, they are accepted).
NOT_SERVED: dict[str, Any] = {
    "grammar": "",
    "json_schema": None,
    "n_probs": 0,
    "lora": None,
    "mirostat": 0,
    "dry_multiplier": 0.0,
    "typical_p": 1.0,
    "dynatemp_range": 0.0,
    "n_cmpl": 1,
    "ignore_eos": False,
    "return_tokens": False,
    "post_sampling_probs": False,
    "response_fields": None,
}


class ExtraFile(Strict):
    filename: str = "tmp"
    text: str = ""


class InfillRequest(Strict):
    model: str | None = None
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: Annotated[list[ExtraFile], Field(max_length=256, default_factory=list)]
    prompt: str = ""  # text the middle starts with (after the middle marker)
    n_predict: Annotated[int, Field(ge=-1)] = -1  # -1: until the end; 0: the prompt only
    t_max_predict_ms: Annotated[int, Field(ge=0)] = 0  # 0: no limit
    n_indent: Annotated[int, Field(ge=0)] = 0
    stop: Annotated[
        list[Annotated[str, Field(min_length=1)]], Field(max_length=16, default_factory=list)
    ]
    stream: bool = False
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    seed: int | None = None  # -1: random, as llama.cpp reads it
    repeat_penalty: Annotated[float, Field(gt=0.0)] | None = None
    repeat_last_n: Annotated[int, Field(ge=0, le=1 << 20)] = 64
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    # Accepted and not needed here: the prompt cache always serves, the sampler chain is
    # mlx-lm's, and a prompt is never cut short by time.
    cache_prompt: bool = True
    samplers: list[str] | str | None = None
    t_max_prompt_ms: int | None = None
    id_slot: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _served(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, neutral_value in NOT_SERVED.items():
                value = data.get(name)
                if value not in (neutral_value, None, [], ""):
                    raise ValueError(f"{name} is not served by this server's /infill")
        return data


def infill_request(wire: InfillRequest) -> neutral.CompletionRequest:
    """The neutral request; `n_predict` 0 becomes one token (its text is not sent)."""
    seed = None if wire.seed is None or wire.seed < 0 else wire.seed
    return neutral.CompletionRequest(
        model=wire.model,
        sampling=neutral.Sampling(
            temperature=wire.temperature,
            top_p=wire.top_p,
            top_k=wire.top_k,  # 0 or -1: no top-k, as in llama.cpp
            min_p=wire.min_p,
            repetition_penalty=wire.repeat_penalty,
            repetition_context_size=max(wire.repeat_last_n, 1),
            presence_penalty=wire.presence_penalty,
            frequency_penalty=wire.frequency_penalty,
            seed=seed,
        ),
        max_tokens=None if wire.n_predict < 0 else max(wire.n_predict, 1),
        max_tokens_param="n_predict",
        stop=tuple(wire.stop),
        prompts=(wire.input_prefix,),
        prompt_param="input_prefix",
        infill=neutral.Infill(
            wire.input_suffix,
            tuple(neutral.FileChunk(f.filename, f.text) for f in wire.input_extra),
            wire.prompt,
            param="input_suffix",
        ),
    )
