"""Drive `promptforge mcp` at the wire and as a process: what no SDK client
sends on purpose (a malformed line, an unknown method, ping before
initialize, an oversized body, a foreign Host), clients that vanish mid-call,
a call that outlives --call-timeout, and SIGTERM while runs are going.

Usage:
  protocol.py stdio BIN PROMPTS_DIR     the stdio server, line by line
  protocol.py http BIN PROMPTS_DIR      HTTP servers started here

PROMPTFORGE_HOME must point at a private data directory: the run log there is
read to check how the runs ended. Each check prints `ok NAME`; the first
failure raises. Waits never assert on time except the SIGTERM bound, which is
the behaviour under test (10 s, with the server's own grace at 6 s).
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

HANG_GUARD_SECONDS = 120
MODERN = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def runs(bin_path, outcome=None):
    args = [bin_path, "runs", "--json", "-n", "200"]
    if outcome:
        args += ["--outcome", outcome]
    listed = subprocess.run(args, capture_output=True, check=True)
    return json.loads(listed.stdout)


def wait_for(what, predicate, guard=HANG_GUARD_SECONDS):
    deadline = time.monotonic() + guard
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"never happened: {what}")


class StdioServer:
    def __init__(self, bin_path, prompts_dir, *extra):
        self.proc = subprocess.Popen(
            [bin_path, "mcp", prompts_dir, *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=dict(os.environ, PROMPTFORGE_LOG="warn"),
        )

    def send(self, line):
        self.proc.stdin.write(line if isinstance(line, bytes) else line.encode())
        self.proc.stdin.write(b"\n")
        self.proc.stdin.flush()

    def request(self, id, method, params=None):
        message = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(json.dumps(message))

    def answer(self):
        line = self.proc.stdout.readline()
        check(line, "the server answered before closing")
        return json.loads(line)

    def answers(self, count):
        """`count` answers, by id (a parse error's id is None)."""
        got = {}
        for _ in range(count):
            answer = self.answer()
            got[answer.get("id")] = answer
        return got


def stdio_protocol(bin_path, prompts_dir):
    # A 2026-07-28 client: no initialize; every request carries its revision in _meta.
    server = StdioServer(bin_path, prompts_dir, "--max-body", "4096")
    server.request(1, "ping")
    check(server.answer() == {"jsonrpc": "2.0", "id": 1, "result": {}}, "ping first")
    server.request(2, "server/discover", {"_meta": META})
    discover = server.answer()
    versions = discover["result"]["supportedVersions"]
    check(MODERN in versions and "2025-06-18" in versions and "2024-11-05" in versions, json.dumps(discover))
    server.request(3, "no/such-method", {"_meta": META})
    check(server.answer()["error"]["code"] == -32601, "unknown method")
    # A malformed line: a parse error with id null, and the session goes on.
    server.send(b'{"jsonrpc": "2.0", "id": 4, "method": ')
    parse_error = server.answer()
    check(parse_error["id"] is None and parse_error["error"]["code"] == -32700, json.dumps(parse_error))
    # A line over --max-body: refused unread, the session goes on.
    server.send(json.dumps({"jsonrpc": "2.0", "id": 5, "method": "ping", "params": {"pad": "x" * 8000}}))
    too_big = server.answer()
    check(too_big["error"]["code"] == -32600 and "--max-body" in too_big["error"]["message"], json.dumps(too_big))
    server.request(6, "tools/call", {"name": "echo", "arguments": {"prose": "modern"}, "_meta": META})
    check(server.answer()["result"]["content"][0]["text"] == "echo: modern", "a call after it all")
    server.proc.stdin.close()
    server.proc.wait(timeout=30)

    # An earlier-revision client: ping before initialize, then the handshake.
    server = StdioServer(bin_path, prompts_dir, "--max-body", "4096")
    server.request(1, "ping")
    check(server.answer() == {"jsonrpc": "2.0", "id": 1, "result": {}}, "ping before initialize")
    server.request(
        2,
        "initialize",
        {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
    )
    check(server.answer()["result"]["protocolVersion"] == "2025-06-18", "initialize")
    server.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
    server.request(3, "no/such-method")
    unknown = server.answer()
    check(unknown.get("error", {}).get("code") == -32601, f"unknown method after initialize: {unknown}")
    server.send(b"\x00\xffnot json at all")
    check(server.answer()["error"]["code"] == -32700, "a malformed line after initialize")
    server.request(4, "tools/list")
    tools = {t["name"] for t in server.answer()["result"]["tools"]}
    check("echo" in tools, f"tools/list still answered: {sorted(tools)}")
    server.request(5, "tools/call", {"name": "echo", "arguments": {"prose": "still here"}})
    check(server.answer()["result"]["content"][0]["text"] == "echo: still here", "a call after it all")
    print("ok stdio_protocol")

    # A killed client: stdin closes mid-call. The server cancels the run,
    # logs it as cancelled, and exits.
    before = len(runs(bin_path, "cancelled"))
    server.request(10, "tools/call", {"name": "spin", "arguments": {"index": 0}})
    wait_for("the spin run started", lambda: len(runs(bin_path, "running")) == 1)
    server.proc.stdin.close()
    server.proc.wait(timeout=30)
    check(runs(bin_path, "running") == [], "no run left running")
    check(len(runs(bin_path, "cancelled")) == before + 1, "the run ended cancelled")
    print("ok stdio_killed_client")


class HttpServer:
    def __init__(self, bin_path, prompts_dir, *extra):
        self.proc = subprocess.Popen(
            [bin_path, "mcp", prompts_dir, "--http", "127.0.0.1:0", *extra],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=dict(os.environ, PROMPTFORGE_LOG="info"),
        )
        self.log = []
        self.url = None
        ready = threading.Event()

        def drain():
            for raw in self.proc.stderr:
                line = raw.decode(errors="replace")
                self.log.append(line)
                if line.startswith("promptforge mcp: listening on "):
                    self.url = line.split()[-1]
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        check(ready.wait(HANG_GUARD_SECONDS) and self.url, "the server printed its address")
        self.port = int(self.url.split(":")[2].split("/")[0])

    def logged(self, text):
        return any(text in line for line in self.log)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": MODERN,
}


def modern(id, method, params=None, headers=None, progress=None):
    """A stateless 2026-07-28 request: the body and the headers it needs."""
    meta = dict(META, progressToken=progress) if progress else META
    params = dict(params or {}, _meta=meta)
    extra = {"Mcp-Method": method}
    if method == "tools/call":
        extra["Mcp-Name"] = params["name"]
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params}, dict(HEADERS, **extra, **(headers or {}))


