"""Where a media content part points -> its bytes: a data URI, an http(s) URL (through the
guarded fetch), or a local file inside an allowed folder.

Runs on HTTP threads (no MLX). Every failure is a 400 naming the content part, its code
named by the medium (`invalid_image`, `video_too_large`, `audio_unreachable`, ...), so a
client learns which part was wrong instead of getting an answer that ignored it."""

from __future__ import annotations

import base64
import binascii
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from mlxserve.chat.fetch import FetchError, FetchRules, TooLarge, fetch
from mlxserve.protocol.errors import ServiceError, bad_request

# A data URI each medium's errors show as the shape to send
_EXAMPLE_TYPES = {"image": "image/png", "video": "video/mp4", "audio": "audio/wav"}
_ARTICLE = {"image": "An", "video": "A", "audio": "An"}


@dataclass(frozen=True)
class SourceRules:
    """Where a medium's parts may point and how large they may be."""

    kind: str  # "image", "video" or "audio": the errors' codes and wording
    max_bytes: int
    limit_flag: str  # the setting that raises max_bytes, as a 400 names it
    fetch_timeout: float
    allowed_dirs: tuple[Path, ...]  # local files must lie inside one of these
    allow_local_urls: bool  # URLs may name loopback and private addresses


def read_source(url: str, param: str, rules: SourceRules) -> bytes:
    """The bytes a part's URL names, at most `rules.max_bytes`, or a 400 naming `param`."""
    kind = rules.kind
    if not isinstance(url, str) or not url:
        raise bad_request(
            f"{_ARTICLE[kind]} {kind} part needs a URL string.", param=param, code=f"invalid_{kind}"
        )
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if url.startswith("data:"):
        data = _data_uri(url, param, kind)
    elif scheme in ("http", "https"):
        data = _fetch(url, param, rules)
    elif scheme == "file":
        path = Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
        data = _local_file(path, param, rules)
    elif scheme == "":
        data = _local_file(Path(url), param, rules)
    else:
        raise bad_request(
            f"Unsupported {kind} URL scheme '{scheme}': use a data: URI, http(s) or a file path.",
            param=param,
            code=f"invalid_{kind}",
        )
    if len(data) > rules.max_bytes:
        raise _too_large(len(data), rules, param)
    return data


def _data_uri(url: str, param: str, kind: str) -> bytes:
    header, comma, payload = url.partition(",")
    if not comma or not header.endswith(";base64"):
        raise bad_request(
            f"{_ARTICLE[kind]} {kind} data URI must look like data:{_EXAMPLE_TYPES[kind]};base64,<data>.",
            param=param,
            code=f"invalid_{kind}",
        )
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError) as e:
        raise bad_request(
            f"The {kind} data URI is not valid base64: {e}", param=param, code=f"invalid_{kind}"
        ) from e


def _fetch(url: str, param: str, rules: SourceRules) -> bytes:
    kind = rules.kind
    try:
        return fetch(url, FetchRules(rules.fetch_timeout, rules.max_bytes, rules.allow_local_urls))
    except TooLarge as e:
        raise _too_large(e.size, rules, param) from e
    except FetchError as e:
        if e.refused:
            raise bad_request(
                f"The {kind} URL may not be fetched: {e}.",
                param=param,
                code=f"{kind}_url_not_allowed",
            ) from e
        shown = url if len(url) <= 200 else url[:200] + "..."
        raise bad_request(
            f"The {kind} at {shown} could not be fetched: {e}.",
            param=param,
            code=f"{kind}_unreachable",
        ) from e


def _local_file(path: Path, param: str, rules: SourceRules) -> bytes:
    kind = rules.kind
    try:
        resolved = path.expanduser().resolve()
    except (OSError, ValueError) as e:  # a NUL byte, a name too long
        raise bad_request(f"Not a file path: {e}.", param=param, code=f"invalid_{kind}") from e
    if not any(resolved.is_relative_to(root.resolve()) for root in rules.allowed_dirs):
        raise bad_request(
            f"Local {kind} files are only read from the folders given with --image-dir or "
            "--model-dir; this path is outside them.",
            param=param,
            code=f"{kind}_path_not_allowed",
        )
    if not resolved.is_file():
        raise bad_request(f"No {kind} file at '{path}'.", param=param, code=f"invalid_{kind}")
    if resolved.stat().st_size > rules.max_bytes:
        raise _too_large(resolved.stat().st_size, rules, param)
    return resolved.read_bytes()


def _too_large(size: int, rules: SourceRules, param: str) -> ServiceError:
    return bad_request(
        f"The {rules.kind} is larger than the server's limit of {rules.max_bytes} bytes"
        f" ({size} bytes or more); see {rules.limit_flag}.",
        param=param,
        code=f"{rules.kind}_too_large",
    )
