"""MCP tools the server runs (--mcp-config), through the Responses API's `mcp` tools, with
the `openai` SDK as it ships: MCP servers written with the official `mcp` SDK
(helpers/mcp_tools.py) over stdio and over streamable HTTP on loopback; tiny-tool-agent calls
the shell tool when the user asks for it and answers AGENT_REPLY from its result.

Each call's outcome is asserted exactly (the output the server gave, the error a failing or
hung tool gave), the turn goes on from the prompt cache, approvals both ways, allowed_tools,
a killed stdio server restarted, and the 400s and 424 of requests the server cannot serve."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import anthropic
import psutil
import pytest
from conversations import AGENT_REPLY, BY_NAME, COMMAND, instruction
from helpers.server import CHAT
from helpers.sse import stream
from openai import BadRequestError, OpenAI

from mlxserve.keys.records import KeyRecord
from mlxserve.keys.store import KeyStore
from mlxserve.mcp import config as mcp_config
from mlxserve.mcp.hub import McpConnectFailed, McpHub

HELPER = str(Path(__file__).parent / "helpers" / "mcp_tools.py")
RAN = "ran: "  # helpers/mcp_tools.py's shell tool's output, then the command
TOOLS = ["bash", "broken", "wait", "headers", "grow"]
CALL_TIMEOUT = 3
NEVER = {"require_approval": "never"}
# allowed by a glob, refused all the same: a link-local address (cloud metadata services)
METADATA_PATTERN = "http://169.254.169.254/*"


def stdio(**env: str) -> dict:
    return {"command": sys.executable, "args": [HELPER], "env": env}


@pytest.fixture(scope="module")
def remote_url() -> str:
    """The helper over streamable HTTP on a free loopback port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, HELPER, "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "the HTTP MCP server did not start"
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    # killed: a graceful stop would wait for the module's server, still connected to it
    process.kill()
    process.wait(10)


def config_file(tmp_path_factory, servers: dict) -> str:
    path = tmp_path_factory.mktemp("mcp") / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return str(path)


@pytest.fixture(scope="module")
def mcp_server(launch_module, tool_agent_model, tmp_path_factory, remote_url):
    servers = {
        "tests": stdio(),
        "remote": {"url": remote_url},
        "failing": stdio(MCP_TESTS_BASH="raise"),
        "hung": stdio(MCP_TESTS_BASH="hang"),
        "down": {"command": "/nonexistent/mcp-server"},
    }
    path = config_file(tmp_path_factory, servers)
    return launch_module(
        tool_agent_model,
        *("--mcp-config", path, "--mcp-call-timeout", str(CALL_TIMEOUT)),
        *("--mcp-allow-url", "http://127.0.0.1:*", "--mcp-allow-url", METADATA_PATTERN),
    )


@pytest.fixture(scope="module")
def client(mcp_server) -> OpenAI:
    return OpenAI(base_url=mcp_server.base_url, api_key="none", max_retries=0)


def ask(client: OpenAI, server: str = "tests", **extra):
    tool = {"type": "mcp", "server_label": server, **extra.pop("tool", NEVER)}
    return client.responses.create(
        model="default", input=instruction("bash"), tools=[tool], **extra
    )


def only(items, kind: str):
    (item,) = [item for item in items if item.type == kind]
    return item


@pytest.mark.parametrize("server", ["tests", "remote"], ids=["stdio", "http"])
def test_a_call_runs_on_the_server_and_the_model_answers_from_it(client, server):
    response = ask(client, server)
    assert [item.type for item in response.output] == ["mcp_list_tools", "mcp_call", "message"]
    listed = response.output[0]
    assert listed.server_label == server and listed.error is None
    assert [tool.name for tool in listed.tools] == TOOLS
    assert listed.tools[0].input_schema["required"] == ["command"]
    call = response.output[1]
    assert (call.server_label, call.name, call.status) == (server, "bash", "completed")
    assert json.loads(call.arguments) == {"command": COMMAND}
    assert (call.output, call.error, call.approval_request_id) == (RAN + COMMAND, None, None)
    assert call.id.startswith("mcp_")
    assert response.output_text == AGENT_REPLY
    assert response.status == "completed"
    # the second round continued the first from the prompt cache
    assert response.usage.input_tokens_details.cached_tokens > 0


