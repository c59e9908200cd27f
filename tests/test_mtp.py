"""Drafters that read the model's hidden states (a checkpoint's multi-token-prediction
head, an EAGLE-3 or DFlash --draft-model) draft inside the continuous batch, and nothing a client can
see changes (greedy tokens and logprobs, alone and batched, with prompt-lookup drafts in
the same pass, from the prompt cache; sampled output keeps the model's distribution; a
seed gives one reply alone and batched).

The fixtures are trained with their drafters so that drafts are accepted: one per MTP
layout, tiny-qwen35-mtp (Qwen3.5's hybrid architecture, `mtp.*`, stored as Hugging Face
stores it) and tiny-glm-mtp (GLM-4.5's, the head as layer `num_hidden_layers`, DeepSeek's
layout); tiny-chat-eagle3, an EAGLE-3 drafter for tiny-chat in mlx-vlm's format; and
tiny-chat-dflash, a DFlash block drafter for tiny-chat in z-lab's format.
Servers run with `--mtp on`: on this machine's CPU backend "auto" may turn it off.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from conversations import BY_NAME, CONVERSATIONS, ECHO, data_uri, square_png
from helpers.server import CHAT, Server
from helpers.speculation import (
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
from scipy.stats import chi2_contingency

PLAIN = ("--speculation", "off", "--prompt-cache-size", "0")


@dataclass(frozen=True)
class Kind:
    """A model with a drafter that reads its hidden states, as the tests serve it."""

    model: str  # the conftest fixture of the model
    drafter: str | None  # the fixture of its --draft-model (None: the checkpoint's head)
    read: str  # what the log says once the drafter is read
    tokens_per_pass: float  # the least the story's reply must average (see below)
    # Its guesses for the fixture's replies to a second turn are accepted (a DFlash
    # drafter, trained on single-turn replies only, guesses few: its cache is checked in
    # test_a_dflash_drafter_* below)
    follows_turns: bool = True


KINDS = {
    "qwen3.5-mtp": Kind("qwen_mtp_model", None, "Read a Qwen3.5-layout MTP head", 1.8),
    "glm-mtp": Kind("glm_mtp_model", None, "Read a DeepSeek/GLM-layout MTP head", 1.8),
    # Its later guesses read its own output, which the fixture was not trained on (a
    # real EAGLE-3 is, by unrolling): mostly its first guess is kept.
    "eagle3": Kind("tiny_model", "eagle3_drafter", "Read an EAGLE-3 drafter", 1.5),
    "dflash": Kind(
        "tiny_model", "dflash_drafter", "Read a DFlash drafter", 2.5, follows_turns=False
    ),
}


@dataclass
class Family:
    kind: Kind
    model: Path
    flags: tuple[str, ...]  # what a server needs to draft with it
    off: Server  # without drafts
    on: Server


@pytest.fixture(scope="module", params=list(KINDS))
def family(request):
    from helpers.server import start_server

    kind = KINDS[request.param]
    model = request.getfixturevalue(kind.model)
    flags = ("--mtp", "on")
    if kind.drafter is not None:
        flags = ("--draft-model", str(request.getfixturevalue(kind.drafter)))
    family = Family(
        kind,
        model,
        flags,
        start_server(model, "--mtp", "off", *PLAIN),
        start_server(model, *flags, *PLAIN),
    )
    yield family
    family.off.stop()
    family.on.stop()


def test_the_drafter_is_read_and_its_drafts_are_accepted(family):
    off, on = family.off, family.on
    assert on.log_lines(family.kind.read)
    assert on.log_lines("Drafting with its ")
    assert not any("MTP" in line for line in off.log)  # --mtp off: the head is not read
    before = speculated(on, "drafted"), accepted(on), verified(on)
    answer = reply(on, BY_NAME["story"].request)[0]
    drafted = speculated(on, "drafted") - before[0]
    taken = accepted(on) - before[1]
    passes = verified(on) - before[2]
    # The drafter learned the replies: its first guess is mostly the model's own next
    # token, and the tokens a verified pass keeps average well above one.
    steps = answer["usage"]["completion_tokens"] - taken
    assert drafted > 0
    assert answer["usage"]["completion_tokens"] / steps >= family.kind.tokens_per_pass
    # About every step verified a draft (the end of turn is not in `usage`); /metrics
    # counts them.
    assert steps - 2 <= passes <= steps + 1
    assert taken / passes >= family.kind.tokens_per_pass - 1
    # Each row's draft length follows what it keeps: a drafter guesses about one token
    # more a pass than it gets kept (EAGLE-3's fixture keeps one of three: it drafts 2).
    assert drafted / passes <= taken / passes + 1.2
    assert speculated(off, "drafted") == 0


@pytest.mark.parametrize("conv", CONVERSATIONS, ids=lambda c: c.name)
def test_greedy_tokens_and_logprobs_are_those_of_plain_decoding(family, conv):
    off, on = family.off, family.on
    assert_same(reply(off, conv.request), reply(on, conv.request))


def test_a_guided_tool_call_drafts_as_an_unguided_one(family):
    """Under tool_choice "auto" the call the model opens follows its tool's grammar; a
    trained call is valid, so the mask changes no token, drafted or not."""
    body = BY_NAME["tool_call"].request
    guided = reply(family.on, body)
    assert guided[0]["message"]["tool_calls"]
    assert_same(reply(family.off, body), guided)
    unguided = reply(family.on, {**body, "tool_call_grammar": "off"})  # logprobs of no mask
    assert unguided[0] == guided[0] and tokens(unguided) == tokens(guided)


def test_batched_every_request_gets_its_plain_reply(family):
    """All at once beside a running stream: every row drafts with the head in one pass,
    keeps a different number of tokens, and the head's cache follows each row's. No pass
    runs twice: Qwen3.5's gated delta-net layers keep their state at each position."""
    off, on = family.off, family.on
    plain = [reply(off, c.request) for c in CONVERSATIONS]
    batched = beside_a_stream(
        on, family.model, ENDS["tiny_model"], lambda c: reply(on, c.request), CONVERSATIONS
    )
    for p, b in zip(plain, batched, strict=True):
        assert_same(p, b)
    assert speculated(on, "drafted") > accepted(on) > 0
    assert replayed(on) == 0


