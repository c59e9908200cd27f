"""Prompt-lookup speculation: drafts from the context verified in the decode step change
nothing a client can see (greedy tokens, logprobs, stops, limits, grammars, penalties, a
reasoning budget, seeded sampling, alone and batched), and a reply that repeats its
prompt accepts them, also under a grammar or penalties.

The servers here run with `--speculation on`: on this machine's CPU backend "auto" turns
speculation off (verifying k tokens costs k steps there), so the default server never
exercises it."""

from __future__ import annotations

import re

import pytest
from conversations import (
    BY_NAME,
    CONVERSATIONS,
    ECHO,
    ECHO_CODE,
    ECHO_CONVERSATIONS,
    ECHO_JSON,
    ECHO_RECORD_SCHEMA,
)
from helpers.speculation import (
    DRAFT_ALWAYS,
    accepted,
    assert_same,
    drafting_counts,
    replayed,
    reply,
    speculated,
    tokens,
    verified,
)
from helpers.streams import ENDS, beside_a_stream, concurrently
from helpers.structured import NO_THINKING, constrained
from transformers import AutoTokenizer

CHAT = "/v1/chat/completions"


def without_and_with(model):
    """The model served without and with speculation, prompt caches off (each request is
    computed from its prompt)."""
    from helpers.server import start_server

    pair = [
        start_server(model, "--speculation", mode, "--prompt-cache-size", "0")
        for mode in ("off", "on")
    ]
    yield pair
    for srv in pair:
        srv.stop()


@pytest.fixture(scope="module")
def servers(tiny_model):
    yield from without_and_with(tiny_model)


@pytest.fixture(scope="module")
def echo_servers(echo_model):
    yield from without_and_with(echo_model)


def think_bias(model) -> dict:
    """A logit bias that changes nothing in the echo reply (it never thinks)."""
    tokenizer = AutoTokenizer.from_pretrained(model)
    return {"logit_bias": {str(tokenizer.convert_tokens_to_ids("<think>")): -100}}


@pytest.mark.parametrize("biased", [False, True], ids=["plain", "logit_bias"])
def test_a_reply_that_repeats_its_prompt_accepts_drafts(echo_servers, echo_model, biased):
    """Also with a logit bias: it applies to every drafted position alike."""
    off, on = echo_servers
    body = {**ECHO.request, **(think_bias(echo_model) if biased else {})}
    before = accepted(on)
    plain, speculated = reply(off, body), reply(on, body)
    assert speculated[0]["message"]["content"] == ECHO_CODE
    assert_same(plain, speculated)
    completion = speculated[0]["usage"]["completion_tokens"]
    # Most of the reply came from drafts: after a few tokens the lookup finds the code in
    # the prompt and the model agrees with it to the end.
    assert accepted(on) - before >= completion / 2
    assert accepted(off) == 0


@pytest.mark.parametrize("conv", CONVERSATIONS, ids=lambda c: c.name)
def test_greedy_tokens_and_logprobs_are_those_of_plain_decoding(servers, conv):
    off, on = servers
    assert_same(reply(off, conv.request), reply(on, conv.request))


@pytest.mark.parametrize(
    ("pair", "model", "conversations"),
    [
        ("servers", "tiny_model", CONVERSATIONS),
        ("echo_servers", "echo_model", ECHO_CONVERSATIONS),
    ],
    ids=["tiny-chat", "tiny-echo"],
)
def test_batched_speculation_gives_every_request_its_plain_reply(
    request, pair, model, conversations
):
    """All at once beside a running stream: rows with and without drafts share a pass, and
    each keeps a different number of tokens."""
    off, on = request.getfixturevalue(pair)
    plain = [reply(off, c.request) for c in conversations]
    batched = beside_a_stream(
        on,
        request.getfixturevalue(model),
        ENDS["tiny_model"],
        lambda c: reply(on, c.request),
        conversations,
    )
    for p, b in zip(plain, batched, strict=True):
        assert_same(p, b)


