"""`mlxserve pull REPO [--quantize 4|8]`, `mlxserve ls`, `mlxserve rm REPO`: the Hugging
Face hub's own download (progress bars, resumed where an earlier one stopped, HF_ENDPOINT
and HF_TOKEN obeyed) into its cache, mlx-lm's converter for quantizing, and a listing that
says which models a running server serves."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from mlxserve.models.capabilities import (
    PIPELINE_INDEX,
    is_model_folder,
    is_pipeline_folder,
    is_text_model,
    read_config,
    weight_files,
)
from mlxserve.models.kinds import KINDS
from mlxserve.models.locations import cached_hub_models, converted_root
from mlxserve.registration import register_all
from mlxserve.units import format_bytes

# What MLX serving reads from a repo: weights, configs, tokenizers, chat templates, code
# for trust_remote_code, a speech model's voices (KittenTTS's voices.npz). PyTorch and
# GGUF weights beside them are left on the hub.
MODEL_FILES = [
    "*.json",
    "*.safetensors",
    "*.py",
    "*.model",
    "*.tiktoken",
    "*.txt",
    "*.jinja",
    "*.npz",
]
QUANTIZE_BITS = (4, 8)
DEFAULT_URL = "http://127.0.0.1:8080"


@dataclass(frozen=True)
class LocalModel:
    name: str  # a repo id, or a converted model's folder name
    path: Path
    converted: bool  # made by `pull --quantize` (else a Hugging Face cache snapshot)

    @property
    def kind(self) -> str:
        """As /v1/models says it; "other" for a folder no library here loads."""
        kind = KINDS.of(self.path)
        return kind.name if kind is not KINDS.fallback or is_text_model(self.path) else "other"

    @property
    def size(self) -> int:
        return sum(f.stat().st_size for f in weight_files(self.path))

    @property
    def quantization(self) -> str:
        config = read_config(self.path)
        quantization = config.get("quantization") or config.get("quantization_config") or {}
        if bits := quantization.get("bits"):
            return f"{bits}-bit"
        return str(config.get("torch_dtype") or config.get("dtype") or "-")


def local_models() -> list[LocalModel]:
    models = [LocalModel(repo, path, False) for repo, path in cached_hub_models()]
    root = converted_root()
    for config in sorted(root.glob("*/config.json")) if root.is_dir() else []:
        models.append(LocalModel(config.parent.name, config.parent, True))
    return models


def pull(repo: str, revision: str | None, bits: int | None, output: Path | None) -> int:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        snapshot = Path(snapshot_download(repo, revision=revision, allow_patterns=MODEL_FILES))
    except RepositoryNotFoundError:
        return fail(f"{repo} is not a model repo on the hub (or it needs HF_TOKEN).")
    except RevisionNotFoundError:
        return fail(f"{repo} has no revision {revision!r}.")
    except EntryNotFoundError as e:
        url = str(e.response.url) if isinstance(e, HfHubHTTPError) and e.response else ""
        missing = url.rsplit("/", 1)[-1] or "a file"
        return fail(f"{repo} lists {missing}, but the hub has no such file (404).")
    except OSError as e:  # the network down, a disk full (HfHubHTTPError is one)
        lines = [line for line in str(e).splitlines() if line.strip()]
        why = lines[-1].rstrip(".") if lines else type(e).__name__
        return fail(f"downloading {repo} failed: {why}. The same command resumes it.")
    if not is_model_folder(snapshot):
        return fail(
            f"{repo} has no config.json (nor a pipeline's {PIPELINE_INDEX}) and weights: it "
            "is not a model mlxserve can serve."
        )
    if bits is None:
        print(f"{repo} is in the Hugging Face cache: {snapshot}")
        print(f"Serve it with: mlxserve --model {repo}")
        return 0
    if is_pipeline_folder(snapshot):
        return fail(f"{repo} is an image pipeline: --quantize converts language models only.")
    target = output or converted_root() / f"{repo.split('/')[-1]}-{bits}bit"
    if target.exists():
        return fail(f"{target} exists already; remove it (mlxserve rm {target.name}) first.")
    from mlx_lm import convert

    print(f"Quantizing {repo} to {bits} bits into {target} ...")
    convert(str(snapshot), mlx_path=str(target), quantize=True, q_bits=bits)
    print(f"Serve it with: mlxserve --model {target}")
    return 0


def served_by(url: str) -> dict[str, str] | None:
    """{model path or id: state} of the server at `url`, or None when none answers."""
    headers = {}
    if key := os.environ.get("MLXSERVE_API_KEY"):
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(f"{url.rstrip('/')}/v1/models", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=3) as response:
            listed = json.load(response)["data"]
    except (OSError, ValueError, KeyError):
        return None
    return {entry["id"]: entry.get("state", "loaded") for entry in listed}


def listing(url: str) -> int:
    models = local_models()
    served = served_by(url)
    if not models:
        print("No models yet: mlxserve pull REPO downloads one.")
        return 0
    rows = [("MODEL", "KIND", "SIZE", "QUANTIZATION", "SERVED")]
    for model in models:
        state = "-"
        if served is not None:
            names = (model.name, str(model.path))
            state = "loaded" if any(served.get(n) == "loaded" for n in names) else "no"
        size = format_bytes(model.size)
        rows.append((model.name, model.kind, size, model.quantization, state))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    if served is None:
        print(f"(no server answers at {url}: SERVED is unknown)")
    return 0


def remove(name: str) -> int:
    """Delete a cached repo (every revision) or a converted model's folder."""
    for model in local_models():
        if model.name != name:
            continue
        if model.converted:
            freed = model.size
            shutil.rmtree(model.path)
        else:
            freed = remove_cached_repo(name)
        print(f"Removed {name} ({format_bytes(freed)} freed)")
        return 0
    return fail(f"{name} is not among your models (mlxserve ls lists them).")


def remove_cached_repo(repo_id: str) -> int:
    """Delete a repo's folder in the Hugging Face cache (its revisions, its blobs and any
    unfinished download); the bytes freed."""
    from huggingface_hub import scan_cache_dir

    freed = 0
    for repo in scan_cache_dir().repos:
        if repo.repo_id == repo_id and repo.repo_type == "model":
            freed += repo.size_on_disk
            shutil.rmtree(repo.repo_path)
    return freed


def fail(message: str) -> int:
    print(f"mlxserve: {message}", file=sys.stderr)
    return 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mlxserve", description="Models on this machine.")
    commands = p.add_subparsers(dest="command", required=True)
    get = commands.add_parser("pull", help="download a model from the Hugging Face hub")
    get.add_argument("repo", help="a hub repo id, e.g. mlx-community/Qwen3-4B-4bit")
    get.add_argument("--revision", help="a branch, tag or commit (default: main)")
    get.add_argument(
        "--quantize",
        type=int,
        choices=QUANTIZE_BITS,
        help="convert it with mlx-lm to this many bits, into its own folder",
    )
    get.add_argument("--output", type=Path, help="the converted model's folder")
    show = commands.add_parser("ls", help="list the models on this machine")
    show.add_argument(
        "--url", default=DEFAULT_URL, help=f"the server to ask what it serves ({DEFAULT_URL})"
    )
    drop = commands.add_parser("rm", help="delete a downloaded or converted model")
    drop.add_argument("name", help="as `mlxserve ls` lists it")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    register_all()
    if args.command == "pull":
        return pull(args.repo, args.revision, args.quantize, args.output)
    if args.command == "ls":
        return listing(args.url)
    return remove(args.name)