def test_stops_and_limits_cut_the_reply_where_plain_decoding_does(family):
    off, on = family.off, family.on
    story = BY_NAME["story"].request
    for limits in ({"max_tokens": 7}, {"max_tokens": 12}, {"stop": ["the"]}):
        plain, drafted = reply(off, {**story, **limits}), reply(on, {**story, **limits})
        assert_same(plain, drafted)
        if "max_tokens" in limits:
            assert drafted[0]["usage"]["completion_tokens"] == limits["max_tokens"]


def test_a_constrained_row_shares_passes_with_drafting_rows(family):
    """A grammar row drafts with the head too, its drafts verified under its mask, in the
    passes that verify the other rows' drafts."""
    off, on = family.off, family.on
    bodies = [
        {**BY_NAME["capital"].request, "response_format": {"type": "json_object"}},
        BY_NAME["story"].request,
        BY_NAME["count"].request,
    ]
    plain = [reply(off, b) for b in bodies]
    for p, b in zip(plain, concurrently(lambda b: reply(on, b), bodies), strict=True):
        assert_same(p, b)


def test_a_constrained_rows_guesses_follow_its_grammar(family):
    """The drafter's guesses for a constrained row are masked by its grammar as the verify
    pass masks the model's (engine/speculation/draft_guide.py), then taken back from the grammar:
    asked for digits the fixtures never write, the reply is plain decoding's, and the
    drafter's guesses (the digits its own logits prefer) are accepted (measured: the DFlash
    fixture 2 of 23 guided, none unguided; the MTP heads 14 of 39, against 7 and 13).
    EAGLE-3's logits cover its own smaller vocabulary (`d2t`): it is not guided."""
    off, on = family.off, family.on
    body = {**BY_NAME["capital"].request, "guided_regex": "[0-9]{30}", "max_tokens": 40}
    (drafted, taken), answer = drafting_counts(on, body)
    assert_same(reply(off, body), answer)
    assert drafted > 0
    if family.kind.drafter != "eagle3_drafter":
        assert taken > 0


