"""Client quirks: what clients send as they ship that a local server takes in its stride.
Each is named once here, applied where a dialect is read, and documented on that dialect's
page in docs/; the core never learns a client's name."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

# Claude Code opens its system prompt with a line (or a text block of its own) such as
# `x-anthropic-billing-header: cc_version=2.1.330.abc; cc_entrypoint=sdk-cli; cch=4f2a1;`,
# whose hash changes between sessions (in some versions between requests). Kept, it
# would make every session's prompt differ from its first tokens, and the prompt cache
# would never serve one. CLAUDE_CODE_ATTRIBUTION_HEADER=0 stops Claude Code sending it.
BILLING_HEADER = "x-anthropic-billing-header:"


def without_billing_header(system: str) -> str:
    """The system text without Claude Code's leading billing line."""
    if not system.startswith(BILLING_HEADER):
        return system
    return system.partition("\n")[2]


# Tools the provider would run itself (web search, file search, a code interpreter, a
# computer...). Codex always offers `web_search`; Claude Code can offer Anthropic's server
# tools. The model cannot call them here, so they are left out of the prompt instead of
# failing the request; naming one in tool_choice stays a 400.
_warned: set[str] = set()


def leave_out_hosted_tools(kinds: list[str]) -> None:
    """Say once per kind of tool (Codex sends its web search with every request) that
    it was left out."""
    new = sorted(set(kinds) - _warned)
    if new:
        _warned.update(new)
        log.warning(
            "Left out of the prompt: hosted tools this server cannot run (%s); the model "
            "is offered the client's own tools only.",
            ", ".join(new),
        )
    elif kinds:
        log.debug("hosted tools left out: %s", ", ".join(kinds))
