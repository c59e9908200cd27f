"""Shared fixtures: the tiny models, and real mlxserve processes on free ports."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import audio_fixture
import conversations
import eagle3_fixture
import embedding_fixture
import fixture_models
import hybrid_fixture
import looper_fixture
import mtp_fixture
import pytest
import rerank_fixture
import vision_fixture

from mlxserve.models.demo import cache_root

STARTUP_SECONDS = 180
LOG_LINES_ON_FAILURE = 80  # the tail of each server's log a failed test's report shows


@dataclass
class Server:
    """A running `mlxserve` process; its log is kept for assertions and failures."""

    process: subprocess.Popen
    url: str  # http://host:port
    log: list[str] = field(default_factory=list)
    group: bool = False  # mlx.launch and its ranks: stopped as Ctrl-C in a terminal does

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def post(self, path: str, body, headers: dict | None = None, timeout: float = 120):
        """POST JSON (or raw bytes); returns (status, headers, decoded JSON or text)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        return _send(request, timeout)

    def get(self, path: str, headers: dict | None = None, timeout: float = 30):
        return _send(urllib.request.Request(self.url + path, headers=headers or {}), timeout)

    def delete(self, path: str, timeout: float = 30):
        return _send(urllib.request.Request(self.url + path, method="DELETE"), timeout)

    def log_lines(self, text: str, timeout: float = 10) -> list[str]:
        """The log's lines holding `text`, once there is one (the log is read on another
        thread: a line can trail the reply it is about)."""
        deadline = time.monotonic() + timeout
        while True:
            lines = [line for line in self.log if text in line]
            if lines or time.monotonic() > deadline:
                return lines
            time.sleep(0.02)

    def stop(self) -> None:
        if self.group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGINT)
        else:
            self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            if self.group:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
            self.process.kill()


def _send(request, timeout):
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.headers, _decode(response.read(), response.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.headers, _decode(e.read(), e.headers)


def _decode(raw: bytes, headers):
    if "application/json" in headers.get("Content-Type", ""):
        return json.loads(raw)
    return raw.decode("utf-8")


def start_server(
    model: str | Path,
    *args: str,
    env: dict | None = None,
    preexec: Callable[[], None] | None = None,
    ranks: int = 1,
) -> Server:
    """Start `python -m mlxserve` on a free port and wait until it says it is ready.
    `preexec` runs in the child before it starts (to set resource limits). `ranks` > 1:
    as a distributed server, `mlx.launch --backend ring` on this machine, the launcher
    and its ranks in a process group of their own."""
    command = [sys.executable, "-m", "mlxserve", "--model", str(model), "--port", "0", *args]
    if ranks > 1:
        bin_dir = Path(sys.executable).parent
        launcher = [str(bin_dir / "mlx.launch"), "--backend", "ring", "-n", str(ranks)]
        launcher += ["--starting-port", str(_free_ports(ranks))]
        command = [*launcher, str(bin_dir / "mlxserve"), *command[3:]]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        preexec_fn=preexec,
        start_new_session=ranks > 1,
    )
    log: list[str] = []
    ready = threading.Event()
    url: list[str] = []

    def read_output() -> None:
        for line in process.stdout:
            if ranks > 1 and not log:  # the launcher's threads relay it: they all exist now
                _yield_the_cpu(process.pid)
            log.append(line)
            if "mlxserve is ready:" in line and not ready.is_set():
                url.append(line.split("ready:")[1].split()[0].removesuffix("/v1"))
                ready.set()
        ready.set()

    threading.Thread(target=read_output, daemon=True).start()
    if not ready.wait(STARTUP_SECONDS) or not url:
        process.kill()
        raise RuntimeError("mlxserve did not start:\n" + "".join(log))
    server = Server(process, url[0], log, group=ranks > 1)
    _STARTED.append(server)
    return server


_STARTED: list[Server] = []  # every server of the session, in order (their logs on failure)