def test_seeded_sampling_is_the_same_alone_and_batched(family):
    on = family.on

    def sampled(seed: int) -> str:
        body = {**BY_NAME["story"].request, "temperature": 1.0, "seed": seed, "max_tokens": 30}
        status, _, answer = on.post(CHAT, body)
        assert status == 200, answer
        return answer["choices"][0]["message"]["content"]

    alone = [sampled(seed) for seed in (1, 2, 3)]
    assert concurrently(sampled, [1, 2, 3, 1]) == [*alone, alone[0]]


@pytest.mark.parametrize(
    "constraint",
    [{}, {"guided_regex": "[^oa]+", "temperature": 1.0}],
    ids=["free", "grammar"],
)
def test_sampled_output_keeps_the_model_distribution(family, constraint):
    """A head's draft is one token proposed with certainty, kept only where the row's own
    sampler draws it: the tokens have the model's distribution, under a grammar the
    masked one (drafts guided by the grammar too; a grammar that forbids much of the
    story's words, at a temperature where drafts are often kept: unmasked drafted
    positions fail it). 400 seeded replies with drafts and 400 without, at a temperature
    that spreads the choices, must not be told apart (a chi-squared test at each of the
    second to fourth tokens, which drafts decide)."""
    off, on = family.off, family.on

    def one(srv, seed: int) -> tuple[str, ...]:
        body = {
            **BY_NAME["story"].request,
            "temperature": 2.0,
            "seed": seed,
            "max_tokens": 4,
            "logprobs": True,
            **constraint,
        }
        status, _, answer = srv.post(CHAT, body)
        assert status == 200, answer
        return tuple(e["token"] for e in answer["choices"][0]["logprobs"]["content"])

    def replies(srv) -> list[tuple[str, ...]]:
        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(lambda seed: one(srv, seed), range(400)))

    before = accepted(on)
    samples = replies(off), replies(on)
    assert accepted(on) > before  # sampled rows drafted, and kept some drafts
    for position in (1, 2, 3):
        a, b = (Counter(t[position] for t in sample if len(t) > position) for sample in samples)
        frequent = sorted(token for token in a | b if a[token] + b[token] >= 10)
        table = [[c[token] for token in frequent] for c in (a, b)]
        table = [[*row, c.total() - sum(row)] for row, c in zip(table, (a, b), strict=True)]
        columns = [column for column in zip(*table, strict=True) if any(column)]
        assert len(columns) >= 3  # the temperature spreads the choices
        assert chi2_contingency(list(zip(*columns, strict=True))).pvalue > 1e-3


def test_the_prompt_cache_carries_the_head_cache(launch, family):
    """The next turn of a conversation continues from the cache the first left, the
    head's included, and still drafts: the same replies as a server without either."""
    off = family.off
    srv = launch(family.model, *family.flags, "--speculation", "off")
    first = BY_NAME["story"].request
    answer = reply(srv, first)
    assert_same(reply(off, first), answer)
    turn = {
        "messages": [
            *first["messages"],
            answer[0]["message"],
            *BY_NAME["count"].request["messages"],
        ]
    }
    before = (speculated(srv, "drafted"), accepted(srv))
    again = reply(srv, turn)
    counts = (speculated(srv, "drafted") - before[0], accepted(srv) - before[1])
    assert again[0]["usage"].pop("prompt_tokens_details")["cached_tokens"] > 0
    plain = reply(off, turn)
    plain[0]["usage"].pop("prompt_tokens_details")
    assert_same(plain, again)
    assert counts[0] > 0
    if family.kind.follows_turns:
        assert counts[1] > 0


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_under_auto_a_named_drafter_drafts_what_this_device_pays_for(request, launch, kind):
    """Under the default --speculation auto an EAGLE-3 or DFlash drafter's lengths follow
    this device's measured costs (the log says what a pass costs), a row drafting only
    tries where no length pays; the plain steps between still give the drafter each
    position (the head its entry, the DFlash drafter its context). Whatever the costs
    decide, every reply, alone and batched, is plain decoding's. (On this CPU the tiny
    fixtures' passes cost about a step at any width, and both drafters draft: the rests
    are checked with a draft model, tests/test_speculation.py, and in
    tests/unit/test_draft_costs.py.)"""
    drafted_kind = KINDS[kind]
    model = request.getfixturevalue(drafted_kind.model)
    drafter = request.getfixturevalue(str(drafted_kind.drafter))
    srv = launch(model, "--draft-model", str(drafter), *PLAIN[2:])
    off = launch(model, *PLAIN)
    assert srv.log_lines("Drafting and verifying")
    plain = [reply(off, c.request) for c in CONVERSATIONS]
    for p, c in zip(plain, CONVERSATIONS, strict=True):
        assert_same(p, reply(srv, c.request))
    batched = concurrently(lambda c: reply(srv, c.request), CONVERSATIONS)
    for p, b in zip(plain, batched, strict=True):
        assert_same(p, b)


