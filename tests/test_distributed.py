"""One model across two ranks: `mlx.launch --backend ring -n 2 mlxserve ...` on this
machine. Greedy replies equal the single-process server's token for token (alone, all at
once, streamed, with stops, tool calls and a grammar); sampled, cancelled and concurrent
requests keep the ranks in step; what stays single-machine says so; a rank that dies or
hangs makes rank 0 answer 503 and exit, and Ctrl-C stops every rank.

tiny-chat (qwen3) splits by tensor parallelism; tiny-hybrid (qwen3_next, whose mlx-lm
architecture has no `shard`) by pipeline parallelism; the vision-language fixtures
(Qwen2-VL, Qwen3.5, Gemma 3) by our own tensor split of their language models."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import anthropic
import openai
import pytest
from conversations import BY_NAME, CONVERSATIONS, colour_question, data_uri, square_png
from helpers.server import start_server
from helpers.sse import open_stream
from helpers.streams import (
    ENDS,
    beside_a_stream,
    concurrently,
    endless,
    tokens_and_message,
)
from helpers.structured import NO_THINKING, SCHEMAS, assert_valid, constrained

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def pair(tiny_model):
    """Speculation on: drafted batches run in lockstep too (the rows keep different
    numbers of tokens per step)."""
    srv = start_server(tiny_model, "--keepalive-seconds", "0.5", "--speculation", "on", ranks=2)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def hybrid_pair(hybrid_model):
    srv = start_server(hybrid_model, ranks=2)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def hybrid_single(hybrid_model):
    srv = start_server(hybrid_model)
    yield srv
    srv.stop()


# The vision-language fixtures, by family
VISION = {
    "qwen2_vl": "vision_model",
    "qwen3_5": "qwen35_vision_model",
    "gemma3": "gemma3_vision_model",
    "qwen3_vl_moe": "qwen3_vl_moe_model",
    "gemma4": "gemma4_vision_model",
}  # (Qwen3-VL dense and Mistral 3 split as Qwen2-VL does, attention and MLP: left to
# the batching tests, to keep the suite's time)
MLX_VLM_SHARD = {"qwen3_vl_moe"}  # split by mlx-vlm's own `shard` (the others by ours)


@pytest.fixture(scope="module", params=list(VISION))
def vision_servers(request):
    """(single-process server, two ranks, the model, the family) of one vision-language
    family."""
    model = request.getfixturevalue(VISION[request.param])
    single = start_server(model)
    pair = start_server(model, ranks=2)
    yield single, pair, model, request.param
    pair.stop()
    single.stop()


def answer(srv, body: dict) -> tuple[dict, list[str], list[float]]:
    """(message and finish reason, tokens, logprobs) of a non-streamed reply."""
    status, _, reply = srv.post(CHAT, {**body, "logprobs": True})
    assert status == 200, reply
    choice = reply["choices"][0]
    for call in choice["message"].get("tool_calls") or []:
        del call["id"]
    entries = choice["logprobs"]["content"]
    outcome = {"message": choice["message"], "finish_reason": choice["finish_reason"]}
    return outcome, [e["token"] for e in entries], [e["logprob"] for e in entries]


def assert_same(single: tuple, distributed: tuple) -> None:
    """The same message, finish reason and tokens; logprobs to float32 rounding (the
    ranks add their partial sums in another order than one process does)."""
    assert distributed[0] == single[0]
    assert distributed[1] == single[1]
    assert distributed[2] == pytest.approx(single[2], abs=1e-4)


def logged(srv, pattern: str, seconds: float = 10) -> re.Match:
    """The first log line matching `pattern` (the other ranks may log after rank 0 says
    it is ready)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for line in list(srv.log):
            if found := re.search(pattern, line):
                return found
        time.sleep(0.05)
    raise AssertionError(f"nothing logged matches {pattern!r}:\n" + "".join(srv.log[-30:]))


def rank_pid(srv, rank: int) -> int:
    return int(logged(srv, rf"Rank {rank} of \d+ \(pid (\d+)\)").group(1))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as stat:  # a zombie has exited
            return stat.read().split(") ")[1][0] != "Z"
    except (ProcessLookupError, FileNotFoundError):  # (reaped between the two)
        return False


def test_the_ranks_split_the_model_by_tensor_parallelism(pair):
    logged(pair, "Split across 2 ranks: tensor parallelism")
    logged(pair, r"Rank 1 \(pid \d+\) follows rank 0")


