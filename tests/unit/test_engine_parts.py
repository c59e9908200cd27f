"""The engine's parts in this process, on tiny-chat (the real Qwen3 model, no server): the
prompt cache and its disk tier, the quantized KV cache, speculative verification and its
roll-back, and admission. `make test-fast` runs these with the rest of tests/unit."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
from conversations import BY_NAME
from mlx_lm import load
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import KVCache, make_prompt_cache

from mlxserve.engine.caches.disk_cache import DiskCache
from mlxserve.engine.caches.prompt_cache import PromptCache
from mlxserve.engine.caches.quantized_cache import KVQuantization, QuantizedCache
from mlxserve.engine.continuous.idle_joins import JoinsApart
from mlxserve.engine.loop.admission import Admission, Capacity
from mlxserve.engine.memory.footprint import KVFootprint
from mlxserve.engine.speculation.draft_costs import DraftCosts
from mlxserve.engine.speculation.draft_model import draft_with_model
from mlxserve.engine.speculation.verify import speculate_in
from mlxserve.protocol.errors import ServiceError


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model):
    return load(str(tiny_model))


@pytest.fixture(scope="module")
def story(model_and_tokenizer) -> list[int]:
    """The story conversation, told once and asked for again: a long prompt whose reply
    repeats much of it (what prompt-lookup drafts feed on)."""
    _, tokenizer = model_and_tokenizer
    told = BY_NAME["story"]
    messages = [*told.messages, {"role": "assistant", "content": told.reply}, *told.messages]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def filled(model, tokens: list[int]) -> list:
    """A fresh cache that has processed `tokens`."""
    cache = make_prompt_cache(model)
    model(mx.array(tokens)[None], cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def keys_of(cache: list) -> list[np.ndarray]:
    return [np.array(c.keys[..., : c.offset, :]) for c in cache]


# The prompt cache ----------------------------------------------------------------------


def test_a_longer_prompt_continues_from_a_stored_prefix(model_and_tokenizer, story):
    model, _ = model_and_tokenizer
    cache = PromptCache(max_entries=4)
    cache.store("m", story[:20], filled(model, story[:20]))
    hit = cache.fetch("m", lambda: make_prompt_cache(model), story)
    assert (hit.cached_tokens, hit.rest) == (20, story[20:])
    assert all(
        np.array_equal(a, b)
        for a, b in zip(keys_of(hit.cache), keys_of(filled(model, story[:20])), strict=True)
    )
    other = cache.fetch("another model", lambda: make_prompt_cache(model), story)
    assert (other.cached_tokens, other.rest) == (0, story)


def test_a_diverging_prompt_reuses_the_shared_part(model_and_tokenizer, story):
    model, _ = model_and_tokenizer
    cache = PromptCache(max_entries=4)
    cache.store("m", story[:30], filled(model, story[:30]))
    changed = [*story[:12], (story[12] + 1) % 100, *story[13:30]]
    hit = cache.fetch("m", lambda: make_prompt_cache(model), changed)
    assert hit.cached_tokens == 12 and hit.diverged_at == 12
    assert [c.offset for c in hit.cache] == [12] * len(hit.cache)


def test_entries_and_bytes_are_bounded(model_and_tokenizer, story):
    model, _ = model_and_tokenizer
    cache = PromptCache(max_entries=2)
    for n in (5, 6, 7):  # three different prompts (the first token differs)
        cache.store("m", [n, *story[1:10]], filled(model, [n, *story[1:10]]))
    assert len(cache) == 2
    cache.trim_to(cache.nbytes - 1)
    assert len(cache) == 1
    cache.trim_to(0)
    assert len(cache) == 0 and cache.nbytes == 0


def test_the_disk_tier_gives_back_what_it_kept(model_and_tokenizer, story, tmp_path):
    model, _ = model_and_tokenizer
    disk = DiskCache(tmp_path, 10 * 2**20)
    cache = PromptCache(max_entries=1, disk=disk)
    first = filled(model, story[:16])
    cache.store("m", story[:16], first)
    cache.store("m", [7, *story[1:16]], filled(model, [7, *story[1:16]]))  # evicts the first
    assert len(disk) == 1
    restarted = PromptCache(max_entries=1, disk=DiskCache(tmp_path, 10 * 2**20))
    hit = restarted.fetch("m", lambda: make_prompt_cache(model), story)
    assert hit.cached_tokens == 16
    assert all(
        np.array_equal(a, b) for a, b in zip(keys_of(hit.cache), keys_of(first), strict=True)
    )


# The quantized KV cache ----------------------------------------------------------------


def test_quantized_values_stay_on_their_grid(wide_heads_model, story):
    model, _ = load(str(wide_heads_model))  # 32-dimensional heads: one group of 32
    quantization = KVQuantization(bits=8, group_size=32)
    plain = filled(model, story[:24])
    once = quantization.quantized(plain)
    assert all(type(c) is QuantizedCache and c.offset == 24 for c in once)
    back = quantization.plain(once)
    assert all(type(c) is KVCache and c.offset == 24 for c in back)
    # Quantized again (a cached prompt taken back to full precision, extended, and joining
    # the batch), each value stays within one step of its group's grid.
    again = quantization.plain(quantization.quantized(back))
    for a, b in zip(keys_of(again), keys_of(back), strict=True):
        groups = b.reshape(-1, 32)
        step = (groups.max(axis=1) - groups.min(axis=1)) / 255
        assert (np.abs(a - b).reshape(-1, 32) <= step[:, None] * 1.01 + 1e-6).all()
    error = max(
        float(np.abs(x - y).max()) for x, y in zip(keys_of(back), keys_of(plain), strict=True)
    )
    assert 0 < error < 0.1  # close to the plain values, not equal to them


# Speculative verification and roll-back ---------------------------------------------------


def greedy(model, prompts: list[list[int]], max_tokens: int, draft: int = 0):
    """Each prompt's greedy continuation, all in one batch (prompt-lookup drafts of up to
    `draft` tokens verified in the decode step when `draft` > 0)."""
    generator = BatchGenerator(model)
    counts = speculate_in(generator, draft) if draft else None
    uids = generator.insert(prompts, max_tokens=[max_tokens] * len(prompts))
    out: dict[int, list[int]] = {uid: [] for uid in uids}
    finished: set[int] = set()
    for _ in range(10 * max_tokens):  # prompt steps answer nothing; every row finishes
        _, responses = generator.next()
        for r in responses:
            out[r.uid].append(r.token)
            if r.finish_reason is not None:
                finished.add(r.uid)
        if finished == set(uids):
            break
    generator.close()
    return [out[uid] for uid in uids], counts


def test_verified_drafts_change_no_token(model_and_tokenizer, story):
    """Drafted and verified, rejected drafts rolled back: the tokens of plain greedy
    decoding, for every row of a batch."""
    model, tokenizer = model_and_tokenizer
    prompts = [story, story[:40], tokenizer.encode("Hello there")]
    plain, _ = greedy(model, prompts, 48)
    drafted, counts = greedy(model, prompts, 48, draft=4)
    assert drafted == plain
    assert counts is not None and counts.drafted > 0  # drafts were made and checked


@pytest.mark.parametrize("fixture", ["tiny_model", "sliding_model", "qwen_mtp_model"])
def test_a_resting_draft_model_catches_up_before_it_drafts(request, fixture, story):
    """Where no draft pays, a draft model rests between tries and misses the plain steps'
    tokens; it takes them in one pass before a try, before a row joins, and into a
    finished row's caches. A model drafting for itself (full attention; a 32-token sliding
    window, wrapped; Qwen3.5's recurrent layers) keeps every try, for a row that joins
    while the first rests too, and each finished row's draft caches give the model's own
    next logits (the same weights fed the same tokens)."""
    model, _ = load(str(request.getfixturevalue(fixture)))
    generator = BatchGenerator(model)
    costs = DraftCosts((2, 4), (1.9, 3.8))  # even guesses always kept never pay: tries only
    counts = draft_with_model(generator, 3, model, costs)
    layers = len(make_prompt_cache(model))

    def insert(prompt: list[int], max_tokens: int) -> int:
        """As the engine inserts a row: both models hold the prompt but its last token."""
        caches = make_prompt_cache(model) + make_prompt_cache(model)
        for part in (caches[:layers], caches[layers:]):
            model(mx.array([prompt[:-1]]), cache=part)
        (uid,) = generator.insert(
            [prompt[-1:]], max_tokens=[max_tokens], caches=[caches], all_tokens=[prompt[:-1]]
        )
        return uid

    uids = [insert(story[:60], 30)]
    finished: dict[int, list] = {}
    behind_at_finish = []  # the tokens the draft had missed when a row finished
    for step in range(200):
        batch = generator._generation_batch
        if step == 12:  # the first row rests: its draft is behind
            assert batch._behind > 0
            uids.append(insert(story[:30], 80))
        for r in generator.next()[1]:
            if r.finish_reason is not None:
                finished[r.uid] = r.prompt_cache
                behind_at_finish.append(batch._behind)
        if len(finished) == 2:
            break
    generator.close()
    assert counts.accepted == counts.drafted >= 6
    assert counts.drafted < 40  # rests between tries
    assert max(behind_at_finish) > 0
    probe = mx.array([[story[0]]])
    for uid in uids:
        caches = finished[uid]
        own = model(probe, cache=caches[:layers])
        drafts = model(probe, cache=caches[layers:])
        assert mx.allclose(own, drafts, atol=1e-3).item()


# Rows joining apart ------------------------------------------------------------------------


def join_late(model, first: list[list[int]], late: list[int], apart: bool):
    """`first`'s rows decode a few steps, then `late` joins them: in mlx-lm's own step, or
    through `JoinsApart` (then the parts it took, and whether the running rows decoded
    during them). Every row's greedy tokens."""
    generator = BatchGenerator(model)
    joins = JoinsApart(generator)
    uids = generator.insert(first, max_tokens=[24] * len(first))
    out: dict[int, list[int]] = {uid: [] for uid in uids}
    finished: set[int] = set()

    def collect() -> None:
        for r in generator.next()[1]:
            out[r.uid].append(r.token)
            if r.finish_reason is not None:
                finished.add(r.uid)

    for _ in range(8):
        collect()
    (late_uid,) = generator.insert([late], max_tokens=[16])
    uids.append(late_uid)
    out[late_uid] = []
    before = [list(t) for t in generator._generation_batch.tokens]
    parts, decoded = 0, False
    while apart and joins.step():
        parts += 1
        running = generator._generation_batch.tokens[: len(before)]
        decoded = decoded or [list(t) for t in running] != before
    while len(finished) < len(uids):
        collect()
    generator.close()
    tokens = [out[uid] for uid in uids]
    return (tokens, parts, decoded) if apart else tokens