@pytest.mark.parametrize(
    "limits",
    [
        {"stop": ["1 + tax"]},  # a stop string inside a run of accepted drafts
        {"stop": ["subtotal"]},  # its first occurrence is in a drafted stretch too
        {"max_tokens": 9},  # the token limit falls inside a draft
        {"max_tokens": 30},
    ],
    ids=["stop-late", "stop-early", "max-9", "max-30"],
)
def test_stops_and_limits_cut_the_reply_where_plain_decoding_does(echo_servers, limits):
    off, on = echo_servers
    body = {**ECHO.request, **limits}
    plain, speculated = reply(off, body), reply(on, body)
    assert_same(plain, speculated)
    content = speculated[0]["message"]["content"]
    for stop in limits.get("stop", []):
        assert stop not in content and speculated[0]["finish_reason"] == "stop"
    if "max_tokens" in limits:
        assert speculated[0]["usage"]["completion_tokens"] == limits["max_tokens"]
        assert speculated[0]["finish_reason"] == "length"


# Echo replies under constraints they meet: each row drafts what it copies from its
# prompt, and its drafts are verified under its grammar's mask or its penalties at every
# position.
RECORD_FORMAT = {"type": "json_schema", "json_schema": {"name": "r", "schema": ECHO_RECORD_SCHEMA}}
COPYING = {
    "json-schema": (ECHO_JSON, {"response_format": RECORD_FORMAT}),
    "regex": (ECHO, {"guided_regex": r"[ -~\n]+"}),  # printable ASCII lines
    "penalties": (
        ECHO,
        {"presence_penalty": 0.1, "frequency_penalty": 0.1, "repetition_penalty": 1.02},
    ),
}


@pytest.mark.parametrize(("conv", "constraint"), COPYING.values(), ids=COPYING.keys())
def test_a_constrained_reply_drafts_and_is_unchanged(echo_servers, conv, constraint):
    off, on = echo_servers
    body = {**conv.request, **constraint}
    before = accepted(on)
    plain, speculated = reply(off, body), reply(on, body)
    assert_same(plain, speculated)
    assert speculated[0]["message"]["content"] == conv.reply
    assert accepted(on) - before >= speculated[0]["usage"]["completion_tokens"] / 2


def test_a_grammar_row_beside_a_drafting_row_keeps_its_reply(echo_servers):
    """A JSON schema the echo model does not copy into: its drafts are mostly rejected, and
    every rejection takes the grammar back (a matcher left a token ahead would forbid the
    reply's next token); a drafting row shares its passes."""
    off, on = echo_servers
    schema_body = constrained("capital", "nested", **NO_THINKING)
    before = accepted(on)
    plain = [reply(off, b) for b in (schema_body, ECHO.request)]
    batched = concurrently(lambda b: reply(on, b), [schema_body, ECHO.request])
    assert accepted(on) > before
    for p, b in zip(plain, batched, strict=True):
        assert_same(p, b)


