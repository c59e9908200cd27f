"""Several LoRA adapters on one base, in one batch: rows under different adapters (LoRA,
DoRA, PEFT's layout, QLoRA on a quantized base) and rows on the bare base decode
together, and each gets exactly what mlx-lm gives with that adapter alone
(`load(base, adapter_path=...)`); prompt-cache entries never cross adapters, in memory or
on disk; adapters load, unload and make room at runtime; what cannot be served is a 4xx
naming its field while the server goes on."""

from __future__ import annotations

import json
import math
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import openai
import pytest
from adapter_fixture import QUANTIZED_PIRATE, QUESTIONS, REPLIES
from helpers.errors import assert_error
from helpers.sse import logprob_entries, open_stream, stream
from transformers import AutoTokenizer

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
LENGTH = 12  # tokens per reply: the end of turn is forbidden, so each row decodes them all
LOGPROB_TOLERANCE = 1e-3  # a batch sums in another order than a single row
# served name -> the fixture folder it is read from
SERVED = {"pirate": "pirate", "terse": "terse", "formal": "formal", "peft": "pirate-peft"}
EXPECTED_AS = {"peft": "pirate"}  # PEFT's layout of pirate answers as pirate does


def lora_flags(adapters: Path, served: dict[str, str] = SERVED, base: str = "") -> list[str]:
    at = f"@{base}" if base else ""
    return [
        f for name, folder in served.items() for f in ("--lora", f"{name}={adapters / folder}{at}")
    ]


def messages(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


def end_tokens(model: Path) -> list[int]:
    """The tokens that end a reply of the model (as the server reads them)."""
    from mlxserve.models.tokenizer import load_text_tokenizer

    return sorted(load_text_tokenizer(model, False).eos_token_ids)


Row = tuple[list[str], list[float]]  # a reply's tokens (as text) and their logprobs


def library(base: Path, adapter: Path | None, end: list[int]) -> list[Row]:
    """What mlx-lm's own generate_step gives for each question, greedy, the end of turn
    forbidden as logit_bias forbids it."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, tokenizer = load(str(base), adapter_path=str(adapter) if adapter else None)

    def forbid_end(_tokens, logits):
        return logits + mx.zeros((logits.shape[-1],)).at[mx.array(end)].add(-100.0)

    expected = []
    for question in QUESTIONS:
        prompt = tokenizer.apply_chat_template(messages(question), add_generation_prompt=True)
        steps = generate_step(mx.array(prompt), model, logits_processors=[forbid_end])
        ids, logprobs = [], []
        for (token, row), _ in zip(steps, range(LENGTH), strict=False):
            ids.append(int(token))
            logprobs.append(row[token].item())
        expected.append(([tokenizer.decode([t]) for t in ids], logprobs))
    return expected


def same(got: Row, want: Row) -> bool:
    return got[0] == want[0] and all(
        math.isclose(a, b, abs_tol=LOGPROB_TOLERANCE) for a, b in zip(got[1], want[1], strict=True)
    )


@pytest.fixture(scope="module")
def adapter_server(launch_module, tiny_model, adapters):
    return launch_module(tiny_model, *lora_flags(adapters))


def chat_row(srv, model: str, question: str, end: list[int], streamed: bool) -> Row:
    """A chat reply's tokens and logprobs, streamed or not."""
    body = {
        "model": model,
        "messages": messages(question),
        "max_tokens": LENGTH,
        "logit_bias": {str(t): -100 for t in end},
        "logprobs": True,
    }
    if streamed:
        result = stream(srv.url, CHAT, {**body, "stream": True})
        assert result.status == 200, result.lines
        entries = logprob_entries(result.chunks)
    else:
        status, _, reply = srv.post(CHAT, body)
        assert status == 200, reply
        assert reply["model"] == model
        entries = reply["choices"][0]["logprobs"]["content"]
    return [e["token"] for e in entries], [e["logprob"] for e in entries]


def completion_row(
    srv, model: str, question: str, end: list[int], tokenizer, streamed: bool
) -> Row:
    """A text completion of the chat prompt as token ids (the same row as chat's), streamed
    or not."""
    prompt = tokenizer.apply_chat_template(
        messages(question), add_generation_prompt=True, return_dict=False
    )
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": LENGTH,
        "logit_bias": {str(t): -100 for t in end},
        "logprobs": 0,
        "temperature": 0,
    }
    if streamed:
        result = stream(srv.url, COMPLETIONS, {**body, "stream": True})
        assert result.status == 200, result.lines
        parts = [c["choices"][0]["logprobs"] for c in result.chunks if c["choices"]]
        parts = [p for p in parts if p]
        return (
            [t for p in parts for t in p["tokens"]],
            [x for p in parts for x in p["token_logprobs"]],
        )
    status, _, reply = srv.post(COMPLETIONS, body)
    assert status == 200, reply
    logprobs = reply["choices"][0]["logprobs"]
    return logprobs["tokens"], logprobs["token_logprobs"]