def sse_answer(response):
    for line in response.text.splitlines():
        if line.startswith("data: ") and line[6:].strip():
            return json.loads(line[6:])
    return response.json()


async def http_protocol(bin_path, prompts_dir):
    server = HttpServer(bin_path, prompts_dir, "--max-body", "4096")
    try:
        async with httpx2.AsyncClient(timeout=60) as http:
            body, headers = modern(1, "server/discover")
            discover = sse_answer(await http.post(server.url, json=body, headers=headers))
            check(MODERN in discover["result"]["supportedVersions"], json.dumps(discover))
            body, headers = modern(2, "no/such-method")
            unknown = sse_answer(await http.post(server.url, json=body, headers=headers))
            check(unknown["error"]["code"] == -32601, json.dumps(unknown))
            bad = await http.post(server.url, content=b'{"jsonrpc": "2.0", "id": 3, ', headers=HEADERS)
            check(bad.status_code == 400 and bad.json()["error"]["code"] == -32700, f"{bad.status_code} {bad.text}")
            # Over the limit: refused from the declared length, before the body is read.
            big = await http.post(server.url, content=b"x" * 8000, headers=HEADERS)
            check(big.status_code == 413, f"body limit: {big.status_code}")

            async def chunks():
                # Over the limit only with its last chunk, so the client has sent
                # it all and reads the answer (not a reset) when it comes.
                for _ in range(5):
                    yield b"x" * 1000

            async with httpx2.AsyncClient(timeout=60) as fresh:
                chunked = await fresh.post(server.url, content=chunks(), headers=HEADERS)
            check(chunked.status_code == 413, f"body limit, no length: {chunked.status_code}")
            # DNS rebinding: a foreign Host is refused, a loopback one is not.
            body, headers = modern(4, "server/discover")
            rebound = await http.post(server.url, json=body, headers=dict(headers, Host=f"evil.example:{server.port}"))
            check(rebound.status_code == 403, f"foreign Host: {rebound.status_code}")
            local = await http.post(server.url, json=body, headers=dict(headers, Host=f"localhost:{server.port}"))
            check(local.status_code == 200, f"localhost Host: {local.status_code}")
            origin = await http.post(server.url, json=body, headers=dict(headers, Origin="https://evil.example"))
            check(origin.status_code == 403, f"foreign Origin: {origin.status_code}")
        print("ok http_protocol")
    finally:
        server.stop()


