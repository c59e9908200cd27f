"""Generation results -> Responses objects: the whole response, or its typed SSE events,
built from the same blocks (an output item starts where Choice.add starts a block, so the
items streamed and the final response's output agree, ids included)."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from mlxserve.api.responses.sealed import REASONING
from mlxserve.api.sse import EventSink
from mlxserve.postprocess.events import Reasoning, ToolCallArguments, ToolCallStart
from mlxserve.protocol.errors import ServiceError
from mlxserve.service.results import Block, Choice, TokenLogprob, Usage
from mlxserve.service.run import Step
from mlxserve.service.token_texts import TokenTexts

ID_PREFIXES = {"reasoning": "rs", "text": "msg", "tool_call": "fc"}
MCP_CALL, MCP_APPROVAL = "mcp_call", "mcp_approval_request"  # calls the server runs
CALL_PREFIXES = {MCP_CALL: "mcp", MCP_APPROVAL: "mcpr"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def usage_dict(usage: Usage) -> dict:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def error_object(error: ServiceError) -> dict:
    """A failed response's `error`, and the `error` event's fields."""
    return {"code": error.code or "server_error", "message": error.message, "param": error.param}


@dataclass
class ResponseBuilder:
    """One response: its id, the settings it echoes, and its output items."""

    model: str
    settings: dict  # the request's settings, echoed in every response object
    summary: bool = False  # reasoning items carry their text as a summary part too
    encrypted: bool = False  # reasoning items carry encrypted_content
    namespaces: dict[str, str] = field(default_factory=dict)  # function -> its namespace
    texts: TokenTexts | None = None  # token texts for logprobs; None: none asked for
    mcp: dict[str, str] = field(default_factory=dict)  # an MCP tool -> its server_label
    approval: frozenset[str] = frozenset()  # the MCP tools whose calls wait for approval
    # the output before this round's: the MCP tools listed, earlier rounds' items
    earlier: list[dict] = field(default_factory=list)
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))
    _item_ids: list[str] = field(default_factory=list)
    _logprobs: dict[int, list[TokenLogprob]] = field(default_factory=dict)  # per text block
    _unplaced: list[TokenLogprob] = field(default_factory=list)

    def place_logprobs(self, step: Step) -> list[TokenLogprob]:
        """Give a step's logprob entries to the text block it wrote; entries of tokens
        that wrote nothing yet (held-back markup) go with the next step's, and are dropped
        with it when that step writes reasoning or a tool call, which carry no logprobs.
        Returns the entries given now."""
        self._unplaced += step.logprobs
        if self.texts is None or not step.events:
            return []
        entries, self._unplaced = self._unplaced, []
        index = len(step.choice.blocks) - 1
        if step.choice.blocks[index].kind != "text":
            return []
        self._logprobs.setdefault(index, []).extend(entries)
        return entries

    def delta_logprobs(self, entries: list[TokenLogprob]) -> list[dict]:
        """Entries as output_text.delta events carry them (no bytes)."""
        return [
            {
                **self._token(e.token, e.logprob, with_bytes=False),
                "top_logprobs": [self._token(t, lp, with_bytes=False) for t, lp in e.top],
            }
            for e in entries
        ]

    def logprobs_of(self, index: int) -> list[TokenLogprob]:
        return self._logprobs.get(index, [])

    def _text(self, index: int, text: str) -> dict:
        """A text block's output_text part."""
        logprobs = [
            {**self._token(e.token, e.logprob), "top_logprobs": [self._token(*t) for t in e.top]}
            for e in self.logprobs_of(index)
        ]
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}

    def _token(self, token: int, logprob: float, with_bytes: bool = True) -> dict:
        assert self.texts is not None  # logprob entries exist only when texts were given
        text = self.texts(token)
        entry = {"token": text.text, "logprob": logprob}
        return {**entry, "bytes": list(text.bytes)} if with_bytes else entry

    def item_id(self, index: int, block: Block) -> str:
        while len(self._item_ids) <= index:
            self._item_ids.append("")
        if not self._item_ids[index]:
            kind = self.mcp_kind(block)
            prefix = CALL_PREFIXES[kind] if kind else ID_PREFIXES[block.kind]
            self._item_ids[index] = new_id(prefix)
        return self._item_ids[index]

    def mcp_kind(self, block: Block) -> str | None:
        """A call to an MCP tool (run by the server, or asked to be approved first); None:
        not a call, or one for the client."""
        if block.kind != "tool_call" or block.name not in self.mcp:
            return None
        return MCP_APPROVAL if block.name in self.approval else MCP_CALL

    def continues(self, choice: Choice) -> bool:
        """Whether a finished round made calls the server runs now: they run before the
        response goes on (or ends, where it also asks for approval or calls the client)."""
        kinds = map(self.mcp_kind, choice.blocks)
        return choice.finish_reason == "tool_calls" and MCP_CALL in kinds

    def next_round(self, items: list[dict]) -> None:
        """A round is over: its items (its MCP calls with their outcomes) come before the
        next round's."""
        self.earlier += items
        self._item_ids, self._logprobs, self._unplaced = [], {}, []

    def response(
        self,
        status: str,
        choice: Choice | None = None,
        usage: Usage | None = None,
        error: ServiceError | None = None,
    ) -> dict:
        output = list(self.earlier)
        if choice is not None:
            last = len(choice.blocks) - 1
            output += [
                self.item(i, block, "incomplete" if status != "completed" and i == last else None)
                for i, block in enumerate(choice.blocks)
            ]
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": error_object(error) if error is not None else None,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": output,
            **self.settings,
            "usage": usage_dict(usage) if usage is not None and status != "in_progress" else None,
        }

    def item(self, index: int, block: Block, status: str | None = "completed") -> dict:
        """The output item of a block; `status` None: completed."""
        base = {"id": self.item_id(index, block), "type": "", "status": status or "completed"}
        if block.kind == "reasoning":
            return {**base, **self._reasoning(block.text)}
        if block.kind == "text":
            content = [self._text(index, block.text)]
            return {**base, "type": "message", "role": "assistant", "content": content}
        kind = self.mcp_kind(block)
        if kind == MCP_APPROVAL:
            return {
                "id": base["id"],
                "type": kind,
                "server_label": self.mcp[block.name],
                "name": block.name,
                "arguments": block.text,
            }
        if kind == MCP_CALL:
            return {
                **base,
                "type": kind,
                "server_label": self.mcp[block.name],
                "name": block.name,
                "arguments": block.text,
                "output": None,
                "error": None,
                "approval_request_id": None,
            }
        call = {**base, "type": "function_call", "call_id": block.call_id, "name": block.name}
        call["arguments"] = block.text
        if block.name in self.namespaces:
            call["namespace"] = self.namespaces[block.name]
        return call

    def _reasoning(self, text: str) -> dict:
        item = {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": text}] if self.summary and text else [],
            "content": [{"type": "reasoning_text", "text": text}],
        }
        if self.encrypted:
            item["encrypted_content"] = REASONING.seal(text)
        return item