def test_mixed_batch_rows_equal_mlx_lm_alone(adapter_server, tiny_model, adapters):
    """The base and four adapters (LoRA twice, DoRA, PEFT's layout), three questions each:
    fifteen rows at once, half streamed, and each row's tokens and logprobs equal mlx-lm's
    generate with that adapter alone; then through completions too (streamed and not)."""
    end = end_tokens(tiny_model)
    names = [None, *SERVED]
    expected = {
        name: library(
            tiny_model, adapters / SERVED[EXPECTED_AS.get(name, name)] if name else None, end
        )
        for name in names
    }
    rows = [(name, i) for name in names for i in range(len(QUESTIONS))]

    def run(job: tuple[int, tuple[str | None, int]]):
        n, (name, i) = job
        return chat_row(adapter_server, name or "default", QUESTIONS[i], end, n % 2 == 0)

    with ThreadPoolExecutor(len(rows)) as pool:
        batched = list(pool.map(run, enumerate(rows)))
    for (name, i), got in zip(rows, batched, strict=True):
        assert same(got, expected[name][i]), (name, QUESTIONS[i], got, expected[name][i])
    # the adapters answer differently from the base and from each other
    firsts = {name: tuple(expected[name][0][0]) for name in names if name != "peft"}
    assert len(set(firsts.values())) == len(firsts)

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    with ThreadPoolExecutor(len(rows)) as pool:
        completed = list(
            pool.map(
                lambda job: completion_row(
                    adapter_server,
                    job[1][0] or "default",
                    QUESTIONS[job[1][1]],
                    end,
                    tokenizer,
                    job[0] % 2 == 1,
                ),
                enumerate(rows),
            )
        )
    for (name, i), got in zip(rows, completed, strict=True):
        assert same(got, expected[name][i]), (name, QUESTIONS[i], got, expected[name][i])


def test_every_dialect_names_an_adapter_as_its_model(adapter_server):
    """The openai SDK (chat, streamed and not; Responses) and the anthropic SDK, all at
    once: each adapter answers with what it was trained to say (mlx-lm's own answer, the
    fixture checked), the base with its own."""
    oai = openai.OpenAI(base_url=adapter_server.url + "/v1", api_key="x")
    claude = anthropic.Anthropic(base_url=adapter_server.url, api_key="x")

    def chat(name: str, question: str, streamed: bool) -> str:
        if not streamed:
            reply = oai.chat.completions.create(model=name, messages=messages(question))
            assert reply.model == name
            return reply.choices[0].message.content or ""
        chunks = oai.chat.completions.create(model=name, messages=messages(question), stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    def responses(name: str, question: str, streamed: bool) -> str:
        if not streamed:
            return oai.responses.create(model=name, input=question).output_text
        with oai.responses.stream(model=name, input=question) as events:
            return events.get_final_response().output_text

    def messages_api(name: str, question: str, streamed: bool) -> str:
        request = {"model": name, "max_tokens": 100, "messages": messages(question)}
        if not streamed:
            reply = claude.messages.create(**request)
            assert reply.model == name
            return "".join(b.text for b in reply.content if b.type == "text")
        with claude.messages.stream(**request) as events:
            return events.get_final_text()

    jobs = [
        (ask, name, i, streamed)
        for ask in (chat, responses, messages_api)
        for name in ("pirate", "formal", "peft", "terse")
        for i in (0, 2)
        for streamed in (False, True)
    ]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda job: job[0](job[1], QUESTIONS[job[2]], job[3]), jobs))
    for (_, name, i, _), answer in zip(jobs, answers, strict=True):
        assert answer == REPLIES[EXPECTED_AS.get(name, name)][i], (name, i, answer)
    assert chat("default", QUESTIONS[0], False) == "The capital of France is Paris."