@pytest.mark.parametrize("conv", CONVERSATIONS, ids=lambda c: c.name)
def test_greedy_replies_equal_the_single_process_servers(server, pair, conv):
    assert_same(answer(server, conv.request), answer(pair, conv.request))


def test_all_at_once_beside_a_running_stream(server, pair, tiny_model):
    """Every request joins a running batch; each gets its reply alone."""
    alone = [answer(server, c.request) for c in CONVERSATIONS]
    batched = beside_a_stream(
        pair, tiny_model, ENDS["tiny_model"], lambda c: answer(pair, c.request), CONVERSATIONS
    )
    for single, distributed in zip(alone, batched, strict=True):
        assert_same(single, distributed)


@pytest.mark.parametrize("name", ["unicode", "think", "tool_call"])
def test_streamed_replies_equal_the_single_process_servers(server, pair, name):
    body = BY_NAME[name].request
    assert tokens_and_message(pair, body, streamed=True) == tokens_and_message(
        server, body, streamed=False
    )


def test_the_anthropic_and_responses_dialects(server, pair):
    """Thin edges over the same loop: the SDKs get the single-process server's replies."""
    conv = BY_NAME["think"]

    def claude(srv) -> list:
        client = anthropic.Anthropic(base_url=srv.url, api_key="none", max_retries=0)
        message = client.messages.create(model="default", max_tokens=100, messages=conv.messages)
        return [block.model_dump() for block in message.content]

    def responses(srv) -> list:
        client = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0)
        response = client.responses.create(model="default", input=conv.messages)
        return [(item.type, item.model_dump(exclude={"id"})) for item in response.output]

    blocks = claude(pair)
    assert blocks == claude(server)
    assert [b["type"] for b in blocks] == ["thinking", "text"]
    assert blocks[1]["text"] == conv.content
    assert responses(pair) == responses(server)


def test_a_stop_string_ends_the_reply_where_it_does_in_one_process(server, pair):
    body = {**BY_NAME["story"].request, "stop": [" the "], "max_tokens": 60}
    single, distributed = answer(server, body), answer(pair, body)
    assert_same(single, distributed)
    assert distributed[0]["finish_reason"] == "stop"
    assert " the " not in distributed[0]["message"]["content"]


def test_a_grammar_constrained_reply(server, pair):
    body = constrained("capital", "nested", **NO_THINKING)
    single, distributed = answer(server, body), answer(pair, body)
    assert_same(single, distributed)
    assert_valid(distributed[0]["message"]["content"], SCHEMAS["nested"])


def test_sampled_requests_at_once_keep_the_ranks_in_step(server, pair):
    """Unseeded draws come from one random state every rank seeded alike; seeded ones
    from their own key: the batch ends each row at the same step on every rank (or the
    ranks would stall). A seed gives the single-process server's text."""

    def sampled(seed: int | None, tokens: int = 30) -> str:
        body = {
            "messages": BY_NAME["story"].messages,
            "temperature": 1.2,
            "max_tokens": tokens,
            **({"seed": seed} if seed is not None else {}),
        }
        status, _, reply = pair.post(CHAT, body, timeout=60)
        assert status == 200, reply
        return reply["choices"][0]["message"]["content"]

    alone = [sampled(seed) for seed in (1, 2)]
    batched = concurrently(lambda args: sampled(*args), [(1,), (None, 7), (2,), (None, 50)])
    assert [batched[0], batched[2]] == alone
    _, _, reply = server.post(
        CHAT,
        {"messages": BY_NAME["story"].messages, "temperature": 1.2, "max_tokens": 30, "seed": 1},
    )
    assert reply["choices"][0]["message"]["content"] == alone[0]


def test_a_client_that_disconnects_leaves_both_ranks_in_step(server, pair, tiny_model):
    for _ in range(2):
        conn, response = open_stream(
            pair.url, CHAT, {**endless(tiny_model, max_tokens=3000), "stream": True}
        )
        assert response.status == 200
        response.readline()
        conn.close()
    conv = BY_NAME["count"]
    assert_same(answer(server, conv.request), answer(pair, conv.request))


def test_other_models_are_a_single_machine_feature(pair, tmp_path):
    status, _, body = pair.post("/v1/models/unload", {"model": "default"})
    assert status == 400 and body["error"]["code"] == "model_pinned"
    assert "distributed" in body["error"]["message"]
    status, _, body = pair.post(CHAT, {**BY_NAME["capital"].request, "model": "nope/nope"})
    assert status == 404  # unknown, as on one machine
    assert answer(pair, BY_NAME["capital"].request)[0]["message"]["content"] == (
        BY_NAME["capital"].reply
    )


