"""POST /v1/embeddings on embedding models of each family: the Qwen3-Embedding layout
(through mlx-embeddings), the same on qwen2 (gte-Qwen2, through mlx-lm) and a BERT encoder
(through mlx-embeddings). Vectors equal a reference computed here from the same weights
with mlx-lm's decoder or mlx-embeddings' encoder, through the `openai` SDK and raw HTTP."""

from __future__ import annotations

import base64
import importlib
import json
import shutil
import time

import mlx.core as mx
import numpy as np
import openai
import pytest
from conversations import BY_NAME
from embedding_fixture import LIMIT
from helpers.server import start_server
from transformers import AutoTokenizer

EMBEDDINGS = "/v1/embeddings"
CHAT = "/v1/chat/completions"
TEXTS = ["The capital of France is Paris.", "Tell me a story.", "Hi"]


def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0)


def normalized(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


def decoder_reference(path, ids: list[int]) -> np.ndarray:
    """mlx-lm's decoder with the checkpoint's bare transformer weights: the last token's
    hidden state, normalised."""
    config = json.loads((path / "config.json").read_text())
    architecture = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = architecture.Model(architecture.ModelArgs.from_dict(config))
    weights = mx.load(str(path / "model.safetensors"))
    model.model.load_weights(list(weights.items()))
    hidden = model.model(mx.array([ids]))
    return normalized(np.array(hidden[0, -1].astype(mx.float32)))


def bert_reference(path, ids: list[int]) -> np.ndarray:
    """mlx-embeddings' BERT: the mean of the hidden states, normalised."""
    from mlx_embeddings.utils import load_model

    hidden = load_model(path)(mx.array([ids])).last_hidden_state
    return normalized(np.array(hidden[0].astype(mx.float32)).mean(axis=0))


FAMILIES = {"qwen3": decoder_reference, "qwen2": decoder_reference, "bert": bert_reference}


@pytest.fixture(scope="module", params=list(FAMILIES))
def embedder(request):
    """(server, model folder, reference) for each family."""
    path = request.getfixturevalue(f"embed_{request.param}_model")
    srv = start_server(path)
    yield srv, path, FAMILIES[request.param]
    srv.stop()


def test_vectors_equal_the_reference(embedder):
    srv, path, reference = embedder
    tokenizer = AutoTokenizer.from_pretrained(path)
    reply = client(srv).embeddings.create(model="default", input=TEXTS)
    assert [d.index for d in reply.data] == [0, 1, 2] and reply.object == "list"
    ids = [tokenizer.encode(text) for text in TEXTS]
    for item, tokens in zip(reply.data, ids, strict=True):
        assert item.object == "embedding"
        np.testing.assert_allclose(item.embedding, reference(path, tokens), atol=2e-4)
        assert np.linalg.norm(item.embedding) == pytest.approx(1, abs=1e-5)
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == sum(map(len, ids))


def test_batched_equals_one_by_one_and_token_ids(embedder):
    srv, path, _ = embedder
    sdk = client(srv)
    together = [d.embedding for d in sdk.embeddings.create(model="default", input=TEXTS).data]
    alone = [sdk.embeddings.create(model="default", input=t).data[0].embedding for t in TEXTS]
    np.testing.assert_allclose(together, alone, atol=2e-5)
    ids = AutoTokenizer.from_pretrained(path).encode(TEXTS[0])
    by_ids = sdk.embeddings.create(model="default", input=[ids, ids]).data
    np.testing.assert_allclose(by_ids[0].embedding, together[0], atol=2e-5)
    single = sdk.embeddings.create(model="default", input=ids).data
    assert len(single) == 1


def test_base64_and_dimensions(embedder):
    srv, _, _ = embedder
    floats = client(srv).embeddings.create(model="default", input=TEXTS[0]).data[0].embedding
    status, _, raw = srv.post(
        EMBEDDINGS, {"model": "default", "input": TEXTS[0], "encoding_format": "base64"}
    )
    assert status == 200
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.array(floats, dtype=np.float32))
    cut = client(srv).embeddings.create(model="default", input=TEXTS[0], dimensions=8)
    np.testing.assert_allclose(cut.data[0].embedding, normalized(np.array(floats[:8])), atol=1e-6)
    status, _, reply = srv.post(
        EMBEDDINGS, {"model": "default", "input": "x", "dimensions": len(floats) + 1}
    )
    assert status == 400 and reply["error"]["param"] == "dimensions"


def test_inputs_over_the_limit(embedder):
    srv, path, reference = embedder
    tokenizer = AutoTokenizer.from_pretrained(path)
    text = " ".join(["paris"] * LIMIT)
    ids = tokenizer.encode(text)
    assert len(ids) > LIMIT
    status, _, reply = srv.post(EMBEDDINGS, {"model": "default", "input": ["ok", text]})
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
    assert reply["error"]["param"] == "input[1]" and str(LIMIT) in reply["error"]["message"]
    body = {"model": "default", "input": text, "truncate_prompt_tokens": -1}
    status, _, reply = srv.post(EMBEDDINGS, body)
    assert status == 200 and reply["usage"]["prompt_tokens"] == LIMIT
    np.testing.assert_allclose(
        reply["data"][0]["embedding"], reference(path, ids[-LIMIT:]), atol=2e-4
    )
    # A text far past the size guard is truncated too (cut by characters first), to the
    # same last tokens, and with a fixed count of them.
    huge = "the river " * 100_000 + text  # a megabyte
    status, _, reply = srv.post(EMBEDDINGS, {**body, "input": huge})
    assert status == 200 and reply["usage"]["prompt_tokens"] == LIMIT, reply
    np.testing.assert_allclose(
        reply["data"][0]["embedding"], reference(path, ids[-LIMIT:]), atol=2e-4
    )
    status, _, reply = srv.post(EMBEDDINGS, {**body, "input": huge, "truncate_prompt_tokens": 5})
    assert status == 200 and reply["usage"]["prompt_tokens"] == 5
    status, _, reply = srv.post(EMBEDDINGS, {"model": "default", "input": huge})
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
    status, _, reply = srv.post(
        EMBEDDINGS, {**body, "input": huge, "truncate_prompt_tokens": LIMIT + 5}
    )
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded"


