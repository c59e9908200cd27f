"""Shared fixtures: the tiny models, and real mlxserve processes on free ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import catalog
import conversations
import pytest
from helpers.server import STARTED, Server, start_server

LOG_LINES_ON_FAILURE = 80  # the tail of each server's log a failed test's report shows


def _session_fixture(name: str, build: Callable[[], Path]) -> Callable:
    def fixture() -> Path:
        return build()

    fixture.__doc__ = build.__doc__
    return pytest.fixture(scope="session", name=name)(fixture)


# One session fixture per model of tests/fixtures/catalog.py, by the same name (`make
# fixtures` has built them all before the tests start).
for _name, _build in catalog.BUILDERS.items():
    globals()[_name] = _session_fixture(_name, _build)


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


@pytest.fixture(scope="session")
def image_dir(tmp_path_factory) -> Path:
    """A folder of squares (red.png, blue.png, green.png) the vision server may read."""
    folder = tmp_path_factory.mktemp("images")
    for colour in conversations.COLOURS:
        (folder / f"{colour}.png").write_bytes(conversations.square_png(colour))
    return folder


# The tier of each test module outside tests/unit (whose tests are "unit"); the rest are
# "server". The markers are declared in pyproject.toml.
TIERS = {
    "test_agents": "agents",
    "test_launch_clients": "agents",
    "test_client_vercel": "clients",
    "test_client_agents_sdk": "clients",
    "test_client_dify": "clients",
    "test_webapp": "browser",
    "test_distributed": "distributed",
    "test_audio": "audio",
    "test_realtime": "audio",
}


# The modules that take longest (over 100 s each, `--durations=0`), run first: the two
# workers of `make test` take whole modules in this order (--no-loadscope-reorder), so a
# long one never starts last while the other worker sits idle.
LONGEST_FIRST = (
    "test_agents",
    "test_distributed",
    "test_mtp",
    "test_openapi",
    "test_shutdown",
    "test_speculation",
    "test_vision_batching",
)


def pytest_collection_modifyitems(items):
    for item in items:
        path = Path(str(item.fspath))
        tier = "unit" if path.parent.name == "unit" else TIERS.get(path.stem, "server")
        item.add_marker(tier)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).stem, len(rank)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.first_server = len(STARTED)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report on the test item (rep_setup, rep_call, rep_teardown), for
    fixtures that act on a failure (the web app's screenshots). A failure's report ends
    with the log of each server started for the test (a flake says why it happened)."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    if report.failed:
        for srv in STARTED[getattr(item, "first_server", len(STARTED)) :]:
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


@pytest.fixture(scope="module")
def launch_module() -> Iterator:
    """Servers shared by a module's tests, stopped at its end."""
    started: list[Server] = []

    def _launch(model, *args) -> Server:
        srv = start_server(model, *args)
        started.append(srv)
        return srv

    yield _launch
    for srv in started:
        srv.stop()


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
