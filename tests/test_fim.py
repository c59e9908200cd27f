"""Fill in the middle for editors: OpenAI's `/v1/completions` with `suffix` and
llama.cpp's `/infill`, on two FIM families (Qwen2.5-Coder's tokens and CodeLlama's), each
trained to write fim_fixture.SNIPPETS' middles: the reply is the middle only, whole or
streamed; an editor's limits (`n_indent`, `t_max_predict_ms`) cut it as llama.cpp does;
prompts sharing the code up to the cursor come from the prompt cache; an abandoned request
frees its row; what cannot be served is a 400 that says why."""

from __future__ import annotations

import json
import time

import openai
import pytest
from fim_fixture import SNIPPETS
from helpers.errors import assert_error
from helpers.sse import open_stream, stream
from transformers import AutoTokenizer

COMPLETIONS = "/v1/completions"
INFILL = "/infill"
FAMILIES = ["qwen_coder_model", "codellama_model"]
PLAIN = [0, 1, 2]  # the snippets without another file (2 starts with indentation)


@pytest.fixture(scope="module")
def coders(launch_module, qwen_coder_model, codellama_model, tiny_model):
    models = ("--model", str(codellama_model), "--model", str(tiny_model))
    return launch_module(qwen_coder_model, *models)


def infill_body(model, i: int, **extra) -> dict:
    prefix, suffix, _, files = SNIPPETS[i]
    body = {"model": str(model), "input_prefix": prefix, "input_suffix": suffix, **extra}
    if files:
        body["input_extra"] = [{"filename": name, "text": text} for name, text in files]
    return body


@pytest.mark.parametrize("family", FAMILIES)
def test_suffix_gives_the_middle_through_the_openai_sdk(request, coders, family):
    """The openai SDK's completions with `suffix`, whole and streamed: the middle only."""
    model = str(request.getfixturevalue(family))
    client = openai.OpenAI(base_url=coders.url + "/v1", api_key="x")
    for i in PLAIN:
        prefix, suffix, middle, _ = SNIPPETS[i]
        whole = client.completions.create(
            model=model, prompt=prefix, suffix=suffix, temperature=0, max_tokens=40
        )
        assert whole.choices[0].text == middle
        assert whole.choices[0].finish_reason == "stop"
        chunks = client.completions.create(
            model=model, prompt=prefix, suffix=suffix, temperature=0, max_tokens=40, stream=True
        )
        assert "".join(c.choices[0].text for c in chunks) == middle


def test_a_prompt_laid_out_by_the_editor_gives_the_middle(coders, qwen_coder_model):
    """Continue lays the FIM prompt out itself and sends it as a plain prompt: the markers
    in its text are read as the tokenizer's special tokens, so the reply is the middle."""
    client = openai.OpenAI(base_url=coders.url + "/v1", api_key="x")
    for i in PLAIN:
        prefix, suffix, middle, _ = SNIPPETS[i]
        prompt = f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"
        reply = client.completions.create(
            model=str(qwen_coder_model), prompt=prompt, temperature=0, max_tokens=40
        )
        assert reply.choices[0].text == middle


