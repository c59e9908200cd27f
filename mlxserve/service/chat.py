"""Neutral requests -> runs: the prompt rendered by the model's template, the sampling
settings, the grammar, and each choice's output pipeline, the same for every dialect."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from mlxserve.chat.media import MediaLimits
from mlxserve.chat.templates import check_token_ids, encode_prompts, render_chat
from mlxserve.chat.tool_prompt import injects_tools
from mlxserve.chat.vision_prompt import VisionChat, render_vision_chat
from mlxserve.config import ServerConfig
from mlxserve.engine.generation.jobs import PromptImages
from mlxserve.engine.generation.reasoning_budget import ReasoningBudget
from mlxserve.engine.generation.sampling import GenerationParams
from mlxserve.engine.loop.worker import GenerationWorker
from mlxserve.models.catalog import ModelCatalog
from mlxserve.models.spec import ModelSpec
from mlxserve.models.tokenizer import longest_token
from mlxserve.postprocess.output import (
    ChatMarkup,
    TextOutput,
    chat_markup,
    chat_output_factory,
    reasoning_markers,
)
from mlxserve.postprocess.reasoning import starts_in_reasoning
from mlxserve.protocol.errors import ContextLengthExceeded, bad_request, not_found
from mlxserve.protocol.request import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    GenerationRequest,
    TextPart,
)
from mlxserve.service.checkpoints import SystemEnds
from mlxserve.service.context import RequestContext
from mlxserve.service.embeddings import (
    Embeddings,
    cut_for_truncation,
    embed,
    shortened,
    tokenized,
)
from mlxserve.service.grammars import chat_grammar, completion_grammar
from mlxserve.service.infill import infill_prompts
from mlxserve.service.media import Media
from mlxserve.service.models import ServedModels
from mlxserve.service.run import ChoicePlan, GenerationRun
from mlxserve.service.token_texts import TokenTexts
from mlxserve.structured.matcher import Grammar
from mlxserve.telemetry.record import Metered

# A last turn cut to fit the context (Responses' truncation "auto"): at most this many
# renders, each cut scaled from the tokens still over, with this much to spare.
CUT_ROUNDS = 8
CUT_SLACK = 1.05


@dataclass(frozen=True)
class Prepared:
    """A request ready to run: its prompts as tokens and how each choice is generated
    and post-processed."""

    spec: ModelSpec
    prompts: list[list[int]]
    params: GenerationParams
    n: int
    texts: TokenTexts  # token ids -> text and bytes, for logprobs
    make_output: Callable[[list[int]], Any]
    context: RequestContext  # whose it is
    images: PromptImages | None = None
    checkpoints: tuple[int, ...] = ()  # see GenerationJob
    context_length: int | None = None  # the model's: a choice that fills it says so
    adapter: str | None = None  # the adapter it runs under (a served name), if any


@dataclass
class ChatService:
    config: ServerConfig
    catalog: ModelCatalog
    worker: GenerationWorker
    _system_ends: SystemEnds = field(default_factory=SystemEnds, init=False)
    # the edge's door to what is not chat: the models, and the other models' work
    models: ServedModels = field(init=False)
    media: Media = field(init=False)

    def __post_init__(self) -> None:
        self.models = ServedModels(self.catalog, self.worker)
        self.media = Media(self.worker, self.config.prefill_chunk)

    def prepare_chat(
        self, request: ChatRequest, context: RequestContext, reasoning_format: str | None = None
    ) -> Prepared:
        """`reasoning_format` overrides --reasoning-format (a dialect with reasoning
        blocks of its own always wants them separate)."""
        spec, tokenizer = self.generator(request.model, context)
        adapter = self._adapter(request, spec)
        if request.drop_oldest_to_fit:
            request = self._within_text_bound(spec, tokenizer, request)
        self._check_text(spec, tokenizer, request.text_length, request.messages_param)
        tools = request.tool_definitions
        config = self.catalog.config_for(spec)
        injected = injects_tools(tokenizer, config.chat_template, tools)
        prompt, images = self._render(spec, tokenizer, request, injected)
        if request.drop_oldest_to_fit:
            request, (prompt, images) = self._drop_oldest(
                spec, tokenizer, request, injected, (prompt, images)
            )
            request, (prompt, images) = self._cut_last_turn(
                spec, tokenizer, request, injected, (prompt, images)
            )
        markup = chat_markup(
            tokenizer,
            reasoning_parser=config.reasoning_parser,
            tool_parser=config.tool_parser,
            tools_in_request=tools,
            injected_tools=injected,
        )
        max_tokens = self._fit(spec, request, len(prompt), request.messages_param, request.n)
        guide_calls = self.config.tool_call_grammar == "auto"
        grammar = chat_grammar(request, tokenizer, prompt, markup, guide_calls)
        params = _params(request, self.config, tokenizer, grammar, max_tokens)
        if request.reasoning_budget is not None:
            budget = _reasoning_budget(request.reasoning_budget, tokenizer, prompt, markup)
            params = replace(params, reasoning_budget=budget)
        make_output = chat_output_factory(
            tokenizer,
            markup,
            reasoning_format=reasoning_format or self.config.reasoning_format,
            tools_in_request=tools,
            parallel_tool_calls=request.parallel_tool_calls,
        )
        checkpoints: tuple[int, ...] = ()
        if not spec.vision and self.worker.residency.checkpoints(spec):

            def render(opening: ChatRequest) -> list[int]:
                return self._render(spec, tokenizer, opening, injected)[0]

            checkpoints = self._system_ends.find(spec, request, injected, prompt, render)
        return Prepared(
            spec,
            [prompt],
            params,
            request.n,
            TokenTexts(tokenizer),
            make_output,
            context,
            images,
            checkpoints,
            self.catalog.context_length(spec),
            adapter,
        )

    def prompt_tokens(self, request: ChatRequest, context: RequestContext) -> int:
        """How many tokens the request's prompt takes, rendered exactly as for a reply."""
        return len(self.chat_prompt(request, context)[1])

    def chat_prompt(
        self, request: ChatRequest, context: RequestContext
    ) -> tuple[ModelSpec, list[int]]:
        """The request's prompt tokens, rendered exactly as for a reply."""
        spec, tokenizer = self.model(request.model, context)
        self._check_text(spec, tokenizer, request.text_length, request.messages_param)
        template = self.catalog.config_for(spec).chat_template
        injected = injects_tools(tokenizer, template, request.tool_definitions)
        return spec, self._render(spec, tokenizer, request, injected)[0]

    def text_tokens(
        self, model: str | None, context: RequestContext, text: str, add_special_tokens: bool
    ) -> tuple[ModelSpec, list[int]]:
        spec, tokenizer = self.model(model, context)
        self._check_text(spec, tokenizer, len(text), "prompt")
        return spec, tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def detokenize(
        self, model: str | None, context: RequestContext, tokens: list[int]
    ) -> tuple[ModelSpec, str]:
        spec, tokenizer = self.model(model, context)
        check_token_ids(tokenizer, tokens, "tokens")
        return spec, tokenizer.decode(tokens)

    def token_strings(self, spec: ModelSpec, tokens: list[int]) -> list[str]:
        return self.catalog.tokenizer(spec).convert_ids_to_tokens(tokens)

    def prepare_completion(self, request: CompletionRequest, context: RequestContext) -> Prepared:
        spec, tokenizer = self.generator(request.model, context)
        for prompt in request.prompts:
            if isinstance(prompt, str):
                self._check_text(spec, tokenizer, len(prompt), request.prompt_param)
        infill, stop_tokens = request.infill, frozenset[int]()
        if infill is None:
            prompts = encode_prompts(tokenizer, request)
        else:
            extra = sum(len(c.text) + len(c.filename) for c in infill.extra)
            chars = len(infill.suffix) + len(infill.after_middle) + extra
            self._check_text(spec, tokenizer, chars, infill.param)
            name = request.model or self.catalog.name(spec)
            prompts, stop_tokens = infill_prompts(tokenizer, request, infill, name)
        longest = max(len(p) for p in prompts)
        sequences = request.n * len(prompts)
        max_tokens = self._fit(spec, request, longest, request.prompt_param, sequences)
        grammar = completion_grammar(request, tokenizer)
        params = _params(request, self.config, tokenizer, grammar, max_tokens)
        # A constrained completion's grammar lets a word-marking tokenizer's first token
        # carry a space the text drops (structured/lark.after_space): it stays trimmed.
        params = replace(params, stop_tokens=stop_tokens, continuation=grammar is None)
        return Prepared(
            spec,
            prompts,
            params,
            request.n,
            TokenTexts(tokenizer),
            lambda _: TextOutput(),
            context,
            context_length=self.catalog.context_length(spec),
            adapter=self._adapter(request, spec),
        )

    def run(self, prepared: Prepared) -> GenerationRun:
        """The run of every choice: `n` for each prompt, seeded siblings apart."""
        plans = [
            ChoicePlan(
                p * prepared.n + j,
                prompt,
                _sibling_seed(prepared.params, j),
                j == 0,
                images=prepared.images,
                checkpoints=prepared.checkpoints,
            )
            for p, prompt in enumerate(prepared.prompts)
            for j in range(prepared.n)
        ]
        return GenerationRun(
            self.worker,
            prepared.spec,
            plans,
            prepared.context,
            prepared.make_output,
            prepared.texts,
            prepared.context_length,
            prepared.adapter,
        )

    def _fit(
        self,
        spec: ModelSpec,
        request: GenerationRequest,
        prompt_tokens: int,
        prompt_param: str,
        sequences: int,
    ) -> int:
        """The most tokens a choice may generate, checked before any prefill against the
        context (see `_context_room`) and the memory budget (`sequences` KV caches of
        that size: what can really be generated, not what was asked for)."""
        max_tokens = self._context_room(spec, request, prompt_tokens, prompt_param)
        param = request.max_tokens_param if request.max_tokens is not None else prompt_param
        self.worker.admission.check(spec, prompt_tokens, max_tokens, sequences, param)
        return max_tokens

    def _context_room(
        self, spec: ModelSpec, request: GenerationRequest, prompt_tokens: int, prompt_param: str
    ) -> int:
        """A prompt that leaves no room in the context is a 400. max_tokens (the request's
        or the server's default) is a ceiling: it is clipped to the room left, and
        generation stops when the context is full (clients such as Claude Code ask for
        more output than a local model's context could ever hold)."""
        wanted = request.max_tokens or self.config.defaults.max_tokens
        limit = self.catalog.context_length(spec)
        if limit is None:
            return wanted
        if prompt_tokens >= limit:
            raise ContextLengthExceeded(prompt_tokens, limit, prompt_param)
        return min(wanted, limit - prompt_tokens)

    def _text_bound(self, spec: ModelSpec, tokenizer) -> int | None:
        """The most characters a prompt that fits the context can have (see longest_token)."""
        limit = self.catalog.context_length(spec)
        return None if limit is None else limit * longest_token(tokenizer)

    def _check_text(self, spec: ModelSpec, tokenizer, chars: int, param: str) -> None:
        """Text that cannot fit the context is refused before it is tokenized: tokenizing
        megabytes takes seconds and gigabytes of memory, only to refuse them after."""
        bound = self._text_bound(spec, tokenizer)
        if bound is not None and chars > bound:
            limit = bound // longest_token(tokenizer)
            at_least = -(-chars // longest_token(tokenizer))
            raise ContextLengthExceeded(at_least, limit, param, at_least=True)

    def _within_text_bound(self, spec: ModelSpec, tokenizer, request: ChatRequest):
        """A request that may drop its oldest turns, without those that could not fit
        anyway, found by their characters (before any of it is rendered)."""
        bound = self._text_bound(spec, tokenizer)
        if bound is None or request.text_length <= bound:
            return request
        for candidate in _without_oldest_turns(request):
            if candidate.text_length <= bound:
                return candidate
        # The last turn alone is too long: its text loses its start (never tokenized whole).
        last = (_without_oldest_turns(request) or [request])[-1]
        return _keep_last_chars(last, last.messages[-1].text_length - (last.text_length - bound))

    def embed(
        self, request: EmbeddingRequest, context: RequestContext
    ) -> tuple[ModelSpec, Embeddings]:
        if self.catalog.adapter(request.model) is not None:
            raise bad_request(
                f"'{request.model}' is an adapter: adapters apply to generation, not to "
                "embeddings.",
                param="model",
                code="model_not_embedding",
            )
        spec = self.models.resolve_kind(
            request.model,
            context,
            "embedding",
            "it does not compute embeddings",
            "model_not_embedding",
        )
        tokenizer = self.catalog.tokenizer(spec)
        limit = self.catalog.context_length(spec)
        if limit is not None and request.keep_last_tokens is not None:
            # truncated, not refused: cut by characters first, so as bounded as the guard
            request = cut_for_truncation(request, limit, longest_token(tokenizer))
        else:
            for i, given in enumerate(request.inputs):
                if isinstance(given, str):
                    param = f"{request.inputs_param}[{i}]"
                    self._check_text(spec, tokenizer, len(given), param)
        inputs = tokenized(request, tokenizer, limit)
        vectors = embed(self.worker, spec, inputs, self.config.prefill_chunk, context.client_gone)
        context.meter(Metered(prompt_tokens=sum(map(len, inputs)), embedding_inputs=len(inputs)))
        return spec, Embeddings(shortened(vectors, request.dimensions), sum(map(len, inputs)))

    def generator(self, requested: str | None, context: RequestContext):
        """The spec and tokenizer of a model that generates (a 400 for an embedding
        model)."""
        spec = self.models.resolve(requested, context)
        if not spec.generative:
            raise bad_request(
                f"The model '{requested}' is a {spec.kind} model; send it to "
                f"{spec.model_kind.endpoint}.",
                param="model",
                code="model_not_generative",
            )
        return spec, self.catalog.tokenizer(spec)

    def _adapter(self, request: GenerationRequest, spec: ModelSpec) -> str | None:
        """The served adapter a request runs under: its `model`'s, or the one its
        `adapter` field names (by name or folder, on the model it names); None: the
        base."""
        named = self.catalog.adapter(request.model)
        if request.adapter is None:
            return named.name if named is not None else None
        adapters = self.catalog.adapters
        chosen = adapters.get(request.adapter) or adapters.by_path(request.adapter)
        if chosen is None:
            raise not_found(
                f"No adapter '{request.adapter}' is served (load one with --lora or "
                "POST /v1/adapters/load; /v1/models lists them).",
                param="adapters",
                code="adapter_not_found",
            )
        if self.catalog.served[chosen.base] != spec or (named and named != chosen):
            raise bad_request(
                f"The adapter '{chosen.name}' runs on {chosen.base}, not on the model "
                f"'{request.model}' this request names.",
                param="adapters",
            )
        return chosen.name

    def model(self, requested: str | None, context: RequestContext):
        """The spec and tokenizer of the model a request names (404 if not servable)."""
        spec = self.models.resolve(requested, context)
        return spec, self.catalog.tokenizer(spec)

    def _drop_oldest(self, spec: ModelSpec, tokenizer, request: ChatRequest, injected, rendered):
        """The request without its oldest turns (each up to a user message; system turns
        stay) as far as needed for its prompt to fit the context with room for an answer.
        When even the last turn alone does not fit, the request as it is (its context error
        follows)."""
        if self._fits(spec, request, rendered[0]):
            return request, rendered
        candidates = _without_oldest_turns(request)
        best = request, rendered
        low, high = 0, len(candidates) - 1
        while low <= high:  # the fewest turns dropped: prompts shrink as more are dropped
            middle = (low + high) // 2
            candidate = candidates[middle]
            prompt = self._render(spec, tokenizer, candidate, injected)
            if self._fits(spec, request, prompt[0]):
                best, high = (candidate, prompt), middle - 1
            else:
                low = middle + 1
        return best

    def _fits(self, spec: ModelSpec, request: ChatRequest, prompt: list[int]) -> bool:
        limit = self.catalog.context_length(spec)
        return limit is None or len(prompt) + _answer_room(request, limit) <= limit

    def _cut_last_turn(self, spec: ModelSpec, tokenizer, request: ChatRequest, injected, rendered):
        """Where the last turn alone does not fit, its text without as much of its start
        as it takes to fit: each cut scaled from the text's tokens as measured, then one
        step back up where the text's density left room (a context error follows where
        even its empty turn does not fit)."""
        limit = self.catalog.context_length(spec)
        if limit is None or not request.messages or self._fits(spec, request, rendered[0]):
            return request, rendered
        room = limit - _answer_room(request, limit)
        fixed = len(self._render(spec, tokenizer, _keep_last_chars(request, 0), injected)[0])
        if fixed >= room:
            return request, rendered
        whole, text = request, request.messages[-1].text_length

        def scaled() -> int:
            return int(text * (room - fixed) / max(len(rendered[0]) - fixed, 1) / CUT_SLACK)

        for _ in range(CUT_ROUNDS):
            if self._fits(spec, request, rendered[0]):
                grown = scaled()
                if grown > text:
                    larger = _keep_last_chars(whole, grown)
                    prompt = self._render(spec, tokenizer, larger, injected)
                    if self._fits(spec, larger, prompt[0]):
                        return larger, prompt
                break
            text = scaled()
            request = _keep_last_chars(whole, text)
            rendered = self._render(spec, tokenizer, request, injected)
        return request, rendered

    def _render(self, spec: ModelSpec, tokenizer, request: ChatRequest, injected: bool):
        config = self.catalog.config_for(spec)
        template_args, template = config.chat_template_args, config.chat_template
        if not spec.vision:
            return render_chat(tokenizer, request, template_args, template, injected), None
        vision = VisionChat(
            tokenizer,
            self.catalog.processor(spec),
            spec.path,
            MediaLimits.from_config(self.config),
        )
        return render_vision_chat(vision, request, template_args, template, injected)


def _answer_room(request: ChatRequest, limit: int) -> int:
    """What a prompt that drops or cuts turns leaves for the answer: max_tokens, up to a
    quarter of the context."""
    return min(request.max_tokens or 1, limit // 4) or 1


def _keep_last_chars(request: ChatRequest, chars: int) -> ChatRequest:
    """The request with its last message's text cut to its last `chars` characters (text
    parts from the end; a message with images or tool calls is left as it is)."""
    last = request.messages[-1] if request.messages else None
    if last is None or last.tool_calls:
        return request
    parts = (TextPart(last.content),) if isinstance(last.content, str) else last.content or ()
    if not all(isinstance(p, TextPart) for p in parts):
        return request
    kept: list[TextPart] = []
    for part in reversed(parts):
        assert isinstance(part, TextPart)
        left = max(chars, 0) - sum(len(p.text) for p in kept)
        if left <= 0:
            break
        kept.insert(0, TextPart(part.text[-left:]))
    if isinstance(last.content, str):
        content: str | tuple[TextPart, ...] = kept[0].text if kept else ""
    else:
        content = tuple(kept)
    return replace(request, messages=(*request.messages[:-1], replace(last, content=content)))


def _without_oldest_turns(request: ChatRequest) -> list[ChatRequest]:
    """The request without its oldest turn, without its two oldest, and so on: each turn
    up to a user message; the system turns it opens with stay."""
    messages = request.messages
    lead = next((i for i, m in enumerate(messages) if m.role != "system"), len(messages))
    cuts = [i for i in range(lead + 1, len(messages)) if messages[i].role == "user"]
    return [replace(request, messages=messages[:lead] + messages[cut:]) for cut in cuts]


def _reasoning_budget(budget: int, tokenizer, prompt: list[int], markup: ChatMarkup):
    """The budget in this model's reasoning markup; None when the model has none (then
    there is no reasoning to cap)."""
    markers = reasoning_markers(markup)
    if markers is None:
        return None
    opening, closing = (tuple(tokenizer.encode(m, add_special_tokens=False)) for m in markers)
    opened = markup.think is not None and starts_in_reasoning(tokenizer, prompt, markup.think)
    return ReasoningBudget(budget, opening, closing, opened)


def _params(
    request: GenerationRequest,
    config: ServerConfig,
    tokenizer,
    grammar: Grammar | None,
    max_tokens: int,
) -> GenerationParams:
    sampling, defaults = request.sampling, config.defaults
    if any(token >= len(tokenizer) for token in sampling.logit_bias):
        raise bad_request(
            f"logit_bias token ids must be below {len(tokenizer)}.", param="logit_bias"
        )

    return GenerationParams(
        max_tokens=max_tokens,
        sampling=sampling.over(defaults),
        stop=request.stop,
        logprobs=request.logprobs,
        grammar=grammar,
    )


def _sibling_seed(params: GenerationParams, sibling: int) -> GenerationParams:
    """Choice j of a seeded request draws from seed + j: the n choices differ from each
    other, the first equals the same request with n = 1, and all are reproducible."""
    seed = params.sampling.seed
    if sibling == 0 or seed is None:
        return params
    return replace(params, sampling=replace(params.sampling, seed=seed + sibling))
