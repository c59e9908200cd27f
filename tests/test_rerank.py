"""Rerank (/v1/rerank, /rerank, /v2/rerank) and score (/v1/score) on a cross-encoder and a
Qwen3-Reranker-style decoder, both served by one server: the scores equal the same model
run in-process on each pair alone (batching and padding change nothing), the order
follows them, and bad requests are 400s in OpenAI's shape."""

from __future__ import annotations

import pytest
from helpers.server import start_server

from mlxserve.models.tokenizer import load_text_tokenizer
from mlxserve.rerank.model import CrossEncoder, load_reranker

QUERY = "What colour is the sky?"
DOCUMENTS = [
    "The sky is blue on a clear day.",
    "Paris is the capital of France.",
    "Grass is green.",
    "The ocean looks blue because it reflects the sky, and it is very deep and wide.",
]


@pytest.fixture(scope="module")
def server(cross_encoder_model, qwen3_reranker_model, tiny_model):
    srv = start_server(
        cross_encoder_model, "--model", str(qwen3_reranker_model), "--model", str(tiny_model)
    )
    yield srv
    srv.stop()


def alone(folder, query: str, documents: list[str], instruction: str | None = None):
    """Each pair's score from the model in-process, one pair per forward pass."""
    model = load_reranker(folder, load_text_tokenizer(folder, False), False)
    scores = []
    for document in documents:
        if isinstance(model, CrossEncoder):
            pairs = model.pairs([query], [document])
        else:
            pairs = model.pairs([query], [document], instruction)
        scores.append(float(model.score(pairs)[0]))
    return scores


@pytest.mark.parametrize("which", ["cross", "decoder"])
@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_rerank_orders_documents_by_the_models_scores(
    server, cross_encoder_model, qwen3_reranker_model, which, path
):
    folder = cross_encoder_model if which == "cross" else qwen3_reranker_model
    expected = alone(folder, QUERY, DOCUMENTS)
    documents = [DOCUMENTS[0], {"text": DOCUMENTS[1]}, *DOCUMENTS[2:]]
    status, _, reply = server.post(
        path, {"model": str(folder), "query": QUERY, "documents": documents, "top_n": 3}
    )
    assert status == 200, reply
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])[:3]
    assert [r["index"] for r in reply["results"]] == order
    for result in reply["results"]:
        assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=1e-4)
        assert result["document"] == {"text": DOCUMENTS[result["index"]]}
        assert 0.0 <= result["relevance_score"] <= 1.0
    assert set(reply) == {"id", "model", "results", "usage"}
    assert reply["model"] == str(folder)
    assert reply["usage"]["total_tokens"] == reply["usage"]["prompt_tokens"] > 0


def test_return_documents_false_and_no_top_n(server, cross_encoder_model):
    body = {"model": str(cross_encoder_model), "query": QUERY, "documents": DOCUMENTS}
    status, _, reply = server.post("/v1/rerank", {**body, "return_documents": False})
    assert status == 200
    assert sorted(r["index"] for r in reply["results"]) == [0, 1, 2, 3]
    assert all(set(r) == {"index", "relevance_score"} for r in reply["results"])


def test_instruction_steers_a_decoder_reranker(server, qwen3_reranker_model):
    instruction = "Find passages about geography"
    expected = alone(qwen3_reranker_model, QUERY, DOCUMENTS, instruction)
    body = {"model": str(qwen3_reranker_model), "query": QUERY, "documents": DOCUMENTS}
    status, _, reply = server.post("/v1/rerank", {**body, "instruction": instruction})
    assert status == 200
    got = {r["index"]: r["relevance_score"] for r in reply["results"]}
    assert [got[i] for i in range(4)] == pytest.approx(expected, abs=1e-4)
    assert expected != pytest.approx(alone(qwen3_reranker_model, QUERY, DOCUMENTS), abs=1e-6)


