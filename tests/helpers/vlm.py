"""Vision-language replies compared: the server's (alone, batched, streamed or not) and
mlx-vlm's own `generate_step` for the same prompt, rendered as the server renders it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from helpers.sse import chat_message, logprob_entries, stream

CHAT = "/v1/chat/completions"
LOGPROB_TOLERANCE = 1e-3  # a batch pads and sums in another order than a single row


def reply(srv, body: dict, streamed: bool) -> tuple[str, list[str], list[float]]:
    """The content, the tokens and their logprobs, streamed or not."""
    if streamed:
        result = stream(srv.url, CHAT, {**body, "stream": True})
        assert result.status == 200, result.lines
        entries = logprob_entries(result.chunks)
        content = chat_message(result.chunks)["content"]
    else:
        status, _, whole = srv.post(CHAT, body)
        assert status == 200, whole
        return whole_reply(whole)
    return content, [e["token"] for e in entries], [e["logprob"] for e in entries]


def whole_reply(whole: dict) -> tuple[str, list[str], list[float]]:
    """A non-streamed reply's content, tokens and their logprobs."""
    entries = whole["choices"][0]["logprobs"]["content"]
    content = whole["choices"][0]["message"]["content"]
    return content, [e["token"] for e in entries], [e["logprob"] for e in entries]


def same(a: tuple, b: tuple) -> bool:
    """The same content and tokens, and logprobs equal within the batch's rounding."""
    return a[:2] == b[:2] and all(
        math.isclose(x, y, abs_tol=LOGPROB_TOLERANCE) for x, y in zip(a[2], b[2], strict=True)
    )


@dataclass(frozen=True)
class Family:
    model: Path
    end_token: int  # the id of the token that ends a turn
    # the encoder's output for an image is kept for the next prompt with it
    keeps_features: bool = True


def generate_alone(family: Family, bodies: list[dict], length: int) -> list[tuple]:
    """What mlx-vlm's own generate_step gives for each body, in this process: the prompt
    rendered as the server renders it, the end token forbidden as logit_bias does."""
    import mlx.core as mx
    from mlx_vlm.generate import generate_step
    from mlx_vlm.utils import load_model

    from mlxserve.api.openai.requests import ChatRequest, chat_request
    from mlxserve.api.wire import validate
    from mlxserve.chat.media import MediaLimits
    from mlxserve.chat.vision_prompt import VisionChat, render_vision_chat
    from mlxserve.config import ServerConfig
    from mlxserve.models.tokenizer import load_text_tokenizer
    from mlxserve.models.vision_loader import load_vision_processor
    from mlxserve.models.vision_mends import scale_gemma3n_text_embeddings

    tokenizer = load_text_tokenizer(family.model, False)
    processor = load_vision_processor(family.model, False)
    chat = VisionChat(tokenizer, processor, family.model, MediaLimits.from_config(ServerConfig()))
    model = load_model(family.model)  # mlx-vlm's own code, none of mlxserve's mends
    # but Gemma 3n's text scaled in the prompt as in its decode steps (without it mlx-vlm
    # disagrees with itself: vision_mends' docstring); a no-op for every other family
    scale_gemma3n_text_embeddings(model)

    def forbid_end(_tokens, logits):
        return logits + mx.where(mx.arange(logits.shape[-1]) == family.end_token, -100.0, 0.0)

    expected = []
    for body in bodies:
        request = chat_request(validate(ChatRequest, {"messages": body["messages"]}))
        prompt, images = render_vision_chat(chat, request, {}, None, False)
        model.language_model._position_ids = None  # each prompt computes its own positions
        model.language_model._rope_deltas = None
        steps = generate_step(
            mx.array(prompt)[None],
            model,
            images.pixel_values,
            images.attention_mask,
            logits_processors=[forbid_end],
            **images.extra,
        )
        ids, logprobs = [], []
        for (token, row), _ in zip(steps, range(length), strict=False):
            ids.append(token)
            logprobs.append(row[token].item())
        tokens = [tokenizer.decode([t]) for t in ids]
        expected.append(("".join(tokens), tokens, logprobs))
    return expected
