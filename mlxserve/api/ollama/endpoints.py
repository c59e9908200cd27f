"""Ollama's API (its docs/api.md): the model list, show and ps, chat and generate (NDJSON
streams by default), embeddings, and pull, delete, copy and create, on the same neutral
requests, batch, prompt cache, residency and keys as every other dialect."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from mlxserve.api.ollama import catalog, pull
from mlxserve.api.ollama.catalog import ollama_name, served_name, timestamp
from mlxserve.api.ollama.errors import error_body
from mlxserve.api.ollama.names import MadeName, ModelNames
from mlxserve.api.ollama.options import Options, keep_alive_seconds, read_options
from mlxserve.api.ollama.replies import DONE_REASONS, Clock, ReplyShape, logprobs, tool_call
from mlxserve.api.ollama.requests import (
    ChatRequest,
    CopyRequest,
    CreateRequest,
    DeleteRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    PullRequest,
    ShowRequest,
)
from mlxserve.api.ollama.translate import chat_request, generate_chat, generate_completion
from mlxserve.api.responder import Responder
from mlxserve.api.sse import NDJSONWriter, stream_failure
from mlxserve.api.wire import parse
from mlxserve.chat.fim import find_fim
from mlxserve.keys.caller import Caller
from mlxserve.models.demo import has_accelerator
from mlxserve.models.spec import ModelSpec
from mlxserve.postprocess.events import Content, Reasoning
from mlxserve.protocol.errors import ErrorKind, ServiceError, bad_request, not_found, unavailable
from mlxserve.protocol.request import EmbeddingRequest
from mlxserve.service.chat import ChatService, Prepared
from mlxserve.service.context import RequestContext
from mlxserve.service.results import Choice
from mlxserve.service.run import Step

# The version of Ollama's API whose fields are served (clients gate features on it).
VERSION = "0.13.0"
REASONING_FORMAT = "separate"  # thinking goes in `thinking`, as Ollama's replies put it
FOREVER = timedelta(days=365 * 292)  # Ollama's "forever": now + the longest Go duration
# The kinds an Ollama client can use: it chats with them, or embeds with them
KINDS = ("chat", "vision", "embedding")


@dataclass(frozen=True)
class Listed:
    """A model as /api/tags lists it: what it runs, whose weights it adds, its parent."""

    name: str
    spec: ModelSpec
    weights_folder: Path  # the model's, or an adapter's
    parent: str = ""  # the model an adapter or a made name runs on


@dataclass
class OllamaEndpoints:
    service: ChatService
    names: ModelNames

    # The catalog ------------------------------------------------------------------------

    def version(self) -> dict:
        return {"version": VERSION}

    def tags(self, caller: Caller) -> dict:
        """Every model `mlxserve ls` would list, the served ones, the adapters and the
        names made by copy and create, most recently modified first."""
        models = []
        for entry in self._listed(caller):
            folder = entry.weights_folder
            details = catalog.details(entry.spec.path)
            models.append(
                {
                    "name": ollama_name(entry.name),
                    "model": ollama_name(entry.name),
                    "modified_at": catalog.modified_at(folder),
                    "size": sum(f.stat().st_size for f in catalog.weight_files(folder)),
                    "digest": catalog.weights(folder).digest,
                    "details": {**details, "parent_model": entry.parent},
                }
            )
        models.sort(key=lambda m: str(m["modified_at"]), reverse=True)
        return {"models": models}

    def ps(self, caller: Caller) -> dict:
        models = self.service.models
        names = {
            entry.spec: entry.name for entry in reversed(self._listed(caller)) if not entry.parent
        }
        now = datetime.now(timezone.utc)
        running = []
        for loaded in models.resident:
            spec = loaded.spec
            if spec.kind not in KINDS:
                continue
            keep = models.keep_time(spec)
            left = FOREVER if keep is None else timedelta(seconds=keep - models.idle_for(spec))
            name = ollama_name(names.get(spec, models.name(spec)))
            running.append(
                {
                    "name": name,
                    "model": name,
                    "size": loaded.nbytes,
                    "digest": catalog.weights(spec.path).digest,
                    "details": catalog.details(spec.path),
                    "expires_at": timestamp(now + max(left, timedelta(0))),
                    "size_vram": loaded.nbytes if has_accelerator() else 0,
                    "context_length": models.context_length(spec) or 0,
                }
            )
        return {"models": running}

    def show(self, raw: bytes, responder: Responder) -> dict:
        name = _required(parse(ShowRequest, raw).named)
        spec = self._spec(name, responder.context, f"model '{ollama_name(name)}' not found")
        path = spec.path
        made = self.names.get(served_name(name))
        template = ""
        if spec.generative:
            template = self.service.models.tokenizer(spec).chat_template or ""
        parameters = self._parameters((made.parameters or {}) if made else {})
        parent = ollama_name(made.base) if made else ""
        reply = {
            "license": "",
            "modelfile": _modelfile(path, made.system if made else None, parameters),
            "parameters": parameters,
            "template": template,
            "details": {**catalog.details(path), "parent_model": parent},
            "model_info": catalog.model_info(path, self.service.models.context_length(spec)),
            "capabilities": self._capabilities(spec),
            "modified_at": catalog.modified_at(path),
        }
        if made is not None and made.system:
            reply["system"] = made.system
        return reply

    # Generation -------------------------------------------------------------------------

    def chat(self, raw: bytes, responder: Responder) -> dict | None:
        wire = parse(ChatRequest, raw)
        spec = self._spec(_required(wire.model), responder.context)
        keep = keep_alive_seconds(wire.keep_alive)
        shape = ReplyShape(wire.model, chat=True)
        if not wire.messages:
            return self._load_or_unload(spec, keep, shape)
        self._can(spec, wire.model, "chat", wire.think)
        made = self.names.get(served_name(wire.model))
        options = self._options(wire.options, made)
        request = chat_request(wire, self._model(wire.model), options)
        if made is not None:
            request = made.apply(request)
        clock = Clock(load=self._resident(spec, keep))
        prepared = self.service.prepare_chat(request, responder.context, REASONING_FORMAT)
        self._check_context(options, prepared)
        return self._reply(prepared, shape, wire.stream, responder, clock, spec, keep)

    def generate(self, raw: bytes, responder: Responder) -> dict | None:
        wire = parse(GenerateRequest, raw)
        spec = self._spec(_required(wire.model), responder.context)
        keep = keep_alive_seconds(wire.keep_alive)
        shape = ReplyShape(wire.model, chat=False)
        if not wire.prompt and not wire.images and wire.suffix is None:
            return self._load_or_unload(spec, keep, shape)
        if wire.template:
            raise bad_request(
                "A template of its own is not served: mlxserve renders the prompt with the "
                "model's chat template (send raw: true with a prompt you render yourself).",
                param="template",
            )
        self._can(spec, wire.model, "generate", wire.think)
        made = self.names.get(served_name(wire.model))
        options = self._options(wire.options, made)
        model = self._model(wire.model)
        clock = Clock(load=self._resident(spec, keep))
        templated = not wire.raw and wire.suffix is None and not wire.context
        if templated:
            request = generate_chat(wire, model, options)
            if made is not None:
                request = made.apply(request)
            prepared = self.service.prepare_chat(request, responder.context, REASONING_FORMAT)
        else:
            raw_prompt = self._raw_prompt(wire, model, responder.context)
            prepared = self.service.prepare_completion(
                generate_completion(wire, model, options, raw_prompt), responder.context
            )
        self._check_context(options, prepared)
        context = prepared.prompts[0] if not wire.raw else None
        return self._reply(prepared, shape, wire.stream, responder, clock, spec, keep, context)

    def _raw_prompt(
        self, wire: GenerateRequest, model: str, context: RequestContext
    ) -> str | tuple[int, ...]:
        """The prompt of a generate without its template: raw text, or an earlier
        exchange's `context` continued by this prompt (templated unless raw)."""
        if wire.images:
            raise bad_request(
                "images need the chat template: send them without raw, context or suffix.",
                param="images",
            )
        if not wire.context:
            return wire.prompt
        if wire.raw:
            tokens = self.service.text_tokens(model, context, wire.prompt, False)[1]
        else:
            tokens = self.service.chat_prompt(generate_chat(wire, model, Options()), context)[1]
        return (*wire.context, *tokens)

    def _reply(
        self,
        prepared: Prepared,
        shape: ReplyShape,
        stream: bool,
        responder: Responder,
        clock: Clock,
        spec: ModelSpec,
        keep: float | None,
        context: list[int] | None = None,
    ) -> dict | None:
        run = self.service.run(prepared)
        writer = NDJSONWriter(responder) if stream else None
        reply = _Reply(shape, prepared)
        clock.begin()
        try:
            for step in run.steps():
                if step.token is not None:
                    clock.token()
                line = reply.step(step)
                if writer is not None and line is not None:
                    writer.line(line)
        except Exception as e:
            if writer is None:
                raise
            writer.line(error_body(stream_failure(writer, e)))
            writer.close()
            return None
        finally:
            if keep == 0:
                self.service.models.expire(spec)
        extra = clock.metrics(run.usage)
        if context is not None:
            extra["context"] = [*context, *reply.tokens]
        if writer is None:
            return reply.whole(extra)
        writer.line(shape.done(reply.done_reason, extra))
        writer.close()
        return None

    def _load_or_unload(self, spec: ModelSpec, keep: float | None, shape: ReplyShape) -> dict:
        """A chat without messages (a generate without a prompt): load the model, or with
        keep_alive 0 unload it (once nothing uses it)."""
        self._resident(spec, keep, load=keep != 0)
        if keep == 0:
            self.service.models.expire(spec)
            return shape.done("unload")
        return shape.done("load")

    def _resident(self, spec: ModelSpec, keep: float | None, load: bool = True) -> int:
        """The request's keep_alive noted (none: the server's default again), the model
        loaded first: the nanoseconds the load took."""
        self.service.models.keep_alive(spec, keep)
        return self.service.models.ensure_loaded(spec) if load else 0

    # Embeddings -------------------------------------------------------------------------

    def embed(self, raw: bytes, responder: Responder) -> dict:
        wire = parse(EmbedRequest, raw)
        spec = self._embedding_spec(wire.model, responder.context)
        keep = keep_alive_seconds(wire.keep_alive)
        inputs = [wire.input] if isinstance(wire.input, str) else wire.input
        clock = Clock(load=self._resident(spec, keep))
        if not any(inputs):
            return {"model": wire.model, "embeddings": []}
        request = EmbeddingRequest(
            model=self._model(wire.model),
            inputs=tuple(inputs),
            dimensions=wire.dimensions,
            keep_last_tokens=-1 if wire.truncate else None,
        )
        _, found = self.service.embed(request, responder.context)
        vectors = found.vectors / np.maximum(
            np.linalg.norm(found.vectors, axis=1, keepdims=True), 1e-12
        )
        if keep == 0:
            self.service.models.expire(spec)
        return {
            "model": wire.model,
            "embeddings": vectors.astype(float).tolist(),
            "total_duration": clock.elapsed(),
            "load_duration": clock.load,
            "prompt_eval_count": found.prompt_tokens,
        }

    def embeddings(self, raw: bytes, responder: Responder) -> dict:
        wire = parse(EmbeddingsRequest, raw)
        spec = self._embedding_spec(wire.model, responder.context)
        keep = keep_alive_seconds(wire.keep_alive)
        self._resident(spec, keep)
        if not wire.prompt:
            return {"embedding": []}
        request = EmbeddingRequest(model=self._model(wire.model), inputs=(wire.prompt,))
        _, found = self.service.embed(request, responder.context)
        if keep == 0:
            self.service.models.expire(spec)
        return {"embedding": found.vectors[0].astype(float).tolist()}

    def _embedding_spec(self, name: str, context: RequestContext) -> ModelSpec:
        missing = f'model "{name}" not found, try pulling it first'
        spec = self._spec(_required(name), context, missing)
        if spec.kind != "embedding":
            raise bad_request(f'"{name}" does not support embeddings', param="model")
        return spec

    # Model management -------------------------------------------------------------------

    def pull(self, raw: bytes, responder: Responder) -> dict | None:
        wire = parse(PullRequest, raw)
        repo, revision = pull.repo_and_revision(_required(wire.named, "invalid model name"))
        lines = pull.pull(repo, revision)
        if not wire.stream:
            last: dict = {}
            for line in _hub_errors(lines):
                last = line
            return last
        writer = NDJSONWriter(responder)
        try:
            for line in _hub_errors(lines):
                writer.line(line)
        except Exception as e:
            writer.line(error_body(stream_failure(writer, e)))
        writer.close()
        return None

    def delete(self, raw: bytes, responder: Responder) -> dict:
        name = _required(parse(DeleteRequest, raw).named)
        internal = served_name(name)
        if self.names.get(internal) is not None:
            self.names.remove(internal)
            return {}  # Ollama's has no body; its clients read the status only
        spec = self._spec(name, responder.context)
        served = self.service.models.served()
        if internal in served or spec in served.values():
            raise ServiceError(
                ErrorKind.CONFLICT,
                f"model '{name}' is served by this server's --model; it cannot be deleted.",
                param="model",
            )
        if not self.names.remove_local(internal, spec, self.service):
            raise not_found(f"model '{name}' not found")
        return {}  # Ollama's has no body; its clients read the status only

    def copy(self, raw: bytes, responder: Responder) -> dict:
        wire = parse(CopyRequest, raw)
        source = _required(wire.source, 'source "" is invalid')
        destination = _required(wire.destination, 'destination "" is invalid')
        try:
            self._spec(source, responder.context)
        except ServiceError as e:
            if e.kind is ErrorKind.NOT_FOUND:
                raise not_found(f'model "{source}" not found') from e
            raise
        self.names.copy(served_name(source), served_name(destination))
        return {}  # Ollama's has no body; its clients read the status only

    def create(self, raw: bytes, responder: Responder) -> dict | None:
        wire = parse(CreateRequest, raw)
        name = _required(wire.named)
        if wire.files or wire.quantize:
            what = "files" if wire.files else "quantize"
            raise bad_request(
                f"create from {what} is not served: mlxserve serves MLX folders (`mlxserve "
                "pull REPO --quantize 4` quantizes); create a name from an existing model "
                "with `from`.",
                param=what,
            )
        base = _required(wire.from_, "neither 'from' or 'files' was specified")
        self._spec(base, responder.context)
        read_options(wire.parameters, "parameters")  # refused now, not at each request
        self.names.create(served_name(name), served_name(base), wire, self.service)
        lines = [{"status": "using existing layer"}, {"status": "writing manifest"}]
        lines.append({"status": "success"})
        if not wire.stream:
            return lines[-1]
        writer = NDJSONWriter(responder)
        for line in lines:
            writer.line(line)
        writer.close()
        return None

    # Helpers ----------------------------------------------------------------------------

    def _listed(self, caller: Caller) -> list[Listed]:
        """Every model an Ollama client can use: the models, the adapters (on their
        base), and the names made by copy and create."""
        models = self.service.models
        found = []
        for entry in models.entries(caller):
            if entry["kind"] not in (*KINDS, "adapter"):
                continue
            spec = models.spec_of(entry["id"])
            adapter = models.adapter(entry["id"])
            if adapter is None:
                found.append(Listed(entry["id"], spec, spec.path))
            else:
                found.append(Listed(entry["id"], spec, adapter.path, ollama_name(adapter.base)))
        for name, made in self.names.all().items():
            try:
                spec = models.spec_of(made.base)
            except ServiceError:
                continue  # its base is gone
            found.append(Listed(name, spec, spec.path, ollama_name(made.base)))
        return found

    def _spec(self, name: str, context: RequestContext, missing: str | None = None) -> ModelSpec:
        """The model a request names (NAME:latest is NAME), or Ollama's 404."""
        try:
            return self.service.models.resolve(self._model(name), context)
        except ServiceError as e:
            if e.kind is ErrorKind.NOT_FOUND:
                raise not_found(missing or f"model '{name}' not found") from e
            raise

    def _model(self, name: str) -> str:
        """The name the core resolves: a name made by copy or create stands for its base."""
        internal = served_name(name)
        made = self.names.get(internal)
        return made.base if made is not None else internal

    def _can(self, spec: ModelSpec, name: str, action: str, think: bool | str | None) -> None:
        """Ollama's 400s for what a model cannot do: chat (an embedding model), think."""
        if not spec.generative:
            raise bad_request(f'"{name}" does not support {action}', param="model")
        if think and "thinking" not in self._capabilities(spec):
            raise bad_request(f'"{name}" does not support thinking', param="think")

    def _capabilities(self, spec: ModelSpec) -> list[str]:
        if not spec.generative:
            return ["embedding"] if spec.kind == "embedding" else []
        tokenizer = self.service.models.tokenizer(spec)
        found = ["completion", "tools"]
        if self.service.models.capabilities(spec).get("reasoning"):
            found.append("thinking")
        if spec.vision:
            found.append("vision")
        if find_fim(tokenizer) is not None:
            found.append("insert")
        return found

    def _options(self, given: dict | None, made: MadeName | None) -> Options:
        """The request's options over those its name was made with."""
        return read_options({**((made.parameters or {}) if made else {}), **(given or {})})

    def _check_context(self, options: Options, prepared: Prepared) -> None:
        """num_ctx beyond the model's context is a 400 (the model's context is used)."""
        limit = prepared.context_length
        if options.num_ctx is not None and limit is not None and options.num_ctx > limit:
            raise bad_request(
                f"num_ctx {options.num_ctx} is beyond the model's context of {limit} tokens.",
                param="options.num_ctx",
            )

    def _parameters(self, made: dict) -> str:
        """Modelfile parameters as Ollama's show writes them: a key padded to 30, a value."""
        defaults = self.service.config.defaults
        values: dict = {
            "temperature": defaults.temperature,
            "top_p": defaults.top_p,
            "top_k": defaults.top_k,
            "min_p": defaults.min_p,
            "num_predict": defaults.max_tokens,
            **made,
        }
        lines = []
        for key, value in values.items():
            for item in value if isinstance(value, list) else [value]:
                shown = f'"{item}"' if isinstance(item, str) else item
                lines.append(f"{key:<30} {shown}")
        return "\n".join(lines)


