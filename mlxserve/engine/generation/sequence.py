"""One generated sequence's tokens turned into its job's events, the same way whether
the tokens come from a batch or from single-stream generation."""

from __future__ import annotations

import math

import mlx.core as mx

from mlxserve.engine.caches.prompt_cache import CacheHit
from mlxserve.engine.generation.jobs import FinishEvent, GenerationJob, TokenEvent
from mlxserve.engine.generation.stops import StopMatcher
from mlxserve.models.tokenizer import keep_leading_space
from mlxserve.values import as_float, floats, ints


class SequenceOutput:
    def __init__(self, job: GenerationJob, tokenizer, hit: CacheHit):
        self._job = job
        self._detokenizer = tokenizer.detokenizer  # a fresh copy per sequence
        if job.params.continuation:
            keep_leading_space(self._detokenizer)
        self._stops = StopMatcher(list(job.params.stop))
        self._cached_tokens = hit.cached_tokens
        self._diverged_at = hit.diverged_at
        self._stopped = False
        self.completion_tokens = 0

    def add(self, token: int, logprobs: mx.array | None, finish_reason: str | None) -> bool:
        """Emit one token; True once a stop string completed (the text after it is dropped)
        or a stop token came. An end-of-sequence token (finish "stop") or a stop token (a
        FIM model's end markers) is not output, only what it flushes."""
        if token in self._job.params.stop_tokens and finish_reason != "stop":
            self._detokenizer.finalize()
            text, self._stopped = self._stops.feed(self._detokenizer.last_segment)
            if not self._stopped:
                text += self._stops.flush()
                self._stopped = True
            if text:
                self._job.emit(TokenEvent(text, token))
            return True
        if finish_reason == "stop":
            self._detokenizer.finalize()
            text, self._stopped = self._stops.feed(self._detokenizer.last_segment)
            if text:
                self._job.emit(TokenEvent(text, token))
            return self._stopped
        self._detokenizer.add_token(token)
        if finish_reason is not None:
            self._detokenizer.finalize()
        text, self._stopped = self._stops.feed(self._detokenizer.last_segment)
        self.completion_tokens += 1
        self._job.emit(_token_event(text, token, logprobs, self._job.params.logprobs))
        return self._stopped

    def finish(self, finish_reason: str) -> None:
        held = "" if self._stopped else self._stops.flush()
        reason = "stop" if self._stopped else finish_reason
        self._job.emit(
            FinishEvent(
                reason,
                held,
                len(self._job.prompt),
                self.completion_tokens,
                self._cached_tokens,
                self._stops.matched,
                self._diverged_at,
            )
        )


def _token_event(text: str, token: int, logprobs: mx.array | None, top: int | None) -> TokenEvent:
    if top is None or logprobs is None:
        return TokenEvent(text, token)
    top_logprobs = None
    if top > 0:
        ids = mx.argpartition(-logprobs, top - 1)[:top]
        values = logprobs[ids]
        order = mx.argsort(-values)
        pairs = zip(ints(ids[order]), floats(values[order]), strict=True)
        # A token a grammar forbids has logprob -inf: it was never a candidate (and JSON
        # has no infinity).
        top_logprobs = [(t, v) for t, v in pairs if v != -math.inf]
    return TokenEvent(text, token, as_float(logprobs[token]), top_logprobs)