async def http_client_gone(bin_path, prompts_dir):
    """One run slot. A client starts a call and disappears without a cancel or
    a DELETE, once after the response stream opened (its first progress) and
    once before; the server ends each run, and a later call gets the slot."""
    server = HttpServer(bin_path, prompts_dir, "--max-concurrent", "1", "--queue", "4")
    try:
        cancelled_before = len(runs(bin_path, "cancelled"))
        for index, progress in [(0, "p0"), (1, None)]:
            body, headers = modern(index, "tools/call", {"name": "spin", "arguments": {"index": index}}, progress=progress)
            async with httpx2.AsyncClient(timeout=HANG_GUARD_SECONDS) as http:
                if progress:
                    async with http.stream("POST", server.url, json=body, headers=headers) as response:
                        check(response.status_code == 200, f"spin: {response.status_code}")
                        async for line in response.aiter_lines():
                            if "notifications/progress" in line:
                                break
                    # Leaving the block closed the connection mid-stream.
                else:
                    with anyio.move_on_after(HANG_GUARD_SECONDS) as waiting:

                        async def abandon():
                            with anyio.CancelScope() as scope:
                                abandon.scope = scope
                                await http.post(server.url, json=body, headers=headers)

                        async with anyio.create_task_group() as tg:
                            tg.start_soon(abandon)
                            while len(runs(bin_path, "running")) < 1:
                                await anyio.sleep(0.1)
                            abandon.scope.cancel()
                    check(not waiting.cancelled_caught, "the run started")
            async with Client(
                streamable_http_client(server.url, http_client=create_mcp_http_client()), mode="auto"
            ) as client:
                with anyio.fail_after(HANG_GUARD_SECONDS):
                    result = await client.call_tool("echo", {"prose": "after"})
                check(result.content[0].text == "echo: after", result.content[0].text)
            check(len(runs(bin_path, "cancelled")) == cancelled_before + index + 1, "the abandoned run ended cancelled")
        # A client of an earlier revision, in a session, gone mid-stream.
        async with httpx2.AsyncClient(timeout=HANG_GUARD_SECONDS) as http:
            legacy = dict(HEADERS, **{"MCP-Protocol-Version": "2025-06-18"})
            opened = await http.post(
                server.url,
                json={
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": "2025-06-18",
                        "capabilities": {},
                        "clientInfo": {"name": "raw", "version": "1"},
                    },
                },
                headers=legacy,
            )
            check(opened.status_code == 200, f"initialize: {opened.status_code} {opened.text}")
            session = dict(legacy, **{"Mcp-Session-Id": opened.headers["mcp-session-id"]})
            await http.post(server.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
            call = {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "spin", "arguments": {"index": 2}, "_meta": {"progressToken": "p2"}},
            }
            async with http.stream("POST", server.url, json=call, headers=session) as response:
                async for line in response.aiter_lines():
                    if "notifications/progress" in line:
                        break
        async with Client(streamable_http_client(server.url, http_client=create_mcp_http_client())) as client:
            with anyio.fail_after(HANG_GUARD_SECONDS):
                result = await client.call_tool("echo", {"prose": "after"})
            check(result.content[0].text == "echo: after", result.content[0].text)
        check(len(runs(bin_path, "cancelled")) == cancelled_before + 3, "the abandoned session call ended cancelled")
        print(f"ok http_client_gone (a call ended by the server's grace: {server.logged('the client is gone')})")
    finally:
        server.stop()


