"""A fill-in-the-middle request's prompts in its model's FIM format (chat/fim.py), or a
400 that says why it cannot be served."""

from __future__ import annotations

from typing import Any

from mlxserve.chat.fim import find_fim
from mlxserve.chat.templates import check_token_ids
from mlxserve.protocol.errors import bad_request
from mlxserve.protocol.request import CompletionRequest, Infill


def infill_prompts(
    tokenizer: Any, request: CompletionRequest, infill: Infill, model: str
) -> tuple[list[list[int]], frozenset[int]]:
    """Each prompt (the code before the cursor) with the infill's suffix and context, and
    the tokens that end a middle besides end-of-sequence."""
    fim = find_fim(tokenizer)
    if fim is None:
        raise bad_request(
            f"The model '{model}' cannot fill in the middle: its tokenizer has no FIM tokens "
            "(such as Qwen2.5-Coder's <|fim_prefix|>, StarCoder's <fim_prefix> or "
            "CodeLlama's <PRE>). Serve a code model trained for it, or send the prompt "
            f"without `{infill.param}`.",
            param=infill.param,
            code="fim_not_supported",
        )
    prompts = []
    for prompt in request.prompts:
        if not isinstance(prompt, str):
            raise bad_request(
                f"With `{infill.param}`, the prompt is the text before the cursor, not token ids.",
                param=request.prompt_param,
            )
        tokens = fim.prompt(tokenizer, prompt, infill.suffix, infill.extra, infill.after_middle)
        check_token_ids(tokenizer, tokens, request.prompt_param)
        prompts.append(tokens)
    return prompts, fim.stop_tokens
