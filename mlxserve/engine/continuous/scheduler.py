"""Which waiting prompts get the prompt-processing budget of the next loop iteration.

Each iteration of the generation loop runs one decode step for the running streams and at
most `budget` prompt tokens, so a running stream's longest pause while prompts arrive is
one chunk's time, not a whole long prompt's. The budget goes to the waiting prompt with
the fewest tokens left to process (its first token comes soonest), with aging so that a
long prompt is never starved: every second waited counts as one budget of tokens less.
A prompt whose rest fits the budget joins the batch (prompts of similar length share one
padded model call); a longer one is processed on its own, one chunk per iteration. With no
stream running there is no pause to bound: every prompt that fits joins at once, so a
burst of clients starts as one batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Waiting:
    """What the scheduler needs to know of one waiting prompt."""

    remaining: int  # prompt tokens still to process, the last one included
    sequences: int  # batch slots it takes: jobs with one prompt share its processing
    waited: float  # seconds since it arrived

    @property
    def shared(self) -> bool:
        """Sibling choices join the batch only once their prompt is processed but for its
        last token, each from its own copy of the cache."""
        return self.sequences > 1


@dataclass
class Plan:
    insert: list[int] = field(default_factory=list)  # indices that join the batch now
    chunk: tuple[int, int] | None = None  # (index, tokens) to process on their own now


def plan_prefill(waiting: list[Waiting], budget: int, free_slots: int, batch_empty: bool) -> Plan:
    """Spend one iteration's `budget` of prompt tokens, highest priority first."""
    order = sorted(range(len(waiting)), key=lambda i: _priority(waiting[i], budget))
    plan = Plan()
    members = longest = 0
    for i in order:
        item = waiting[i]
        if not _ready(item, budget):
            if not plan.insert:
                plan.chunk = (i, min(item.remaining - 1, budget))
            break
        cost = (members + item.sequences) * max(longest, _batched_tokens(item))
        fits = item.sequences <= free_slots or (batch_empty and not plan.insert)
        if not fits or (plan.insert and cost > budget and not batch_empty):
            break
        plan.insert.append(i)
        members += item.sequences
        longest = max(longest, _batched_tokens(item))
        free_slots -= item.sequences
    return plan


def _priority(item: Waiting, budget: int) -> float:
    return item.remaining - budget * item.waited


def _ready(item: Waiting, budget: int) -> bool:
    return item.remaining == 1 if item.shared else item.remaining <= budget


def _batched_tokens(item: Waiting) -> int:
    """Tokens the batch processes for it: all but the last, which starts decoding."""
    return max(item.remaining - 1, 1)
