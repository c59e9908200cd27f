"""The images a `response_format: "url"` reply links to, kept in memory for a while and
served at /v1/images/files/{name}. The id (128 random bits) is what grants access, as
OpenAI's signed links do: a browser's <img> or a chat app fetches it without a key."""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from mlxserve.api.responder import RawReply
from mlxserve.protocol.errors import not_found

LINK_PREFIX = "/v1/images/files/"
LINK_SECONDS = 3600  # how long a link works (OpenAI's last an hour)
LINK_BYTES = 256 * 1024 * 1024  # the most kept at once; the oldest go first


@dataclass(frozen=True)
class Linked:
    data: bytes
    content_type: str
    expires: float


class ImageLinks:
    def __init__(self, seconds: float = LINK_SECONDS, max_bytes: int = LINK_BYTES):
        self._seconds, self._max_bytes = seconds, max_bytes
        self._kept: OrderedDict[str, Linked] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, data: bytes, content_type: str, extension: str) -> str:
        """The path the image is served at from now on, for a while."""
        name = f"{secrets.token_urlsafe(16)}.{extension}"
        with self._lock:
            self._kept[name] = Linked(data, content_type, time.monotonic() + self._seconds)
            self._drop_old()
        return LINK_PREFIX + name

    def get(self, name: str) -> RawReply:
        with self._lock:
            self._drop_old()
            found = self._kept.get(name)
        if found is None:
            raise not_found("No such image, or its link has expired.", code="image_not_found")
        return RawReply(found.content_type, found.data)

    def _drop_old(self) -> None:
        now = time.monotonic()
        total = sum(len(item.data) for item in self._kept.values())
        while self._kept:
            name, oldest = next(iter(self._kept.items()))
            if oldest.expires > now and total <= self._max_bytes:
                return
            total -= len(oldest.data)
            del self._kept[name]
