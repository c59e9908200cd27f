"""Tool definitions the dialect tests share."""

from __future__ import annotations

from conversations import WEATHER_TOOL

WEATHER = {
    "name": WEATHER_TOOL["function"]["name"],
    "description": WEATHER_TOOL["function"]["description"],
    "input_schema": WEATHER_TOOL["function"]["parameters"],
}

# A tool whose arguments hold a little of everything a schema holds (nested objects,
# arrays, enums, bounded numbers, optional keys), strict; what guided and forced calls to
# it must validate against is `TRIP_ARGUMENTS`, the schema closed as strict reads it.
TRIP = {
    "type": "function",
    "function": {
        "name": "plan_trip",
        "description": "Plan a trip.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 16},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
                "budget": {"type": "number", "minimum": 0, "maximum": 5000},
                "mode": {"enum": ["car", "train", "plane"]},
                "stops": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 10},
                    "maxItems": 3,
                },
                "options": {
                    "type": "object",
                    "properties": {
                        "pets": {"type": "boolean"},
                        "rooms": {"type": "integer", "minimum": 1, "maximum": 4},
                    },
                    "required": ["pets"],
                },
            },
            "required": ["city", "days", "mode", "options"],
        },
        "strict": True,
    },
}
_TRIP = TRIP["function"]["parameters"]
TRIP_ARGUMENTS = {
    **_TRIP,
    "additionalProperties": False,
    "properties": {
        **_TRIP["properties"],
        "options": {**_TRIP["properties"]["options"], "additionalProperties": False},
    },
}

# The weather tool with its one argument closed: a city of at most five characters (the
# trained "Paris"), strict (no other key). After "Paris" a guided call can only close.
CLOSED_WEATHER_TOOL = {
    "type": "function",
    "function": {
        **WEATHER_TOOL["function"],
        "parameters": {
            **WEATHER_TOOL["function"]["parameters"],
            "properties": {"city": {"type": "string", "maxLength": 5}},
        },
        "strict": True,
    },
}


def named_calls(reply: dict) -> list[tuple[str, str]]:
    """A Chat Completions reply's calls as (name, arguments) pairs."""
    calls = reply["choices"][0]["message"].get("tool_calls") or []
    return [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


def unclosable_call(request: dict, model) -> dict:
    """`request` (a trained weather call's) with the weather tool closed (CLOSED_WEATHER_TOOL)
    and every token of `model`'s vocabulary that holds "}" biased away: the model cannot
    close the call's JSON unless a grammar leaves it nothing else."""
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(model).get_vocab()
    return {
        **request,
        "tools": [CLOSED_WEATHER_TOOL],
        "logit_bias": {str(i): -100 for text, i in vocab.items() if "}" in text},
        "max_tokens": 80,
    }
