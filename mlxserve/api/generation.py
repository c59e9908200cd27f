"""Runs a request's choices on the generation thread and turns their events into a
response: whole JSON or SSE chunks, from the same event loop."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from mlxserve.api.errors import APIError, unavailable
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
from mlxserve.postprocess.events import Event, Reasoning, ToolCallStart
from mlxserve.postprocess.output import TextOutput

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
        make_output: Callable[[list[int]], Any] | None = None,
    ):
        self._worker = worker
        self._spec = spec
        self._fmt = fmt
        self._plans = plans
        self._num_draft_tokens = num_draft_tokens
        self._client_gone = client_gone
        # Text completions pass the model text through; chat parses it.
        self._make_output = make_output or (lambda _prompt: TextOutput())
        self.usage = Usage()

    def collect(self) -> dict:
        """Run every choice to the end and return the whole response object."""
        choices = []
        for plan in self._plans:
            for choice, _events, _entries, finish_reason in self._steps(plan, lambda: None):
                choice.finish_reason = finish_reason
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
        # The role chunk waits for the first event, so that an error is still a plain reply.
        pending_start = self._fmt.start_chunk(plan.index)
        for choice, events, entries, finish_reason in self._steps(plan, keepalive):
            if pending_start is not None:
                send(pending_start)
                pending_start = None
            if entries and not events:
                send(self._fmt.event_chunk(choice, None, entries))
            for i, event in enumerate(events):
                send(self._fmt.event_chunk(choice, event, entries if i == 0 else []))
            choice.text_offset += sum(len(self._fmt.texts(e.token).text) for e in entries)
            if finish_reason is not None:
                send(self._fmt.finish_chunk(plan.index, finish_reason))

    def _steps(self, plan: ChoicePlan, on_idle: Callable[[], None]) -> Iterator:
        """For each generation event: (choice, output events, logprob entries, finish
        reason or None), with the events already applied to the choice."""
        choice = Choice(plan.index, logprobs=[] if plan.params.logprobs is not None else None)
        output = self._make_output(plan.prompt)
        for event in self._events(plan, on_idle):
            was_reasoning = output.in_reasoning
            items: list[Event] = output.feed(event.text)
            entries, finish_reason = [], None
            if isinstance(event, TokenEvent):
                if was_reasoning or any(isinstance(i, Reasoning) for i in items):
                    choice.reasoning_tokens += 1
                if choice.logprobs is not None and event.logprob is not None:
                    entries = [_entry(event)]
                    choice.logprobs += entries
            else:
                items += output.finish()
                finish_reason = event.finish_reason
                if finish_reason == "stop" and (
                    choice.tool_calls or any(isinstance(i, ToolCallStart) for i in items)
                ):
                    finish_reason = "tool_calls"
                self.usage.reasoning_tokens += choice.reasoning_tokens
            for item in items:
                choice.add(item)
            yield choice, items, entries, finish_reason

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
                    if not self._worker.alive:  # nothing will ever answer this job
                        raise unavailable("The generation thread has stopped.")
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


def _entry(event: TokenEvent) -> TokenLogprob:
    return TokenLogprob(event.token, event.logprob, event.top_logprobs or [])
