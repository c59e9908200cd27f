"""Agent loops on every cache family: each turn of a growing conversation continues from
the prompt cache, at least up to the previous turn's prompt, also on models whose caches
cannot be trimmed back (a hybrid gated-delta-net model, a sliding-window model), and also
when the reply comes back in the history not quite as it was generated (templates that
drop reasoning, clients that strip or rewrite it): here the client appends a word."""

from __future__ import annotations

import pytest
from fixture_models import HERE

CHAT = "/v1/chat/completions"
# ~400 tokens of instructions, as an agent's system prompt opens every turn
SYSTEM = " ".join((HERE / "corpus.txt").read_text().split()[:300])


@pytest.mark.parametrize("family", ["tiny_model", "hybrid_model", "sliding_model"])
def test_every_turn_continues_from_the_previous_prompt(request, launch, family):
    srv = launch(request.getfixturevalue(family))
    messages = [{"role": "system", "content": SYSTEM}]
    previous = 0
    cached = []
    for turn in range(5):
        messages.append({"role": "user", "content": f"Now do step {turn} of the plan."})
        status, _, body = srv.post(CHAT, {"messages": messages, "max_tokens": 12})
        assert status == 200, body
        usage = body["usage"]
        cached.append((usage["prompt_tokens_details"]["cached_tokens"], previous))
        previous = usage["prompt_tokens"]
        reply = body["choices"][0]["message"]["content"] or ""
        messages.append({"role": "assistant", "content": reply.strip() + " Done."})
    # every turn after the first reuses the previous turn's whole prompt but its last token
    assert all(hit >= before - 1 for hit, before in cached[1:]), cached


@pytest.mark.parametrize("family", ["hybrid_model", "sliding_model"])
def test_a_new_conversation_continues_from_the_shared_system_prompt(request, launch, family):
    """A cache that cannot be trimmed back keeps a checkpoint where the system prompt (and
    tools) end, so another conversation with the same system prompt skips it."""
    srv = launch(request.getfixturevalue(family))

    def cached(question: str) -> tuple[int, int]:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        status, _, body = srv.post(CHAT, {"messages": messages, "max_tokens": 4})
        assert status == 200, body
        usage = body["usage"]
        return usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]

    assert cached("What is the first step?")[0] == 0
    hit, total = cached("Which tools do we have?")
    question = len(srv.post("/tokenize", {"prompt": "Which tools do we have?"})[2]["tokens"])
    assert total - question - 10 <= hit < total  # all but the new user turn
