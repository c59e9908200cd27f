"""The API endpoints: validated request in, OpenAI response out."""

from __future__ import annotations

from dataclasses import dataclass, replace

from mlxserve.api.errors import bad_request, not_found, unavailable
from mlxserve.api.generation import ChoicePlan, GenerationRun
from mlxserve.api.logprobs import TokenTexts
from mlxserve.api.requests import (
    ChatRequest,
    CompletionRequest,
    GenerationRequest,
    parse_json_body,
    validate,
)
from mlxserve.api.responses import ChatFormat, CompletionFormat, ResponseFormat
from mlxserve.api.sse import SSEWriter
from mlxserve.api.structured import chat_grammar, completion_grammar
from mlxserve.chat.images import ImageLimits
from mlxserve.chat.templates import encode_prompts, render_chat
from mlxserve.chat.tool_prompt import injects_tools
from mlxserve.chat.vision import VisionChat, render_vision_chat
from mlxserve.config import SamplingDefaults, ServerConfig
from mlxserve.engine.jobs import PromptImages
from mlxserve.engine.sampling import GenerationParams
from mlxserve.engine.worker import GenerationWorker
from mlxserve.models.provider import ModelProvider, ModelSpec
from mlxserve.postprocess.output import chat_markup, chat_output_factory
from mlxserve.structured.matcher import Grammar


@dataclass
class Endpoints:
    config: ServerConfig
    provider: ModelProvider
    worker: GenerationWorker

    def health(self) -> tuple[int, dict]:
        if not self.worker.alive or self.provider.loaded is None:
            return 503, {"status": "unavailable"}
        return 200, {"status": "ok", "model": self.provider.alias}

    def models(self) -> dict:
        return {"object": "list", "data": self.provider.list_models()}

    def model(self, model_id: str) -> dict:
        for entry in self.provider.list_models():
            if entry["id"] == model_id:
                return entry
        raise not_found(
            f"The model '{model_id}' does not exist.", param="model", code="model_not_found"
        )

    def chat(self, raw: bytes, handler) -> dict | None:
        request = validate(ChatRequest, parse_json_body(raw))
        spec, tokenizer = self._model(request)
        tools = request.tool_definitions
        injected = injects_tools(tokenizer, self.config.chat_template, tools)
        template_args, template = self.config.chat_template_args, self.config.chat_template
        images = None
        if spec.vision:
            vision = VisionChat(
                tokenizer, self.provider.processor(spec), spec.path, self._image_limits()
            )
            prompt, images = render_vision_chat(vision, request, template_args, template, injected)
        else:
            prompt = render_chat(tokenizer, request, template_args, template, injected)
        markup = chat_markup(
            tokenizer,
            reasoning_parser=self.config.reasoning_parser,
            tool_parser=self.config.tool_parser,
            tools_in_request=tools,
            injected_tools=injected,
        )
        grammar = chat_grammar(request, tokenizer, prompt, markup)
        params = _params(request, self.config.defaults, tokenizer, _usable(grammar, spec))
        fmt = ChatFormat(self._model_name(request), TokenTexts(tokenizer))
        make_output = chat_output_factory(
            tokenizer,
            markup,
            reasoning_format=self.config.reasoning_format,
            tools_in_request=tools,
            parallel_tool_calls=request.parallel_tool_calls,
        )
        return self._run(request, spec, fmt, [prompt], params, handler, make_output, images)

    def completion(self, raw: bytes, handler) -> dict | None:
        request = validate(CompletionRequest, parse_json_body(raw))
        spec, tokenizer = self._model(request)
        prompts = encode_prompts(tokenizer, request)
        grammar = _usable(completion_grammar(request, tokenizer), spec)
        params = _params(request, self.config.defaults, tokenizer, grammar)
        fmt = CompletionFormat(self._model_name(request), TokenTexts(tokenizer))
        return self._run(request, spec, fmt, prompts, params, handler)

    def _model(self, request: GenerationRequest):
        if not self.worker.alive:
            raise unavailable("The generation thread is not running.")
        spec = self.provider.resolve(request.model)
        return spec, self.provider.tokenizer(spec)

    def _image_limits(self) -> ImageLimits:
        config = self.config
        return ImageLimits(
            max_bytes=config.max_image_bytes,
            max_pixels=config.max_image_pixels,
            fetch_timeout=config.image_fetch_timeout,
            allowed_dirs=(*config.image_dirs, *config.model_dirs),
        )

    def _model_name(self, request: GenerationRequest) -> str:
        return request.model or self.provider.alias

    def _run(
        self,
        request: GenerationRequest,
        spec,
        fmt: ResponseFormat,
        prompts: list[list[int]],
        params: GenerationParams,
        handler,
        make_output=None,
        images: PromptImages | None = None,
    ) -> dict | None:
        plans = [
            ChoicePlan(p * request.n + j, prompt, _sibling_seed(params, j), j == 0, images=images)
            for p, prompt in enumerate(prompts)
            for j in range(request.n)
        ]
        run = GenerationRun(
            self.worker,
            spec,
            fmt,
            plans,
            self.config.num_draft_tokens,
            handler.client_gone,
            make_output,
        )
        if not request.stream:
            return run.collect()
        run.stream(SSEWriter(handler), request.include_usage, self.config.keepalive_seconds)
        return None


def _usable(grammar: Grammar | None, spec: ModelSpec) -> Grammar | None:
    """Speculative decoding feeds the logits processors draft tokens it may take back,
    which a grammar's matcher cannot follow."""
    if grammar is not None and spec.draft_path is not None:
        raise bad_request(
            "Constrained decoding is not available on a server started with --draft-model."
        )
    return grammar


def _params(
    request: ChatRequest | CompletionRequest,
    defaults: SamplingDefaults,
    tokenizer,
    grammar: Grammar | None,
) -> GenerationParams:
    logit_bias = {int(k): v for k, v in (request.logit_bias or {}).items()}
    if any(token >= len(tokenizer) for token in logit_bias):
        raise bad_request(
            f"logit_bias token ids must be below {len(tokenizer)}.", param="logit_bias"
        )

    def pick(value, default):
        return default if value is None else value

    return GenerationParams(
        max_tokens=pick(request.token_limit, defaults.max_tokens),
        temperature=pick(request.temperature, defaults.temperature),
        top_p=pick(request.top_p, defaults.top_p),
        top_k=pick(request.top_k, defaults.top_k),
        min_p=pick(request.min_p, defaults.min_p),
        xtc_probability=pick(request.xtc_probability, 0.0),
        xtc_threshold=pick(request.xtc_threshold, 0.0),
        repetition_penalty=request.repetition_penalty,
        repetition_context_size=request.repetition_context_size,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        logit_bias=logit_bias,
        seed=request.seed,
        stop=tuple(request.stop or ()),
        logprobs=request.logprob_count,
        grammar=grammar,
    )


def _sibling_seed(params: GenerationParams, sibling: int) -> GenerationParams:
    """Choice j of a seeded request draws from seed + j: the n choices differ from each
    other, the first equals the same request with n = 1, and all are reproducible."""
    if sibling == 0 or params.seed is None:
        return params
    return replace(params, seed=params.seed + sibling)