def test_a_dflash_drafter_guesses_alike_alone_and_batched(launch, tiny_model, dflash_drafter):
    """A row's guesses read its own context only (not the left padding a batch puts
    before a shorter row's), and its draft length follows its own acceptance: each
    conversation drafts and accepts as many tokens batched as alone."""
    srv = launch(tiny_model, "--draft-model", str(dflash_drafter), *PLAIN)
    alone = [drafting_counts(srv, c.request) for c in CONVERSATIONS]
    before = (speculated(srv, "drafted"), accepted(srv))
    batched = concurrently(lambda c: reply(srv, c.request), CONVERSATIONS)
    for (_, answer), together in zip(alone, batched, strict=True):
        assert_same(answer, together)
    total = [sum(counts[i] for counts, _ in alone) for i in (0, 1)]
    assert total[1] > 0.6 * total[0]
    assert (speculated(srv, "drafted") - before[0], accepted(srv) - before[1]) == tuple(total)


def test_a_dflash_drafter_cache_holds_every_position(launch, tiny_model, dflash_drafter):
    """A finished reply's cache (which the prompt cache keeps) holds the drafter's context
    for every position the model's holds: the same request again, its prompt taken from
    that cache, guesses exactly as it did computed afresh."""
    srv = launch(tiny_model, "--draft-model", str(dflash_drafter), "--speculation", "off")
    story = {**BY_NAME["story"].request, "max_tokens": 80}
    first, answer = drafting_counts(srv, story)
    again, repeated = drafting_counts(srv, story)
    assert repeated[0]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert repeated[1] == answer[1]
    assert again == first and first[1] > 0


def test_prompt_lookup_and_the_head_draft_in_the_same_pass(launch, family):
    """A row whose context predicts a draft verifies that one; the others the head's."""
    off = family.off
    srv = launch(family.model, *family.flags, "--speculation", "on", *PLAIN[2:])
    bodies = [ECHO.request, BY_NAME["story"].request, BY_NAME["unicode"].request]
    plain = [reply(off, b) for b in bodies]
    for p, b in zip(plain, concurrently(lambda b: reply(srv, b), bodies), strict=True):
        assert_same(p, b)
    assert accepted(srv) > 0


def test_auto_drafts_only_where_the_measured_cost_pays(launch, glm_mtp_model):
    srv = launch(glm_mtp_model, "--mtp", "auto")
    (line,) = srv.log_lines("Drafting and verifying 4 tokens costs")
    cost = float(re.search(r"costs ([\d.]+) steps", line).group(1))
    head = "Drafting with its DeepSeek/GLM-layout MTP head"
    assert srv.log_lines(f"{head} for" if cost <= 2 else f"{head} off for")
    status, _, answer = srv.post(CHAT, BY_NAME["story"].request)
    assert status == 200, answer


