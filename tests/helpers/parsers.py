"""What the parser tests share."""

from __future__ import annotations

PARIS = ("get_weather", '{"city": "Paris"}')
