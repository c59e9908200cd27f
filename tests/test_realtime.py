"""The Realtime API (/v1/realtime) through the `openai` SDK's realtime client, as it ships:
one server with a chat model, the tool agent, the looper (a model that never stops),
Whisper and KittenTTS. Every event the server sends is checked against the SDK's own
models of the GA protocol, strictly (a missing field fails)."""

from __future__ import annotations

import base64
import json
import socket
import time

import numpy as np
import openai
import pytest
from audio_fixture import UTTERANCES, speak
from catalog import looper_model, tool_agent_model
from conversations import AGENT_REPLY, COMMAND, instruction
from helpers.server import start_server
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter
from websockets.exceptions import ConnectionClosed

from mlxserve.api.realtime.wire import DEFAULT_INSTRUCTIONS
from mlxserve.audio.codec import decode, pcm16_bytes, pcm16_samples

EVENTS = TypeAdapter(RealtimeServerEvent)
RATE = 24_000
TEXT_ONLY = {"type": "realtime", "output_modalities": ["text"]}
# Every session answers greedily and briefly (the beta's temperature, served), as
# chat_reply asks Chat Completions to: the same reply, and no answer runs on for minutes.
GREEDY = {"type": "realtime", "temperature": 0, "max_output_tokens": 100}
# The looper, writing until it is stopped: its whole context (4,096 tokens). "inf" is
# the server's --max-tokens (512), which the looper wrote in 0.16 s in a cold CI run on
# this machine, ending before the voice detector beside it heard the speech over it.
ENDLESS = {**TEXT_ONLY, "max_output_tokens": 4096}


@pytest.fixture(scope="module")
def server(tiny_model, whisper_model, kitten_model):
    models = [
        tiny_model,
        tool_agent_model(),
        looper_model("byte_level"),
        whisper_model,
        kitten_model,
    ]
    args = [arg for path in models[1:] for arg in ("--model", str(path))]
    srv = start_server(models[0], *args, "--trust-remote-code")
    yield srv
    srv.stop()


