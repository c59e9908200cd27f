"""The web app at `/` in a real browser: Playwright drives a headless chromium (Debian's
on Linux, installed by `make test`) against one server with the API key on, serving the
chat fixture (which reasons on some questions) and the vision fixture (which names a
square's colour). A failed test leaves a screenshot in test-screenshots/."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import openai
import pytest
from audio_fixture import UTTERANCES, speak
from conversations import (
    AUDIO_QUESTION,
    COLOUR_QUESTION,
    VIDEO_QUESTION,
    colour_clip,
    square_png,
    tone_wav,
    video_reply,
)
from helpers.server import start_server
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from mlxserve.api.realtime.wire import DEFAULT_INSTRUCTIONS
from mlxserve.audio.codec import decode, encode
from mlxserve.keys.records import KeyRecord
from mlxserve.keys.store import KeyStore

KEY = "sk-webapp-test"
SCREENSHOTS = Path(__file__).parent.parent / "test-screenshots"
ANSWER_SECONDS = 60_000  # ms: a reply on the CPU, a model load


@pytest.fixture(scope="module")
def app(tiny_model, vision_model, z_image_model, qwen25_vl_model, gemma4_audio_model):
    models = ("--model", str(vision_model), "--model", str(z_image_model))
    models += ("--model", str(qwen25_vl_model), "--model", str(gemma4_audio_model))
    srv = start_server(tiny_model, *models, "--api-key", KEY)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    """Playwright's driver (Node) and the browser it starts, without the OpenBLAS that
    `make test` preloads for MLX: in them it breaks thread creation."""
    preload = os.environ.pop("LD_PRELOAD", None)
    try:
        driver = sync_playwright().start()
    finally:
        if preload is not None:
            os.environ["LD_PRELOAD"] = preload
    yield driver
    driver.stop()


@pytest.fixture(scope="module")
def browser(playwright) -> Iterator[Browser]:
    system = shutil.which("chromium")  # Debian's; elsewhere Playwright's own
    launched = playwright.chromium.launch(executable_path=system, args=["--no-sandbox"])
    yield launched
    launched.close()


@pytest.fixture
def page(browser, request) -> Iterator[Page]:
    """A fresh browser context (nothing stored: no key yet); a screenshot if the test fails."""
    context = browser.new_context()
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        SCREENSHOTS.mkdir(exist_ok=True)
        opened.screenshot(path=str(SCREENSHOTS / f"{request.node.name}.png"), full_page=True)
    context.close()
    assert errors == [], errors  # the page's own scripts never throw


def sign_in(page: Page, app, key: str = KEY) -> None:
    page.goto(app.url + "/")
    expect(page.locator("#key-form")).to_be_visible()  # the status call was refused
    page.fill("#key-input", key)
    page.click("#key-form button[type=submit]")


def chat(page: Page, model: Path, text: str) -> None:
    page.select_option("#model-select", str(model))
    page.click("#settings summary")
    page.fill("#temperature", "0")
    page.fill("#prompt", text)
    page.click("#send")
    expect(page.locator(".message.assistant .stats")).to_contain_text(
        "tok/s", timeout=ANSWER_SECONDS
    )


def test_the_page_is_served_without_the_key_and_its_api_calls_are_not(app):
    status, headers, body = app.get("/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert "<title>mlxserve</title>" in body
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    assert app.get("/app/app.js")[0] == 200
    assert app.get("/v1/status")[0] == 401
    assert app.get("/app/../server.py")[0] == 404


def test_a_message_streams_its_answer(page, app, tiny_model):
    sign_in(page, app)
    chat(page, tiny_model, "Hello!")
    _, _, reply = app.post(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hello!"}], "temperature": 0},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    expected = reply["choices"][0]["message"]["content"]
    expect(page.locator(".message.assistant .content")).to_have_text(expected)
    stats = page.inner_text(".message.assistant .stats")
    assert "TTFT" in stats and "prompt cache" in stats, stats


def test_reasoning_is_collapsed_and_expands(page, app, tiny_model):
    sign_in(page, app)
    chat(page, tiny_model, "What is two plus two?")
    expect(page.locator(".message.assistant .content")).to_have_text("The answer is 4.")
    thought = page.locator(".message.assistant .reasoning-text")
    expect(thought).to_be_hidden()
    page.click(".message.assistant .reasoning summary")
    expect(thought).to_be_visible()
    expect(thought).to_have_text("Two plus two makes four.")


def test_an_attached_image_gets_its_colour(page, app, vision_model, tmp_path):
    image = tmp_path / "square.png"
    image.write_bytes(square_png("blue"))
    sign_in(page, app)
    page.select_option("#model-select", str(vision_model))
    expect(page.locator("#attach-label")).to_be_visible()
    page.set_input_files("#attach", str(image))
    expect(page.locator("#attachments img")).to_have_count(1)
    chat(page, vision_model, COLOUR_QUESTION)
    expect(page.locator(".message.assistant .content")).to_have_text("Blue.")


def test_an_attached_video_and_audio_clip_are_answered(
    page, app, qwen25_vl_model, gemma4_audio_model, tmp_path
):
    """A model that reads video takes a video file, one that hears audio a WAV (each
    offered only what it takes), shown with a player in the conversation."""
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(colour_clip("red", "blue"))
    tone = tmp_path / "tone.wav"
    tone.write_bytes(tone_wav("high"))
    sign_in(page, app)
    page.select_option("#model-select", str(qwen25_vl_model))
    expect(page.locator("#attach-label")).to_have_text("Attach")
    assert page.get_attribute("#attach", "accept") == "image/*,video/*"
    expect(page.locator("#record")).to_be_hidden()
    page.set_input_files("#attach", str(clip))
    expect(page.locator("#attachments video")).to_have_count(1)
    chat(page, qwen25_vl_model, VIDEO_QUESTION)
    expect(page.locator(".message.assistant .content")).to_have_text(video_reply("red", "blue"))
    expect(page.locator(".message.user video")).to_have_count(1)
    page.click("#new-chat")
    page.select_option("#model-select", str(gemma4_audio_model))
    assert page.get_attribute("#attach", "accept") == "image/*,audio/*"
    expect(page.locator("#record")).to_be_visible()
    page.set_input_files("#attach", str(tone))
    expect(page.locator("#attachments audio")).to_have_count(1)
    page.fill("#prompt", AUDIO_QUESTION)  # the settings (temperature 0) stay as they were
    page.click("#send")
    expect(page.locator(".message.assistant .content")).to_have_text("A high tone.")
    expect(page.locator(".message.user audio")).to_have_count(1)


def test_a_recorded_voice_note_is_heard(playwright, launch, gemma4_audio_model, tmp_path):
    """Record, in a chromium whose microphone plays a low tone, then Stop recording: the
    voice note (Opus in WebM, as Chromium records) is attached and the model names the
    tone it hears."""
    srv = launch(gemma4_audio_model, "--api-key", KEY)
    microphone = tmp_path / "microphone.wav"
    microphone.write_bytes(tone_wav("low", 3.0))
    with hearing(playwright, microphone) as page:
        sign_in(page, srv)
        page.select_option("#model-select", str(gemma4_audio_model))
        page.click("#record")
        expect(page.locator("#record")).to_have_text("Stop recording")
        page.wait_for_timeout(1500)
        page.click("#record")
        expect(page.locator("#attachments audio")).to_have_count(1)
        chat(page, gemma4_audio_model, AUDIO_QUESTION)
        expect(page.locator(".message.assistant .content")).to_have_text("A low tone.")


@contextmanager
def hearing(playwright, microphone: Path) -> Iterator[Page]:
    """A page of a chromium whose microphone plays `microphone` (a WAV file) once, the
    page allowed to use it; its scripts never throw."""
    args = [
        "--no-sandbox",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={microphone}%noloop",
    ]
    browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=args)
    try:
        context = browser.new_context(permissions=["microphone"])
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        yield page
        assert errors == [], errors
    finally:
        browser.close()


def test_a_text_model_offers_no_attachment(page, app, tiny_model):
    sign_in(page, app)
    page.select_option("#model-select", str(tiny_model))
    expect(page.locator("#attach-label")).to_be_hidden()


def test_an_image_model_draws_in_the_chat(page, app, z_image_model):
    """An image model in the picker: a message is a prompt to draw, answered with the
    image inline (partial images first), no attachment offered."""
    sign_in(page, app)
    page.select_option("#model-select", str(z_image_model))
    expect(page.locator("#attach-label")).to_be_hidden()
    page.click("#settings summary")
    page.fill("#image-size", "128x64")
    page.fill("#prompt", "a red boat")
    page.click("#send")
    drawn = page.locator(".message.assistant img.drawn:not(.partial)")
    expect(drawn).to_be_visible(timeout=ANSWER_SECONDS)
    expect(page.locator(".message.assistant .stats")).to_contain_text("128x64")
    assert drawn.evaluate("img => [img.naturalWidth, img.naturalHeight]") == [128, 64]
    assert drawn.get_attribute("src").startswith("data:image/png;base64,iVBORw0KGgo")
    expect(page.locator(".message.user")).to_have_text("a red boat")


def test_unload_and_reload_from_the_models_page(page, app, vision_model):
    sign_in(page, app)
    page.click("button[data-page=models]")
    row = page.locator(f'#models-table tr[data-model="{vision_model}"]')
    expect(row.locator(".state")).to_contain_text("yes")
    row.locator("button[data-action=unload]").click()
    expect(row.locator(".state")).to_have_text("no", timeout=ANSWER_SECONDS)
    _, _, entry = app.get(f"/v1/models/{vision_model}", {"Authorization": f"Bearer {KEY}"})
    assert entry["state"] == "not-loaded"
    row.locator("button[data-action=load]").click()
    expect(row.locator(".state")).to_contain_text("yes", timeout=ANSWER_SECONDS)
    row.locator("button[data-action=pin]").click()
    expect(row.locator(".pinned")).to_have_text("yes")
    row.locator("button[data-action=unpin]").click()
    expect(row.locator(".pinned")).to_have_text("no")
    expect(page.locator("#memory-legend")).to_contain_text("weights")
    # the same figure as the start-up screen's (one byte formatter, a GB of 2**30 bytes)
    screen = next(line for line in app.log if line.startswith("  Memory    budget "))
    budget = screen.removeprefix("  Memory    budget ").strip()
    expect(page.locator("#memory-legend")).to_contain_text(f"budget {budget}")


def test_an_adapter_served_from_the_models_page_answers_in_the_chat(page, app, adapters):
    """The Models page's form serves an adapter; the picker offers it and it answers as it
    was trained to; Remove stops serving it."""
    sign_in(page, app)
    page.click("button[data-page=models]")
    page.fill("#adapter-name", "terse")
    page.fill("#adapter-path", str(adapters / "terse"))
    page.click("#adapter-form button[type=submit]")
    row = page.locator('#models-table tr[data-model="terse"]')
    expect(row).to_contain_text("adapter on", timeout=ANSWER_SECONDS)
    expect(row.locator(".state")).to_contain_text("yes")
    page.click("button[data-page=chat]")
    chat(page, Path("terse"), "What is the capital of France?")
    expect(page.locator(".message.assistant .content")).to_have_text("Paris.")
    page.click("button[data-page=models]")
    row.locator("button[data-action=remove]").click()
    expect(row).to_have_count(0, timeout=ANSWER_SECONDS)
    expect(page.locator('#model-select option[value="terse"]')).to_have_count(0)


def test_a_server_anyone_can_reach_says_so_on_every_page(page, launch, tiny_model):
    exposed = launch(tiny_model, "--host", "0.0.0.0")
    page.goto(exposed.url.replace("0.0.0.0", "127.0.0.1") + "/")
    expect(page.locator("#banner")).to_contain_text("without an API key")
    page.click("button[data-page=models]")
    expect(page.locator("#banner")).to_contain_text("bind to 127.0.0.1")


def test_the_status_page_lists_recent_requests(page, app, tiny_model):
    sign_in(page, app)
    chat(page, tiny_model, "Hello!")
    page.click("button[data-page=status]")
    row = page.locator("#recent-table tbody tr").first
    expect(row).to_contain_text("/v1/chat/completions")
    expect(row).to_contain_text("req_")
    expect(page.locator("#running")).to_have_text("0")


def test_the_status_page_lists_batches_and_files_with_progress(page, launch, tiny_model, tmp_path):
    srv = launch(tiny_model, "--batch-db", str(tmp_path / "batches.sqlite"))
    sdk = openai.OpenAI(base_url=srv.base_url, api_key="x")
    line = {
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    }
    data = b"".join(json.dumps({**line, "custom_id": f"c{i}"}).encode() + b"\n" for i in range(3))
    uploaded = sdk.files.create(file=("night.jsonl", data), purpose="batch")
    batch = sdk.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    page.goto(srv.url + "/")
    page.click("button[data-page=status]")
    row = page.locator("#batches-table tbody tr").first
    expect(row).to_contain_text(batch.id)
    expect(row).to_contain_text("completed")  # the page refreshes while it runs
    expect(row).to_contain_text("3 / 3")
    expect(row.locator("progress")).to_have_attribute("value", "3")
    files = page.locator("#files-table tbody")
    expect(files).to_contain_text("night.jsonl")
    expect(files).to_contain_text(f"{batch.id}_output.jsonl")
    expect(page.locator("#batches-note")).to_be_hidden()


def test_a_wrong_key_shows_an_error_not_a_blank_page(page, app):
    sign_in(page, app, key="sk-wrong")
    expect(page.locator("#banner")).to_contain_text("Invalid or missing API key")
    expect(page.locator("#key-form")).to_be_visible()
    page.fill("#prompt", "Hello!")
    page.click("#send")
    expect(page.locator(".message.assistant.error")).to_contain_text("Invalid or missing API key")


def test_the_status_page_shows_a_keys_usage_and_only_its_own(page, launch, tiny_model, tmp_path):
    db = tmp_path / "keys.sqlite"
    store = KeyStore(db)
    mine = store.create(KeyRecord("mine", "", None))
    other = store.create(KeyRecord("other", "", None))
    store.close()
    srv = launch(tiny_model, "--keys-db", str(db))
    for key in (mine, other):
        sdk = openai.OpenAI(base_url=srv.base_url, api_key=key)
        sdk.chat.completions.create(
            model=str(tiny_model), messages=[{"role": "user", "content": "Hi"}], max_tokens=3
        )
    sign_in(page, srv, key=mine)
    page.click("button[data-page=status]")
    rows = page.locator("#usage-table tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("mine")
    expect(rows.first.locator("td").nth(2)).to_have_text("1")  # one request
    expect(page.locator("#usage-note")).to_be_hidden()
    expect(page.locator("#recent-table tbody tr")).to_have_count(1)  # not the other key's


def test_talk_hears_the_microphone_and_speaks_the_answer(
    playwright, launch, tiny_model, whisper_model, kitten_model, tmp_path
):
    """The Talk button over /v1/realtime, in a chromium whose microphone plays an espeak
    recording: the user's words appear as Whisper heard them, the answer as the chat model
    gives them, spoken (its first audio and length in the figures); the Status page counts
    the open session."""
    models = ("--model", str(whisper_model), "--model", str(kitten_model))
    srv = launch(tiny_model, *models, "--api-key", KEY)  # the browser's key: a subprotocol
    microphone = tmp_path / "microphone.wav"
    microphone.write_bytes(padded_wav(UTTERANCES[0]))
    with hearing(playwright, microphone) as page:
        sign_in(page, srv)
        page.select_option("#model-select", str(tiny_model))
        page.click("#settings summary")
        page.fill("#temperature", "0")  # Talk keeps the chat page's settings
        page.click("#talk")
        expect(page.locator("#talk")).to_have_text("Stop talking")
        expect(page.locator(".message.user")).to_have_text(UTTERANCES[0], timeout=ANSWER_SECONDS)
        _, _, reply = srv.post(
            "/v1/chat/completions",
            {
                "model": str(tiny_model),
                "messages": [
                    {"role": "system", "content": DEFAULT_INSTRUCTIONS},
                    {"role": "user", "content": UTTERANCES[0]},
                ],
                "temperature": 0,
            },
            headers={"Authorization": f"Bearer {KEY}"},
        )
        expected = reply["choices"][0]["message"]["content"]
        answer = page.locator(".message.assistant")
        expect(answer.locator(".stats")).to_contain_text("spoken", timeout=ANSWER_SECONDS)
        shown = answer.locator(".content").inner_text()
        assert shown.split() and "".join(shown.split()) == "".join(expected.split())
        stats = answer.locator(".stats").inner_text()
        assert "first audio" in stats and "spoken 0.0 s" not in stats, stats
        page.click("button[data-page=status]")
        expect(page.locator("#sockets")).to_have_text("1")
        page.click("button[data-page=chat]")
        page.click("#talk")
        expect(page.locator("#talk")).to_have_text("Talk")


def padded_wav(text: str) -> bytes:
    """`text` spoken by espeak-ng as a 48 kHz 16-bit wav, with a second of silence before
    and three after (the voice detector's end of turn)."""
    rate = 48_000
    voice = decode(speak(text), rate)
    samples = np.concatenate([np.zeros(rate, np.float32), voice, np.zeros(3 * rate, np.float32)])
    return b"".join(encode([samples], rate, "wav"))


def test_a_tool_of_an_mcp_server_is_called_and_its_result_shown(
    page, launch, tool_agent_model, tmp_path
):
    """A toggle per ready MCP server: on, the message goes through the Responses API with
    that server's tools; the call the server ran shows with its result, then the answer."""
    from conversations import AGENT_REPLY, COMMAND, instruction

    helper = Path(__file__).parent / "helpers" / "mcp_tools.py"
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps({"mcpServers": {"tests": {"command": sys.executable, "args": [str(helper)]}}})
    )
    srv = launch(tool_agent_model, "--mcp-config", str(config), "--api-key", KEY)
    sign_in(page, srv)
    toggle = page.locator("#mcp-tools label", has_text="tests").locator("input")
    expect(toggle).to_be_visible()
    toggle.check()
    chat(page, tool_agent_model, instruction("bash"))
    call = page.locator(".message.assistant .tool-call")
    expect(call).to_contain_text("bash")
    expect(call).to_contain_text(COMMAND)
    expect(call.locator(".tool-result")).to_have_text(f"ran: {COMMAND}")
    expect(page.locator(".message.assistant .content")).to_have_text(AGENT_REPLY)
