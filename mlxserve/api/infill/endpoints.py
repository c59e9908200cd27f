"""POST /infill in llama.cpp's shape: the middle between `input_prefix` and
`input_suffix` (other files in `input_extra`), whole or streamed, in llama.cpp's
/completion reply. Its two early ends for editors are applied here, where the text is:
`t_max_predict_ms` (once a line is complete and the time is up) and `n_indent` (a line
indented less than asked ends the middle before it). Both stop the generation at once."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mlxserve.api.infill.errors import error_body
from mlxserve.api.infill.requests import InfillRequest, infill_request
from mlxserve.api.responder import Responder
from mlxserve.api.sse import SSEWriter, keepalive, stream_failure
from mlxserve.api.wire import parse
from mlxserve.postprocess.events import Content
from mlxserve.protocol.request import Sampling
from mlxserve.service.chat import ChatService
from mlxserve.service.results import Usage


@dataclass
class Middle:
    """The middle as it streams in, cut where an editor's limits say."""

    n_indent: int
    t_max_predict_ms: int
    started: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    text: str = ""
    stop_type: str = "none"  # eos, limit, word

    def take(self, piece: str) -> tuple[str, bool]:
        """The part of `piece` that is sent, and whether the middle ends here."""
        now = time.perf_counter()
        if self.first_token is None:
            self.first_token = now
        before = len(self.text)
        self.text += piece
        if self.n_indent:
            cut = _underindented(self.text, self.n_indent)
            if cut is not None:
                self.text, self.stop_type = self.text[:cut], "limit"
                return self.text[before:], True
        late = (now - self.first_token) * 1000 > self.t_max_predict_ms
        if self.t_max_predict_ms and late and "\n" in self.text:
            self.stop_type = "limit"
            return piece, True
        return piece, False


def _underindented(text: str, n_indent: int) -> int | None:
    """Where a line after the first, indented less than `n_indent`, starts its content
    (llama.cpp keeps that line's indentation and drops the rest)."""
    start = text.find("\n") + 1
    while start:
        end = text.find("\n", start)
        line = text[start:] if end < 0 else text[start:end]
        content = len(line) - len(line.lstrip(" \t"))
        if content < len(line) and content < n_indent:
            return start + content
        start = end + 1
    return None


@dataclass
class InfillEndpoints:
    service: ChatService

    def infill(self, raw: bytes, responder: Responder) -> dict | None:
        wire = parse(InfillRequest, raw)
        prepared = self.service.prepare_completion(infill_request(wire), responder.context)
        tokenizer = self.service.models.tokenizer(prepared.spec)
        model = wire.model or self.service.models.alias
        middle = Middle(wire.n_indent, wire.t_max_predict_ms)
        run = self.service.run(prepared)
        sse = SSEWriter(responder) if wire.stream else None
        pings = keepalive(sse, self.service.config.keepalive_seconds)
        cut = False
        stopping_word = ""
        try:
            for step in run.steps(pings):
                if not cut:
                    pieces = "".join(e.text for e in step.events if isinstance(e, Content))
                    sent, cut = middle.take(pieces)
                    if cut:
                        run.finish_early()  # the rest is not wanted: the row ends now
                    if sse is not None and sent and wire.n_predict != 0:
                        sse.event(_chunk(sent, len(prepared.prompts[0])))
                if step.finished:
                    choice = step.choice
                    if middle.stop_type == "none":
                        middle.stop_type = _stop_type(choice.finish_reason, choice.stop_sequence)
                    stopping_word = choice.stop_sequence or ""
        except Exception as e:
            if sse is None:
                raise
            sse.event(error_body(stream_failure(sse, e)))
            sse.close()  # llama.cpp's streams end without [DONE]
            return None
        if wire.n_predict == 0:  # the prompt only, into the prompt cache
            middle.text = ""
        prompt = tokenizer.decode(prepared.prompts[0])
        sampling = prepared.params.sampling
        final = _final(model, middle, run.usage, prompt, stopping_word, wire, sampling)
        if sse is None:
            return final
        sse.event({**final, "content": ""})
        sse.close()
        return None


def _stop_type(finish_reason: str | None, stop_sequence: str | None) -> str:
    if stop_sequence:
        return "word"
    return "eos" if finish_reason == "stop" else "limit"


def _chunk(content: str, prompt_tokens: int) -> dict:
    return {
        "index": 0,
        "content": content,
        "tokens": [],
        "stop": False,
        "id_slot": -1,
        "tokens_evaluated": prompt_tokens,
    }


def _final(
    model: str,
    middle: Middle,
    usage: Usage,
    prompt: str,
    stopping_word: str,
    wire: InfillRequest,
    sampling: Sampling,
) -> dict:
    """llama.cpp's /completion reply (its last event, streamed)."""
    end = time.perf_counter()
    first = middle.first_token or end
    prompt_ms = (first - middle.started) * 1000
    predicted_ms = (end - first) * 1000
    predicted = usage.completion_tokens
    return {
        "index": 0,
        "content": middle.text,
        "tokens": [],
        "id_slot": 0,
        "stop": True,
        "model": model,
        "tokens_predicted": predicted,
        "tokens_evaluated": usage.prompt_tokens,
        "generation_settings": {
            "n_predict": wire.n_predict,
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "min_p": sampling.min_p,
            "seed": sampling.seed if sampling.seed is not None else -1,
            "stop": wire.stop,
            "n_indent": wire.n_indent,
            "t_max_predict_ms": wire.t_max_predict_ms,
            "stream": wire.stream,
            "model": model,
        },
        "prompt": prompt,
        "has_new_line": "\n" in middle.text,
        "truncated": False,
        "stop_type": middle.stop_type,
        "stopping_word": stopping_word,
        "tokens_cached": usage.cached_tokens,
        "timings": {
            "prompt_n": usage.prompt_tokens - usage.cached_tokens,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / max(usage.prompt_tokens - usage.cached_tokens, 1),
            "prompt_per_second": 1000 * usage.prompt_tokens / prompt_ms if prompt_ms else 0.0,
            "predicted_n": predicted,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / max(predicted, 1),
            "predicted_per_second": 1000 * predicted / predicted_ms if predicted_ms else 0.0,
        },
    }