def test_models_lists_adapters_with_their_base(adapter_server, tiny_model):
    status, _, listed = adapter_server.get("/v1/models")
    assert status == 200
    entries = {m["id"]: m for m in listed["data"]}
    base = next(m for m in listed["data"] if m["kind"] == "chat")
    for name in SERVED:
        entry = entries[name]
        assert entry["kind"] == "adapter" and entry["base"] == base["id"]
        assert entry["context_length"] == base["context_length"]
        assert entry["size_bytes"] > 0
    status, _, one = adapter_server.get("/v1/models/pirate")
    assert status == 200 and one["kind"] == "adapter"
    # the status page's list (the web app's) has them too, with the memory each takes
    ask(adapter_server, "pirate", QUESTIONS[0])  # one is read, whatever ran before
    _, _, page = adapter_server.get("/v1/status")
    shown = {m["id"]: m for m in page["models"]}
    assert shown["pirate"]["kind"] == "adapter"
    loaded = [m for m in page["models"] if m["kind"] == "adapter" and m["state"] == "loaded"]
    assert loaded and all(m["memory_bytes"] > 0 for m in loaded)


def test_mlx_lm_servers_adapters_field(adapter_server, adapters):
    """mlx_lm.server's clients name the adapter folder in `adapters` beside the base."""
    body = {"messages": messages(QUESTIONS[0]), "adapters": str(adapters / "terse")}
    status, _, reply = adapter_server.post(CHAT, {**body, "model": "default"})
    assert status == 200 and reply["choices"][0]["message"]["content"] == REPLIES["terse"][0]
    status, _, reply = adapter_server.post(CHAT, {**body, "adapters": "formal"})
    assert status == 200 and reply["choices"][0]["message"]["content"] == REPLIES["formal"][0]
    assert_error(
        adapter_server.post(CHAT, {**body, "adapters": "/nowhere/adapter"}),
        404,
        "adapters",
        "adapter_not_found",
    )
    assert_error(adapter_server.post(CHAT, {**body, "model": "pirate"}), 400, "adapters")


@pytest.mark.parametrize("drafter", ["lookup", "draft-model"])
def test_drafted_rows_under_an_adapter(launch, tiny_model, adapters, drafter):
    """Prompt-lookup drafts, or a draft model's (drafting from the base), verified by
    adapter rows beside base rows: the tokens and logprobs of mlx-lm alone."""
    end = end_tokens(tiny_model)
    flags = ["--speculation", "on"] if drafter == "lookup" else ["--draft-model", str(tiny_model)]
    srv = launch(tiny_model, *flags, *lora_flags(adapters))
    names = ["formal", "pirate", "default"]
    expected = {
        name: library(tiny_model, adapters / name if name != "default" else None, end)
        for name in names
    }
    rows = [(name, i) for name in names for i in range(len(QUESTIONS))]
    with ThreadPoolExecutor(len(rows)) as pool:
        got = list(pool.map(lambda r: chat_row(srv, r[0], QUESTIONS[r[1]], end, r[1] == 0), rows))
    for (name, i), row in zip(rows, got, strict=True):
        assert same(row, expected[name][i]), (name, i, row, expected[name][i])
    _, _, metrics = srv.get("/metrics")
    drafted = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("mlxserve_speculative_drafted_tokens_total{")
    ]
    assert drafted and sum(drafted) > 0  # the rows did draft


def test_structured_output_under_an_adapter(adapter_server):
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 20}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    body = {
        "model": "pirate",
        "messages": messages(QUESTIONS[0]),
        "max_tokens": 60,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    }
    status, _, reply = adapter_server.post(CHAT, body)
    assert status == 200, reply
    assert set(json.loads(reply["choices"][0]["message"]["content"])) == {"answer"}


def test_qlora_rows_on_a_quantized_base(launch, adapters):
    """An adapter trained on a quantized base (QLoRA) beside the base's own rows."""
    base = adapters / "tiny-chat-q8"
    end = end_tokens(base)
    srv = launch(base, "--lora", f"qpirate={adapters / QUANTIZED_PIRATE}")
    want = {
        "default": library(base, None, end),
        "qpirate": library(base, adapters / QUANTIZED_PIRATE, end),
    }
    rows = [(name, i) for name in want for i in range(len(QUESTIONS))]
    with ThreadPoolExecutor(len(rows)) as pool:
        got = list(pool.map(lambda r: chat_row(srv, r[0], QUESTIONS[r[1]], end, r[1] == 1), rows))
    for (name, i), row in zip(rows, got, strict=True):
        assert same(row, want[name][i]), (name, i, row, want[name][i])
    assert want["qpirate"][0][0] != want["default"][0][0]