@pytest.mark.parametrize("family", FAMILIES)
def test_infill_in_llama_cpps_shape(request, coders, family):
    """/infill as llama.vscode sends it (its default fields included), whole and
    streamed; another file of the project as context (`input_extra`)."""
    model = request.getfixturevalue(family)
    vscode = {"top_k": 40, "top_p": 0.99, "samplers": ["top_k", "top_p", "infill"]}
    vscode |= {"cache_prompt": True, "t_max_prompt_ms": 500, "n_predict": 64, "prompt": ""}
    for i in [*PLAIN, 4]:
        middle = SNIPPETS[i][2]
        status, _, reply = coders.post(INFILL, infill_body(model, i, temperature=0, **vscode))
        assert status == 200, reply
        assert reply["content"] == middle and reply["stop"] is True
        assert reply["stop_type"] == "eos" and reply["stopping_word"] == ""
        assert reply["model"] == str(model) and reply["has_new_line"] is False
        assert reply["tokens_predicted"] > 0 and reply["tokens_evaluated"] > 0
        assert set(reply["timings"]) >= {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms"}
        result = stream(coders.url, INFILL, infill_body(model, i, temperature=0, stream=True))
        assert result.status == 200, result.lines
        events = result.chunks
        assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
        assert "".join(e["content"] for e in events[:-1]) == middle
        assert events[-1]["content"] == "" and events[-1]["stop_type"] == "eos"
        assert not any(line == "data: [DONE]" for line in result.lines)  # llama.cpp sends none


def test_the_repository_layout_of_another_file(coders, qwen_coder_model):
    """Qwen-Coder's repo-level markers hold the extra file, as llama.cpp lays them out."""
    _, _, reply = coders.post(INFILL, infill_body(qwen_coder_model, 4, temperature=0))
    assert reply["prompt"] == (
        "<|repo_name|>myproject\n<|file_sep|>utils.py\ndef helper():\n    return 42\n"
        "<|file_sep|>filename\n<|fim_prefix|>from utils import helper\nvalue = "
        "<|fim_suffix|>\nprint(value)\n<|fim_middle|>"
    )


def test_an_editors_limits_cut_the_middle(coders, qwen_coder_model):
    """n_indent: a line indented less than asked ends the middle before its code (its
    indentation kept, as llama.cpp keeps it); t_max_predict_ms: once a line is complete
    and the time is up. Either way the row ends at once, and the prompt is cached."""
    full = SNIPPETS[3][2]  # "    x = 1\n    return x\nprint(f())"
    status, _, reply = coders.post(INFILL, infill_body(qwen_coder_model, 3, n_indent=4))
    assert status == 200, reply
    assert reply["content"] == "    x = 1\n    return x\n" and reply["stop_type"] == "limit"
    _, _, whole = coders.post(INFILL, infill_body(qwen_coder_model, 3))
    assert whole["content"] == full and whole["stop_type"] == "eos"
    status, _, timed = coders.post(INFILL, infill_body(qwen_coder_model, 3, t_max_predict_ms=1))
    assert status == 200, timed
    assert timed["stop_type"] == "limit" and "\n" in timed["content"]
    assert full.startswith(timed["content"]) and timed["content"] != full
    assert timed["tokens_predicted"] < whole["tokens_predicted"]


def test_prompts_sharing_the_code_up_to_the_cursor_come_from_the_cache(coders, codellama_model):
    """llama.vscode's warm-up (`n_predict` 0: the prompt only) and then keystrokes: each
    request continues from the last one's prompt."""
    body = infill_body(codellama_model, 0, n_predict=0)
    status, _, warm = coders.post(INFILL, body)
    assert status == 200 and warm["content"] == "" and warm["stop"] is True
    _, _, answer = coders.post(INFILL, {**body, "n_predict": 16, "temperature": 0})
    assert answer["content"] == SNIPPETS[0][2]
    assert answer["tokens_cached"] >= answer["tokens_evaluated"] - 1
    typed = {**body, "input_prefix": body["input_prefix"] + "a", "n_predict": 16}
    _, _, after = coders.post(INFILL, typed)
    # the marker and the code before the cursor (its last token may merge with the key)
    tokenizer = AutoTokenizer.from_pretrained(codellama_model)
    before_cursor = 1 + len(tokenizer.encode(body["input_prefix"], add_special_tokens=False))
    assert after["tokens_cached"] >= before_cursor - 1 > 0


def test_an_abandoned_request_frees_its_row(launch, qwen_coder_model):
    """An editor cancels at each keystroke: with room for one sequence, the next request
    is served at once after the previous one's client hangs up mid-stream."""
    srv = launch(qwen_coder_model, "--max-concurrent", "1")
    tokenizer = AutoTokenizer.from_pretrained(qwen_coder_model)
    ends = ["<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>"]
    bias = {str(tokenizer.convert_tokens_to_ids(t)): -100 for t in ends}
    prefix, suffix, _, _ = SNIPPETS[0]
    body = {"prompt": prefix, "suffix": suffix, "max_tokens": 3000, "logit_bias": bias}
    conn, response = open_stream(srv.url, COMPLETIONS, {**body, "stream": True})
    assert response.status == 200
    response.readline()
    conn.close()
    start = time.monotonic()
    status, _, reply = srv.post(INFILL, infill_body(qwen_coder_model, 0, temperature=0), timeout=30)
    assert status == 200 and reply["content"] == SNIPPETS[0][2]
    assert time.monotonic() - start < 20
    assert srv.log_lines("client closed the connection")


def test_what_cannot_be_served(coders, tiny_model, qwen_coder_model):
    # a model without FIM tokens, in each endpoint's shape
    body = {"model": str(tiny_model), "prompt": "def f(", "suffix": ")"}
    reply = coders.post(COMPLETIONS, body)
    assert_error(reply, 400, "suffix", "fim_not_supported")
    assert "no FIM tokens" in reply[2]["error"]["message"]
    status, headers, reply = coders.post(INFILL, infill_body(tiny_model, 0))
    assert status == 400 and headers["Content-Type"] == "application/json"
    assert set(reply) == {"error"} and set(reply["error"]) == {"code", "message", "type"}
    assert reply["error"]["code"] == 400 and "no FIM tokens" in reply["error"]["message"]
    # echo (not served, with or without suffix), token ids with suffix
    model = str(qwen_coder_model)
    assert_error(coders.post(COMPLETIONS, {**body, "model": model, "echo": True}), 400, "echo")
    ids = coders.post(COMPLETIONS, {"model": model, "prompt": [1, 2, 3], "suffix": ")"})
    assert_error(ids, 400, "prompt")
    # llama.cpp's fields that would change the reply and are not served
    for field, value in {
        "grammar": "root ::= x",
        "n_probs": 3,
        "lora": [{"id": 0, "scale": 1}],
    }.items():
        status, _, reply = coders.post(INFILL, infill_body(qwen_coder_model, 0, **{field: value}))
        assert status == 400 and field in reply["error"]["message"], reply
    # a wrong type names its field
    status, _, reply = coders.post(INFILL, infill_body(qwen_coder_model, 0, n_predict="many"))
    assert status == 400 and "n_predict" in reply["error"]["message"]
    # the server goes on
    _, _, reply = coders.post(INFILL, infill_body(qwen_coder_model, 0, temperature=0))
    assert reply["content"] == SNIPPETS[0][2]
    assert json.dumps(reply)  # plain JSON
