"""Drive `promptforge mcp` with the official MCP Python SDK client.

Usage:
  scenarios.py stdio BIN PROMPTS_DIR ERRLOG   start the server over stdio and run every scenario
  scenarios.py http URL TOKEN PROMPTS_DIR     connect to a running HTTP server and run every scenario
  scenarios.py auth URL TOKEN                 the bearer check: no token and a wrong one refused, the right one accepted

Each scenario prints `ok NAME`; the first failure raises, and the script exits non-zero.
Waits never assert on time: they wait for the event itself, with a generous hang guard.
"""

import contextlib
import json
import os
import sys

import anyio
import httpx2
import mcp.types as types
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

# Only a guard against a hang: no scenario depends on how long anything takes.
HANG_GUARD_SECONDS = 120


class Connection:
    """How to reach the server: a command to start (stdio) or a URL (HTTP)."""

    def __init__(self, mode, target, token=None, errlog=None):
        self.mode, self.target, self.token, self.errlog = mode, target, token, errlog

    @contextlib.asynccontextmanager
    async def session(self, elicitation_callback=None, message_handler=None):
        async with contextlib.AsyncExitStack() as stack:
            if self.mode == "stdio":
                bin_path, prompts_dir = self.target
                params = StdioServerParameters(
                    command=bin_path,
                    args=["mcp", prompts_dir, "--max-concurrent", "2", "--queue", "1"],
                    env=dict(os.environ, PROMPTFORGE_LOG="info"),
                )
                errlog = stack.enter_context(open(self.errlog, "a"))
                read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
            else:
                headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
                client = await stack.enter_async_context(create_mcp_http_client(headers=headers))
                read, write = await stack.enter_async_context(
                    streamable_http_client(self.target, http_client=client)
                )
            session = await stack.enter_async_context(
                ClientSession(
                    read,
                    write,
                    elicitation_callback=elicitation_callback,
                    message_handler=message_handler,
                )
            )
            await session.initialize()
            yield session

    def transport(self, stack_errlog=None):
        """A transport for the SDK's high-level `Client` (which does its own handshake)."""
        if self.mode == "stdio":
            bin_path, prompts_dir = self.target
            return StdioServerParameters(
                command=bin_path,
                args=["mcp", prompts_dir, "--max-concurrent", "2", "--queue", "1"],
                env=dict(os.environ, PROMPTFORGE_LOG="warn"),
            )
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        return streamable_http_client(self.target, http_client=create_mcp_http_client(headers=headers))


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def text_of(result):
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def tools_and_schemas(conn, prompts_dir):
    async with conn.session() as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
        for name in ["echo", "search", "fails", "ask", "spin", "dup", "dup_2"]:
            check(name in tools, f"tool {name} listed: {sorted(tools)}")
        check("broken" not in tools, "a prompt that does not parse is left out")
        echo = tools["echo"]
        check(echo.description == "Echo the caller's text", echo.description)
        check(
            echo.input_schema
            == {
                "type": "object",
                "properties": {"prose": {"type": "string", "description": "Freeform input for this prompt"}},
            },
            json.dumps(echo.input_schema),
        )
        search = tools["search"]
        check(
            search.input_schema
            == {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What to search for"},
                    "limit": {"type": "integer", "default": 3},
                },
                "required": ["query"],
            },
            json.dumps(search.input_schema),
        )
        check(search.output_schema is not None and "outcome" in search.output_schema["properties"], "outputSchema")
    print("ok tools_and_schemas")


async def call_and_fail(conn, prompts_dir):
    async with conn.session() as s:
        await s.list_tools()
        echo = await s.call_tool("echo", {"prose": "  hello there"})
        check(not echo.is_error, text_of(echo))
        check(text_of(echo) == "echo:   hello there", repr(text_of(echo)))
        report = echo.structured_content
        check(report["outcome"] == "completed" and report["result"] == "echo:   hello there", json.dumps(report))
        check(report["execution"].startswith("run-"), json.dumps(report))

        search = await s.call_tool("search", {"query": "papers", "limit": 5})
        check(text_of(search) == "papers/5", text_of(search))

        fails = await s.call_tool("fails", {})
        check(fails.is_error, "a failed run is isError")
        check(text_of(fails).startswith("error[Lua]: ") and "boom" in text_of(fails), text_of(fails))
        check(fails.structured_content["error"]["kind"] == "Lua", json.dumps(fails.structured_content))
    print("ok call_and_fail")