def cached_tokens(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def ask(srv, model: str, question: str) -> dict:
    status, _, reply = srv.post(CHAT, {"model": model, "messages": messages(question)})
    assert status == 200, reply
    return reply


def test_prompt_cache_never_crosses_adapters(launch, tiny_model, adapters, tmp_path):
    """One prompt under the base and two adapters: each reuses only its own entries, in
    memory and, after a restart, from the disk tier."""
    folder = tmp_path / "prompt-cache"
    flags = ["--prompt-cache-dir", str(folder), *lora_flags(adapters)]
    srv = launch(tiny_model, *flags)
    question = QUESTIONS[1]
    first = {name: ask(srv, name, question) for name in ("pirate", "default", "terse")}
    assert all(cached_tokens(reply) == 0 for reply in first.values())
    again = {name: ask(srv, name, question) for name in ("terse", "pirate", "default")}
    for name, reply in again.items():
        content = reply["choices"][0]["message"]["content"]
        assert content == first[name]["choices"][0]["message"]["content"]
        assert cached_tokens(reply) == reply["usage"]["prompt_tokens"] - 1
    assert again["pirate"]["choices"][0]["message"]["content"] == REPLIES["pirate"][1]
    srv.stop()

    restarted = launch(tiny_model, *flags)
    # only pirate's entry reaches formal's prompt? none: formal has none of its own
    reply = ask(restarted, "formal", question)
    assert cached_tokens(reply) == 0
    assert reply["choices"][0]["message"]["content"] == REPLIES["formal"][1]
    for name in ("pirate", "terse", "default"):
        reply = ask(restarted, name, question)
        assert cached_tokens(reply) > 0, name
        assert (
            reply["choices"][0]["message"]["content"]
            == first[name]["choices"][0]["message"]["content"]
        )


def states(srv) -> dict[str, tuple[str, bool]]:
    _, _, listed = srv.get("/v1/models")
    return {m["id"]: (m["state"], m["pinned"]) for m in listed["data"] if m["kind"] == "adapter"}


def test_least_recently_used_adapters_make_room(launch, tiny_model, adapters):
    """With room for two, a third adapter sets the least recently used idle one free (a
    pinned one stays), and a freed one is read again when asked for."""
    srv = launch(tiny_model, "--max-loaded-adapters", "2", *lora_flags(adapters))
    assert (
        ask(srv, "pirate", QUESTIONS[0])["choices"][0]["message"]["content"] == REPLIES["pirate"][0]
    )
    ask(srv, "terse", QUESTIONS[0])
    ask(srv, "formal", QUESTIONS[0])
    assert states(srv)["pirate"] == ("not-loaded", False)
    assert states(srv)["terse"][0] == states(srv)["formal"][0] == "loaded"
    assert srv.log_lines("Set adapter pirate free")
    status, _, pinned = srv.post("/v1/models/pin", {"model": "terse", "pinned": True})
    assert status == 200 and pinned["pinned"] is True
    reply = ask(srv, "pirate", QUESTIONS[2])  # room made by formal, terse is pinned
    assert reply["choices"][0]["message"]["content"] == REPLIES["pirate"][2]
    assert states(srv)["formal"][0] == "not-loaded" and states(srv)["terse"] == ("loaded", True)
    # an operator frees one, and loads it again
    status, _, freed = srv.post("/v1/models/unload", {"model": "pirate"})
    assert status == 200 and freed["state"] == "not-loaded"
    status, _, loaded = srv.post("/v1/models/load", {"model": "formal"})
    assert status == 200 and loaded["state"] == "loaded"


def test_adapters_load_and_unload_while_others_stream(launch, tiny_model, adapters):
    """A runtime load and an unload while an adapter's row streams: the stream goes on,
    unbroken; a busy adapter is not unloaded (409), an idle one is, and is no longer
    served."""
    srv = launch(tiny_model, "--lora", f"pirate={adapters / 'pirate'}")
    body = {
        "model": "pirate",
        "messages": messages("Tell me a story."),
        "logit_bias": {str(t): -100 for t in end_tokens(tiny_model)},
        "max_tokens": 3000,
        "stream": True,
    }
    conn, response = open_stream(srv.url, CHAT, body)
    assert response.status == 200
    response.readline()
    status, _, entry = srv.post(
        "/v1/adapters/load", {"name": "formal", "path": str(adapters / "formal")}
    )
    assert status == 200, entry
    assert entry["kind"] == "adapter" and entry["state"] == "loaded"
    reply = ask(srv, "formal", QUESTIONS[0])
    assert reply["choices"][0]["message"]["content"] == REPLIES["formal"][0]
    busy = srv.post("/v1/adapters/unload", {"name": "pirate"})
    assert_error(busy, 409, "name", "adapter_busy")
    status, _, gone = srv.post("/v1/adapters/unload", {"name": "formal"})
    assert status == 200 and gone == {"id": "formal", "object": "model", "deleted": True}
    refused = srv.post(CHAT, {"model": "formal", "messages": messages(QUESTIONS[0])})
    assert_error(refused, 404, "model", "model_not_found")
    assert set(states(srv)) == {"pirate"}
    # the stream is still running: more tokens come, each chunk whole
    later = [response.readline() for _ in range(60)]
    chunks = [json.loads(line[6:]) for line in later if line.startswith(b"data: {")]
    assert len(chunks) >= 25 and all(c["choices"][0]["finish_reason"] is None for c in chunks)
    conn.close()


def _changed(adapters: Path, folder: Path, change) -> Path:
    """A copy of pirate with its weights changed by `change`."""
    import mlx.core as mx

    shutil.copytree(adapters / "pirate", folder)
    weights = mx.load(str(folder / "adapters.safetensors"))
    mx.save_safetensors(str(folder / "adapters.safetensors"), change(weights))
    return folder


def test_what_cannot_be_served_is_a_4xx_naming_its_field(launch, tiny_model, adapters, tmp_path):
    srv = launch(tiny_model, *lora_flags(adapters, {"pirate": "pirate"}))
    full = tmp_path / "full"
    shutil.copytree(adapters / "pirate", full)
    (full / "adapter_config.json").write_text(json.dumps({"fine_tune_type": "full"}))
    garbage = tmp_path / "garbage"
    shutil.copytree(adapters / "pirate", garbage)
    (garbage / "adapters.safetensors").write_bytes(b"not safetensors")
    cases = {  # folder -> (the field at fault, what the message says)
        tmp_path / "missing": ("path", "is not a folder"),
        full: ("path", "a full fine-tune is a model of its own"),
        garbage: ("path", "not a readable safetensors file"),
        # trained on another architecture: a module this model does not have
        _changed(
            adapters,
            tmp_path / "elsewhere",
            lambda w: {k.replace("layers.1.", "layers.7."): v for k, v in w.items()},
        ): ("path", "which this model does not have"),
        # trained on a narrower base: the updates are another shape
        _changed(
            adapters,
            tmp_path / "narrower",
            lambda w: {k: v[:32] if k.endswith("lora_a") else v for k, v in w.items()},
        ): ("path", "an adapter for another base model"),
        _changed(
            adapters,
            tmp_path / "ranks",
            lambda w: {k: v[:4] if k.endswith("lora_b") else v for k, v in w.items()},
        ): ("path", "their ranks differ"),
    }
    for folder, (field, says) in cases.items():
        status, headers, reply = srv.post(
            "/v1/adapters/load", {"name": folder.name, "path": str(folder)}
        )
        assert_error((status, headers, reply), 400, field, "adapter_invalid")
        assert says in reply["error"]["message"], reply
    # a name already served
    taken = srv.post("/v1/adapters/load", {"name": "pirate", "path": str(adapters / "terse")})
    assert_error(taken, 409, "name", "name_taken")
    # an unknown adapter, in each dialect's shape
    unknown = srv.post(CHAT, {"model": "nobody", "messages": messages("hi")})
    assert_error(unknown, 404, "model", "model_not_found")
    status, _, reply = srv.post(
        "/v1/messages", {"model": "nobody", "max_tokens": 5, "messages": messages("hi")}
    )
    assert status == 404 and reply["type"] == "error"
    assert reply["error"]["type"] == "not_found_error"
    # embeddings take no adapter
    embedded = srv.post("/v1/embeddings", {"model": "pirate", "input": "hi"})
    assert_error(embedded, 400, "model", "model_not_embedding")
    # nothing that failed was kept, and the server goes on
    assert set(states(srv)) == {"pirate"}
    reply = ask(srv, "pirate", QUESTIONS[0])
    assert reply["choices"][0]["message"]["content"] == REPLIES["pirate"][0]