def test_a_row_joins_idle_rows_a_part_a_step_with_the_tokens_of_one_step(
    model_and_tokenizer, story
):
    """A row joining running rows apart: its prompt pass, its first pass and the merge of
    its caches are a step each, in which the running rows decode nothing; every row's
    tokens are those of mlx-lm's own join (decode and join in one step) and the late row's
    those of greedy decoding alone."""
    model, tokenizer = model_and_tokenizer
    first = [story[:40], tokenizer.encode("Hello there")]
    late = story[:30]
    together = join_late(model, first, late, apart=False)
    tokens, parts, decoded = join_late(model, first, late, apart=True)
    assert parts == 3 and not decoded
    assert tokens == together
    assert tokens[-1] == greedy(model, [late], 16)[0][0]


# Admission ---------------------------------------------------------------------------------


def test_capacity_refuses_beyond_its_limit_but_never_an_idle_server():
    capacity = Capacity(4)
    capacity.take(6)  # idle: taken whatever its size
    with pytest.raises(ServiceError) as busy:
        capacity.take(1)
    assert busy.value.retry_after == 1 and "the limit is 4" in str(busy.value)
    capacity.release(6)
    capacity.take(4)
    capacity.refuse()
    with pytest.raises(ServiceError, match="shutting down"):
        capacity.take(1)


