"""The web app at `/`: chat, models and status pages as static files in the package,
served as they are by the stdlib server (no build step, no CDN: it works offline). The
files hold no data: everything they show comes from the API, with the browser's key."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STATIC = Path(__file__).parent / "static"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# The page runs its own scripts and styles only, talks to this server only, and is
# framed by no one.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data: blob:; frame-ancestors 'none'; "
        "base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class Asset:
    data: bytes
    content_type: str


def asset(name: str) -> Asset | None:
    """A file of the web app by its name (`index.html` is the page at `/`)."""
    if "/" in name or name.startswith("."):
        return None
    file = STATIC / name
    if file.suffix not in CONTENT_TYPES or not file.is_file():
        return None
    return Asset(file.read_bytes(), CONTENT_TYPES[file.suffix])
