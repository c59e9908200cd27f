"""`mlxserve pull`, `ls` and `rm` against a fake hub on loopback (fake_hub.py, reached
through HF_ENDPOINT) serving tiny-chat's folder as a repo: a download cut short resumes,
a missing file is one sentence, a pulled model is listed by a server as not loaded and
loads on request, `--quantize` converts it, `--no-cached-models` hides what is cached."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fake_hub import COMMIT, FakeHub, Repo
from helpers.server import start_server

from mlxserve.units import format_bytes

REPO = "test-org/tiny-chat"
IMAGE_REPO = "test-org/tiny-z-image"  # a pipeline: model_index.json, a folder per component
DOWNLOAD_PIECE = 10 * 1024 * 1024  # what the hub client writes at a time


@pytest.fixture(scope="module")
def repo_folder(tmp_path_factory, tiny_model) -> Path:
    """tiny-chat's tokenizer and template on a wider, random-weight Qwen3 of ~30 MB: the
    hub client writes a download in 10 MB pieces, so only a file past 20 MB cut in half
    leaves a piece to resume from."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3

    folder = tmp_path_factory.mktemp("repo")
    for file in tiny_model.iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, folder / file.name)
    config = json.loads((tiny_model / "config.json").read_text())
    config |= {"hidden_size": 384, "intermediate_size": 1152, "num_hidden_layers": 4}
    config |= {"num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 64}
    (folder / "config.json").write_text(json.dumps(config))
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    return folder


@pytest.fixture(scope="module")
def hub(repo_folder, tiny_model, z_image_model):
    served = FakeHub(
        {
            REPO: Repo(repo_folder, cut_short={"model.safetensors"}),
            IMAGE_REPO: Repo(z_image_model),
            "test-org/broken": Repo(tiny_model, missing=("tokenizer.model",)),
        }
    )
    yield served
    served.stop()


@pytest.fixture(scope="module")
def homes(tmp_path_factory, hub) -> dict[str, str]:
    """The environment of every command and server here: its own caches, the fake hub."""
    root = tmp_path_factory.mktemp("hub")
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(root / "hf")}
    env |= {"MLXSERVE_CACHE_DIR": str(root / "mlxserve"), "HF_HUB_DISABLE_XET": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("MLXSERVE_API_KEY", None)
    return env


def mlxserve(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "mlxserve", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def pulled(homes, hub, tiny_model) -> Path:
    """The repo pulled once; its download of the weights was cut short half way."""
    done = mlxserve(homes, "pull", REPO)
    assert done.returncode == 0, done.stderr
    snapshot = Path(homes["HF_HOME"]) / "hub" / "models--test-org--tiny-chat" / "snapshots"
    assert f"Serve it with: mlxserve --model {REPO}" in done.stdout
    assert "Fetching" in done.stderr and "resume" in done.stderr  # the hub's progress bars
    return snapshot / COMMIT


def test_a_download_cut_short_resumes_where_it_stopped(pulled, hub, repo_folder):
    weights = (repo_folder / "model.safetensors").read_bytes()
    assert len(weights) > 2 * DOWNLOAD_PIECE
    assert (pulled / "model.safetensors").read_bytes() == weights
    assert hub.ranges == [("model.safetensors", f"bytes={DOWNLOAD_PIECE}-")]
    names = {f.name for f in pulled.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names


def test_a_file_the_hub_does_not_have_is_one_sentence(homes, hub):
    done = mlxserve(homes, "pull", "test-org/broken")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert (
        last
        == "mlxserve: test-org/broken lists tokenizer.model, but the hub has no such file (404)."
    )
    assert "Traceback" not in done.stderr


def test_an_unknown_repo_is_one_sentence(homes, hub):
    done = mlxserve(homes, "pull", "test-org/nothing")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "mlxserve: test-org/nothing is not a model repo on the hub (or it needs HF_TOKEN)."
    )


def test_ls_lists_it_and_says_what_a_server_serves(homes, pulled, tiny_model):
    alone = mlxserve(homes, "ls", "--url", "http://127.0.0.1:9")
    row = next(line for line in alone.stdout.splitlines() if line.startswith(REPO))
    size = format_bytes((pulled / "model.safetensors").stat().st_size).split()
    assert row.split() == [REPO, "chat", *size, "float32", "-"], row
    assert "(no server answers at http://127.0.0.1:9: SERVED is unknown)" in alone.stdout
    srv = start_server(tiny_model, env=homes)
    try:
        listed = {m["id"]: m for m in srv.get("/v1/models")[2]["data"]}
        assert listed[REPO]["state"] == "not-loaded" and listed[REPO]["kind"] == "chat"
        served = mlxserve(homes, "ls", "--url", srv.url)
        assert (
            next(line for line in served.stdout.splitlines() if line.startswith(REPO)).split()[-1]
            == "no"
        )
        body = {"model": REPO, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 5}
        status, _, reply = srv.post("/v1/chat/completions", body)
        assert status == 200 and reply["model"] == REPO
        assert srv.get(f"/v1/models/{REPO}")[2]["state"] == "loaded"
        served = mlxserve(homes, "ls", "--url", srv.url)
        assert (
            next(line for line in served.stdout.splitlines() if line.startswith(REPO)).split()[-1]
            == "loaded"
        )
        assert any(
            "Loading model from" in line and f"chat, {' '.join(size)} of weights" in line
            for line in srv.log
        )
    finally:
        srv.stop()


def test_no_cached_models_hides_them(homes, pulled, tiny_model):
    srv = start_server(tiny_model, "--no-cached-models", env=homes)
    try:
        listed = [m["id"] for m in srv.get("/v1/models")[2]["data"]]
        assert listed == [str(tiny_model)]
        body = {"model": REPO, "messages": [{"role": "user", "content": "Hello!"}]}
        status, _, reply = srv.post("/v1/chat/completions", body)
        assert status == 404 and reply["error"]["code"] == "model_not_found"
    finally:
        srv.stop()


def test_quantize_converts_then_rm_removes(homes, pulled, tiny_model):
    done = mlxserve(homes, "pull", REPO, "--quantize", "4")
    assert done.returncode == 0, done.stderr
    target = Path(homes["MLXSERVE_CACHE_DIR"]) / "converted" / "tiny-chat-4bit"
    assert f"Serve it with: mlxserve --model {target}" in done.stdout
    listing = mlxserve(homes, "ls", "--url", "http://127.0.0.1:9").stdout
    row = next(line for line in listing.splitlines() if line.startswith("tiny-chat-4bit"))
    assert row.split()[1] == "chat" and row.split()[4] == "4-bit", row
    srv = start_server(tiny_model, env=homes)
    try:
        body = {"model": "tiny-chat-4bit", "messages": [{"role": "user", "content": "Hi"}]}
        assert srv.post("/v1/chat/completions", {**body, "max_tokens": 3})[0] == 200
    finally:
        srv.stop()
    assert mlxserve(homes, "rm", "tiny-chat-4bit").stdout.startswith("Removed tiny-chat-4bit (")
    assert not target.exists()
    first = mlxserve(homes, "rm", REPO)
    assert first.returncode == 0, first.stderr
    again = mlxserve(homes, "rm", REPO)
    assert again.stderr.strip() == (
        f"mlxserve: {REPO} is not among your models (mlxserve ls lists them)."
    ), (first.stdout, again.stdout)
    left = mlxserve(homes, "ls", "--url", "http://127.0.0.1:9").stdout
    assert REPO not in left and "tiny-chat-4bit" not in left


def test_an_image_pipeline_is_pulled_whole_listed_and_served(homes, hub, tiny_model, z_image_model):
    done = mlxserve(homes, "pull", IMAGE_REPO)
    assert done.returncode == 0, done.stderr
    snapshot = (
        Path(homes["HF_HOME"]) / "hub" / "models--test-org--tiny-z-image" / "snapshots" / COMMIT
    )
    for file in z_image_model.rglob("*"):
        if file.is_file():
            assert (snapshot / file.relative_to(z_image_model)).read_bytes() == file.read_bytes()
    quantize = mlxserve(homes, "pull", IMAGE_REPO, "--quantize", "4")
    assert quantize.returncode == 1 and "Traceback" not in quantize.stderr
    assert quantize.stderr.strip().splitlines()[-1] == (
        f"mlxserve: {IMAGE_REPO} is an image pipeline: --quantize converts language models only."
    )
    listing = mlxserve(homes, "ls", "--url", "http://127.0.0.1:9").stdout
    row = next(line for line in listing.splitlines() if line.startswith(IMAGE_REPO))
    weights = sum(f.stat().st_size for f in z_image_model.glob("*/*.safetensors"))
    assert row.split()[:4] == [IMAGE_REPO, "image", *format_bytes(weights).split()], row
    srv = start_server(tiny_model, env=homes)
    try:
        listed = {m["id"]: m for m in srv.get("/v1/models")[2]["data"]}
        assert listed[IMAGE_REPO]["kind"] == "image"
        body = {"model": IMAGE_REPO, "prompt": "a cat", "size": "64x64", "steps": 2}
        status, _, reply = srv.post("/v1/images/generations", body)
        assert status == 200 and len(reply["data"]) == 1, reply
    finally:
        srv.stop()