def test_the_stream_says_each_step_of_the_call(client):
    events = list(ask(client, stream=True))
    kinds = [event.type for event in events]
    collapsed = [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]
    assert collapsed == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.output_item.done",
        "response.output_item.added",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [item.model_dump() for item in done] == [item.model_dump() for item in final.output]
    assert [e.output_index for e in events if e.type == "response.output_item.done"] == [0, 1, 2]
    deltas = "".join(e.delta for e in events if e.type == "response.mcp_call_arguments.delta")
    assert deltas == final.output[1].arguments
    assert final.output[1].output == RAN + COMMAND
    assert final.output_text == AGENT_REPLY


def test_a_call_waits_for_approval_then_runs(client):
    """require_approval left out: OpenAI's default, every call is approved first."""
    asked = ask(client, tool={})
    assert [item.type for item in asked.output] == ["mcp_list_tools", "mcp_approval_request"]
    request = asked.output[1]
    assert (request.name, request.server_label) == ("bash", "tests")
    assert json.loads(request.arguments) == {"command": COMMAND}
    answer = {"type": "mcp_approval_response", "approval_request_id": request.id}
    tools = [{"type": "mcp", "server_label": "tests"}]
    approved = client.responses.create(
        model="default",
        previous_response_id=asked.id,
        tools=tools,
        input=[{**answer, "approve": True}],
    )
    # the tools listed before are not listed again
    assert [item.type for item in approved.output] == ["mcp_call", "message"]
    call = approved.output[0]
    assert (call.approval_request_id, call.output) == (request.id, RAN + COMMAND)
    assert approved.output_text == AGENT_REPLY
    denied = client.responses.create(
        model="default",
        previous_response_id=asked.id,
        tools=tools,
        input=[{**answer, "approve": False, "reason": "not now"}],
    )
    assert [item.type for item in denied.output] == ["message"]  # nothing ran


def test_an_approval_request_streams_whole(client):
    events = list(ask(client, tool={"require_approval": "always"}, stream=True))
    kinds = [event.type for event in events]
    assert not [k for k in kinds if "mcp_call" in k]
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["mcp_list_tools", "mcp_approval_request"]
    assert kinds[-1] == "response.completed"
    assert [item.type for item in events[-1].response.output] == added


@pytest.mark.parametrize(
    ("allowed", "listed"),
    [(["wait", "broken"], ["broken", "wait"]), ({"tool_names": ["bash"]}, ["bash"])],
    ids=["names", "filter"],
)
def test_allowed_tools_are_all_the_model_is_offered(client, allowed, listed):
    tool = {"allowed_tools": allowed, "require_approval": "always"}
    response = ask(client, tool=tool)
    assert [t.name for t in response.output[0].tools] == listed
    calls = [item for item in response.output if item.type == "mcp_approval_request"]
    assert {call.name for call in calls} <= set(listed)


def test_a_tool_that_fails_gives_the_model_its_error(client):
    response = ask(client, "failing")
    call = only(response.output, "mcp_call")
    assert (call.status, call.output) == ("failed", None)
    assert call.error.type == "mcp_tool_execution_error"
    assert call.error.content[0]["type"] == "text"
    assert response.output_text == AGENT_REPLY  # the model went on from the error


def test_a_hung_tool_times_out_and_holds_up_no_other_request(client, mcp_server):
    outcome: dict = {}

    def hung_turn() -> None:
        outcome["response"] = ask(client, "hung")
        outcome["done"] = time.monotonic()

    turn = threading.Thread(target=hung_turn)
    turn.start()
    time.sleep(0.5)  # the call is under way
    chunks = stream(mcp_server.url, CHAT, {"messages": [{"role": "user", "content": "Hello!"}]})
    streamed = time.monotonic()
    turn.join(60)
    assert "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks.chunks if c["choices"]
    )
    assert streamed < outcome["done"]  # the chat finished while the tool hung
    call = only(outcome["response"].output, "mcp_call")
    assert call.status == "failed"
    assert call.error.model_dump() == {
        "type": "mcp_protocol_error",
        "code": -32001,
        "message": f"The call to 'bash' timed out after {CALL_TIMEOUT} s.",
    }
    assert outcome["response"].output_text == AGENT_REPLY


def test_a_server_url_the_operator_allows(client, remote_url):
    """A request's own server: a server_url matching --mcp-allow-url."""
    tool = {"server_url": remote_url, "headers": {"X-Test": "1"}, "authorization": "t", **NEVER}
    response = ask(client, "own", tool=tool)
    assert [item.type for item in response.output] == ["mcp_list_tools", "mcp_call", "message"]
    assert {item.server_label for item in response.output[:2]} == {"own"}
    assert response.output[1].output == RAN + COMMAND
    assert response.output_text == AGENT_REPLY