def test_a_required_tool_call_drafts_under_its_grammar(servers):
    off, on = servers
    body = {**BY_NAME["tool_call"].request, "tool_choice": "required"}
    before = speculated(on, "drafted")
    plain, drafted = reply(off, body), reply(on, body)
    assert_same(plain, drafted)
    assert drafted[0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert speculated(on, "drafted") > before


def test_an_auto_tool_call_drafts_under_its_guide(servers):
    """Under tool_choice "auto" the opened call's drafted tokens are verified under its
    grammar; the trained call is valid, so guided or not the tokens are the same."""
    off, on = servers
    body = BY_NAME["tool_call"].request
    before = speculated(on, "drafted")
    plain, drafted = reply(off, body), reply(on, body)
    assert_same(plain, drafted)
    unguided = reply(on, {**body, "tool_call_grammar": "off"})  # logprobs of no mask
    assert unguided[0] == drafted[0] and tokens(unguided) == tokens(drafted)
    assert drafted[0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert speculated(on, "drafted") > before


def test_a_reasoning_budget_follows_drafted_tokens(servers):
    """The budget counts drafted tokens as they are verified and takes back the rejected
    ones: the reasoning is cut where plain decoding cuts it."""
    off, on = servers
    body = {
        "model": "default",
        "max_tokens": 60,
        "messages": BY_NAME["think"].messages,
        "thinking": {"type": "enabled", "budget_tokens": 5},
    }
    before = speculated(on, "drafted")
    replies = []
    for srv in (off, on):
        status, _, answer = srv.post("/v1/messages", body)
        assert status == 200, answer
        replies.append((answer["content"], answer["usage"]["output_tokens"]))
    assert replies[0] == replies[1]
    cut, after = replies[1][0][:2]  # (the fixture, its answer given, may think again)
    assert 0 < len(cut["thinking"]) < len(BY_NAME["think"].reasoning)
    assert after["type"] == "text"
    assert speculated(on, "drafted") > before


def test_seeded_sampling_is_reproducible_alone_and_batched(echo_servers):
    """Sampled drafts are kept when the request's own sampler agrees with them, drawing
    from its own key: a seed gives one reply whatever else is in the batch."""
    _, on = echo_servers

    def sampled(seed: int) -> str:
        body = {**ECHO.request, "temperature": 0.8, "seed": seed, "max_tokens": 40}
        status, _, answer = on.post(CHAT, body)
        assert status == 200, answer
        return answer["choices"][0]["message"]["content"]

    alone = [sampled(seed) for seed in (1, 2)]
    assert concurrently(sampled, [1, 2, 1]) == [*alone, alone[0]]


def test_n_choices_each_speculate(echo_servers):
    off, on = echo_servers
    body = {**ECHO.request, "n": 3}
    status, _, answer = on.post(CHAT, body)
    assert status == 200
    assert [c["message"]["content"] for c in answer["choices"]] == [ECHO_CODE] * 3
    assert answer["usage"] == off.post(CHAT, body)[2]["usage"]


def test_a_sliding_window_speculates(launch, sliding_model):
    """A pass over several tokens appends to the random-weight fixture's 32-token window
    without overwriting it, so a wrapped window drops rejected drafts as a full cache does
    (each row's own count):
    alone and all at once, every reply is plain decoding's, and drafts were accepted and
    rejected. The replies are written in three letters (a logit bias), so that lookups
    are often right and often wrong."""
    tokenizer = AutoTokenizer.from_pretrained(sliding_model)
    letters = {str(tokenizer.convert_tokens_to_ids(t)): 30 for t in ("a", "b", "c")}
    plain = launch(sliding_model, "--speculation", "off", "--prompt-cache-size", "0")
    srv = launch(sliding_model, "--speculation", "on", "--prompt-cache-size", "0")
    tales = [[{"role": "user", "content": f"Tale {i}"}] for i in range(4)]
    bodies = [{"messages": m, "max_tokens": 90, "logit_bias": letters} for m in tales]
    expected = [reply(plain, b) for b in bodies]
    for body, want in zip(bodies, expected, strict=True):
        assert_same(want, reply(srv, body))
    for got, want in zip(concurrently(lambda b: reply(srv, b), bodies), expected, strict=True):
        assert_same(want, got)
    assert speculated(srv, "drafted") > 2 * accepted(srv) > 0


def test_a_hybrid_model_drops_rejected_drafts_without_a_second_pass(launch, qwen_mtp_model):
    """Qwen3.5's gated delta-net layers fold every token into one state; a verify pass
    keeps their state at each position, and a row takes the one after its last kept token.
    Prompt-lookup drafts on the trained Qwen3.5 fixture are often rejected: alone and all
    at once, every reply is plain decoding's, and no pass ran twice."""
    plain = launch(
        qwen_mtp_model, "--mtp", "off", "--speculation", "off", "--prompt-cache-size", "0"
    )
    srv = launch(qwen_mtp_model, "--mtp", "off", "--speculation", "on", "--prompt-cache-size", "0")
    bodies = [c.request for c in CONVERSATIONS]
    expected = [reply(plain, b) for b in bodies]
    for body, want in zip(bodies, expected, strict=True):
        assert_same(want, reply(srv, body))
    for got, want in zip(concurrently(lambda b: reply(srv, b), bodies), expected, strict=True):
        assert_same(want, got)
    assert speculated(srv, "drafted") > accepted(srv) > 0
    assert replayed(srv) == 0


# A model and its draft model (fixtures), where one of them has recurrent layers (the
# draft model beside a sliding window: test_vision_batching's Gemma 3).
DRAFT_PAIRS = {
    "a hybrid draft model": ("tiny_model", "qwen_mtp_model"),
    "a hybrid model": ("qwen_mtp_model", "tiny_model"),
}


@pytest.mark.parametrize("pair", list(DRAFT_PAIRS))
def test_a_draft_model_beside_recurrent_layers(request, launch, pair):
    """A draft model's chain writes its caches a token at a time, recurrent layers into
    their state (a wrapped sliding window in place): they go back to where the chain began
    and take each row's kept tokens again (tests/unit/test_rewind.py checks them against
    each row alone). The trained Qwen3.5 fixture and tiny-chat draft for each other (their
    replies mostly agree): every reply is the one without the draft model, alone and all
    at once; drafts are accepted and rejected, and each conversation drafts and accepts as
    many tokens batched as alone."""
    model, draft = (request.getfixturevalue(f) for f in DRAFT_PAIRS[pair])
    flags = ("--mtp", "off", "--prompt-cache-size", "0")
    drafting = launch(model, "--draft-model", str(draft), *DRAFT_ALWAYS, *flags)
    plain = launch(model, "--speculation", "off", *flags)
    assert not drafting.log_lines("does not draft with --draft-model")
    bodies = [c.request for c in CONVERSATIONS]
    alone = [drafting_counts(drafting, b) for b in bodies]
    for body, (_, answer) in zip(bodies, alone, strict=True):
        assert_same(reply(plain, body), answer)
    before = (speculated(drafting, "drafted"), accepted(drafting))
    batched = concurrently(lambda b: reply(drafting, b), bodies)
    for (_, answer), together in zip(alone, batched, strict=True):
        assert_same(answer, together)
    total = tuple(sum(counts[i] for counts, _ in alone) for i in (0, 1))
    assert total[0] > total[1] > 0
    assert (speculated(drafting, "drafted") - before[0], accepted(drafting) - before[1]) == total


def test_a_constrained_row_beside_a_draft_models_rows(launch, tiny_model):
    """A server with --draft-model serves structured output: the constrained row drafts
    too, its drafts verified under its grammar beside rows without one; its reply is the
    one without the draft model."""
    drafting = launch(tiny_model, "--draft-model", str(tiny_model), *DRAFT_ALWAYS)
    plain = launch(tiny_model, "--prompt-cache-size", "0")
    schema_body = constrained("capital", "nested", **NO_THINKING)
    free = CONVERSATIONS[0].request
    batched = concurrently(lambda b: reply(drafting, b), [schema_body, free])
    assert accepted(drafting) > 0
    for body, got in zip([schema_body, free], batched, strict=True):
        expected = reply(plain, body)
        assert got[0]["message"] == expected[0]["message"]
        assert [e[0] for e in got[1]] == [e[0] for e in expected[1]]


def test_a_draft_models_guesses_follow_the_rows_grammar(launch, tiny_model):
    """A draft model guesses from its own logits; a constrained row's are masked by its
    grammar as the verify pass masks the model's (engine/speculation/draft_guide.py). tiny-chat
    drafting for itself, asked for digits it never writes: its masked guesses are the
    model's own choices, and nearly all are accepted (unmasked, every one was refused);
    the reply is the one without the draft model."""
    flags = ("--prompt-cache-size", "0")
    drafting = launch(tiny_model, "--draft-model", str(tiny_model), *DRAFT_ALWAYS, *flags)
    plain = launch(tiny_model, "--speculation", "off", *flags)
    body = {**BY_NAME["capital"].request, "guided_regex": "[0-9]{30}", "max_tokens": 40}
    (drafted, taken), answer = drafting_counts(drafting, body)
    assert_same(reply(plain, body), answer)
    assert re.fullmatch("[0-9]{30}", answer[0]["message"]["content"])
    assert taken >= 0.9 * drafted > 0


def test_a_draft_models_drafts_shorten_where_they_miss(launch, tiny_model, echo_model):
    """tiny-echo never learned the story: drafting for tiny-chat its guesses miss, and each
    row's draft shrinks to one token a pass (from --num-draft-tokens 3); the reply is
    tiny-chat's own."""
    flags = ("--num-draft-tokens", "3", *DRAFT_ALWAYS)
    srv = launch(tiny_model, "--draft-model", str(echo_model), *flags)
    story = BY_NAME["story"]
    before = speculated(srv, "drafted"), verified(srv)
    assert reply(srv, story.request)[0]["message"]["content"] == story.reply
    drafted, passes = speculated(srv, "drafted") - before[0], verified(srv) - before[1]
    assert passes > 100
    assert drafted < 1.3 * passes  # three a pass were it not shortened


def test_by_default_a_draft_model_whose_guesses_miss_only_tries(launch, tiny_model, echo_model):
    """Under --speculation auto (the default) a named drafter drafts what this device's
    measured costs pay for (engine/speculation/draft_costs.py). Here a pass over two tokens and a step
    of the draft model cost more than a step; tiny-echo's guesses for tiny-chat's story
    miss, so the row drafts only a token now and then (after rests of 2 to 32 steps, or
    at once after a try that was kept), and the reply is tiny-chat's own."""
    srv = launch(tiny_model, "--draft-model", str(echo_model), "--num-draft-tokens", "3")
    assert srv.log_lines("Drafting and verifying 4 tokens costs")
    story = BY_NAME["story"]
    before = speculated(srv, "drafted"), verified(srv)
    status, _, answer = srv.post(CHAT, story.request)
    assert status == 200, answer
    assert answer["choices"][0]["message"]["content"] == story.reply
    drafted, passes = speculated(srv, "drafted") - before[0], verified(srv) - before[1]
    assert drafted == passes  # a token a try
    assert 0 < drafted <= answer["usage"]["completion_tokens"] / 8


def test_a_resting_draft_model_catches_up_with_the_tokens_it_missed(launch, tiny_model):
    """Between tries the draft model takes no tokens; a try first feeds it those it missed
    in one pass, and a cached turn's caches get them too. tiny-chat drafting for itself
    under `auto` has (nearly) every draft accepted, in a reply, in the next turn from the
    prompt cache and batched: its caches hold what the model's hold. On this CPU its
    measured costs mostly pay for no draft (a pass over two tokens and a draft step, about
    two steps, against the 1.86 at which guesses always kept would pay), so the row rests
    between tries; a run whose timing says drafts pay drafts every step instead, which
    this checks the same way. tests/unit/test_engine_parts.py checks the catch-up with
    set costs."""
    srv = launch(tiny_model, "--draft-model", str(tiny_model))
    story = BY_NAME["story"]
    status, _, first = srv.post(CHAT, story.request)
    assert status == 200, first
    assert first["choices"][0]["message"]["content"] == story.reply
    turn = [*story.messages, first["choices"][0]["message"], {"role": "user", "content": "Again."}]
    status, _, second = srv.post(CHAT, {"messages": turn, "max_tokens": 80})
    assert status == 200, second
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 150
    assert accepted(srv) >= 0.97 * speculated(srv, "drafted") > 0
    # rows joining a batch whose draft is behind: it catches up before they join
    bodies = [c.request for c in CONVERSATIONS]
    fn = lambda b: reply(srv, b)[0]["message"]  # noqa: E731
    batched = beside_a_stream(srv, tiny_model, ENDS["tiny_model"], fn, bodies)
    assert batched == [c.message for c in CONVERSATIONS]
    assert accepted(srv) >= 0.97 * speculated(srv, "drafted")


@pytest.mark.parametrize("draft", ["tiny_model", "echo_model"], ids=["itself", "another"])
def test_a_draft_model_joins_the_batch(request, launch, tiny_model, draft):
    """With a draft model the model batches as any other: every reply is its trained reply,
    alone, from the prompt cache, and all at once beside a running stream. Drafting with
    the model itself accepts (nearly) every draft, which also shows that the draft's
    caches stay aligned with the model's through the prompt cache and the batch."""
    srv = launch(tiny_model, "--draft-model", str(request.getfixturevalue(draft)), *DRAFT_ALWAYS)
    expected = [(c.message, c.request) for c in CONVERSATIONS]
    for _ in range(2):  # the second time from the prompt cache
        for message, body in expected:
            assert reply(srv, body)[0]["message"] == message
    batched = beside_a_stream(
        srv,
        tiny_model,
        ENDS["tiny_model"],
        lambda body: reply(srv, body)[0]["message"],
        [b for _, b in expected],
    )
    assert batched == [m for m, _ in expected]
    assert speculated(srv, "drafted") > 0
    if draft == "tiny_model":
        assert accepted(srv) >= 0.97 * speculated(srv, "drafted")  # 89% when the draft lags a token
        # A row with a penalty drafts too, and leaves the draft's caches aligned: the
        # conversation continued from its cached caches drafts as well.
        story = BY_NAME["story"]
        status, _, first = srv.post(CHAT, {**story.request, "frequency_penalty": 1e-6})
        assert status == 200
        turn = [
            *story.messages,
            first["choices"][0]["message"],
            {"role": "user", "content": "Tell me a story."},
        ]
        before = (accepted(srv), speculated(srv, "drafted"))
        status, _, second = srv.post(CHAT, {"messages": turn, "max_tokens": 60})
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 150
        gained = (accepted(srv) - before[0], speculated(srv, "drafted") - before[1])
        assert gained[0] >= 0.97 * gained[1] > 0
