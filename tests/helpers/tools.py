"""Tool definitions the dialect tests share."""

from __future__ import annotations

from conversations import WEATHER_TOOL

WEATHER = {
    "name": WEATHER_TOOL["function"]["name"],
    "description": WEATHER_TOOL["function"]["description"],
    "input_schema": WEATHER_TOOL["function"]["parameters"],
}