def test_a_request_servers_headers_and_token_are_sent(remote_url):
    """The hub's connection for a request's server_url carries the headers it is given
    (the endpoint's: `headers`, and `authorization` as a bearer token), as the server sees
    them; a URL nothing answers at fails to open."""
    hub = McpHub((), call_timeout=10, max_output=10_000)
    try:
        name = hub.open(remote_url, {"X-Test": "1", "Authorization": "Bearer t"})
        seen = json.loads(hub.call(name, "headers", {}).output or "{}")
        hub.close(name)
    finally:
        hub.stop()
    assert (seen["x-test"], seen["authorization"]) == ("1", "Bearer t")
    hub = McpHub((), call_timeout=2, max_output=10)
    try:
        with pytest.raises(McpConnectFailed):
            hub.open("http://127.0.0.1:9/mcp", {})
    finally:
        hub.stop()


def test_a_changed_tool_list_is_read_again_and_outputs_are_cut():
    """The hub on a stdio server: a tool that adds a tool and sends tools/list_changed
    makes the hub list the tools again; an output over --mcp-max-output is cut, and the
    cut said."""
    hub = McpHub(load_config({"tests": stdio()}), call_timeout=10, max_output=8)
    try:
        hub.start()
        assert hub.tools("tests") is not None and "grown" not in _names(hub)
        assert hub.call("tests", "bash", {"command": "x" * 20}).output == (
            f"{RAN}xxx\n[... 17 more characters cut by the server]"
        )
        assert hub.call("tests", "grow", {}).output == "grew"
        deadline = time.monotonic() + 10
        while "grown" not in _names(hub):
            assert time.monotonic() < deadline, _names(hub)
            time.sleep(0.05)
        assert hub.call("tests", "grown", {}).output == "grown"
    finally:
        hub.stop()


def _names(hub: McpHub) -> list[str]:
    return [tool.name for tool in hub.tools("tests") or ()]