class Session:
    """A realtime connection whose events are read raw and validated strictly."""

    def __init__(self, connection):
        self.connection = connection
        self.seen: list[dict] = []

    def send(self, event: dict) -> None:
        self.connection.send(event)

    def next(self) -> dict:
        raw = self.connection.recv_bytes()
        EVENTS.validate_json(raw)  # the GA protocol's shape, required fields and all
        event = json.loads(raw)
        self.seen.append(event)
        return event

    def until(self, kind: str) -> list[dict]:
        """The events up to and including the first of `kind`."""
        events = []
        while True:
            events.append(self.next())
            if events[-1]["type"] == kind:
                return events

    def say(self, text: str) -> None:
        """A user's text item, added."""
        item = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        }
        self.send({"type": "conversation.item.create", "item": item})
        self.until("conversation.item.done")

    def append(self, samples: np.ndarray, piece: int = RATE // 10) -> None:
        for start in range(0, samples.size, piece):
            chunk = pcm16_bytes(samples[start : start + piece])
            self.send(
                {"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()}
            )


@pytest.fixture
def connect(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="none")
    opened = []

    def open_session(model):
        manager = client.realtime.connect(model=str(model))
        opened.append(manager)
        session = Session(manager.enter())
        assert session.next()["type"] == "session.created"
        session.send({"type": "session.update", "session": GREEDY})
        assert session.next()["type"] == "session.updated"
        return session

    yield open_session
    for manager in opened:
        manager.__exit__(None, None, None)


def looping(connect) -> Session:
    """A session on the looper, answering: it writes on until it is stopped."""
    session = connect(looper_model("byte_level"))
    session.send({"type": "session.update", "session": ENDLESS})
    session.next()
    session.say("Go.")
    session.send({"type": "response.create"})
    session.until("response.output_text.delta")
    return session


def spoken(text: str, lead_s: float = 0.5, tail_s: float = 1.0) -> np.ndarray:
    """`text` spoken by espeak-ng at 24 kHz, with silence before and after."""
    voice = decode(speak(text), RATE)
    return np.concatenate(
        [np.zeros(int(lead_s * RATE), np.float32), voice, np.zeros(int(tail_s * RATE), np.float32)]
    )


def chat_reply(server, model, messages, **fields) -> dict:
    status, _, body = server.post(
        "/v1/chat/completions",
        {"model": str(model), "messages": messages, "temperature": 0, "max_tokens": 100, **fields},
    )
    assert status == 200, body
    return body


def types(events: list[dict]) -> list[str]:
    return [e["type"] for e in events]


def test_a_voice_turn_heard_transcribed_answered_and_spoken(server, connect, tiny_model):
    """Server VAD: speech_started (with the 300 ms padding), speech_stopped, the commit,
    Whisper's transcript, then the answer the chat model gives that transcript over
    Chat Completions, as transcript deltas and 24 kHz pcm16 spoken sentence by sentence."""
    session = connect(tiny_model)
    session.send(
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"input": {"transcription": {"model": None}}}},
        }
    )
    updated = session.next()["session"]
    assert updated["output_modalities"] == ["audio"]
    assert updated["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    session.append(spoken(UTTERANCES[0]))
    events = session.until("response.done")
    started = next(e for e in events if e["type"] == "input_audio_buffer.speech_started")
    stopped = next(e for e in events if e["type"] == "input_audio_buffer.speech_stopped")
    assert 0 <= started["audio_start_ms"] <= 500 < stopped["audio_end_ms"]
    committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
    assert committed["item_id"] == started["item_id"] == stopped["item_id"]
    heard = next(
        e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"
    )
    assert heard["transcript"] == UTTERANCES[0]
    expected = chat_reply(
        server,
        tiny_model,
        [
            {"role": "system", "content": DEFAULT_INSTRUCTIONS},
            {"role": "user", "content": UTTERANCES[0]},
        ],
    )["choices"][0]["message"]["content"]
    deltas = [e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta"]
    assert "".join(deltas) == expected
    done = next(e for e in events if e["type"] == "response.output_audio_transcript.done")
    assert done["transcript"] == expected
    audio = b"".join(
        base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta"
    )
    assert len(audio) > RATE  # half a second and more of speech
    assert np.abs(pcm16_samples(audio)).max() > 0.01
    assert "response.output_text.delta" not in types(events)  # audio mode: transcripts only
    response = events[-1]["response"]
    assert response["status"] == "completed"
    assert response["output"][0]["content"] == [{"type": "output_audio", "transcript": expected}]
    assert response["usage"]["output_tokens"] > 0
    assert types(events).index("response.output_audio_transcript.delta") < types(events).index(
        "response.output_audio.done"
    )


def test_text_turns_continue_from_the_prompt_cache(server, connect, tiny_model):
    """Text in, text out: each answer is Chat Completions' for the same conversation, and
    the second turn's prompt continues from the first's cache."""
    session = connect(tiny_model)
    session.send({"type": "session.update", "session": {**TEXT_ONLY, "instructions": "Be brief."}})
    session.next()
    messages = [{"role": "system", "content": "Be brief."}]
    usage = None
    for words in UTTERANCES[1:3]:
        session.send(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": words}],
                },
            }
        )
        assert types([session.next(), session.next()]) == [
            "conversation.item.added",
            "conversation.item.done",
        ]
        session.send({"type": "response.create"})
        events = session.until("response.done")
        messages.append({"role": "user", "content": words})
        expected = chat_reply(server, tiny_model, messages)["choices"][0]["message"]["content"]
        text = next(e for e in events if e["type"] == "response.output_text.done")["text"]
        assert text == expected
        assert "response.output_audio.delta" not in types(events)
        messages.append({"role": "assistant", "content": expected})
        usage = events[-1]["response"]["usage"]
    assert usage["input_token_details"]["cached_tokens"] > 0


def test_a_function_call_round_trip(server, connect):
    """The tool agent calls the session's tool: a function_call item streamed as argument
    deltas; its output goes back as an item and the next response answers."""
    session = connect(tool_agent_model())
    tool = {
        "type": "function",
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    }
    session.send({"type": "session.update", "session": {**TEXT_ONLY, "tools": [tool]}})
    session.next()
    session.say(instruction("bash"))
    session.send({"type": "response.create"})
    events = session.until("response.done")
    call = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert call["name"] == "bash" and json.loads(call["arguments"]) == {"command": COMMAND}
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert "".join(deltas) == call["arguments"]
    [item] = events[-1]["response"]["output"]
    assert item["type"] == "function_call" and item["call_id"] == call["call_id"]
    session.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": call["call_id"], "output": "done"},
        }
    )
    session.until("conversation.item.done")
    session.send({"type": "response.create"})
    events = session.until("response.done")
    assert next(e for e in events if e["type"] == "response.output_text.done")["text"] == (
        AGENT_REPLY
    )