def refused_at_start(model, *args: str, ranks: int = 2) -> str:
    """What the ranks said before they all exited (the launcher with them)."""
    bin_dir = os.path.dirname(sys.executable)
    launcher = [os.path.join(bin_dir, "mlx.launch"), "--backend", "ring", "-n", str(ranks)]
    command = [*launcher, os.path.join(bin_dir, "mlxserve"), "--model", str(model), *args]
    with subprocess.Popen(
        [*command, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as launched:
        try:
            output, _ = launched.communicate(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):  # no rank outlives the test
                os.killpg(launched.pid, signal.SIGKILL)
    assert "mlxserve is ready" not in output, output[-2000:]  # (mlx.launch exits 0)
    return output


def test_a_draft_model_is_refused_at_start(tiny_model):
    output = refused_at_start(tiny_model, "--draft-model", str(tiny_model))
    assert "a distributed server (launched by mlx.launch) cannot serve" in output
    assert "a draft model (--draft-model)" in output


def test_shares_of_unequal_size_are_refused_at_start(hybrid_model):
    """4 layers over 3 ranks: 2, 1 and 1. Eviction and admission decide by bytes, and
    every rank must decide alike."""
    output = refused_at_start(hybrid_model, ranks=3)
    assert "the ranks hold shares of different sizes" in output, output[-2000:]


def test_a_hybrid_model_splits_by_pipeline_and_replies_as_one_process(hybrid_pair, hybrid_single):
    """qwen3_next: recurrent layers between attention layers, random weights; alone and
    all at once, and a second turn continues from the prompt cache on both."""
    logged(hybrid_pair, "Split across 2 ranks: pipeline parallelism")
    bodies = [{**c.request, "max_tokens": 24} for c in CONVERSATIONS[:4]]
    alone = [answer(hybrid_single, b) for b in bodies]
    for single, distributed in zip(alone, [answer(hybrid_pair, b) for b in bodies], strict=True):
        assert_same(single, distributed)
    batched = concurrently(lambda b: answer(hybrid_pair, b), bodies)
    for single, distributed in zip(alone, batched, strict=True):
        assert_same(single, distributed)
    first = alone[0][0]["message"]
    turn = {
        "messages": [*bodies[0]["messages"], first, {"role": "user", "content": "And Spain?"}],
        "max_tokens": 16,
    }
    replies = [srv.post(CHAT, turn)[2] for srv in (hybrid_single, hybrid_pair)]
    assert replies[1]["choices"] == replies[0]["choices"]
    assert replies[1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_a_vision_model_splits_its_language_model_and_replies_as_one_process(vision_servers):
    """The language model's heads and MLPs split, the vision tower whole on each rank:
    rows with images of different sizes (each row its own positions) and a text row get
    the single-process server's tokens alone and all at once; a follow-up turn about the
    same image comes from the prompt cache; a client that leaves an image stream mid-way
    leaves the ranks in step."""
    single, pair, model, family = vision_servers
    if family not in MLX_VLM_SHARD:
        logged(pair, r"Split the language model's \d+ layers across 2 ranks")
    logged(pair, "Split across 2 ranks: tensor parallelism")
    squares = [("red", 56), ("blue", 84), ("green", 112)]
    bodies = [
        {"messages": colour_question(data_uri(square_png(*s))), "max_tokens": 12} for s in squares
    ]
    bodies.append({"messages": BY_NAME["capital"].messages, "max_tokens": 12})
    alone = [answer(single, b) for b in bodies]
    assert [a[0]["message"]["content"] for a in alone[:3]] == ["Red.", "Blue.", "Green."]
    for one, split in zip(alone, [answer(pair, b) for b in bodies], strict=True):
        assert_same(one, split)
    for one, split in zip(alone, concurrently(lambda b: answer(pair, b), bodies), strict=True):
        assert_same(one, split)
    turn = {
        "messages": [
            *bodies[1]["messages"],
            alone[1][0]["message"],
            BY_NAME["capital"].messages[0],
        ],
        "max_tokens": 12,
    }
    replies = [srv.post(CHAT, turn)[2] for srv in (single, pair)]
    assert replies[1]["choices"] == replies[0]["choices"]
    assert replies[1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    left = {**endless(model, ENDS[VISION[family]], max_tokens=3000), "stream": True}
    conn, response = open_stream(pair.url, CHAT, {**left, "messages": bodies[2]["messages"]})
    assert response.status == 200
    response.readline()
    conn.close()
    assert_same(alone[0], answer(pair, bodies[0]))


def test_a_vision_model_splits_by_tensor_parallelism_only(vision_model):
    output = refused_at_start(vision_model, "--distributed", "pipeline")
    assert (
        "mlx-vlm's qwen2_vl architecture does not support pipeline parallelism across "
        "machines (it supports tensor)"
    ) in output, output[-2000:]


def test_heads_that_do_not_divide_among_the_ranks_are_refused_at_start(vision_model):
    """Qwen2-VL's 4 attention heads over 3 ranks."""
    output = refused_at_start(vision_model, ranks=3)
    assert (
        "mlx-vlm's qwen2_vl architecture cannot be split across machines: its attention "
        "heads (4) do not divide among 3 ranks"
    ) in output, output[-2000:]


def test_a_key_value_head_that_does_not_divide_among_the_ranks_is_refused_at_start(
    wide_heads_model,
):
    """tiny-chat-wide-heads has 1 key-value head: mlx-lm's qwen3 `shard` would leave each
    of 2 ranks none (an empty KV cache), as it does not repeat it."""
    output = refused_at_start(wide_heads_model)
    assert (
        "mlx-lm's qwen3 architecture cannot be split across machines: its key-value heads "
        "(1) do not divide among 2 ranks"
    ) in output, output[-2000:]
    assert "--kv-bits" not in output  # (it read as a KV quantization error)


def stream_until_error(response, seconds: float) -> str:
    """Read a stream to its end (the server must end it within `seconds`); its text."""
    response.fp.raw._sock.settimeout(seconds)
    return response.read().decode()


@pytest.mark.parametrize("fault", ["killed", "hung"])
def test_a_failed_rank_makes_rank_0_answer_503_and_exit(tiny_model, fault):
    """A rank killed (its connections close) or stopped (no heartbeat for
    --distributed-timeout): the stream in flight ends with an error event, a new request
    gets a 503 or finds the port closed, and every process exits."""
    srv = start_server(tiny_model, "--distributed-timeout", "3", ranks=2)
    follower = rank_pid(srv, 1)
    try:
        conn, response = open_stream(
            srv.url, CHAT, {**endless(tiny_model, max_tokens=3000), "stream": True}
        )
        assert response.status == 200
        response.readline()
        os.kill(follower, signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
        text = stream_until_error(response, 30)
        assert '"error"' in text and "distributed group failed" in text, text[-500:]
        if fault == "hung":  # the error says why (mlx.launch may drop rank 0's last log lines)
            assert "rank 1 sent no heartbeat for 3s" in text, text[-500:]
        conn.close()
        try:
            status, _, body = srv.post(CHAT, BY_NAME["capital"].request, timeout=10)
            assert status == 503, body
        except OSError:
            pass  # rank 0 has already exited
        leader = rank_pid(srv, 0)
        deadline = time.monotonic() + 30
        while alive(leader) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(leader)

    finally:
        if alive(follower):
            os.kill(follower, signal.SIGKILL)
        srv.stop()


def test_a_killed_launcher_stops_every_rank(tiny_model):
    """The launcher killed outright (its ranks' stdin pipes close): rank 0 shuts down as
    on SIGTERM and the others follow; nothing is left serving."""
    srv = start_server(tiny_model, ranks=2)
    pids = [rank_pid(srv, 0), rank_pid(srv, 1)]
    os.kill(srv.process.pid, signal.SIGKILL)
    srv.process.wait(timeout=10)
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids)


def test_ctrl_c_stops_every_rank(tiny_model):
    """SIGINT to the launcher's process group, as Ctrl-C in its terminal: rank 0 shuts
    down (its last step tells the others) and every rank exits 0. (The launcher stops
    relaying their output at the SIGINT, but says which rank exits otherwise.)"""
    # as started from a terminal: a runner that starts the suite as a background job leaves
    # SIGINT ignored, and mlx.launch (not mlxserve) would keep it so
    terminal = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    srv = start_server(tiny_model, ranks=2, preexec=terminal)
    pids = [rank_pid(srv, 0), rank_pid(srv, 1)]
    assert answer(srv, BY_NAME["capital"].request)[0]["message"]["content"] == (
        BY_NAME["capital"].reply
    )
    os.killpg(srv.process.pid, signal.SIGINT)
    srv.process.wait(timeout=30)  # the launcher itself dies of the SIGINT (status -2)
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids)
    log = "".join(srv.log)
    assert "exited with code" not in log and "was killed" not in log, log[-2000:]