class ResponseStream:
    """Writes one response as the Responses API's SSE events, each with its type as the
    `event:` name and an increasing `sequence_number`."""

    def __init__(self, sse: EventSink, fmt: ResponseBuilder):
        self._sse = sse
        self._fmt = fmt
        self._sequence = 0
        self._open: int | None = None  # the index of the block being written
        self._open_id = ""  # its item's id
        self._count = 0  # blocks started
        self._base = len(fmt.earlier)  # the output index of this round's first block

    def keepalive(self) -> None:
        """While the prompt is processed: the response starts, comments keep it alive."""
        self._start()
        self._sse.comment("keepalive")

    def step(self, step: Step, usage: Usage) -> dict | None:
        """Send a step's events; once it finishes, the final response (also returned)."""
        self._start()
        choice = step.choice
        logprobs = self._fmt.delta_logprobs(self._fmt.place_logprobs(step))
        for event in step.events:
            if isinstance(event, ToolCallStart):
                self._open_item(choice)
                continue
            if isinstance(event, ToolCallArguments):
                kind = self._call_kind(choice)
                if kind is not None:  # an approval request has no argument events
                    self._send(f"response.{kind}_arguments.delta", delta=event.text)
                continue
            kind = "reasoning" if isinstance(event, Reasoning) else "text"
            if self._open is None or choice.blocks[self._open].kind != kind:
                self._open_item(choice)
            if kind == "text":
                self._send(
                    "response.output_text.delta",
                    content_index=0,
                    delta=event.text,
                    logprobs=logprobs,
                )
                logprobs = []  # the step's entries go with its first text delta
                continue
            self._send("response.reasoning_text.delta", content_index=0, delta=event.text)
            if self._fmt.summary:
                self._send(
                    "response.reasoning_summary_text.delta", summary_index=0, delta=event.text
                )
        if not step.finished:
            return None
        if self._fmt.continues(choice):  # its MCP calls run, then the next round
            self._close_item(choice, "completed")
            return None
        status = "incomplete" if choice.finish_reason == "length" else "completed"
        self._close_item(choice, status)
        response = self._fmt.response(status, choice, usage)
        self._send_response(f"response.{status}", response)
        return response

    def earlier(self) -> None:
        """The items a response with MCP tools opens with: the servers' tool lists, and
        the calls the input approved, run."""
        self._start()
        for index, item in enumerate(self._fmt.earlier):
            self._open, self._open_id = index - self._base, item["id"]
            if item["type"] == "mcp_list_tools":
                self._item_event("response.output_item.added", item={**item, "tools": []})
                self._send("response.mcp_list_tools.in_progress")
                self._send("response.mcp_list_tools.completed")
            else:
                added = {**item, "status": "in_progress", "output": None, "error": None}
                self._item_event("response.output_item.added", item=added)
                self._send("response.mcp_call.in_progress")
                self._send("response.mcp_call_arguments.done", arguments=item["arguments"])
                self._send(f"response.mcp_call.{item['status']}")
            self._item_event("response.output_item.done", item=item)
        self._open = None

    def ran(self, items: list[dict]) -> None:
        """A round's MCP calls ran: each call's outcome, its item done; the next round's
        items follow these."""
        for index, item in enumerate(items):
            if item["type"] != MCP_CALL:
                continue
            self._open, self._open_id = index, item["id"]
            self._send(f"response.mcp_call.{item['status']}")
            self._item_event("response.output_item.done", item=item)
        self._open, self._count = None, 0
        self._base += len(items)

    def finish(self, response: dict) -> None:
        """A response whose last round ran its calls (it also called the client's, or
        asked for an approval, or its rounds ran out)."""
        self._send_response(f"response.{response['status']}", response)

    def whole(self, response: dict) -> None:
        """Send a response whose items were made whole, not generated as they stream (a
        compaction): each item added and done, then the response completed."""
        self._start()
        for index, item in enumerate(response["output"]):
            self._open = index
            self._item_event("response.output_item.added", item=item)
            self._item_event("response.output_item.done", item=item)
        self._open = None
        self._send_response("response.completed", response)

    def fail(self, error: ServiceError, choice: Choice | None) -> dict:
        """End the stream with an `error` event and the failed response; returns it."""
        self._start()
        self._event("error", **error_object(error))
        response = self._fmt.response("failed", choice, error=error)
        self._send_response("response.failed", response)
        return response

    # Items ------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._sse.started:
            return
        response = self._fmt.response("in_progress")
        self._send_response("response.created", response)
        self._send_response("response.in_progress", response)

    def _open_item(self, choice: Choice) -> None:
        self._close_item(choice, "completed")
        self._open, self._count = self._count, self._count + 1
        block = choice.blocks[self._open]
        item = self._fmt.item(self._open, Block(block.kind, "", block.call_id, block.name))
        self._open_id = item["id"]
        if "status" in item:  # an approval request has none
            item["status"] = "in_progress"
        if block.kind != "tool_call":  # the parts are added by their own events
            item = {**item, "content": []} | ({"summary": []} if block.kind == "reasoning" else {})
            item.pop("encrypted_content", None)
        self._item_event("response.output_item.added", item=item)
        if self._fmt.mcp_kind(block) == MCP_CALL:
            self._send("response.mcp_call.in_progress")
        if block.kind == "text":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            self._send("response.content_part.added", content_index=0, part=part)
        elif block.kind == "reasoning":
            part = {"type": "reasoning_text", "text": ""}
            self._send("response.content_part.added", content_index=0, part=part)
            if self._fmt.summary:
                part = {"type": "summary_text", "text": ""}
                self._send("response.reasoning_summary_part.added", summary_index=0, part=part)

    def _close_item(self, choice: Choice, status: str) -> None:
        if self._open is None:
            return
        block = choice.blocks[self._open]
        item = self._fmt.item(self._open, block, status)
        if block.kind == "text":
            logprobs = self._fmt.delta_logprobs(self._fmt.logprobs_of(self._open))
            self._send(
                "response.output_text.done", content_index=0, text=block.text, logprobs=logprobs
            )
            self._send("response.content_part.done", content_index=0, part=item["content"][0])
        elif block.kind == "reasoning":
            self._send("response.reasoning_text.done", content_index=0, text=block.text)
            part = {"type": "reasoning_text", "text": block.text}
            self._send("response.content_part.done", content_index=0, part=part)
            if self._fmt.summary:
                self._send("response.reasoning_summary_text.done", summary_index=0, text=block.text)
                part = {"type": "summary_text", "text": block.text}
                self._send("response.reasoning_summary_part.done", summary_index=0, part=part)
        elif self._fmt.mcp_kind(block) == MCP_APPROVAL:
            pass  # made whole at once
        elif self._fmt.mcp_kind(block) == MCP_CALL:
            self._send("response.mcp_call_arguments.done", arguments=block.text)
            self._open = None
            return  # done once it has run (ran)
        else:
            self._send(
                "response.function_call_arguments.done", name=block.name, arguments=block.text
            )
        self._item_event("response.output_item.done", item=item)
        self._open = None

    def _call_kind(self, choice: Choice) -> str | None:
        """Whose arguments events the open call's are; None: it has none."""
        assert self._open is not None
        kind = self._fmt.mcp_kind(choice.blocks[self._open])
        return None if kind == MCP_APPROVAL else kind or "function_call"

    # Events -----------------------------------------------------------------------------

    def _send(self, kind: str, **fields) -> None:
        """An event about the open item."""
        self._event(kind, item_id=self._open_id, output_index=self._index(), **fields)

    def _item_event(self, kind: str, item: dict) -> None:
        self._event(kind, output_index=self._index(), item=item)

    def _index(self) -> int | None:
        return None if self._open is None else self._base + self._open

    def _send_response(self, kind: str, response: dict) -> None:
        self._event(kind, response=response)

    def _event(self, kind: str, **fields) -> None:
        self._sse.event({"type": kind, **fields, "sequence_number": self._sequence}, kind)
        self._sequence += 1