def load_config(servers: dict):
    """McpServerConfigs as --mcp-config's file would give them."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
        json.dump({"mcpServers": servers}, file)
        file.flush()
        return mcp_config.load(Path(file.name))


def test_the_agents_sdk_runs_a_turn_with_a_hosted_mcp_tool(mcp_server, remote_url):
    from agents import Agent, HostedMCPTool, OpenAIResponsesModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=mcp_server.base_url, api_key="none", max_retries=0)
    config = {"type": "mcp", "server_label": "remote", "server_url": remote_url, **NEVER}
    agent = Agent(
        name="Shell",
        model=OpenAIResponsesModel(model="default", openai_client=client),
        tools=[HostedMCPTool(tool_config=config)],  # type: ignore[arg-type]
    )
    result = asyncio.run(Runner.run(agent, instruction("bash")))
    assert result.final_output == AGENT_REPLY
    raw = [item.raw_item for item in result.new_items]
    calls = [item for item in raw if getattr(item, "type", None) == "mcp_call"]
    assert [(call.name, call.output) for call in calls] == [("bash", RAN + COMMAND)]


def test_what_cannot_be_served_is_refused_naming_the_field(client, mcp_server):
    metadata = METADATA_PATTERN.replace("*", "mcp")
    cases = [
        ({"type": "mcp", "server_label": "nope"}, "tools[0].server_label", "configured"),
        ({"server_url": "http://example.com/mcp"}, "tools[0].server_url", "--mcp-allow-url"),
        ({"server_url": metadata}, "tools[0].server_url", "link-local"),
        ({"server_url": "file:///etc/passwd"}, "tools[0].server_url", "http"),
        ({"connector_id": "connector_gmail"}, "tools[0].connector_id", "not served"),
    ]
    for tool, param, words in cases:
        tool = {"type": "mcp", "server_label": "x", **tool}
        with pytest.raises(BadRequestError) as refused:
            client.responses.create(model="default", input="Hi", tools=[tool])
        assert refused.value.body["param"] == param, refused.value.body
        assert words in refused.value.body["message"]
    # two servers offering a tool of one name
    both = [{"type": "mcp", "server_label": name, **NEVER} for name in ("tests", "remote")]
    with pytest.raises(BadRequestError) as refused:
        client.responses.create(model="default", input="Hi", tools=both)
    assert refused.value.body["param"] == "tools[1].allowed_tools"
    # an approval for a request that does not exist
    with pytest.raises(BadRequestError) as refused:
        client.responses.create(
            model="default",
            tools=[{"type": "mcp", "server_label": "tests"}],
            input=[{"type": "mcp_approval_response", "approval_request_id": "x", "approve": True}],
        )
    assert refused.value.body["param"] == "input[0].approval_request_id"
    # a configured server that is not connected: OpenAI's 424
    status, _, body = mcp_server.post(
        "/v1/responses", {"input": "Hi", "tools": [{"type": "mcp", "server_label": "down"}]}
    )
    assert status == 424, body
    assert body["error"]["type"] == "external_connector_error"
    assert body["error"]["param"] == "tools[0].server_label"
    assert "Error retrieving tool list from MCP server 'down'" in body["error"]["message"]


def test_the_servers_are_listed_with_their_state(mcp_server):
    status, _, body = mcp_server.get("/v1/mcp/servers")
    assert status == 200
    states = {s["name"]: s for s in body["data"]}
    assert list(states) == ["tests", "remote", "failing", "hung", "down"]
    assert states["tests"]["state"] == "ready" and states["tests"]["tools"] == TOOLS
    assert states["remote"]["transport"] == "http"
    assert states["down"]["state"] == "restarting"
    assert "FileNotFoundError" in states["down"]["error"]
    assert mcp_server.get("/v1/status")[2]["mcp_servers"] == body["data"]


def test_max_tool_calls_bounds_a_rounds_parallel_calls(launch, tiny_model, tmp_path):
    """tiny-chat's trained parallel calls (Paris, London) to the weather tool as an MCP
    server serves it (helpers/mcp_weather.py): both run, their outputs in order; with
    max_tool_calls 1 the second is not made, its item says so, and the next round answers
    with tools off (no third call)."""
    weather = str(Path(__file__).parent / "helpers" / "mcp_weather.py")
    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps({"mcpServers": {"weather": {"command": sys.executable, "args": [weather]}}})
    )
    server = launch(tiny_model, "--mcp-config", str(path))
    client = OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
    question = BY_NAME["parallel_tool_calls"].messages[-1]["content"]
    tool = {"type": "mcp", "server_label": "weather", **NEVER}

    def calls(**extra) -> list:
        response = client.responses.create(model="default", input=question, tools=[tool], **extra)
        return [item for item in response.output if item.type == "mcp_call"]

    both = calls()
    assert [(c.arguments, c.output) for c in both[:2]] == [
        ('{"city": "Paris"}', "Sunny in Paris"),
        ('{"city": "London"}', "Sunny in London"),
    ]
    bounded = calls(max_tool_calls=1)
    assert len(bounded) == 2, bounded
    assert (bounded[0].status, bounded[0].output) == ("completed", "Sunny in Paris")
    assert (bounded[1].status, bounded[1].output) == ("failed", None)
    assert bounded[1].error.message == "Not called: the response's max_tool_calls are spent."


def test_a_killed_stdio_server_is_restarted(launch, tool_agent_model, tmp_path_factory):
    path = config_file(tmp_path_factory, {"tests": stdio()})
    server = launch(tool_agent_model, "--mcp-config", path)
    (child,) = _children(server.process.pid, HELPER)
    os.kill(child, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:
        state = server.get("/v1/mcp/servers")[2]["data"][0]
        if state["state"] == "ready" and state["restarts"] >= 1:
            break
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
    assert _children(server.process.pid, HELPER) != [child]
    client = OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
    assert only(ask(client).output, "mcp_call").output == RAN + COMMAND


def test_calls_are_counted_per_key_and_the_list_is_an_admins(launch, tool_agent_model, tmp_path):
    db = tmp_path / "keys.sqlite"
    store = KeyStore(db)
    user, admin = (store.create(KeyRecord(n, "", None, admin=n == "admin")) for n in ("u", "admin"))
    store.close()
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"tests": stdio()}}))
    server = launch(tool_agent_model, "--mcp-config", str(path), "--keys-db", str(db))
    client = OpenAI(base_url=server.base_url, api_key=user, max_retries=0)
    assert only(ask(client).output, "mcp_call").output == RAN + COMMAND
    status, _, usage = server.get("/v1/usage", {"Authorization": f"Bearer {user}"})
    assert status == 200, usage
    assert usage["total"]["mcp_calls"] == 1 and usage["total"]["requests"] == 1
    assert 0 < usage["total"]["mcp_seconds"] < CALL_TIMEOUT
    assert server.get("/v1/mcp/servers", {"Authorization": f"Bearer {user}"})[0] == 403
    listed = server.get("/v1/mcp/servers", {"Authorization": f"Bearer {admin}"})
    assert listed[0] == 200 and listed[2]["data"][0]["name"] == "tests"


def test_a_config_file_that_is_not_mcp_servers_stops_the_start(tmp_path):
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"x": {"args": []}}}))
    done = subprocess.run(
        [sys.executable, "-m", "mlxserve", "--mcp-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "mcpServers.x: give either `command` (stdio) or `url` (HTTP)" in done.stderr


def _children(pid: int, needle: str) -> list[int]:
    """The processes `pid` started whose command line holds `needle`."""
    children = psutil.Process(pid).children()
    return [child.pid for child in children if needle in " ".join(child.cmdline())]


# Anthropic's MCP connector ------------------------------------------------------------


def connector_request(remote_url: str, **extra) -> dict:
    server = {"type": "url", "url": remote_url, "name": "remote", **extra.pop("server", {})}
    return {
        "model": "default",
        "max_tokens": 200,
        "messages": [{"role": "user", "content": instruction("bash")}],
        "mcp_servers": [server],
        "betas": ["mcp-client-2025-04-04"],
        **extra,
    }


@pytest.fixture(scope="module")
def claude(mcp_server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=mcp_server.url, api_key="none", max_retries=0)


def test_the_connector_runs_a_call_within_the_assistants_message(claude, remote_url):
    message = claude.beta.messages.create(**connector_request(remote_url))
    assert [b.type for b in message.content] == ["mcp_tool_use", "mcp_tool_result", "text"]
    use, result, text = message.content
    assert (use.name, use.server_name, use.input) == ("bash", "remote", {"command": COMMAND})
    assert use.id.startswith("mcptoolu_") and result.tool_use_id == use.id
    assert not result.is_error and [c.text for c in result.content] == [RAN + COMMAND]
    assert text.text == AGENT_REPLY and message.stop_reason == "end_turn"
    assert message.usage.cache_read_input_tokens > 0  # the second round continued the first
    # the message goes back as history: the next turn reads its blocks
    history = [
        *connector_request(remote_url)["messages"],
        {
            "role": "assistant",
            "content": [b.model_dump(exclude_none=True) for b in message.content],
        },
        {"role": "user", "content": "Hello!"},
    ]
    again = claude.beta.messages.create(**connector_request(remote_url, messages=history))
    assert again.content[-1].type == "text"


def test_the_connector_streams_as_anthropic_does(claude, remote_url):
    with claude.beta.messages.stream(**connector_request(remote_url)) as events:
        seen = [(e.type, getattr(e, "index", None)) for e in events]
        final = events.get_final_message()
    starts = [(kind, index) for kind, index in seen if kind == "content_block_start"]
    assert [index for _, index in starts] == [0, 1, 2]
    stops = [index for kind, index in seen if kind == "content_block_stop"]
    assert stops == [0, 1, 2]
    assert seen[0][0] == "message_start" and seen[-1][0] == "message_stop"
    assert [b.type for b in final.content] == ["mcp_tool_use", "mcp_tool_result", "text"]
    assert final.content[0].input == {"command": COMMAND}
    assert final.content[1].content[0].text == RAN + COMMAND
    assert final.content[2].text == AGENT_REPLY and final.stop_reason == "end_turn"


def test_the_connectors_tool_configurations(claude, remote_url):
    toolset = {
        "type": "mcp_toolset",
        "mcp_server_name": "remote",
        "default_config": {"enabled": False},
        "configs": {"bash": {"enabled": True}},
    }
    newer = connector_request(remote_url, tools=[toolset], betas=["mcp-client-2025-11-20"])
    message = claude.beta.messages.create(**newer)
    assert [b.type for b in message.content] == ["mcp_tool_use", "mcp_tool_result", "text"]
    off = connector_request(remote_url, server={"tool_configuration": {"enabled": False}})
    message = claude.beta.messages.create(**off)
    assert "mcp_tool_use" not in [b.type for b in message.content]


def test_the_connector_refuses_what_the_operator_does_not_allow(claude, remote_url):
    cases = [
        (connector_request("http://example.com/mcp"), "--mcp-allow-url"),
        (connector_request(METADATA_PATTERN.replace("*", "mcp")), "link-local"),
        (
            connector_request(
                remote_url, tools=[{"type": "mcp_toolset", "mcp_server_name": "other"}]
            ),
            "not among mcp_servers",
        ),
    ]
    for request, words in cases:
        with pytest.raises(anthropic.BadRequestError) as refused:
            claude.beta.messages.create(**request)
        assert refused.value.body["error"]["type"] == "invalid_request_error"
        assert words in refused.value.body["error"]["message"], refused.value.body
