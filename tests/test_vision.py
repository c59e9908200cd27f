"""Vision models end to end: images as data URIs, URLs and files; limits and errors; the
text features on a vision model; the prompt cache with images; hot-swap text <-> vision."""

from __future__ import annotations

import io
import json
import random
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest
from conversations import (
    BY_NAME,
    COLOURS,
    VISION_CONVERSATIONS,
    colour_question,
    data_uri,
    image_part,
    square_png,
)
from helpers.errors import assert_error
from helpers.server import start_server
from helpers.sse import open_stream, stream
from PIL import Image
from transformers import AutoTokenizer

CHAT = "/v1/chat/completions"
VISION = {conv.name: conv for conv in VISION_CONVERSATIONS}
SMALL_PROMPT_TOKENS = 21  # a 56x56 square (4 image tokens) and the question


# A byte every 50 ms: each read waits far less than the fetch timeout, the whole square
# takes several seconds.
TRICKLE_SECONDS = 0.05


def noise_png(size: int) -> bytes:
    """A PNG that does not compress: larger than the server's 4096-byte image limit."""
    rng = random.Random(0)
    image = Image.frombytes(
        "RGB", (size, size), bytes(rng.randrange(256) for _ in range(size * size * 3))
    )
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


class _Images(BaseHTTPRequestHandler):
    """Serves the squares, a redirect, a redirect loop, a text file, a large image, a 404."""

    def do_GET(self) -> None:
        name = self.path.strip("/")
        if name.removesuffix(".png") in COLOURS:
            self._send(200, square_png(name.removesuffix(".png")), "image/png")
        elif name.startswith("moved/"):
            self._redirect("/" + name.removeprefix("moved/"))
        elif name == "loop":
            self._redirect("/loop")
        elif name == "to-ftp":
            self._redirect("ftp://127.0.0.1:9/red.png")
        elif name == "to-file":
            self._redirect("file:///etc/hostname")
        elif name == "text":
            self._send(200, b"hello, not an image", "text/plain")
        elif name == "big.png":
            self._send(200, noise_png(64), "image/png")
        elif name == "slow.png":
            self._trickle(square_png("red"), TRICKLE_SECONDS)
        elif name == "slow-headers.png":
            self._trickle_head(TRICKLE_SECONDS * 10)
        elif name == "to-metadata":
            self._redirect("http://169.254.169.254/latest/meta-data/")
        else:
            self._send(404, b"no such file", "text/plain")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _trickle(self, body: bytes, seconds_per_byte: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        for i in range(len(body)):
            self.wfile.write(body[i : i + 1])
            self.wfile.flush()
            time.sleep(seconds_per_byte)

    def _trickle_head(self, seconds_per_byte: float) -> None:
        """Response headers a byte at a time: never silent for long, never finished."""
        for byte in b"HTTP/1.1 200 OK\r\nX-Padding: " + b"a" * 1000:
            try:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
            except OSError:
                return
            time.sleep(seconds_per_byte)

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def image_host() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def ask(server, url: str, **extra):
    return server.post(CHAT, {"messages": colour_question(url), "max_tokens": 10, **extra})


def answer(response) -> str:
    status, _, body = response
    assert status == 200, body
    return body["choices"][0]["message"]["content"]


@pytest.mark.parametrize("colour", COLOURS)
def test_each_colour_as_data_uri(vision, colour):
    status, _, body = ask(vision, data_uri(square_png(colour)))
    assert status == 200
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": f"{colour.capitalize()}."}
    assert choice["finish_reason"] == "stop"
    assert body["usage"]["prompt_tokens"] == SMALL_PROMPT_TOKENS
    assert body["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("colour", COLOURS)
def test_each_colour_by_url_and_redirect(vision, image_host, colour):
    assert answer(ask(vision, f"{image_host}/{colour}.png")) == f"{colour.capitalize()}."
    assert answer(ask(vision, f"{image_host}/moved/{colour}.png")) == f"{colour.capitalize()}."


@pytest.mark.parametrize("colour", COLOURS)
def test_each_colour_from_an_allowed_file(vision, image_dir, colour):
    path = image_dir / f"{colour}.png"
    assert answer(ask(vision, str(path))) == f"{colour.capitalize()}."
    assert answer(ask(vision, path.as_uri())) == f"{colour.capitalize()}."


def test_openai_client_with_image_parts(vision):
    client = openai.OpenAI(base_url=vision.base_url, api_key="unused")
    completion = client.chat.completions.create(
        model="default",
        messages=colour_question(data_uri(square_png("green", 112))),
        max_tokens=10,
    )
    assert completion.choices[0].message.content == "Green."
    assert completion.usage.prompt_tokens == SMALL_PROMPT_TOKENS + 12  # 16 image tokens, not 4
    chunks = list(
        client.chat.completions.create(
            model="default",
            messages=colour_question(data_uri(square_png("blue"))),
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Blue."
    assert chunks[-1].usage.prompt_tokens == SMALL_PROMPT_TOKENS


@pytest.mark.parametrize("conv", VISION_CONVERSATIONS, ids=lambda c: c.name)
def test_streamed_equals_non_streamed(vision, conv):
    body = {"messages": conv.messages, "max_tokens": 20}
    status, _, whole = vision.post(CHAT, body)
    streamed = stream(
        vision.url, CHAT, {**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert status == 200 and streamed.status == 200
    assert whole["choices"][0]["message"]["content"] == conv.reply
    chunks = streamed.chunks
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == conv.reply
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]
    assert chunks[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]
    assert streamed.data[-1] == "[DONE]"


def test_several_images_and_images_in_earlier_turns(vision):
    assert (
        answer(vision.post(CHAT, {"messages": VISION["two-squares"].messages})) == "Red and blue."
    )
    for colour in COLOURS:
        messages = VISION[f"{colour}-again"].messages
        assert answer(vision.post(CHAT, {"messages": messages})) == f"{colour.capitalize()} again."


def test_text_only_request_to_a_vision_model(vision):
    assert (
        answer(vision.post(CHAT, {"messages": VISION["hello"].messages})) == VISION["hello"].reply
    )
    status, _, body = vision.post(
        "/v1/completions",
        {
            "prompt": "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n",
            "max_tokens": 20,
        },
    )
    assert status == 200 and body["choices"][0]["text"] == VISION["hello"].reply


def test_prompt_cache_reuses_only_what_matches_the_images(vision, vision_model):
    """A cache built on other images is never continued: a blue square after a red one
    reuses only the text before the image; the same image again reuses the whole prompt.
    (57-pixel squares: bytes no other test sends, so the cache has not seen them.)"""
    tokenizer = AutoTokenizer.from_pretrained(vision_model)
    before_image = len(tokenizer.encode("<|im_start|>user\n<|vision_start|>"))
    red = ask(vision, data_uri(square_png("red", 57)))[2]
    blue = ask(vision, data_uri(square_png("blue", 57)))[2]
    assert red["choices"][0]["message"]["content"] == "Red."
    assert blue["choices"][0]["message"]["content"] == "Blue."
    assert blue["usage"]["prompt_tokens_details"]["cached_tokens"] == before_image
    again = ask(vision, data_uri(square_png("blue", 57)))[2]
    assert again["choices"][0]["message"]["content"] == "Blue."
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == SMALL_PROMPT_TOKENS - 1


def test_a_follow_up_turn_continues_the_cached_image_turn(vision):
    first = colour_question(data_uri(square_png("green")))
    assert answer(vision.post(CHAT, {"messages": first})) == "Green."
    _, _, follow_up = vision.post(CHAT, {"messages": VISION["green-again"].messages})
    assert follow_up["choices"][0]["message"]["content"] == "Green again."
    # The first turn and its reply come from the cache: image tokens included.
    assert follow_up["usage"]["prompt_tokens_details"]["cached_tokens"] > SMALL_PROMPT_TOKENS


def test_stops_limits_logprobs_and_seeded_sampling(vision):
    url = data_uri(square_png("green"))
    turns = VISION["green-again"].messages
    status, _, body = vision.post(CHAT, {"messages": turns, "stop": [" again"]})
    assert status == 200
    assert body["choices"][0]["message"]["content"] == "Green"
    assert body["choices"][0]["finish_reason"] == "stop"
    status, _, body = ask(vision, url, max_tokens=1)
    assert status == 200
    assert body["choices"][0]["message"]["content"] == "Green"
    assert body["choices"][0]["finish_reason"] == "length"
    _, _, body = ask(vision, url, logprobs=True, top_logprobs=2)
    entries = body["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in entries] == ["Green", "."]
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in entries)
    sampled = [answer(ask(vision, url, temperature=1.5, seed=7, max_tokens=8)) for _ in range(2)]
    assert sampled[0] == sampled[1]


def test_disconnect_cancels_a_vision_generation(vision, vision_model):
    tokenizer = AutoTokenizer.from_pretrained(vision_model)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    body = {
        "messages": colour_question(data_uri(square_png("red"))),
        "logit_bias": {str(end): -100},
        "max_tokens": 4000,  # all the 4,096-token context leaves
        "stream": True,
    }
    conn, response = open_stream(vision.url, CHAT, body)
    assert response.status == 200
    for _ in range(5):
        response.fp.readline()
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    # 4,000 tokens take most of a minute: the model is free for the next answer at once.
    assert answer(ask(vision, data_uri(square_png("blue")))) == "Blue."
    assert any("client closed the connection" in line for line in vision.log)


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("/etc/hostname", "image_path_not_allowed"),
        ("file:///etc/passwd", "image_path_not_allowed"),
        ("/tmp/red\u0000.png", "invalid_image"),
        ("data:text/plain;base64,aGVsbG8=", "invalid_image"),
        ("data:image/png;base64,!!!not-base64!!!", "invalid_image"),
        ("data:image/png,rawbytes", "invalid_image"),
        (data_uri(noise_png(64)), "image_too_large"),
        ("http://127.0.0.1:9/red.png", "image_unreachable"),
        ("ftp://example.com/red.png", "invalid_image"),
        ("", "invalid_image"),
    ],
)
def test_bad_images_are_400_naming_the_part(vision, url, code):
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Look:"}, image_part(url)],
        }
    ]
    assert_error(
        vision.post(CHAT, {"messages": messages}), 400, param="messages[0].content[1]", code=code
    )


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("text", "invalid_image"),
        ("big.png", "image_too_large"),
        ("missing.png", "image_unreachable"),
        ("loop", "image_unreachable"),
    ],
)
def test_bad_image_urls_are_400(vision, image_host, path, code):
    assert_error(
        ask(vision, f"{image_host}/{path}"), 400, param="messages[0].content[0]", code=code
    )