def test_push_to_talk_without_turn_detection(server, connect, tiny_model):
    """turn_detection null: no VAD events; the client commits, and asks for the answer."""
    session = connect(tiny_model)
    session.send(
        {
            "type": "session.update",
            "session": {**TEXT_ONLY, "audio": {"input": {"turn_detection": None}}},
        }
    )
    assert session.next()["session"]["audio"]["input"]["turn_detection"] is None
    session.send({"type": "input_audio_buffer.commit", "event_id": "evt_empty"})
    error = session.next()
    assert error["type"] == "error"
    assert error["error"]["code"] == "input_audio_buffer_commit_empty"
    assert error["error"]["event_id"] == "evt_empty"
    session.append(spoken(UTTERANCES[3]))
    session.send({"type": "input_audio_buffer.commit"})
    events = session.until("conversation.item.done")
    assert types(events) == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    session.send({"type": "response.create"})
    events = session.until("response.done")
    assert not any(t.startswith("input_audio_buffer.speech") for t in types(events))
    expected = chat_reply(
        server,
        tiny_model,
        [
            {"role": "system", "content": DEFAULT_INSTRUCTIONS},
            {"role": "user", "content": UTTERANCES[3]},
        ],
    )["choices"][0]["message"]["content"]
    assert next(e for e in events if e["type"] == "response.output_text.done")["text"] == expected


def test_speech_over_a_response_cancels_it(server, connect):
    """Barge-in: the looper writes on and on; the user's voice stops it (turn_detected),
    its item ends incomplete, and the new turn is answered. response.cancel stops one too."""
    session = looping(connect)
    session.append(spoken(UTTERANCES[2]))
    events = session.until("response.done")
    assert "input_audio_buffer.speech_started" in types(events)
    response = events[-1]["response"]
    assert response["status"] == "cancelled"
    assert response["status_details"]["reason"] == "turn_detected"
    assert response["output"][0]["status"] == "incomplete"
    events = session.until("response.created")  # the spoken turn's own response
    assert "input_audio_buffer.committed" in types(events)
    session.until("response.output_text.delta")
    session.send({"type": "response.cancel"})
    response = session.until("response.done")[-1]["response"]
    assert response["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    session.send({"type": "response.cancel", "event_id": "evt_late"})
    error = session.next()
    assert error["error"]["code"] == "response_cancel_not_active"


def test_truncation_keeps_what_was_heard(server, connect, tiny_model):
    """conversation.item.truncate cuts an answer's transcript to the sentences whose audio
    had begun; beyond its audio is an error."""
    session = connect(tiny_model)
    session.say(UTTERANCES[1])
    session.send({"type": "response.create"})
    events = session.until("response.done")
    item = events[-1]["response"]["output"][0]
    audio_ms = (
        sum(
            len(base64.b64decode(e["delta"])) // 2
            for e in events
            if e["type"] == "response.output_audio.delta"
        )
        * 1000
        // RATE
    )
    session.send(
        {
            "type": "conversation.item.truncate",
            "item_id": item["id"],
            "content_index": 0,
            "audio_end_ms": audio_ms + 1000,
        }
    )
    assert session.next()["error"]["param"] == "audio_end_ms"
    session.send(
        {
            "type": "conversation.item.truncate",
            "item_id": item["id"],
            "content_index": 0,
            "audio_end_ms": 0,
        }
    )
    assert session.next()["type"] == "conversation.item.truncated"
    session.send({"type": "conversation.item.retrieve", "item_id": item["id"]})
    retrieved = session.next()["item"]
    assert retrieved["content"] == [{"type": "output_audio", "transcript": ""}]


def test_mistakes_are_error_events_and_the_session_goes_on(server, connect, tiny_model):
    """Malformed JSON, unknown events and fields, bad audio, a missing item: each an
    `error` naming it; the session then still answers."""
    session = connect(tiny_model)
    raw = session.connection
    cases = [
        ("{not json", None, "invalid_json"),
        (json.dumps({"type": "session.dance"}), "type", "invalid_value"),
        (json.dumps({"type": "session.update", "session": {"voise": "x"}}), "session.voise", None),
        (
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "audio": {
                            "input": {"turn_detection": {"type": "server_vad", "threshold": 2}}
                        }
                    },
                }
            ),
            "session.audio.input.turn_detection.server_vad.threshold",
            None,
        ),
        (
            json.dumps(
                {
                    "type": "session.update",
                    "session": {"audio": {"input": {"format": {"type": "audio/pcmu"}}}},
                }
            ),
            "session.audio.input.format.type",
            None,
        ),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "%%%"}), "audio", None),
        (
            json.dumps(
                {"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()}
            ),
            "audio",
            None,
        ),
        (json.dumps({"type": "conversation.item.delete", "item_id": "nope"}), "item_id", None),
        (
            json.dumps({"type": "response.create", "response": {"output_modalities": ["video"]}}),
            "response.output_modalities[0]",
            None,
        ),
    ]
    for message, param, code in cases:
        raw._connection.send(message)  # as written, past the SDK's own checks
        error = session.next()
        assert error["type"] == "error", message
        assert error["error"]["type"] == "invalid_request_error"
        assert error["error"]["param"] == param, (message, error)
        if code:
            assert error["error"]["code"] == code
    session.send({"type": "session.update", "session": TEXT_ONLY})
    assert session.next()["type"] == "session.updated"