async def http_call_timeout(bin_path, prompts_dir):
    server = HttpServer(bin_path, prompts_dir, "--call-timeout", "2")
    try:
        async with Client(streamable_http_client(server.url, http_client=create_mcp_http_client())) as client:
            with anyio.fail_after(HANG_GUARD_SECONDS):
                result = await client.call_tool("spin", {"index": 0})
            text = result.content[0].text
            check(result.is_error and "--call-timeout of 2 s" in text, text)
            check(result.structured_content["outcome"] == "cancelled", json.dumps(result.structured_content))
            # The slot came back.
            result = await client.call_tool("echo", {"prose": "next"})
            check(result.content[0].text == "echo: next", result.content[0].text)
        print("ok http_call_timeout")
    finally:
        server.stop()


async def http_sigterm_under_load(bin_path, prompts_dir):
    """SIGTERM with every slot busy and calls queued: the server is gone
    within 10 s, and every run it started is logged as cancelled."""
    server = HttpServer(bin_path, prompts_dir, "--max-concurrent", "2", "--queue", "4")
    try:
        running_before = len(runs(bin_path, "running"))
        check(running_before == 0, "no run running before")
        cancelled_before = len(runs(bin_path, "cancelled"))
        async with anyio.create_task_group() as tg:

            async def spin(index):
                body, headers = modern(index, "tools/call", {"name": "spin", "arguments": {"index": index}})
                try:
                    async with httpx2.AsyncClient(timeout=60) as http:
                        await http.post(server.url, json=body, headers=headers)
                except httpx2.HTTPError:
                    pass  # the server went away: expected

            for index in range(4):
                tg.start_soon(spin, index)
            with anyio.fail_after(HANG_GUARD_SECONDS):
                while len(runs(bin_path, "running")) < 2:
                    await anyio.sleep(0.1)
            began = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            await anyio.to_thread.run_sync(lambda: server.proc.wait(timeout=30))
            took = time.monotonic() - began
            check(took < 10, f"stopped {took:.1f} s after SIGTERM")
        check(runs(bin_path, "running") == [], "no run left running")
        # A queued call may take a freed slot while the server stops: its run
        # is cancelled too. What matters is that none is left running.
        cancelled = len(runs(bin_path, "cancelled")) - cancelled_before
        check(2 <= cancelled <= 4, f"every started run ended cancelled ({cancelled})")
        print(f"ok http_sigterm_under_load ({took:.1f} s)")
    finally:
        server.stop()


async def main(argv):
    mode, bin_path, prompts_dir = argv[1], argv[2], argv[3]
    check(os.environ.get("PROMPTFORGE_HOME"), "PROMPTFORGE_HOME is set to a private directory")
    if mode == "stdio":
        await anyio.to_thread.run_sync(stdio_protocol, bin_path, prompts_dir)
    elif mode == "http":
        for scenario in [http_protocol, http_client_gone, http_call_timeout, http_sigterm_under_load]:
            with anyio.fail_after(HANG_GUARD_SECONDS * 2):
                await scenario(bin_path, prompts_dir)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    anyio.run(main, sys.argv)
