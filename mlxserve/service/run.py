"""Runs a request's choices on the generation thread (together, so they batch) and turns
their token events into post-processed steps. Dialects render the steps as they come (a
stream) or the accumulated choices at the end (a whole reply): the same events either way."""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from mlxserve.engine.generation.jobs import (
    ErrorEvent,
    FinishEvent,
    GenerationJob,
    PromptImages,
    TokenEvent,
)
from mlxserve.engine.generation.sampling import GenerationParams
from mlxserve.engine.loop.worker import GenerationWorker
from mlxserve.models.spec import ModelSpec
from mlxserve.postprocess.events import Event, Reasoning, ToolCallStart
from mlxserve.protocol.errors import ClientGone, unavailable
from mlxserve.service.context import RequestContext
from mlxserve.service.results import Choice, TokenLogprob, Usage
from mlxserve.service.token_texts import TokenTexts
from mlxserve.telemetry.record import Metered

POLL_SECONDS = 0.25
DIVERGENCE_CONTEXT = 16  # tokens of text shown either side of where a prompt diverged
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChoicePlan:
    index: int
    prompt: list[int]
    params: GenerationParams
    counts_prompt: bool  # the first choice of its prompt: its prompt counts in usage
    images: PromptImages | None = None  # a vision model's prompt images
    checkpoints: tuple[int, ...] = ()  # see GenerationJob


@dataclass
class Step:
    """What one generation event did to a choice: the output events it added (already
    applied to `choice`), its logprob entries, and whether the choice is now finished."""

    choice: Choice
    events: list[Event]
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finished: bool = False
    token: int | None = None  # the token generated (None: the choice's finish)


@dataclass
class _ChoiceState:
    plan: ChoicePlan
    choice: Choice
    output: Any  # the choice's output pipeline (postprocess)
    last_token: float | None = None  # when its last token arrived (monotonic)


class GenerationRun:
    def __init__(
        self,
        worker: GenerationWorker,
        spec: ModelSpec,
        plans: list[ChoicePlan],
        context: RequestContext,
        make_output: Callable[[list[int]], Any],
        texts: TokenTexts,
        context_length: int | None = None,
        adapter: str | None = None,
    ):
        """`adapter`: the adapter every choice runs under, if any."""
        self._worker = worker
        self._adapter = adapter
        self._texts = texts
        self._context_length = context_length
        self._spec = spec
        self._plans = plans
        self._client_gone = context.client_gone
        self._make_output = make_output
        self.usage = Usage()
        self._jobs: list[GenerationJob] = []
        self._record = context.record  # the request this run answers, if any
        self._idle_priority = context.idle_priority  # batch work
        if self._record is not None:
            self._record.generated = True

    def finish_early(self) -> None:
        """End every choice at the next step as if it had stopped (its prompt cache kept);
        its finish still comes through `steps`."""
        for job in self._jobs:
            job.finish_requested.set()

    def collect(self) -> list[Choice]:
        """Run every choice to the end; the choices in index order."""
        finished = {step.choice.index: step.choice for step in self.steps() if step.finished}
        return [finished[i] for i in sorted(finished)]

    def steps(self, on_idle: Callable[[], None] = lambda: None) -> Iterator[Step]:
        """A step for each generation event of any choice; `on_idle` is called while
        nothing arrives (a long prompt is being processed, or the request waits)."""
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
            step = Step(choice, output.feed(event.text))
            if isinstance(event, TokenEvent):
                step.token = event.token
                self._token_arrived(state)
                if was_reasoning or any(isinstance(i, Reasoning) for i in step.events):
                    choice.reasoning_tokens += 1
                if choice.logprobs is not None and event.logprob is not None:
                    step.logprobs = [_entry(event)]
                    choice.logprobs += step.logprobs
            else:
                step.events += output.finish()
                self._finish(state, event, step)
            for item in step.events:
                choice.add(item)
            yield step

    def _token_arrived(self, state: _ChoiceState) -> None:
        now = time.monotonic()
        if self._record is not None:
            self._record.token(now, state.last_token)
        state.last_token = now

    def _finish(self, state: _ChoiceState, event: FinishEvent, step: Step) -> None:
        choice = state.choice
        choice.finish_reason = event.finish_reason
        choice.stop_sequence = event.stop_sequence
        limit = self._context_length
        used = len(state.plan.prompt) + event.completion_tokens
        choice.context_full = (
            event.finish_reason == "length" and limit is not None and used >= limit
        )
        if event.finish_reason == "stop" and (
            choice.tool_calls or any(isinstance(i, ToolCallStart) for i in step.events)
        ):
            choice.finish_reason = "tool_calls"
        step.finished = True
        self.usage.reasoning_tokens += choice.reasoning_tokens
        self.usage.completion_tokens += event.completion_tokens
        prompt, cached = (
            (event.prompt_tokens, event.cached_tokens) if state.plan.counts_prompt else (0, 0)
        )
        self.usage.prompt_tokens += prompt
        self.usage.cached_tokens += cached
        if event.diverged_at is not None and state.plan.counts_prompt:
            log.info(_divergence(state.plan.prompt, event.diverged_at, cached, self._texts))
        if self._record is not None:
            # (a completion's output has no tool calls)
            self._record.unparsed_calls += getattr(state.output, "unparsed_calls", 0)
            images = state.plan.images
            shown = len(images.spans) if images is not None and state.plan.counts_prompt else 0
            self._record.meter(
                Metered(
                    prompt_tokens=prompt,
                    cached_tokens=cached,
                    completion_tokens=event.completion_tokens,
                    images=shown,
                )
            )

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
                images=plan.images,
                checkpoints=plan.checkpoints,
                adapter=self._adapter,
                idle_priority=self._idle_priority,
                events=events,
            )
            for plan in self._plans
        }
        submitted = list(jobs.values())
        self._jobs = submitted
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


def _divergence(prompt: list[int], at: int, cached: int, texts: TokenTexts) -> str:
    """Where a prompt left the cached prompt it shares most with, and the text around
    that point: a nonce (a session id, a date) that defeats the prompt cache shows there."""

    def text(tokens: list[int]) -> str:
        return b"".join(texts(t).bytes for t in tokens).decode("utf-8", errors="replace")

    before, after = (
        text(prompt[max(0, at - DIVERGENCE_CONTEXT) : at]),
        text(prompt[at:][:DIVERGENCE_CONTEXT]),
    )
    return (
        f"Prompt cache: this prompt leaves a cached one at token {at} of {len(prompt)} "
        f"({cached} reused, {len(prompt) - cached} processed anew): ...{before!r} >>> {after!r}..."
    )


def _entry(event: TokenEvent) -> TokenLogprob:
    """A token's logprob entry (made only for events that carry a logprob)."""
    return TokenLogprob(event.token, cast(float, event.logprob), event.top_logprobs or [])