def test_an_unknown_model_is_an_error_then_a_close(server):
    """An error event naming the model, a close with 1008; the server goes on."""
    client = openai.OpenAI(base_url=server.base_url, api_key="none")
    with client.realtime.connect(model="no-such-model") as connection:
        error = json.loads(connection.recv_bytes())
        assert error["type"] == "error" and error["error"]["param"] == "model"
        with pytest.raises(ConnectionClosed) as closed:
            connection.recv_bytes()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    status, _, _ = server.post(
        "/v1/chat/completions", {"messages": [{"role": "user", "content": "Still here?"}]}
    )
    assert status == 200


def test_a_client_that_leaves_ends_its_response(server, connect):
    """The looper writes on until its client hangs up without a closing handshake: then
    its generation stops, and the server serves the next request."""
    session = looping(connect)
    assert running(server) == 1
    raw = session.connection._connection.socket
    raw.shutdown(socket.SHUT_RDWR)
    raw.close()
    deadline = time.monotonic() + 30
    while running(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running(server) == 0
    _, _, body = server.get("/v1/status")
    ended = next(r for r in body["recent"] if r["path"] == "/v1/realtime")
    assert 0 < ended["completion_tokens"] < 2000, ended  # alone, it fills its 4,096
    status, _, _ = server.post(
        "/v1/chat/completions", {"messages": [{"role": "user", "content": "Still here?"}]}
    )
    assert status == 200


def running(server) -> int:
    status, _, body = server.get("/v1/status")
    assert status == 200
    return body["requests"]["running"]


def test_the_settings_name_the_sessions_audio_models(launch, tiny_model, whisper_model):
    """--realtime-speech-model names the voice: here a model that cannot speak, which a
    response asking for audio is told, by name."""
    srv = launch(
        tiny_model, "--model", str(whisper_model), "--realtime-speech-model", str(whisper_model)
    )
    client = openai.OpenAI(base_url=srv.base_url, api_key="none")
    with client.realtime.connect(model=str(tiny_model)) as connection:
        session = Session(connection)
        created = session.next()["session"]
        assert created["output_modalities"] == ["audio"]
        session.send({"type": "response.create"})
        error = session.next()
        assert error["type"] == "error" and error["error"]["code"] == "model_not_speech"
        assert str(whisper_model) in error["error"]["message"]


def test_a_full_input_buffer_is_an_error_until_committed(launch, tiny_model, whisper_model):
    """Without turn detection the buffer holds what is appended up to --max-audio-bytes
    (as an upload): beyond it each append is refused, naming the limit; a commit empties
    it and appends go on."""
    srv = launch(tiny_model, "--model", str(whisper_model), "--max-audio-bytes", "96000")
    client = openai.OpenAI(base_url=srv.base_url, api_key="none")
    with client.realtime.connect(model=str(tiny_model)) as connection:
        session = Session(connection)
        session.next()
        session.send(
            {
                "type": "session.update",
                "session": {**TEXT_ONLY, "audio": {"input": {"turn_detection": None}}},
            }
        )
        session.next()
        session.append(np.zeros(2 * RATE, np.float32))  # 96,000 bytes: full
        session.append(np.zeros(RATE // 10, np.float32))
        error = session.next()
        assert error["type"] == "error"
        assert error["error"]["code"] == "input_audio_buffer_full", error
        session.send({"type": "input_audio_buffer.commit"})
        assert session.until("conversation.item.done")[0]["type"] == (
            "input_audio_buffer.committed"
        )
        session.append(np.zeros(RATE // 10, np.float32))
        session.send({"type": "input_audio_buffer.clear"})
        assert session.next()["type"] == "input_audio_buffer.cleared"