async def progress(conn, prompts_dir):
    seen = []

    async def on_progress(value, total, message):
        seen.append((value, message))

    async with conn.session() as s:
        result = await s.call_tool("echo", {"prose": "x"}, progress_callback=on_progress)
        check(not result.is_error, text_of(result))
    messages = [m for _, m in seen]
    check(
        messages == ["section Echo Prose", "Echo Prose: log: first", "section Second", "Second: log: second"],
        repr(messages),
    )
    check([v for v, _ in seen] == [1.0, 2.0, 3.0, 4.0], repr(seen))

    # A tool call's progress names the tool.
    seen.clear()
    async with conn.session() as s:
        result = await s.call_tool("notes", {}, progress_callback=on_progress)
        check(text_of(result) == "got hi", text_of(result))
    messages = [m for _, m in seen]
    check("Take notes: tool grab succeeded" in messages, repr(messages))
    print("ok progress")


async def every_client_mode(conn, prompts_dir):
    """The SDK's default `Client` (mode "auto": server/discover first, the
    2026-07-28 revision), the pinned modern revision, and the legacy handshake
    all connect, list, call and see progress."""
    for mode, version in [("auto", "2026-07-28"), ("2026-07-28", "2026-07-28"), ("legacy", None)]:
        seen = []

        async def on_progress(value, total, message):
            seen.append(message)

        async with Client(conn.transport(), mode=mode) as client:
            if version is not None:
                check(client.protocol_version == version, f"{mode}: {client.protocol_version}")
            tools = {t.name for t in (await client.list_tools()).tools}
            check("echo" in tools, f"{mode}: {sorted(tools)}")
            result = await client.call_tool("echo", {"prose": mode}, progress_callback=on_progress)
            check(text_of(result) == f"echo: {mode}", f"{mode}: {text_of(result)}")
            check("Second: log: second" in seen, f"{mode}: progress {seen!r}")
            failed = await client.call_tool("fails", {})
            check(failed.is_error, f"{mode}: a failed run is isError")
    print("ok every_client_mode")


async def seeds(conn, prompts_dir):
    """Seeds in structuredContent stay exact in a double (JavaScript clients)."""
    async with conn.session() as s:
        for _ in range(8):
            report = (await s.call_tool("echo", {"prose": "x"})).structured_content
            seed = report["seed"]
            check(isinstance(seed, int) and 0 <= seed < 2**53, repr(seed))
            check(int(float(seed)) == seed, repr(seed))
    print("ok seeds")


async def elicitation(conn, prompts_dir):
    async def answer(context, params):
        check("Your name?" in params.message, params.message)
        return types.ElicitResult(action="accept", content={"answer": "Ada"})

    async with conn.session(elicitation_callback=answer) as s:
        result = await s.call_tool("ask", {})
        check(text_of(result) == "true:Ada", text_of(result))
    async with conn.session() as s:
        # No elicitation capability: input is unavailable, and the run goes on (guide ch. 05).
        result = await s.call_tool("ask", {})
        check(
            text_of(result) == "false:User input is unavailable in this host; continue without it.",
            text_of(result),
        )
    print("ok elicitation")


async def cancel_and_concurrency(conn, prompts_dir):
    """`spin` asks (so we know it runs), then loops until cancelled. Two spins hold
    both run slots (the stdio server runs with --max-concurrent 2 --queue 1)."""
    asked = [anyio.Event(), anyio.Event()]

    async def answer(context, params):
        index = int(params.message.split()[-1])
        asked[index].set()
        return types.ElicitResult(action="accept", content={"answer": "go"})

    async with conn.session(elicitation_callback=answer) as s:
        await s.list_tools()
        with anyio.fail_after(HANG_GUARD_SECONDS):
            async with anyio.create_task_group() as tg:

                async def spin(index):
                    with anyio.CancelScope() as scope:
                        spinning[index] = scope
                        await s.call_tool("spin", {"index": index})

                spinning = [None, None]
                tg.start_soon(spin, 0)
                tg.start_soon(spin, 1)
                await asked[0].wait()
                await asked[1].wait()
                # Both runs are going at once: concurrent calls.
                # Abandoning a call sends notifications/cancelled, which cancels its run.
                spinning[0].cancel()
                spinning[1].cancel()
            # The cancelled runs gave their slots back: this call runs (it would queue forever otherwise).
            result = await s.call_tool("echo", {"prose": "after"})
            check(text_of(result) == "echo: after", text_of(result))
    print("ok cancel_and_concurrency")