class Sized:
    """What admission reads of a session (its KV footprint, weights and reservations)."""

    def __init__(self, jobs: int, reserved: int):
        self.footprint = KVFootprint(per_token=1000, fixed=0)
        self.weight_bytes = 10_000
        self._jobs, self._reserved = jobs, reserved

    def __len__(self) -> int:
        return self._jobs

    def reserved_bytes(self) -> int:
        return self._reserved

    def live_bytes(self) -> int:
        return self._reserved // 2


def test_admission_leaves_each_session_what_the_others_may_not_take():
    spec = "a model"
    mine, other = Sized(jobs=1, reserved=20_000), Sized(jobs=2, reserved=30_000)
    residency = SimpleNamespace(
        sessions={spec: mine},
        open_sessions=lambda: [mine, other],
        weight_bytes=lambda: 20_000,
    )
    admission = Admission(100_000, PromptCache(4), residency, touch=lambda spec: None)
    assert admission.kv_room(mine) == 100_000 - 20_000 - 30_000
    admission.check(spec, prompt_tokens=40, max_tokens=50, sequences=1, param="max_tokens")
    with pytest.raises(ServiceError) as never:  # 2 x 90 tokens x 1000 bytes > 90,000
        admission.check(spec, prompt_tokens=40, max_tokens=50, sequences=2, param="n")
    assert never.value.param == "n" and never.value.code == "insufficient_memory"
