"""The prompt cache: many prefixes reused at once, a byte budget, and a disk tier that
survives a restart. Reused prefixes never change an answer."""

from __future__ import annotations

import os
import resource
from collections.abc import Callable

import pytest
from conversations import BY_NAME, LONG_ANSWER
from helpers.chat import chat
from helpers.server import start_server

CHAT = "/v1/chat/completions"
SYSTEM = {"role": "system", "content": "You are a helpful assistant. " + LONG_ANSWER}


@pytest.fixture(scope="module")
def uncached(tiny_model):
    """The same model with no prompt cache: what every answer must equal."""
    srv = start_server(tiny_model, "--prompt-cache-size", "0")
    yield srv
    srv.stop()


def answer(body: dict) -> str:
    return body["choices"][0]["message"]["content"]


def cached(body: dict) -> int:
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


def next_turn(messages: list[dict], reply: dict, question: str) -> list[dict]:
    answer = reply["choices"][0]["message"]["content"]
    return [
        *messages,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": question},
    ]


def processed(body: dict) -> int:
    """Tokens the model saw for this request: the prompt and the reply."""
    return body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]


def test_two_alternating_conversations_are_both_reused(server, uncached):
    a = BY_NAME["story"].messages
    b = BY_NAME["count"].messages
    first_a = chat(server, a, max_tokens=60)
    first_b = chat(server, b)
    turn_a = next_turn(a, first_a, "Count to five.")
    turn_b = next_turn(b, first_b, "Tell me a story.")
    second_a = chat(server, turn_a, max_tokens=30)
    second_b = chat(server, turn_b, max_tokens=30)
    # Each second turn continues from its own first turn (all but the final reply token).
    assert cached(second_a) >= processed(first_a) - 1
    assert cached(second_b) >= processed(first_b) - 1
    assert answer(second_a) == answer(chat(uncached, turn_a, max_tokens=30))
    assert answer(second_b) == answer(chat(uncached, turn_b, max_tokens=30))


def test_a_shared_system_prompt_is_reused_by_other_conversations(server, uncached):
    one = chat(server, [SYSTEM, {"role": "user", "content": "What is the capital of France?"}])
    turn = [SYSTEM, {"role": "user", "content": "Count to five."}]
    other = chat(server, turn, max_tokens=10)
    system_tokens = one["usage"]["prompt_tokens"] - 20  # the system turn, roughly
    assert cached(one) < system_tokens <= cached(other) < other["usage"]["prompt_tokens"]
    assert answer(other) == answer(chat(uncached, turn, max_tokens=10))


def test_disk_tier_survives_a_restart(launch, tiny_model, tmp_path, uncached):
    folder = tmp_path / "prompt-cache"
    conv = BY_NAME["story"]
    first_server = launch(tiny_model, "--prompt-cache-dir", str(folder))
    first = chat(first_server, conv.messages)
    assert cached(first) == 0 and answer(first) == conv.reply
    first_server.stop()  # SIGTERM: what is in memory is written to disk
    assert len(list(folder.glob("*.safetensors"))) == 1

    restarted = launch(tiny_model, "--prompt-cache-dir", str(folder))
    turn = next_turn(conv.messages, first, "Count to five.")
    again = chat(restarted, turn, max_tokens=30)
    assert cached(again) >= processed(first) - 1
    assert answer(again) == answer(chat(uncached, turn, max_tokens=30))


def test_evicted_prefixes_come_back_from_disk(launch, tiny_model, tmp_path):
    folder = tmp_path / "prompt-cache"
    srv = launch(tiny_model, "--prompt-cache-size", "1", "--prompt-cache-dir", str(folder))
    a, b = BY_NAME["story"], BY_NAME["unicode"]
    chat(srv, a.messages)
    chat(srv, b.messages)  # evicts the story's prefix from memory, onto disk
    assert len(list(folder.glob("*.safetensors"))) == 1
    again = chat(srv, a.messages)
    assert cached(again) == again["usage"]["prompt_tokens"] - 1
    assert answer(again) == a.reply


