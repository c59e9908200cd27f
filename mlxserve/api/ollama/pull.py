"""/api/pull: a hub repo downloaded into the Hugging Face cache (as `mlxserve pull` does,
the same files), its progress reported as Ollama's: a line per file ("layer") with its
digest, total and completed bytes."""

from __future__ import annotations

import fnmatch
import hashlib
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from mlxserve.hub.commands import MODEL_FILES
from mlxserve.models.capabilities import is_model_folder
from mlxserve.protocol.errors import bad_request, not_found

REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
PROGRESS_SECONDS = 0.5  # a file's progress line at most this often
NOT_FOUND = "pull model manifest: file does not exist"  # Ollama's words


@dataclass(frozen=True)
class Layer:
    path: str
    size: int
    digest: str  # sha256:<64 hex>

    @property
    def status(self) -> str:
        return f"pulling {self.digest.removeprefix('sha256:')[:12]}"


def repo_and_revision(name: str) -> tuple[str, str | None]:
    """`owner/name[:tag]` as a hub repo id and revision (latest: the default branch)."""
    repo, _, tag = name.partition(":")
    if not REPO_ID.match(repo):
        raise bad_request(
            f"'{name}' is not a Hugging Face repo id: give owner/name[:revision], e.g. "
            "mlx-community/Qwen3-4B-4bit.",
            param="model",
        )
    return repo, None if tag in ("", "latest") else tag


def layers(repo: str, revision: str | None) -> list[Layer]:
    """The repo's files mlxserve serves, each with its size and a digest (the LFS
    sha256 where the hub gives one)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    try:
        entries = list(HfApi().list_repo_tree(repo, revision=revision, recursive=True))
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise not_found(NOT_FOUND) from e
    found = []
    for entry in entries:
        size = getattr(entry, "size", None)
        if size is None or not any(fnmatch.fnmatch(entry.path, p) for p in MODEL_FILES):
            continue
        lfs = getattr(entry, "lfs", None)
        sha = getattr(lfs, "sha256", None) if lfs is not None else None
        if not sha:
            blob = getattr(entry, "blob_id", "")
            sha = hashlib.sha256(f"{repo}/{entry.path}:{blob}".encode()).hexdigest()
        found.append(Layer(entry.path, size, f"sha256:{sha}"))
    if not found:
        raise not_found(NOT_FOUND)
    return found


def pull(repo: str, revision: str | None) -> Iterator[dict]:
    """Ollama's progress lines, each file downloading while its lines go out; a failure
    raises (the endpoint makes it the stream's error line)."""
    yield {"status": "pulling manifest"}
    folder: Path | None = None
    for layer in layers(repo, revision):
        line = {"status": layer.status, "digest": layer.digest, "total": layer.size}
        yield line
        download = _Download(repo, revision, layer)
        done = 0
        while (grown := download.progress()) is not None:
            done = grown
            yield {**line, "completed": done}
        folder = download.folder()
        if done != layer.size:  # a file the hub sent without counting (or a cached one)
            yield {**line, "completed": layer.size}
    yield {"status": "verifying sha256 digest"}
    if folder is None or not is_model_folder(folder):
        raise bad_request(
            f"{repo} has no config.json and weights: it is not a model mlxserve can serve.",
            param="model",
        )
    yield {"status": "writing manifest"}
    yield {"status": "success"}


class _Download:
    """One file downloading on a thread of its own, its byte counts handed back."""

    def __init__(self, repo: str, revision: str | None, layer: Layer):
        self._layer = layer
        self._counts: queue.Queue = queue.Queue()
        self._done = 0
        self._result: list = []
        self._thread = threading.Thread(
            target=self._run, args=(repo, revision), name="ollama-pull", daemon=True
        )
        self._thread.start()

    def _run(self, repo: str, revision: str | None) -> None:
        from huggingface_hub import hf_hub_download

        try:
            bar = _progress_bar(self._counts.put)
            path = hf_hub_download(repo, self._layer.path, revision=revision, tqdm_class=bar)
            self._result.append(Path(path))
        except Exception as e:
            self._result.append(e)
        self._counts.put(None)

    def progress(self) -> int | None:
        """The bytes downloaded so far, as they grow; None once the download ended."""
        count = self._counts.get()
        if count is None:
            return None
        self._done += count
        return min(self._done, self._layer.size)

    def folder(self) -> Path:
        """The snapshot folder the file went into (or the download's error, raised)."""
        self._thread.join()
        result = self._result[0]
        if isinstance(result, Exception):
            raise result
        return result.parents[len(Path(self._layer.path).parts) - 1]


def _progress_bar(report: Callable[[int], None]) -> type:
    """A tqdm class for the hub's download that hands its byte counts to `report` (at
    most every PROGRESS_SECONDS) and prints nothing."""
    from tqdm.auto import tqdm

    class Reported(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self._pending = 0
            self._last = time.monotonic()

        def update(self, n=1):
            self._pending += n or 0
            if time.monotonic() - self._last >= PROGRESS_SECONDS:
                report(self._pending)
                self._pending, self._last = 0, time.monotonic()

        def close(self):
            if self._pending:
                report(self._pending)
                self._pending = 0
            super().close()

    return Reported