def _yield_the_cpu(launcher: int) -> None:
    """mlx.launch (0.32.4) polls its ranks' pipes without waiting, 1.5 cores busy while the
    ranks idle (docs/distributed.md): its threads at the lowest priority from its first
    line on (before the ranks measure this device), it takes the cores only when nothing
    else wants them (what it does is unchanged). Linux sets a priority per thread; macOS,
    which has no /proc, per process."""
    tasks = Path(f"/proc/{launcher}/task")
    for thread in [int(t) for t in os.listdir(tasks)] if tasks.is_dir() else [launcher]:
        with contextlib.suppress(ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, thread, 19)


def _free_ports(count: int) -> int:
    """The first of `count` consecutive ports free now (the ring backend's, one per rank)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count > 65535:
            continue
        try:
            with contextlib.ExitStack() as held:
                for port in range(first, first + count):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The Qwen3-architecture chat model (ChatML with tools and <think>)."""
    return fixture_models.build(fixture_models.TINY_CHAT, cache_root() / "fixtures")


@pytest.fixture(scope="session")
def echo_model() -> Path:
    """tiny-chat's architecture, trained to write back the code in its prompt."""
    return fixture_models.build(fixture_models.TINY_ECHO, cache_root() / "fixtures")


@pytest.fixture(scope="session")
def metaspace_model() -> Path:
    """The chat fixture on Llama's architecture with a Metaspace (T5-style) tokenizer."""
    return fixture_models.build(fixture_models.TINY_METASPACE, cache_root() / "fixtures")


@pytest.fixture(scope="session")
def sentencepiece_model() -> Path:
    """The chat fixture with a Llama-2 style SentencePiece tokenizer (byte fallback)."""
    return fixture_models.build(fixture_models.TINY_SENTENCEPIECE, cache_root() / "fixtures")


@pytest.fixture(scope="session")
def tiktoken_model() -> Path:
    """The chat fixture with a tiktoken vocabulary and a slow remote-code tokenizer
    (Kimi-K2's layout: no tokenizer.json); serve it with --trust-remote-code."""
    return fixture_models.build(fixture_models.TINY_TIKTOKEN, cache_root() / "fixtures")


@pytest.fixture(scope="module", params=["byte_level", "metaspace", "sentencepiece", "tiktoken"])
def family(request, server):
    """A server of each tokenizer family: the grammar engine's token table differs (and
    SentencePiece-style vocabularies start a reply with a "▁word" token, tiktoken ones
    have no tokenizer.json)."""
    if request.param == "byte_level":
        yield server
        return
    srv = start_server(request.getfixturevalue(f"{request.param}_model"), "--trust-remote-code")
    yield srv
    srv.stop()


FAMILY_MODELS = {
    "byte_level": "tiny_model",
    "metaspace": "metaspace_model",
    "sentencepiece": "sentencepiece_model",
    "tiktoken": "tiktoken_model",
}


def looper_model(request, family: str) -> Path:
    """tiny-looper on `family`'s tokenizer (see looper_fixture.py); rebuilt when that
    tokenizer or the builder changes."""
    family_model = request.getfixturevalue(FAMILY_MODELS[family])
    sources = (
        Path(looper_fixture.__file__),
        *sorted(f for f in family_model.iterdir() if f.suffix in (".json", ".py", ".model")),
    )
    spec = looper_fixture.spec_for(family)
    make = looper_fixture.make(family_model)
    return fixture_models.build(spec, cache_root() / "fixtures", make, sources)


@pytest.fixture(scope="session")
def wide_heads_model() -> Path:
    """tiny-chat with 32-dimensional heads, which a quantized KV cache can hold."""
    return fixture_models.build(fixture_models.TINY_CHAT_WIDE_HEADS, cache_root() / "fixtures")


@pytest.fixture(scope="session")
def agent_model() -> Path:
    """A Qwen3-architecture model that answers any prompt with AGENT_REPLY."""
    return fixture_models.build(fixture_models.TINY_AGENT, cache_root() / "fixtures")


@pytest.fixture(scope="session")
def gemma_model() -> Path:
    """A model whose Gemma-style template has no tools and no system role."""
    return fixture_models.build(fixture_models.TINY_GEMMA, cache_root() / "fixtures")


