"""vLLM's /tokenize and /detokenize: a prompt (or a chat rendered exactly as a reply's
prompt would be) to token ids, and token ids back to text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from mlxserve.api.openai.requests import ChatRequest, chat_request
from mlxserve.api.responder import Responder
from mlxserve.api.wire import Strict, parse_json_body, validate
from mlxserve.models.spec import ModelSpec
from mlxserve.service.chat import ChatService


class TokenizeOptions(Strict):
    model: str | None = None
    return_token_strs: bool = False


class TokenizeText(TokenizeOptions):
    prompt: str
    add_special_tokens: bool = True


class Detokenize(Strict):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


@dataclass
class TokenizeEndpoints:
    service: ChatService

    def tokenize(self, raw: bytes, responder: Responder) -> dict:
        """`prompt` is tokenized as text; `messages` (with tools and template arguments,
        as a chat completion takes them) as the chat prompt."""
        body = parse_json_body(raw)
        options = validate(TokenizeOptions, body)
        if "messages" in body:
            request = chat_request(validate(ChatRequest, body))
            spec, tokens = self.service.chat_prompt(request, responder.context)
        else:
            text = validate(TokenizeText, body)
            spec, tokens = self.service.text_tokens(
                text.model, responder.context, text.prompt, text.add_special_tokens
            )
        return self._tokens(spec, tokens, options.return_token_strs)

    def detokenize(self, raw: bytes, responder: Responder) -> dict:
        request = validate(Detokenize, parse_json_body(raw))
        _, text = self.service.detokenize(request.model, responder.context, request.tokens)
        return {"prompt": text}

    def _tokens(self, spec: ModelSpec, tokens: list[int], with_strings: bool) -> dict:
        body: dict[str, Any] = {
            "count": len(tokens),
            "max_model_len": self.service.models.context_length(spec),
            "tokens": tokens,
        }
        if with_strings:
            body["token_strs"] = self.service.token_strings(spec, tokens)
        return body