def test_score_in_vllms_shape(server, cross_encoder_model):
    expected = alone(cross_encoder_model, QUERY, DOCUMENTS[:2])
    body = {"model": str(cross_encoder_model), "text_1": QUERY, "text_2": DOCUMENTS[:2]}
    status, _, reply = server.post("/v1/score", body)
    assert status == 200, reply
    assert reply["object"] == "list"
    assert [d["index"] for d in reply["data"]] == [0, 1]
    assert all(d["object"] == "score" for d in reply["data"])
    assert [d["score"] for d in reply["data"]] == pytest.approx(expected, abs=1e-4)
    pairwise = {**body, "text_1": [QUERY, QUERY]}
    status, _, again = server.post("/v1/score", pairwise)
    assert [d["score"] for d in again["data"]] == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"query": QUERY, "documents": []}, "documents"),
        ({"query": "", "documents": ["a"]}, "query"),
        ({"query": QUERY, "documents": [""]}, "documents"),
        ({"query": QUERY}, "documents"),
        ({"query": QUERY, "documents": ["a"], "top_n": 0}, "top_n"),
        ({"query": QUERY, "documents": [{"title": "a"}]}, "documents"),
    ],
)
def test_bad_rerank_requests_are_400s(server, cross_encoder_model, body, param):
    status, _, reply = server.post("/v1/rerank", {"model": str(cross_encoder_model), **body})
    assert status == 400, reply
    assert reply["error"]["type"] == "invalid_request_error"
    assert reply["error"]["param"].startswith(param)


def test_models_of_other_kinds_are_refused_both_ways(server, cross_encoder_model, tiny_model):
    status, _, reply = server.post(
        "/v1/rerank", {"model": str(tiny_model), "query": QUERY, "documents": ["a"]}
    )
    assert status == 400 and reply["error"]["code"] == "model_not_reranker"
    chat = {"model": str(cross_encoder_model), "messages": [{"role": "user", "content": "hi"}]}
    status, _, reply = server.post("/v1/chat/completions", chat)
    assert status == 400 and reply["error"]["code"] == "model_not_generative"
    assert "/v1/rerank" in reply["error"]["message"]
    body = {"model": str(cross_encoder_model), "query": QUERY, "documents": ["a"]}
    status, _, reply = server.post("/v1/rerank", {**body, "instruction": "x"})
    assert status == 400 and reply["error"]["param"] == "instruction"
    status, _, reply = server.post(
        "/v1/score", {"model": str(cross_encoder_model), "text_1": ["a", "b"], "text_2": ["c"] * 3}
    )
    assert status == 400 and reply["error"]["param"] == "text_2"


def test_models_lists_the_rerankers_kind(server, cross_encoder_model, qwen3_reranker_model):
    _, _, reply = server.get("/v1/models")
    kinds = {m["id"]: m["kind"] for m in reply["data"]}
    assert kinds[str(cross_encoder_model)] == "rerank"
    assert kinds[str(qwen3_reranker_model)] == "rerank"


def test_rerankers_unload_and_load_like_the_others(server, cross_encoder_model):
    name = str(cross_encoder_model)
    status, _, reply = server.post("/v1/models/unload", {"model": name})
    assert status == 200 and reply["state"] == "not-loaded", reply
    status, _, reply = server.post(
        "/v1/rerank", {"model": name, "query": QUERY, "documents": ["a"]}
    )
    assert status == 200 and len(reply["results"]) == 1  # loaded again on demand
    _, _, listed = server.get("/v1/models")
    assert {m["id"]: m["state"] for m in listed["data"]}[name] == "loaded"


@pytest.mark.parametrize(
    "provider, path",
    [("cohere", "/v2/rerank"), ("hosted_vllm", "/rerank"), ("jina_ai", "/v1/rerank")],
)
def test_litellms_rerank_through_each_provider(
    server, cross_encoder_model, provider, path, monkeypatch
):
    """LiteLLM's rerank() as Dify and others call it, through each provider prefix that
    posts to a rerank path of ours (each a different one)."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch from GitHub
    import litellm

    expected = alone(cross_encoder_model, QUERY, DOCUMENTS)
    reply = litellm.rerank(
        model=f"{provider}/{cross_encoder_model}",
        query=QUERY,
        documents=DOCUMENTS,
        top_n=2,
        api_base=server.url,
        api_key="none",
    )
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])[:2]
    assert [r["index"] for r in reply.results] == order
    assert [r["relevance_score"] for r in reply.results] == pytest.approx(
        [expected[i] for i in order], abs=1e-4
    )
    assert server.log_lines(f'"POST {path}" 200')