def test_a_head_that_does_not_fit_its_family_is_a_warning(launch, glm_mtp_model, tmp_path):
    """A checkpoint whose head lacks a tensor: the model is served, without drafts."""
    import mlx.core as mx

    broken = tmp_path / "broken-glm"
    shutil.copytree(glm_mtp_model, broken)
    weights = mx.load(str(broken / "model.safetensors"))
    del weights["model.layers.2.eh_proj.weight"]
    mx.save_safetensors(str(broken / "model.safetensors"), weights)
    srv = launch(broken, "--mtp", "on", "--speculation", "off")
    assert srv.log_lines("could not be read")
    status, _, answer = srv.post(CHAT, BY_NAME["story"].request)
    assert status == 200
    assert answer["choices"][0]["message"]["content"] == BY_NAME["story"].reply
    assert speculated(srv, "drafted") == 0


@pytest.mark.parametrize(
    ("drafter", "changes", "refusal"),
    [
        # a split-out MTP drafter (mlx-vlm's table names its kind by model type)
        (
            "tiny_model",
            lambda config: {"model_type": "gemma4_assistant"},
            "is a mtp drafter, which mlxserve does not serve",
        ),
        # a DFlash variant whose block pass is not implemented here (a type for each layer,
        # as the loader reads them)
        (
            "dflash_drafter",
            lambda config: {
                "layer_types": ["sliding_attention"] * config["num_hidden_layers"],
                "sliding_window": 64,
            },
            "uses sliding-window layers, which is not served",
        ),
    ],
    ids=["mtp-drafter", "dflash-sliding"],
)
def test_a_drafter_of_a_kind_not_served_is_refused_at_start(
    request, tiny_model, tmp_path, drafter, changes, refusal
):
    """Read as a draft model, such a folder would fail inside mlx-lm or draft wrongly; it
    is refused by name at start instead."""
    import json
    import subprocess
    import sys

    folder = tmp_path / "tiny-drafter"
    shutil.copytree(request.getfixturevalue(drafter), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes(config)}))
    command = [sys.executable, "-m", "mlxserve", "--model", str(tiny_model)]
    command += ["--draft-model", str(folder), "--port", "0"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"tiny-drafter {refusal}" in done.stderr


def test_a_published_qwen35_checkpoint_drafts_with_its_head_when_served_as_text(
    launch, qwen_vl_mtp_model, qwen_mtp_model
):
    """Qwen3.5 is published as a vision-language checkpoint, which mlx-vlm serves one
    request at a time without the head; with --text-only mlx-lm serves it as text:
    batched, drafting with its head, the replies those of its text checkpoint, and an
    image a 400 as for any text model."""
    fixtures = qwen_vl_mtp_model.parent
    srv = launch(qwen_vl_mtp_model, "--text-only", "--mtp", "on", *PLAIN)
    assert srv.log_lines("Drafting with its Qwen3.5-layout MTP head for")
    listed = {m["id"]: m for m in srv.get("/v1/models")[2]["data"]}
    assert listed[str(qwen_vl_mtp_model)]["input_modalities"] == ["text"]
    plain = launch(qwen_mtp_model, "--mtp", "off", *PLAIN, "--model-dir", str(fixtures))
    unflagged = {m["id"]: m for m in plain.get("/v1/models")[2]["data"]}
    assert unflagged[qwen_vl_mtp_model.name]["input_modalities"] == ["text", "image"]
    # Its chat template (tiny-chat's) renders text only: an image is the client's 400
    png = {"type": "image_url", "image_url": {"url": data_uri(square_png("red", 56))}}
    pictured = {"role": "user", "content": [{"type": "text", "text": "What is it?"}, png]}
    body = {"model": qwen_vl_mtp_model.name, "messages": [pictured], "max_tokens": 4}
    status, _, refused = plain.post(CHAT, body)
    assert status == 400 and refused["error"]["param"] == "messages", refused
    assert refused["error"]["message"].startswith("The chat template rejected the messages: ")
    bodies = [c.request for c in CONVERSATIONS[:6]]
    expected = [reply(plain, b) for b in bodies]
    for p, b in zip(expected, concurrently(lambda b: reply(srv, b), bodies), strict=True):
        assert_same(p, b)
    assert accepted(srv) > 0
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    message = {"role": "user", "content": [{"type": "text", "text": "What is it?"}, image]}
    status, _, answer = srv.post(CHAT, {"messages": [message]})
    assert status == 400 and answer["error"]["code"] == "images_not_supported"