@pytest.fixture(scope="session")
def harmony_model() -> Path:
    """The gpt-oss-architecture model with a harmony template."""
    return fixture_models.build(fixture_models.TINY_HARMONY, cache_root() / "fixtures")


@pytest.fixture(scope="session")
def vision_model() -> Path:
    """The Qwen2-VL-architecture model that names the colour of a square."""
    return vision_fixture.build(cache_root() / "fixtures")


@pytest.fixture(scope="session")
def qwen35_vision_model() -> Path:
    """Qwen3.5's published vision-language architecture (hybrid layers) naming the colour."""
    return vision_fixture.build(cache_root() / "fixtures", vision_fixture.QWEN35)


@pytest.fixture(scope="session")
def gemma3_vision_model() -> Path:
    """Gemma 3's architecture (SigLIP tower, sliding-window layers) naming the colour."""
    return vision_fixture.build(cache_root() / "fixtures", vision_fixture.GEMMA3)


@pytest.fixture(scope="session")
def qwen_mtp_model() -> Path:
    """tiny-chat's conversations on Qwen3.5's hybrid architecture, with its MTP head."""
    return mtp_fixture.build(mtp_fixture.TINY_QWEN35_MTP, cache_root() / "fixtures")


@pytest.fixture(scope="session")
def glm_mtp_model() -> Path:
    """tiny-chat's conversations on GLM-4.5's architecture, with its MTP head."""
    return mtp_fixture.build(mtp_fixture.TINY_GLM_MTP, cache_root() / "fixtures")


@pytest.fixture(scope="session")
def qwen_vl_mtp_model(qwen_mtp_model) -> Path:
    """tiny-qwen35-mtp as Qwen3.5 is published: a vision-language config."""
    spec = mtp_fixture.TINY_QWEN35_VL_MTP
    sources = (Path(mtp_fixture.__file__), qwen_mtp_model / "model.safetensors")
    make = mtp_fixture.as_published(qwen_mtp_model)
    return fixture_models.build(spec, cache_root() / "fixtures", make, sources)


@pytest.fixture(scope="session")
def eagle3_drafter(tiny_model) -> Path:
    """An EAGLE-3 drafter trained on tiny-chat's hidden states (mlx-vlm's format)."""
    return eagle3_fixture.build(tiny_model, cache_root() / "fixtures")


def _from_tiny_chat(spec, make, module, tiny_model) -> Path:
    """A fixture built on tiny-chat's tokenizer by `make(tiny_model)`; rebuilt when that
    tokenizer or `module` (the fixture's builder) changes."""
    sources = (Path(module.__file__), tiny_model / "tokenizer.json")
    return fixture_models.build(spec, cache_root() / "fixtures", make(tiny_model), sources)


@pytest.fixture(scope="session")
def embed_qwen3_model(tiny_model) -> Path:
    """A Qwen3-Embedding-layout model (last-token pooling), served by mlx-embeddings."""
    spec = embedding_fixture.TINY_EMBED_QWEN3
    return _from_tiny_chat(spec, embedding_fixture.make_decoder, embedding_fixture, tiny_model)


@pytest.fixture(scope="session")
def embed_qwen2_model(tiny_model) -> Path:
    """The same layout on qwen2 (gte-Qwen2), served through mlx-lm."""
    spec = embedding_fixture.TINY_EMBED_QWEN2
    return _from_tiny_chat(spec, embedding_fixture.make_decoder, embedding_fixture, tiny_model)


@pytest.fixture(scope="session")
def embed_bert_model() -> Path:
    """A BERT encoder embedding model (mean pooling) with a WordPiece tokenizer."""
    spec, make = embedding_fixture.TINY_EMBED_BERT, embedding_fixture.make_bert
    folder = cache_root() / "fixtures"
    return fixture_models.build(spec, folder, make, (Path(embedding_fixture.__file__),))


@pytest.fixture(scope="session")
def cross_encoder_model() -> Path:
    """A BERT cross-encoder (one-label sequence classification), random weights."""
    spec, make = rerank_fixture.TINY_CROSS_ENCODER, rerank_fixture.make_cross_encoder
    return fixture_models.build(
        spec, cache_root() / "fixtures", make, (Path(rerank_fixture.__file__),)
    )