def _required(value: str, message: str = "model is required") -> str:
    if not value:
        raise bad_request(message, param="model")
    return value


def _modelfile(path, system: str | None, parameters: str) -> str:
    lines = ["# Modelfile generated by mlxserve", f"FROM {path}"]
    if system:
        lines.append(f'SYSTEM """{system}"""')
    lines += [f"PARAMETER {line}" for line in parameters.splitlines()]
    return "\n".join(lines) + "\n"


def _hub_errors(lines):
    """A pull's lines; the hub unreachable or failing is a 503 naming why."""
    try:
        yield from lines
    except ServiceError:
        raise
    except OSError as e:
        reason = str(e).splitlines()[-1] if str(e) else type(e).__name__
        raise unavailable(f"pull model manifest: {reason}") from e


class _Reply:
    """A choice's lines as they stream, and the whole reply at the end."""

    def __init__(self, shape: ReplyShape, prepared: Prepared):
        self.shape = shape
        self.texts = prepared.texts
        self.tokens: list[int] = []
        self.sent_calls = 0
        self.done_reason = "stop"
        self.choice: Choice | None = None

    def step(self, step: Step) -> dict | None:
        """The line this step adds to a stream, if any."""
        self.choice = step.choice
        if step.token is not None:
            self.tokens.append(step.token)
        content = "".join(e.text for e in step.events if isinstance(e, Content))
        thinking = "".join(e.text for e in step.events if isinstance(e, Reasoning))
        calls = self._finished_calls(step)
        if step.finished:
            self.done_reason = DONE_REASONS.get(str(step.choice.finish_reason), "stop")
        entries = logprobs(step.logprobs, self.texts) if step.logprobs else []
        if not (content or thinking or calls or entries):
            return None
        line = self.shape.line(content, thinking, calls)
        if entries:
            line["logprobs"] = entries
        return line

    def _finished_calls(self, step: Step) -> list[dict]:
        """Calls whose arguments are complete (another block follows, or the choice
        ended), not sent yet: Ollama sends a call whole."""
        blocks = step.choice.blocks
        ready = [
            block
            for i, block in enumerate(blocks)
            if block.kind == "tool_call" and (step.finished or i < len(blocks) - 1)
        ]
        new = ready[self.sent_calls :]
        start = self.sent_calls
        self.sent_calls = len(ready)
        return [tool_call(block, start + k) for k, block in enumerate(new)]

    def whole(self, extra: dict) -> dict:
        choice = self.choice
        assert choice is not None
        calls = [tool_call(b, i) for i, b in enumerate(choice.tool_calls)]
        line = self.shape.line(choice.text, choice.reasoning, calls)
        if choice.logprobs is not None:
            line["logprobs"] = logprobs(choice.logprobs, self.texts)
        return {**line, "done": True, "done_reason": self.done_reason, **extra}
