"""Runs a request's choices on the generation thread and turns their events into a
response: whole JSON or SSE chunks, from the same event loop."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from mlxserve.api.errors import APIError
from mlxserve.api.responses import Choice, ResponseFormat, TokenLogprob, Usage
from mlxserve.api.sse import ClientGone, SSEWriter
from mlxserve.engine.sampling import GenerationParams
from mlxserve.engine.worker import (
    ErrorEvent,
    FinishEvent,
    GenerationJob,
    GenerationWorker,
    TokenEvent,
)
from mlxserve.models.provider import ModelSpec

POLL_SECONDS = 0.25


@dataclass(frozen=True)
class ChoicePlan:
    index: int
    prompt: list[int]
    params: GenerationParams
    counts_prompt: bool  # the first choice of its prompt: its prompt counts in usage


class GenerationRun:
    def __init__(
        self,
        worker: GenerationWorker,
        spec: ModelSpec,
        fmt: ResponseFormat,
        plans: list[ChoicePlan],
        num_draft_tokens: int,
        client_gone: Callable[[], bool],
    ):
        self._worker = worker
        self._spec = spec
        self._fmt = fmt
        self._plans = plans
        self._num_draft_tokens = num_draft_tokens
        self._client_gone = client_gone
        self.usage = Usage()

    def collect(self) -> dict:
        """Run every choice to the end and return the whole response object."""
        choices = []
        for plan in self._plans:
            choice = _new_choice(plan)
            for event in self._events(plan, on_idle=lambda: None):
                if isinstance(event, TokenEvent):
                    choice.text += event.text
                    if choice.logprobs is not None and event.logprob is not None:
                        choice.logprobs.append(_entry(event))
                else:
                    choice.text += event.text
                    choice.finish_reason = event.finish_reason
            choices.append(choice)
        return self._fmt.response(choices, self.usage)

    def stream(self, sse: SSEWriter, include_usage: bool, keepalive_seconds: float) -> None:
        """Write every choice as SSE chunks. An error before any output (a model that
        fails to load) is raised, to be answered as a plain HTTP error."""

        def keepalive() -> None:
            if time.monotonic() - sse.last_write >= keepalive_seconds:
                sse.comment("keepalive")

        try:
            for plan in self._plans:
                self._stream_choice(plan, sse.event, keepalive)
        except APIError as e:
            if not sse.started:
                raise
            sse.event(e.body())
        else:
            if include_usage:
                sse.event(self._fmt.usage_chunk(self.usage))
        sse.done()

    def _stream_choice(self, plan: ChoicePlan, send, keepalive) -> None:
        choice = _new_choice(plan)
        # The role chunk waits for the first event, so that an error is still a plain reply.
        pending_start = self._fmt.start_chunk(plan.index)
        for event in self._events(plan, on_idle=keepalive):
            if pending_start is not None:
                send(pending_start)
                pending_start = None
            entries = []
            if (
                isinstance(event, TokenEvent)
                and choice.logprobs is not None
                and event.logprob is not None
            ):
                entries = [_entry(event)]
            if event.text or entries:
                send(self._fmt.text_chunk(choice, event.text, entries))
                choice.text_offset += sum(len(self._fmt.texts(e.token).text) for e in entries)
            if isinstance(event, FinishEvent):
                send(self._fmt.finish_chunk(plan.index, event.finish_reason))

    def _events(self, plan: ChoicePlan, on_idle: Callable[[], None]) -> Iterator:
        """The job's token events up to its FinishEvent; cancels it if the client goes."""
        job = GenerationJob(self._spec, plan.prompt, plan.params, self._num_draft_tokens)
        self._worker.submit(job)
        finished = False
        last_check = time.monotonic()
        try:
            while True:
                try:
                    event = job.events.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    event = None
                if time.monotonic() - last_check >= POLL_SECONDS:
                    last_check = time.monotonic()
                    if self._client_gone():
                        raise ClientGone
                if event is None:
                    on_idle()
                    continue
                if isinstance(event, ErrorEvent):
                    finished = True
                    raise event.error
                if isinstance(event, FinishEvent):
                    finished = True
                    self._count(plan, event)
                yield event
                if finished:
                    return
        finally:
            if not finished:
                job.cancel()

    def _count(self, plan: ChoicePlan, event: FinishEvent) -> None:
        self.usage.completion_tokens += event.completion_tokens
        if plan.counts_prompt:
            self.usage.prompt_tokens += event.prompt_tokens
            self.usage.cached_tokens += event.cached_tokens


def _new_choice(plan: ChoicePlan) -> Choice:
    return Choice(plan.index, logprobs=[] if plan.params.logprobs is not None else None)


def _entry(event: TokenEvent) -> TokenLogprob:
    return TokenLogprob(event.token, event.logprob, event.top_logprobs or [])