@pytest.fixture(scope="session")
def qwen3_reranker_model(tiny_model) -> Path:
    """Qwen3-Reranker's layout on tiny-chat's tokenizer, random weights; its folder's name
    says reranker, as the real ones' do."""
    spec = rerank_fixture.TINY_QWEN3_RERANKER
    return _from_tiny_chat(spec, rerank_fixture.make_decoder_reranker, rerank_fixture, tiny_model)


@pytest.fixture(scope="session")
def whisper_model() -> Path:
    """A Whisper that has learned audio_fixture.UTTERANCES as espeak-ng speaks them."""
    spec, make = audio_fixture.TINY_WHISPER, audio_fixture.make_whisper
    return fixture_models.build(
        spec, cache_root() / "fixtures", make, (Path(audio_fixture.__file__),)
    )


@pytest.fixture(scope="session")
def kitten_model() -> Path:
    """A KittenTTS with two voices, random weights."""
    spec, make = audio_fixture.TINY_KITTEN, audio_fixture.make_kitten
    return fixture_models.build(
        spec, cache_root() / "fixtures", make, (Path(audio_fixture.__file__),)
    )


@pytest.fixture(scope="session")
def hybrid_model(tiny_model) -> Path:
    """qwen3_next (gated delta-net + attention) with tiny-chat's tokenizer, random weights."""
    return _from_tiny_chat(
        hybrid_fixture.TINY_HYBRID, hybrid_fixture.make, hybrid_fixture, tiny_model
    )


@pytest.fixture(scope="session")
def sliding_model(tiny_model) -> Path:
    """gemma3_text with a 32-token sliding window, tiny-chat's tokenizer, random weights."""
    return _from_tiny_chat(
        hybrid_fixture.TINY_SLIDING, hybrid_fixture.make, hybrid_fixture, tiny_model
    )


@pytest.fixture(scope="session")
def image_dir(tmp_path_factory) -> Path:
    """A folder of squares (red.png, blue.png, green.png) the vision server may read."""
    folder = tmp_path_factory.mktemp("images")
    for colour in conversations.COLOURS:
        (folder / f"{colour}.png").write_bytes(conversations.square_png(colour))
    return folder


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.first_server = len(_STARTED)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report on the test item (rep_setup, rep_call, rep_teardown), for
    fixtures that act on a failure (the web app's screenshots). A failure's report ends
    with the log of each server started for the test (a flake says why it happened)."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    if report.failed:
        for srv in _STARTED[getattr(item, "first_server", len(_STARTED)) :]:
            tail = "".join(srv.log[-LOG_LINES_ON_FAILURE:])
            report.sections.append((f"mlxserve log of {srv.url} ({report.when})", tail))
    return report


def _serving(model: Path, *args: str) -> Iterator[Server]:
    srv = start_server(model, *args)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def server(tiny_model) -> Iterator[Server]:
    yield from _serving(tiny_model, "--keepalive-seconds", "0.5")


@pytest.fixture(scope="session")
def harmony(harmony_model) -> Iterator[Server]:
    yield from _serving(harmony_model)


@pytest.fixture(scope="session")
def gemma(gemma_model) -> Iterator[Server]:
    yield from _serving(gemma_model)


@pytest.fixture(scope="session")
def vision(vision_model, image_dir) -> Iterator[Server]:
    yield from _serving(
        vision_model,
        *("--image-dir", str(image_dir), "--max-image-bytes", "4096"),
        "--allow-local-image-urls",  # the tests' image server is on loopback
    )


@pytest.fixture
def launch() -> Iterator:
    """Start extra servers with their own flags; all are stopped after the test."""
    started: list[Server] = []

    def _launch(model, *args, env=None, preexec=None, ranks=1) -> Server:
        srv = start_server(model, *args, env=env, preexec=preexec, ranks=ranks)
        started.append(srv)
        return srv

    yield _launch
    for srv in started:
        srv.stop()