def test_a_redirect_is_followed_only_to_http(vision, image_host):
    """A redirect may not reach a scheme that a URL in the request may not name."""
    response = ask(vision, f"{image_host}/to-ftp")
    assert_error(response, 400, param="messages[0].content[0]", code="image_url_not_allowed")
    assert "a redirect to a ftp: URL" in response[2]["error"]["message"]
    response = ask(vision, f"{image_host}/to-file")
    assert_error(response, 400, param="messages[0].content[0]", code="image_url_not_allowed")


@pytest.fixture(scope="module")
def quick_fetch(vision_model) -> Iterator:
    """A vision server with a one-second image fetch timeout and the default byte limit."""
    srv = start_server(vision_model, "--image-fetch-timeout", "1", "--allow-local-image-urls")
    yield srv
    srv.stop()


def test_the_fetch_timeout_bounds_the_whole_fetch(quick_fetch, image_host):
    """A server trickling its image (each read well inside the timeout) is cut off."""
    assert len(square_png("red")) * TRICKLE_SECONDS > 3  # far beyond the 1 s timeout
    response = ask(quick_fetch, f"{image_host}/slow.png")
    assert_error(response, 400, param="messages[0].content[0]", code="image_unreachable")
    assert "longer than --image-fetch-timeout" in response[2]["error"]["message"]