def test_disk_tier_size_cap_and_damaged_files(launch, tiny_model, tmp_path):
    folder = tmp_path / "prompt-cache"
    folder.mkdir()
    (folder / "broken.safetensors").write_bytes(b"not a cache")
    srv = launch(
        tiny_model,
        "--prompt-cache-size",
        "1",
        "--prompt-cache-dir",
        str(folder),
        "--prompt-cache-disk-gb",
        "0.000001",  # about 1 KB: no cache file fits
    )
    conv = BY_NAME["story"]
    chat(srv, conv.messages)
    chat(srv, BY_NAME["count"].messages)
    assert [p.name for p in folder.glob("*.safetensors")] == ["broken.safetensors"]
    again = chat(srv, conv.messages)
    # Only the chat template's first tokens, shared with the count prompt still in memory.
    assert cached(again) < 5 and answer(again) == conv.reply


def file_size_limit(nbytes: int) -> Callable[[], None]:
    """A child-process limit on the size of any file it writes: a full disk, for one
    process (Python ignores SIGXFSZ, so the write fails with EFBIG)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))


def disk_health(srv) -> dict:
    status, _, body = srv.get("/health")
    assert status == 200 and body["status"] == "ok"
    return body["prompt_cache_disk"]


def test_a_full_disk_turns_the_tier_off_and_requests_go_on(launch, tiny_model, tmp_path):
    folder = tmp_path / "prompt-cache"
    srv = launch(
        tiny_model,
        *("--prompt-cache-size", "1", "--prompt-cache-dir", str(folder)),
        preexec=file_size_limit(64 * 1024),
    )
    assert disk_health(srv) == {"enabled": True, "error": None}
    a, b, c = BY_NAME["story"], BY_NAME["unicode"], BY_NAME["count"]
    for conv in (a, b, c, a, b):  # every second request evicts (and tries to save) one
        assert answer(chat(srv, conv.messages)) == conv.reply
    health = disk_health(srv)
    assert health["enabled"] is False and "could not write" in health["error"]
    assert list(folder.iterdir()) == []  # no .partial file left behind
    assert sum("disk tier turned off" in line for line in srv.log) == 1


def test_an_unwritable_folder_is_reported_from_the_start(launch, tiny_model, tmp_path):
    """The tier is probed at start: /health tells the truth before any write is tried,
    and a killed writer's unfinished file is swept away."""
    folder = tmp_path / "prompt-cache"
    folder.mkdir()
    leftover = folder / f"{'a' * 32}.partial.safetensors"
    leftover.write_bytes(b"half a cache")
    swept = launch(tiny_model, "--prompt-cache-dir", str(folder))
    assert disk_health(swept) == {"enabled": True, "error": None}
    assert not leftover.exists()
    full = launch(tiny_model, "--prompt-cache-dir", str(folder), preexec=file_size_limit(0))
    health = disk_health(full)
    assert health["enabled"] is False and "cannot use" in health["error"], health
    assert answer(chat(full, BY_NAME["story"].messages)) == BY_NAME["story"].reply


def test_a_folder_that_goes_away_turns_the_tier_off(launch, tiny_model, tmp_path):
    folder = tmp_path / "prompt-cache"
    srv = launch(tiny_model, "--prompt-cache-size", "1", "--prompt-cache-dir", str(folder))
    folder.rmdir()
    folder.write_text("not a folder any more")
    a, b = BY_NAME["story"], BY_NAME["unicode"]
    for conv in (a, b, a):
        assert answer(chat(srv, conv.messages)) == conv.reply
    assert disk_health(srv)["enabled"] is False


def test_a_fifo_in_the_folder_does_not_block_start_up(launch, tiny_model, tmp_path):
    folder = tmp_path / "prompt-cache"
    folder.mkdir()
    os.mkfifo(folder / f"{'0' * 32}.00000000.safetensors")
    srv = launch(tiny_model, "--prompt-cache-dir", str(folder))
    assert answer(chat(srv, BY_NAME["story"].messages)) == BY_NAME["story"].reply


def test_a_file_with_zeroed_data_is_a_miss(launch, tiny_model, tmp_path):
    folder = tmp_path / "prompt-cache"
    conv = BY_NAME["story"]
    first = launch(tiny_model, "--prompt-cache-dir", str(folder))
    chat(first, conv.messages)
    first.stop()
    [saved] = folder.glob("*.safetensors")
    data = bytearray(saved.read_bytes())
    data_start = 8 + int.from_bytes(data[:8], "little")  # safetensors: u64 header length
    data[data_start:] = bytes(len(data) - data_start)
    saved.write_bytes(data)

    restarted = launch(tiny_model, "--prompt-cache-dir", str(folder))
    again = chat(restarted, conv.messages)
    assert cached(again) == 0 and answer(again) == conv.reply
    assert any("checksum" in line for line in restarted.log)