def test_wrong_model_kind_and_bad_input(embedder, server):
    srv, _, _ = embedder
    status, _, reply = srv.post(CHAT, BY_NAME["capital"].request)
    assert status == 400 and reply["error"]["code"] == "model_not_generative"
    status, _, reply = server.post(EMBEDDINGS, {"input": "Hi"})
    assert status == 400 and reply["error"]["code"] == "model_not_embedding"
    for bad, param in (
        ({"input": []}, "input"),
        ({"input": ""}, "input"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": [[1, -2]]}, "input"),
        ({"input": [10**9]}, "input"),
        ({"input": "x", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ):
        status, _, reply = srv.post(EMBEDDINGS, bad)
        assert status == 400 and reply["error"]["param"].startswith(param), (bad, reply)


def test_a_chat_model_and_an_embedding_model_together(launch, tiny_model, embed_bert_model):
    """Open WebUI's setup: chat and document embeddings from one server."""
    srv = launch(str(tiny_model), "--model", str(embed_bert_model))
    status, _, chat = srv.post(CHAT, BY_NAME["capital"].request)
    assert status == 200
    assert chat["choices"][0]["message"]["content"] == BY_NAME["capital"].reply
    reply = client(srv).embeddings.create(model=str(embed_bert_model), input=TEXTS)
    assert len(reply.data) == 3 and reply.model == str(embed_bert_model)
    listed = srv.get("/v1/models")[2]["data"]
    assert {m["id"]: m["state"] for m in listed} == {
        str(tiny_model): "loaded",
        str(embed_bert_model): "loaded",
    }
    assert [(m["kind"], m["capabilities"]["tools"]) for m in listed] == [
        ("chat", True),
        ("embedding", False),
    ]
    assert len([line for line in srv.log if "Loading model from" in line]) == 2
    assert any("(embedding, " in line for line in srv.log)


def test_a_pipeline_with_other_modules_is_refused(launch, tiny_model, embed_bert_model, tmp_path):
    """A Dense projection after pooling (EmbeddingGemma's pipeline) is not applied: the
    model is refused rather than given vectors without it."""
    folder = tmp_path / "models" / "with-dense"
    shutil.copytree(embed_bert_model, folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))
    srv = launch(tiny_model, "--model-dir", str(folder.parent))
    status, _, reply = srv.post(EMBEDDINGS, {"model": "with-dense", "input": "Hi"})
    assert status == 400 and reply["error"]["code"] == "model_load_failed"
    assert "Dense module" in reply["error"]["message"]


def test_many_inputs_go_in_bounded_batches_and_a_gone_client_stops_them(embedder):
    """A request's inputs are embedded a bounded batch per turn of the generation thread
    (chat streams step in between): the vectors are those of each input alone, and a
    client that hangs up stops the work at the next batch instead of holding the thread."""
    import socket
    from urllib.parse import urlsplit

    srv, path, reference = embedder
    texts = [" ".join(["paris"] * (1 + i % 20)) for i in range(100)]
    reply = client(srv).embeddings.create(model="default", input=texts)
    tokenizer = AutoTokenizer.from_pretrained(path)
    for i in (0, 19, 99):
        ids = tokenizer.encode(texts[i])[:LIMIT]
        np.testing.assert_allclose(reply.data[i].embedding, reference(path, ids), atol=2e-4)

    body = json.dumps({"model": "default", "input": [" ".join(["paris"] * 20)] * 2048})
    parts = urlsplit(srv.url)
    sock = socket.create_connection((parts.hostname, parts.port))
    head = f"POST /v1/embeddings HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json"
    sock.sendall(f"{head}\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
    sock.close()
    deadline = time.monotonic() + 60
    gone = "client closed the connection: POST /v1/embeddings"
    while not any(gone in line for line in srv.log) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert any(gone in line for line in srv.log)


def test_long_inputs_in_parts_equal_the_reference(embedder, launch):
    """With prefill chunks of 16 tokens, a decoder embeds a longer input a part at a time
    (its KV cache kept between them; an encoder takes it whole): the vector is the same."""
    _, path, reference = embedder
    srv = launch(path, "--prefill-chunk", "16")
    tokenizer = AutoTokenizer.from_pretrained(path)
    texts = [" ".join(["paris"] * 20), "paris", " ".join(["lemon tree"] * 9)]
    reply = client(srv).embeddings.create(model="default", input=texts)
    for item, text in zip(reply.data, texts, strict=True):
        ids = tokenizer.encode(text)
        np.testing.assert_allclose(item.embedding, reference(path, ids), atol=2e-4)
