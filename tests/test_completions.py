"""Text completions end to end: prompts as text or token ids, the legacy logprobs format."""

from __future__ import annotations

import openai
from helpers.sse import stream
from transformers import AutoTokenizer

COMPLETIONS = "/v1/completions"
# The tiny model's chat format written out by hand: the completion continues the reply.
PREFIX = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
PROMPT = PREFIX + "The capital of France is"


def complete(server, **body):
    status, _, result = server.post(COMPLETIONS, body)
    assert status == 200, result
    return result


def test_text_prompt_keeps_the_leading_space(server):
    body = complete(server, prompt=PROMPT, max_tokens=10)
    assert body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-")
    choice = body["choices"][0]
    assert choice == {"index": 0, "text": " Paris.", "logprobs": None, "finish_reason": "stop"}
    assert body["usage"]["completion_tokens"] == 2


def test_token_id_prompts_and_several_prompts(server, tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    assert complete(server, prompt=ids)["choices"][0]["text"] == " Paris."
    count = PREFIX.replace("What is the capital of France?", "Count to five.") + "One, two,"
    body = complete(server, prompt=[PROMPT, count], n=2)
    texts = {c["index"]: c["text"] for c in body["choices"]}
    assert texts == {0: " Paris.", 1: " Paris.", 2: " three, four, five.", 3: " three, four, five."}
    batch_ids = [ids, tokenizer.encode(count, add_special_tokens=False)]
    assert [c["text"] for c in complete(server, prompt=batch_ids)["choices"]] == [
        " Paris.",
        " three, four, five.",
    ]


def test_legacy_logprobs(server):
    body = complete(server, prompt=PROMPT, logprobs=2)
    logprobs = body["choices"][0]["logprobs"]
    assert logprobs["tokens"] == [" Paris", "."]
    assert logprobs["text_offset"] == [0, 6]
    assert all(lp <= 0 for lp in logprobs["token_logprobs"])
    assert [len(t) for t in logprobs["top_logprobs"]] == [2, 2]
    assert " Paris" in logprobs["top_logprobs"][0]


def test_streaming_text_completion(server):
    result = stream(
        server.url,
        COMPLETIONS,
        {"prompt": PROMPT, "logprobs": 1, "stream_options": {"include_usage": True}},
    )
    assert result.data[-1] == "[DONE]"
    chunks = result.chunks
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == " Paris."
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    offsets = [
        o
        for c in chunks
        if c["choices"] and c["choices"][0]["logprobs"]
        for o in c["choices"][0]["logprobs"]["text_offset"]
    ]
    assert offsets == [0, 6]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2


def test_stop_and_max_tokens(server):
    body = complete(server, prompt=PROMPT, stop=["ris"])
    assert body["choices"][0]["text"] == " Pa"
    assert body["choices"][0]["finish_reason"] == "stop"
    body = complete(server, prompt=PROMPT, max_tokens=1)
    assert body["choices"][0] == {
        "index": 0,
        "text": " Paris",
        "logprobs": None,
        "finish_reason": "length",
    }


def test_openai_sdk_completions(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="unused")
    model = client.models.list().data[0].id
    assert client.completions.create(model=model, prompt=PROMPT).choices[0].text == " Paris."
    pieces = client.completions.create(model=model, prompt=PROMPT, stream=True)
    assert "".join(p.choices[0].text for p in pieces) == " Paris."
