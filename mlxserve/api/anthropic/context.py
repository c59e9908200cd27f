"""Anthropic's context editing (`context_management.edits`): old tool results and old
thinking cleared from the conversation before it becomes the neutral request, as
Anthropic's API clears them on its side (the client keeps the whole history and sends it
each time), and what each edit cleared, for the reply's `context_management`.

A clear_tool_uses edit runs once the prompt passes its trigger (more input tokens, or more
tool uses, than its value): every tool use but the last `keep` ones, less those of
`exclude_tools`, has its result replaced by PLACEHOLDER (and its input by `{}` where
`clear_tool_inputs` says so), unless that frees fewer tokens than `clear_at_least`. A
clear_thinking edit leaves the thinking blocks out of all but the last `keep` assistant
turns that have them. Tokens are the prompt's, rendered as for the reply, so an edit's
`cleared_input_tokens` is what it took off the prompt."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import is_

from mlxserve.api.anthropic.requests import (
    ClearThinking,
    ClearToolUses,
    ContextManagement,
    Message,
    RedactedThinkingBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

PLACEHOLDER = "[Old tool result content cleared]"


class PromptTokens:
    """The prompt tokens of the request with a list of messages in place of its own
    (`count`), each list counted once."""

    def __init__(self, count: Callable[[list[Message]], int]):
        self._count = count
        self._known: list[tuple[list[Message], int]] = []

    def __call__(self, messages: list[Message]) -> int:
        for known, tokens in self._known:
            if known is messages:
                return tokens
        tokens = self._count(messages)
        self._known.append((messages, tokens))
        return tokens


@dataclass(frozen=True)
class Edited:
    messages: list[Message]
    applied: list[dict]  # the reply's context_management.applied_edits


def edit(config: ContextManagement | None, messages: list[Message], tokens: PromptTokens) -> Edited:
    """The conversation with the edits applied in their order, and what each one that
    cleared something cleared."""
    applied: list[dict] = []
    for step in config.edits if config else []:
        if isinstance(step, ClearThinking):
            done = _clear_thinking(messages, step, tokens)
        else:
            done = _clear_tool_uses(messages, step, tokens)
        if done is not None:
            messages, report = done
            applied.append(report)
    return Edited(messages, applied)


Done = tuple[list[Message], dict] | None  # the messages an edit leaves, and its report


def _clear_tool_uses(messages: list[Message], step: ClearToolUses, tokens: PromptTokens) -> Done:
    uses = _tool_uses(messages)
    older = uses[: max(len(uses) - (step.keep.value or 0), 0)]
    excluded = set(step.exclude_tools or ())
    cleared = [use for use in older if use.name not in excluded]
    # the trigger is looked at (the prompt counted) only when something would go
    if not cleared or not _triggered(step, uses, messages, tokens):
        return None
    results = {use.id for use in cleared}
    inputs = step.clear_tool_inputs
    emptied = {
        use.id
        for use in cleared
        if inputs is True or (isinstance(inputs, list) and use.name in inputs)
    }

    def block(block):
        if isinstance(block, ToolResultBlock) and block.tool_use_id in results:
            return block.model_copy(update={"content": PLACEHOLDER})
        if isinstance(block, ToolUseBlock) and block.id in emptied:
            return block.model_copy(update={"input": {}})
        return block

    edited = [_with_blocks(message, list(map(block, _blocks(message)))) for message in messages]
    freed = tokens(messages) - tokens(edited)
    if step.clear_at_least is not None and freed < (step.clear_at_least.value or 0):
        return None
    report = {"type": step.type, "cleared_tool_uses": len(cleared), "cleared_input_tokens": freed}
    return edited, report


def _triggered(
    step: ClearToolUses, uses: list[ToolUseBlock], messages: list[Message], tokens: PromptTokens
) -> bool:
    """Whether the conversation passes the trigger: more tool uses, or more prompt tokens,
    than its value."""
    threshold = step.trigger.value or 0
    if step.trigger.type == "tool_uses":
        return len(uses) > threshold
    return tokens(messages) > threshold


def _clear_thinking(messages: list[Message], step: ClearThinking, tokens: PromptTokens) -> Done:
    if step.keep.type == "all":
        return None
    turns = [
        i
        for i, message in enumerate(messages)
        if message.role == "assistant" and any(map(_thinking, _blocks(message)))
    ]
    cleared = set(turns[: max(len(turns) - (step.keep.value or 0), 0)])
    if not cleared:
        return None
    edited = [
        _with_blocks(message, [b for b in _blocks(message) if not _thinking(b)])
        if i in cleared
        else message
        for i, message in enumerate(messages)
    ]
    freed = tokens(messages) - tokens(edited)
    report = {
        "type": step.type,
        "cleared_thinking_turns": len(cleared),
        "cleared_input_tokens": freed,
    }
    return edited, report


def _tool_uses(messages: list[Message]) -> list[ToolUseBlock]:
    return [
        block
        for message in messages
        if message.role == "assistant"
        for block in _blocks(message)
        if isinstance(block, ToolUseBlock)
    ]


def _blocks(message: Message) -> list:
    return message.content if isinstance(message.content, list) else []


def _thinking(block) -> bool:
    return isinstance(block, ThinkingBlock | RedactedThinkingBlock)


def _with_blocks(message: Message, blocks: list) -> Message:
    """The message with these blocks, or itself where they are its own."""
    if not isinstance(message.content, list):
        return message
    if len(blocks) == len(message.content) and all(map(is_, blocks, message.content)):
        return message
    return message.model_copy(update={"content": blocks})
