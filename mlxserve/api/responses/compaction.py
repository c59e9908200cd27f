"""Compaction: a conversation that outgrows the context is replaced by one `compaction`
item, a summary the model writes of it, sealed in `encrypted_content` (OpenAI's remote
compaction, as Codex and other agents use it: `POST /v1/responses/compact`, or a
`compaction_trigger` item ending a request's input). Sent back in a later input, the item
expands into the turn it stands for: the summary, as a user message."""

from __future__ import annotations

from dataclasses import replace

from mlxserve.api.responses.output import new_id
from mlxserve.api.responses.sealed import COMPACTION
from mlxserve.protocol import request as neutral

PROMPT = (
    "The conversation above no longer fits the context and is about to be replaced by "
    "your summary of it. Write that summary for yourself, to carry on the work from it "
    "alone: the user's goal and constraints, what has been done so far (files, commands "
    "and their results), the decisions taken and why, and what remains to do next. Be "
    "specific and brief; write only the summary."
)
EXPANSION = "A summary of the earlier conversation, written when it was compacted:\n\n"
SUMMARY_TOKENS = 4096  # the most a summary may take (a ceiling, like every max_tokens)


def summary_request(conversation: neutral.ChatRequest) -> neutral.ChatRequest:
    """The request that writes the summary: the conversation (its oldest turns left out
    where it does not fit the context with room for the summary), then the prompt; no
    tools, no constraint."""
    prompt = neutral.Message("user", PROMPT, "input")
    return replace(
        conversation,
        messages=(*conversation.messages, prompt),
        tools=(),
        tool_choice=neutral.ToolChoice("auto"),
        constraint=None,
        max_tokens=SUMMARY_TOKENS,
        drop_oldest_to_fit=True,
    )


def compaction_item(summary: str) -> dict:
    return {
        "type": "compaction",
        "id": new_id("cmp"),
        "encrypted_content": COMPACTION.seal(summary),
    }


def expanded(blob: str, param: str) -> neutral.Message | None:
    """The turn a compaction item stands for; None when it is not this server's."""
    summary = COMPACTION.unseal(blob, f"{param}.encrypted_content")
    return None if summary is None else neutral.Message("user", EXPANSION + summary, param)