async def queue_bound(conn, prompts_dir):
    """With both slots busy and the one queue place taken, a further call is refused."""
    asked = [anyio.Event(), anyio.Event()]

    async def answer(context, params):
        asked[int(params.message.split()[-1])].set()
        return types.ElicitResult(action="accept", content={"answer": "go"})

    async with conn.session(elicitation_callback=answer) as s:
        await s.list_tools()
        with anyio.fail_after(HANG_GUARD_SECONDS):
            async with anyio.create_task_group() as tg:
                scopes = []

                async def call(name, args):
                    with anyio.CancelScope() as scope:
                        scopes.append(scope)
                        await s.call_tool(name, args)

                tg.start_soon(call, "spin", {"index": 0})
                tg.start_soon(call, "spin", {"index": 1})
                await asked[0].wait()
                await asked[1].wait()
                # Two more calls for the one queue place: whichever the server
                # counts first waits, the other is refused.
                refused = []
                done = anyio.Event()

                async def extra(tag):
                    with anyio.CancelScope() as scope:
                        scopes.append(scope)
                        result = await s.call_tool("echo", {"prose": tag})
                        if result.is_error:
                            refused.append(text_of(result))
                            done.set()

                tg.start_soon(extra, "a")
                tg.start_soon(extra, "b")
                await done.wait()
                check(len(refused) == 1, repr(refused))
                check(refused[0].startswith("busy: 2 runs are going and 1 calls already wait"), refused[0])
                for scope in scopes:
                    scope.cancel()
    print("ok queue_bound")


async def list_changed(conn, prompts_dir):
    changed = anyio.Event()

    async def on_message(message):
        if isinstance(message, types.ServerNotification) or hasattr(message, "root"):
            inner = getattr(message, "root", message)
            if isinstance(inner, types.ToolListChangedNotification):
                changed.set()
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    new_file = os.path.join(prompts_dir, "added.md")
    async with conn.session(message_handler=on_message) as s:
        before = {t.name for t in (await s.list_tools()).tools}
        check("added" not in before, "added is not there yet")
        with open(new_file, "w") as f:
            f.write(PROMPT_ADDED)
        with anyio.fail_after(HANG_GUARD_SECONDS):
            await changed.wait()
        after = {t.name for t in (await s.list_tools()).tools}
        check("added" in after, f"added is listed after the change: {sorted(after)}")
        result = await s.call_tool("added", {})
        check(text_of(result) == "added", text_of(result))
    os.remove(new_file)
    print("ok list_changed")


PROMPT_ADDED = """---
name: added
description: Added while the server runs
promptforge: 0
---

# Added

## Only

```lua
return 'added'
```
"""


async def auth(url, token):
    async with httpx2.AsyncClient() as client:
        body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        missing = await client.post(url, json=body, headers=headers)
        check(missing.status_code == 401, f"no token: {missing.status_code}")
        # The refusal closes the connection and says so, so the next request
        # goes on a new one instead of racing the close.
        check(missing.headers.get("connection") == "close", f"no token: {dict(missing.headers)}")
        wrong = await client.post(url, json=body, headers=dict(headers, Authorization="Bearer nope"))
        check(wrong.status_code == 401, f"wrong token: {wrong.status_code}")
    conn = Connection("http", url, token=token)
    async with conn.session() as s:
        tools = (await s.list_tools()).tools
        check(any(t.name == "echo" for t in tools), "the right token lists tools")
    print("ok auth")


SCENARIOS = [
    tools_and_schemas,
    call_and_fail,
    progress,
    every_client_mode,
    seeds,
    elicitation,
    cancel_and_concurrency,
    list_changed,
]


async def main(argv):
    mode = argv[1]
    if mode == "stdio":
        bin_path, prompts_dir, errlog = argv[2], argv[3], argv[4]
        conn = Connection("stdio", (bin_path, prompts_dir), errlog=errlog)
        scenarios = SCENARIOS + [queue_bound]
    elif mode == "http":
        url, token, prompts_dir = argv[2], argv[3], argv[4]
        conn = Connection("http", url, token=token)
        scenarios = SCENARIOS
    elif mode == "auth":
        await auth(argv[2], argv[3])
        return
    else:
        raise SystemExit(f"unknown mode {mode}")
    for scenario in scenarios:
        with anyio.fail_after(HANG_GUARD_SECONDS * 2):
            await scenario(conn, prompts_dir)


if __name__ == "__main__":
    anyio.run(main, sys.argv)
