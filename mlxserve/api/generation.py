"""Runs a request's choices on the generation thread (together, so they batch) and turns
their events into a response: whole JSON or SSE chunks, from the same event loop."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from mlxserve.api.errors import APIError, unavailable
from mlxserve.api.responses import Choice, ResponseFormat, TokenLogprob, Usage
from mlxserve.api.sse import ClientGone, SSEWriter
from mlxserve.engine.jobs import ErrorEvent, FinishEvent, GenerationJob, PromptImages, TokenEvent
from mlxserve.engine.sampling import GenerationParams
from mlxserve.engine.worker import GenerationWorker
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
    images: PromptImages | None = None  # a vision model's prompt images


@dataclass
class _ChoiceState:
    plan: ChoicePlan
    choice: Choice
    output: Any
    started: bool = False  # streaming: the role chunk has been sent


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
        finished = {}
        for state, _events, _entries, finish_reason in self._steps(lambda: None):
            if finish_reason is not None:
                state.choice.finish_reason = finish_reason
                finished[state.plan.index] = state.choice
        return self._fmt.response([finished[i] for i in sorted(finished)], self.usage)

    def stream(self, sse: SSEWriter, include_usage: bool, keepalive_seconds: float) -> None:
        """Write every choice as SSE chunks. An error before any output (a model that
        fails to load) is raised, to be answered as a plain HTTP error."""

        def keepalive() -> None:
            if time.monotonic() - sse.last_write >= keepalive_seconds:
                sse.comment("keepalive")

        try:
            for state, events, entries, finish_reason in self._steps(keepalive):
                self._send(sse.event, state, events, entries, finish_reason)
        except APIError as e:
            if not sse.started:
                raise
            sse.event(e.body())
        else:
            if include_usage:
                sse.event(self._fmt.usage_chunk(self.usage))
        sse.done()

    def _send(self, send, state: _ChoiceState, events, entries, finish_reason) -> None:
        # The role chunk waits for the first event, so that an error is still a plain reply.
        choice = state.choice
        if not state.started:
            state.started = True
            start = self._fmt.start_chunk(choice.index)  # None: text completions have none
            if start is not None:
                send(start)
        if entries and not events:
            send(self._fmt.event_chunk(choice, None, entries))
        for i, event in enumerate(events):
            send(self._fmt.event_chunk(choice, event, entries if i == 0 else []))
        choice.text_offset += sum(len(self._fmt.texts(e.token).text) for e in entries)
        if finish_reason is not None:
            send(self._fmt.finish_chunk(choice.index, finish_reason))

    def _steps(self, on_idle: Callable[[], None]) -> Iterator:
        """For each generation event of any choice: (its state, output events, logprob
        entries, finish reason or None), with the events already applied to the choice."""
        states = {
            plan.index: _ChoiceState(
                plan,
                Choice(plan.index, logprobs=[] if plan.params.logprobs is not None else None),
                self._make_output(plan.prompt),
            )
            for plan in self._plans
        }
        for index, event in self._events(on_idle):
            state = states[index]
            choice, output = state.choice, state.output
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
                self._count(state.plan, event)
            for item in items:
                choice.add(item)
            yield state, items, entries, finish_reason

    def _events(self, on_idle: Callable[[], None]) -> Iterator[tuple[int, Any]]:
        """(choice index, event) up to every choice's FinishEvent; cancels the jobs left
        if the client goes or an error ends the request."""
        events: queue.Queue = queue.Queue()
        jobs = {
            plan.index: GenerationJob(
                self._spec,
                plan.prompt,
                plan.params,
                plan.index,
                self._num_draft_tokens,
                images=plan.images,
                events=events,
            )
            for plan in self._plans
        }
        submitted = list(jobs.values())
        self._worker.submit(submitted)
        last_check = time.monotonic()
        try:
            while jobs:
                try:
                    index, event = events.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    index, event = None, None
                if time.monotonic() - last_check >= POLL_SECONDS:
                    last_check = time.monotonic()
                    if self._client_gone():
                        raise ClientGone
                if event is None:
                    if not self._worker.alive:  # nothing will ever answer these jobs
                        raise unavailable("The generation thread has stopped.")
                    on_idle()
                    continue
                if isinstance(event, ErrorEvent):
                    raise event.error
                if isinstance(event, FinishEvent):
                    del jobs[index]
                yield index, event
        finally:
            for job in jobs.values():
                job.cancel()
            self._worker.release(submitted)

    def _count(self, plan: ChoicePlan, event: FinishEvent) -> None:
        self.usage.completion_tokens += event.completion_tokens
        if plan.counts_prompt:
            self.usage.prompt_tokens += event.prompt_tokens
            self.usage.cached_tokens += event.cached_tokens


def _entry(event: TokenEvent) -> TokenLogprob:
    return TokenLogprob(event.token, event.logprob, event.top_logprobs or [])
