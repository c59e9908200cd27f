"""The install's secret key (api/secret.py): thinking signatures and sealed blobs can only
come from a server holding it; a blob minted with the constant key of earlier versions is
ignored, and a sealed blob that inflates without bound is refused with memory flat."""

from __future__ import annotations

import base64
import hashlib
import hmac
import stat
import zlib

import psutil
from conversations import BY_NAME

from mlxserve.api import secret
from mlxserve.api.responses.sealed import REASONING, UNSEALED_LIMIT
from mlxserve.models.demo import cache_root

RESPONSES = "/v1/responses"
COUNT = "/v1/messages/count_tokens"
THOUGHT = "The user wants the capital of France; that is Paris."
QUESTION = {"role": "user", "content": "What is the capital of France?"}


def old_reasoning_blob(text: str) -> str:
    """encrypted_content as versions before the install key sealed it (a key in the
    source: anyone could mint one)."""
    body = base64.urlsafe_b64encode(zlib.compress(text.encode())).decode()
    digest = hmac.new(b"mlxserve reasoning seal v1", body.encode(), hashlib.sha256).digest()
    return f"mlxserve-rs1.{body}.{base64.urlsafe_b64encode(digest[:18]).decode()}"


def old_signature(text: str) -> str:
    digest = hmac.new(b"mlxserve thinking signature v1", text.encode(), hashlib.sha256).digest()
    return "mlxserve-v1." + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def responses_prompt(server, reasoning: dict | None) -> int:
    items = [QUESTION, *([reasoning] if reasoning else [])]
    items += [{"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And Italy?"}]
    status, _, body = server.post(RESPONSES, {"input": items, "max_output_tokens": 1})
    assert status == 200, body
    return body["usage"]["input_tokens"]


def anthropic_prompt(server, thinking: dict | None) -> int:
    assistant = [*([thinking] if thinking else []), {"type": "text", "text": "Paris."}]
    messages = [QUESTION, {"role": "assistant", "content": assistant}]
    messages.append({"role": "user", "content": "And Italy?"})
    status, _, body = server.post(COUNT, {"model": "default", "messages": messages})
    assert status == 200, body
    return body["input_tokens"]


def test_the_key_is_made_once_per_install_and_kept_owner_only(server):
    path = cache_root() / secret.KEY_FILE
    assert path.stat().st_size == secret.KEY_BYTES
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_blobs_minted_with_the_old_constant_keys_are_ignored(server):
    """The reasoning a client forges never reaches the prompt as the model's own; what
    this install sealed does."""
    secret.install(None, cache_root())  # the servers' key
    without = responses_prompt(server, None)
    forged = {"type": "reasoning", "summary": [], "encrypted_content": old_reasoning_blob(THOUGHT)}
    assert responses_prompt(server, forged) == without
    sealed = {**forged, "encrypted_content": REASONING.seal(THOUGHT)}
    assert responses_prompt(server, sealed) > without

    without = anthropic_prompt(server, None)
    minted = {"type": "thinking", "thinking": THOUGHT, "signature": old_signature(THOUGHT)}
    assert anthropic_prompt(server, minted) == without
    status, _, reply = server.post(
        "/v1/messages",
        {"model": "default", "max_tokens": 50, "messages": BY_NAME["think"].messages},
    )
    assert status == 200 and reply["content"][0]["type"] == "thinking", reply
    assert anthropic_prompt(server, reply["content"][0]) > without


def test_a_sealed_bomb_is_refused_with_memory_flat(server):
    """A blob with the right tag that inflates to 100 MB: inflating stops at the limit,
    the request is a 400 naming the field, and the server's memory stays where it was."""
    secret.install(None, cache_root())
    bomb = REASONING.seal("x" * (100 * 1024 * 1024))
    assert len(bomb) < 2 * 1024 * 1024
    process = psutil.Process(server.process.pid)
    before = process.memory_info().rss
    item = {"type": "reasoning", "summary": [], "encrypted_content": bomb}
    status, _, body = server.post(RESPONSES, {"input": [QUESTION, item, QUESTION]})
    assert status == 400, body
    assert body["error"]["param"] == "input[1].encrypted_content"
    assert str(UNSEALED_LIMIT) in body["error"]["message"]
    assert process.memory_info().rss - before < 64 * 1024 * 1024


def test_servers_sharing_a_secret_key_accept_each_others_blobs(launch, tiny_model):
    """--secret-key: servers behind one name take back each other's reasoning; a server
    with another key does not."""
    first = launch(tiny_model, "--secret-key", "shared words")
    second = launch(tiny_model, "--secret-key", "shared words")
    other = launch(tiny_model, "--secret-key", "other words")
    request = {
        "input": BY_NAME["think"].messages,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "max_output_tokens": 50,
    }
    status, _, reply = first.post(RESPONSES, request)
    assert status == 200, reply
    reasoning = next(item for item in reply["output"] if item["type"] == "reasoning")
    kept = {key: reasoning[key] for key in ("type", "summary", "encrypted_content")}
    assert responses_prompt(second, kept) > responses_prompt(second, None)
    assert responses_prompt(other, kept) == responses_prompt(other, None)
