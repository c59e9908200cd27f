"""The prefill scheduler's choices: shortest first with aging, a token budget per
iteration, batch slots, and siblings that share a prompt."""

from __future__ import annotations

from mlxserve.engine.continuous.scheduler import Plan, Waiting, plan_prefill


def plan(waiting: list[Waiting], budget=256, free_slots=32, batch_empty=False) -> Plan:
    return plan_prefill(waiting, budget, free_slots, batch_empty)


def test_short_prompts_join_together_shortest_first():
    waiting = [Waiting(40, 1, 0.0), Waiting(30, 1, 0.0), Waiting(50, 1, 0.0)]
    assert plan(waiting) == Plan(insert=[1, 0, 2])


def test_padded_cost_stays_within_the_budget():
    """Joined prompts are padded to the longest: 4 x 63 tokens fit 256, a fifth does not."""
    waiting = [Waiting(64, 1, 0.0) for _ in range(5)]
    assert plan(waiting) == Plan(insert=[0, 1, 2, 3])


def test_an_idle_batch_takes_every_prompt_that_fits_at_once():
    """No stream is running, so no pause is bounded: the whole burst joins together."""
    waiting = [Waiting(64, 1, 0.0) for _ in range(5)] + [Waiting(1000, 1, 0.0)]
    assert plan(waiting, batch_empty=True) == Plan(insert=[0, 1, 2, 3, 4])


def test_a_long_prompt_is_processed_one_chunk_at_a_time():
    assert plan([Waiting(1000, 1, 0.0)]) == Plan(chunk=(0, 256))
    assert plan([Waiting(257, 1, 0.0)]) == Plan(chunk=(0, 256))
    assert plan([Waiting(256, 1, 0.0)]) == Plan(insert=[0])


def test_a_short_prompt_overtakes_a_long_one():
    waiting = [Waiting(1000, 1, 0.5), Waiting(20, 1, 0.0)]
    assert plan(waiting) == Plan(insert=[1])


def test_the_long_prompt_goes_first_once_it_has_waited_long_enough():
    """Aging: each second waited counts as one budget of tokens less (1000 - 4 x 256 < 20)."""
    waiting = [Waiting(1000, 1, 4.0), Waiting(20, 1, 0.0)]
    assert plan(waiting) == Plan(chunk=(0, 256))


def test_a_long_prompt_chunk_does_not_follow_inserts_in_the_same_iteration():
    waiting = [Waiting(20, 1, 0.0), Waiting(1000, 1, 0.0)]
    assert plan(waiting) == Plan(insert=[0])


def test_free_slots_bound_what_joins():
    waiting = [Waiting(10, 1, 0.0), Waiting(11, 1, 0.0), Waiting(12, 1, 0.0)]
    assert plan(waiting, free_slots=2) == Plan(insert=[0, 1])
    assert plan(waiting, free_slots=0) == Plan()


def test_an_idle_batch_takes_a_request_with_more_choices_than_slots():
    assert plan([Waiting(1, 4, 0.0)], free_slots=2, batch_empty=True) == Plan(insert=[0])
    assert plan([Waiting(1, 4, 0.0)], free_slots=2, batch_empty=False) == Plan()


def test_siblings_are_processed_down_to_their_last_token_before_joining():
    assert plan([Waiting(100, 3, 0.0)]) == Plan(chunk=(0, 99))
    assert plan([Waiting(1, 3, 0.0)]) == Plan(insert=[0])


def test_a_single_token_prompt_joins_at_once():
    assert plan([Waiting(1, 1, 0.0)]) == Plan(insert=[0])
