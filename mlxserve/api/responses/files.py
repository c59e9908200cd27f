"""Files a Responses request names in a user message: `input_image` with a `file_id`, and
`input_file` (a `file_id`, inline `file_data`, or a `file_url`), read from the files
uploaded through /v1/files (purpose `user_data` or `vision`) and given to the model as it
takes them: an image as an image, a text file as its text."""

from __future__ import annotations

import base64
import binascii
import mimetypes
from collections.abc import Callable
from dataclasses import dataclass

from mlxserve.api.batches.openai import INPUT_PURPOSES
from mlxserve.api.batches.owners import visible
from mlxserve.batches.store import BatchStore
from mlxserve.protocol import request as neutral
from mlxserve.protocol.errors import bad_request, not_found

# Types read as text besides text/*: what people attach as "a text file".
TEXT_TYPES = {"application/json", "application/xml", "application/x-yaml", "application/yaml"}
TEXT_SUFFIXES = (".md", ".py", ".yaml", ".yml", ".toml", ".jsonl", ".log", ".csv", ".ts", ".rs")


@dataclass(frozen=True)
class FileInput:
    """An input_file part's fields."""

    file_id: str | None
    file_data: str | None
    file_url: str | None
    filename: str | None


@dataclass
class FileInputs:
    store: Callable[[], BatchStore]  # the files' store, opened when first asked for

    def image_url(self, file_id: str, param: str) -> str:
        """An uploaded image as a data URL (the image loader reads it as any other)."""
        name, data = self._uploaded(file_id, param)
        return _data_url(_type(name) or "application/octet-stream", data)

    def part(self, given: FileInput, param: str) -> neutral.Part:
        """An input_file as the model takes it: an image, video or audio part, or a text
        part holding the file's name and text; any other kind of file is a 400 naming the
        part."""
        if given.file_id is not None:
            name, data = self._uploaded(given.file_id, f"{param}.file_id")
            kind = _type(name)
        elif given.file_data is not None:
            name = given.filename or "file"
            kind, data = _inline(given.file_data, f"{param}.file_data")
            kind = kind or _type(name)
        elif given.file_url is not None:
            media = neutral.media_part(
                _type(given.filename or given.file_url), given.file_url, param
            )
            if media is not None:
                return media
            raise bad_request(
                "A file_url is read only for an image, a video or an audio clip; upload "
                "other files to /v1/files, or send them as file_data.",
                f"{param}.file_url",
            )
        else:
            raise bad_request("An input_file needs a file_id, file_data or file_url.", param)
        media = neutral.media_part(kind, _data_url(kind or "", data), param)
        if media is not None:
            return media
        if _is_text(kind, name):
            try:
                return neutral.TextPart(f"File {name}:\n{data.decode('utf-8')}")
            except UnicodeDecodeError:
                pass
        raise bad_request(
            f"The file '{name}' ({kind or 'of an unknown type'}) cannot be read on this "
            "server: images, video, audio and UTF-8 text files can.",
            param,
            code="unsupported_file",
        )

    def _uploaded(self, file_id: str, param: str) -> tuple[str, bytes]:
        store = self.store()
        record = store.file(file_id)
        if record is None or not visible(record.owner):
            raise not_found(f"No such File object: {file_id}", param, code="file_not_found")
        if record.purpose not in INPUT_PURPOSES:
            raise bad_request(
                f"The file's purpose is '{record.purpose}'; a request reads files uploaded "
                f"with purpose {' or '.join(INPUT_PURPOSES)}.",
                param,
            )
        return record.filename, store.content(file_id) or b""


def _type(name: str) -> str | None:
    return mimetypes.guess_type(name, strict=False)[0]


def _is_text(kind: str | None, name: str) -> bool:
    if kind is not None:
        return kind.startswith("text/") or kind in TEXT_TYPES
    return name.lower().endswith(TEXT_SUFFIXES)


def _inline(file_data: str, param: str) -> tuple[str | None, bytes]:
    """(the data URL's type, or None for bare base64; the bytes)."""
    kind = None
    if file_data.startswith("data:"):
        header, _, file_data = file_data.partition(",")
        kind = header.removeprefix("data:").split(";")[0] or None
    try:
        return kind, base64.b64decode("".join(file_data.split()), validate=True)
    except (binascii.Error, ValueError) as e:
        raise bad_request(f"file_data is not valid base64: {e}", param) from e


def _data_url(kind: str, data: bytes) -> str:
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"