def test_the_fetch_timeout_covers_trickled_headers(quick_fetch, image_host):
    """Headers a byte every half second: the fetch ends at its deadline, not never."""
    started = time.monotonic()
    response = ask(quick_fetch, f"{image_host}/slow-headers.png")
    assert_error(response, 400, param="messages[0].content[0]", code="image_unreachable")
    assert "longer than --image-fetch-timeout" in response[2]["error"]["message"]
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",  # the metadata service, by address
        "http://2852039166/latest/meta-data/",  # the same as a decimal integer
        "http://[::ffff:169.254.169.254]/latest/meta-data/",  # as IPv4-mapped IPv6
        "http://[fe80::1]/",  # IPv6 link-local
        "http://0.0.0.0/red.png",
    ],
)
def test_link_local_and_metadata_addresses_are_never_fetched(quick_fetch, url):
    """Refused before connecting (the message says why, not that the network failed),
    even on a server that allows local image URLs."""
    response = ask(quick_fetch, url)
    assert_error(response, 400, param="messages[0].content[0]", code="image_url_not_allowed")
    assert (
        "never fetched" in response[2]["error"]["message"]
        or "not an address" in (response[2]["error"]["message"])
    )


def test_a_redirect_to_the_metadata_service_is_refused(quick_fetch, image_host):
    response = ask(quick_fetch, f"{image_host}/to-metadata")
    assert_error(response, 400, param="messages[0].content[0]", code="image_url_not_allowed")
    assert "169.254.169.254" in response[2]["error"]["message"]


def test_local_image_urls_are_refused_by_default(launch, vision_model, image_host):
    srv = launch(vision_model)
    for url in (f"{image_host}/red.png", "http://localhost:9/red.png", "http://10.0.0.1/x.png"):
        response = ask(srv, url)
        assert_error(response, 400, param="messages[0].content[0]", code="image_url_not_allowed")
        assert "--allow-local-image-urls" in response[2]["error"]["message"]


