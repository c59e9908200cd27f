"""Where a chat prompt's system turn and tools end: a checkpoint for models whose caches
continue only from an exact prefix, so that new conversations with the same system prompt
(an agent's next session, its sub-agents) skip it."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from mlxserve.engine.caches.token_prefix import common_prefix
from mlxserve.models.spec import ModelSpec
from mlxserve.protocol.request import ChatRequest, Message

MIN_TOKENS = 256  # a shorter system prompt is not worth a prompt-cache entry of its own
KEPT = 16  # openings remembered (an agent's prompt is rendered and tokenized once)


class SystemEnds:
    def __init__(self):
        self._openings: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def find(
        self,
        spec: ModelSpec,
        request: ChatRequest,
        injected: bool,
        prompt: list[int],
        render: Callable[[ChatRequest], list[int]],
    ) -> tuple[int, ...]:
        """The prompt length where the system turn and tools end, as a checkpoint: the
        tokens the prompt shares with the same system turn and tools followed by a
        stand-in user turn (template-agnostic). () when there is none worth keeping."""
        lead = next((i for i, m in enumerate(request.messages) if m.role != "system"), 0)
        if not lead and not request.tool_definitions:
            return ()
        opening = replace(
            request, messages=(*request.messages[:lead], Message("user", "\x00", "messages"))
        )
        key = _key(spec, opening, injected)
        with self._lock:
            tokens = self._openings.get(key)
            if tokens is not None:
                self._openings.move_to_end(key)
        if tokens is None:
            tokens = np.asarray(render(opening))
            with self._lock:
                self._openings[key] = tokens
                while len(self._openings) > KEPT:
                    self._openings.popitem(last=False)
        shared = common_prefix(np.asarray(prompt), tokens)
        return (shared,) if MIN_TOKENS <= shared < len(prompt) - 1 else ()


def _key(spec: ModelSpec, opening: ChatRequest, injected: bool) -> str:
    """What the opening's rendering depends on."""
    fields = [
        spec.key,
        [repr(m) for m in opening.messages],
        opening.tool_definitions,
        opening.template_kwargs,
        opening.reasoning_effort,
        injected,
    ]
    return hashlib.sha256(json.dumps(fields, default=repr).encode()).hexdigest()