def test_a_decompression_bomb_is_refused_before_decoding(quick_fetch):
    """100 megapixels in 12 KB of PNG: refused from its header, never decoded."""
    buffer = io.BytesIO()
    Image.new("1", (10_000, 10_000)).save(buffer, format="PNG")
    assert len(buffer.getvalue()) < 20_000
    response = ask(quick_fetch, data_uri(buffer.getvalue()))
    assert_error(response, 400, param="messages[0].content[0]", code="image_too_large")
    assert "10000x10000 pixels" in response[2]["error"]["message"]


def test_images_outside_user_turns_are_refused(vision):
    messages = [
        {"role": "system", "content": [image_part(data_uri(square_png("red")))]},
        {"role": "user", "content": "Hi"},
    ]
    assert_error(vision.post(CHAT, {"messages": messages}), 400, param="messages[0].content[0]")
    status, _, _ = vision.get("/health")
    assert status == 200


def test_large_images_are_downscaled(launch, vision_model):
    """--max-image-pixels shrinks a 112x112 square to 56x56: 4 image tokens instead of 16."""
    srv = launch(vision_model, "--max-image-pixels", str(56 * 56))
    _, _, body = ask(srv, data_uri(square_png("red", 112)))
    assert body["choices"][0]["message"]["content"] == "Red."
    assert body["usage"]["prompt_tokens"] == SMALL_PROMPT_TOKENS


def test_text_vision_text(launch, tiny_model, vision_model):
    """One server: the text model, then the vision model by name (loaded beside it), then
    text again."""
    srv = launch(tiny_model, "--model-dir", str(vision_model.parent))
    listed = {m["id"]: m for m in srv.get("/v1/models")[2]["data"]}
    # Qwen2-VL's config names a video placeholder and its processor reads video
    assert listed[vision_model.name]["input_modalities"] == ["text", "image", "video"]
    assert listed[str(tiny_model)]["input_modalities"] == ["text"]
    capital = BY_NAME["capital"]
    image = data_uri(square_png("blue"))
    text_request = {"messages": capital.messages}
    assert answer(srv.post(CHAT, text_request)) == capital.reply
    refused = srv.post(CHAT, {"messages": colour_question(image)})
    assert_error(refused, 400, param="messages[0].content[0]", code="images_not_supported")
    vision_request = {"model": vision_model.name, "messages": colour_question(image)}
    assert answer(srv.post(CHAT, vision_request)) == "Blue."
    assert answer(srv.post(CHAT, text_request)) == capital.reply
    assert answer(srv.post(CHAT, vision_request)) == "Blue."
    loads = [line for line in srv.log if "Loading model from" in line]
    assert [line.split("(")[-1].split(",")[0] for line in loads] == ["chat", "vision"]
    assert all("peak memory" in line for line in srv.log if "Loaded " in line)


def test_models_lists_image_and_video_input(vision, vision_model):
    _, _, body = vision.get("/v1/models")
    assert body["data"][0]["id"] == str(vision_model)
    assert body["data"][0]["input_modalities"] == ["text", "image", "video"]  # Qwen2-VL's
    assert body["data"][0]["kind"] == "vision"
    assert body["data"][0]["capabilities"] == {"tools": True, "reasoning": False}


def test_forced_tool_call_on_a_vision_model(vision):
    """Tools, constrained decoding and the tool-call parser run on the vision path too."""
    tool = {
        "type": "function",
        "function": {
            "name": "paint",
            "parameters": {
                "type": "object",
                "properties": {"colour": {"enum": list(COLOURS)}},
                "required": ["colour"],
            },
        },
    }
    body = {
        "messages": colour_question(data_uri(square_png("red"))),
        "tools": [tool],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 60,
    }
    status, _, response = vision.post(CHAT, body)
    assert status == 200, response
    choice = response["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "paint"
    assert json.loads(call["function"]["arguments"])["colour"] in COLOURS
    assert "tool_code" not in (choice["message"]["content"] or "")


def test_chat_template_kept_beside_the_processor(launch, vision_model, tmp_path):
    """Many vision repos ship the template as chat_template.json, not in the tokenizer."""
    folder = tmp_path / "template-apart"
    shutil.copytree(vision_model, folder)
    template = (folder / "chat_template.jinja").read_text()
    (folder / "chat_template.jinja").unlink()
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    srv = launch(folder)
    assert answer(ask(srv, data_uri(square_png("red")))) == "Red."
