#!/usr/bin/env python3
"""A small MCP server over stdio (newline-delimited JSON-RPC 2.0) for the pf-plugins tests,
good and bad behaviour alike.

Usage: mcp_server.py SPEC.json
SPEC.json: {"fail_start": false,          # exit 3 before reading anything
            "pid_file": "path",           # write our pid here at start
            "ignore_eof": false,          # keep running after stdin closes
            "page_size": 0,               # paginate tools/list with this many tools per page
            "ignore_term": false,         # ignore SIGTERM too (only SIGKILL ends us)
            "helper_pid_file": "path",    # start a helper process in our group, write its pid here
            "env_file": "path",           # write our environment here as JSON at start
            "stderr_lines": ["..."],      # written to stderr at start
            "list": "ok" | "silent",      # how to answer tools/list
            "init": "ok" | "silent" | "garbage" | "garbage_forever" | "wrong_id",
            "tools": [{"name": "...", "description": "...", "inputSchema": {...},
                       "outputSchema": {...},                       # optional
                       "result": {"texts": ["a", "b"]}              # several text parts
                               | {"structured": {...}, "text": "..."}   # structuredContent (+ text)
                               # a text's {{ARGS}} is the call's arguments, {{ENV:NAME}} a variable's value
                               | {"error": "text"}                  # isError result
                               | {"rpc_error": "message"}           # JSON-RPC error
                               | {"behaviour": "exit" | "silent" | "huge" | "malformed" | "garbage_then_text"
                                             | "wrong_id" | "garbage_only" | "null_id_error" | "no_result",
                                  "size": 100000, "text": "..."}}]}
"""
import json, os, re, signal, subprocess, sys, time

spec = json.load(open(sys.argv[1]))
if spec.get("pid_file"):
    with open(spec["pid_file"], "w") as f:
        f.write(str(os.getpid()))
if spec.get("env_file"):
    with open(spec["env_file"], "w") as f:
        json.dump(dict(os.environ), f)
if spec.get("ignore_term"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if spec.get("helper_pid_file"):
    helper = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(spec["helper_pid_file"], "w") as f:
        f.write(str(helper.pid))
for line in spec.get("stderr_lines", []):
    sys.stderr.write(line + "\n")
sys.stderr.flush()
if spec.get("fail_start"):
    sys.exit(3)


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def reply(i, result=None, error=None):
    msg = {"jsonrpc": "2.0", "id": i}
    if error is not None:
        msg["error"] = error
    else:
        msg["result"] = result
    send(msg)


def describe(t):
    d = {"name": t["name"], "description": t.get("description", ""),
         "inputSchema": t.get("inputSchema", {"type": "object"})}
    if "outputSchema" in t:
        d["outputSchema"] = t["outputSchema"]
    return d


def call(i, params):
    t = next((t for t in spec.get("tools", []) if t["name"] == params.get("name")), None)
    if t is None:
        reply(i, error={"code": -32602, "message": f"unknown tool {params.get('name')}"})
        return
    r = t.get("result", {"texts": [""]})
    args = json.dumps(params.get("arguments", {}), sort_keys=True)
    b = r.get("behaviour")
    if b == "exit":
        sys.exit(1)
    if b == "silent":
        return
    if b == "huge":
        reply(i, {"content": [{"type": "text", "text": "x" * r.get("size", 100000)}]})
        return
    if b == "malformed":
        send({"jsonrpc": "2.0", "id": i, "result": {"content": "not a list", "isError": "maybe"}})
        return
    if b == "wrong_id":
        reply(i + 1000, {"content": [{"type": "text", "text": "for someone else"}]})
        return
    if b == "garbage_only":
        sys.stdout.write("<html>not json</html>\n")
        sys.stdout.write("\x1b[2Jstill not json\n")
        sys.stdout.flush()
        return
    if b == "null_id_error":
        send({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}})
        return
    if b == "no_result":
        send({"jsonrpc": "2.0", "id": i})
        return
    if b == "garbage_then_text":
        sys.stdout.write("this is not json at all\n")
        sys.stdout.write("{\"half\": \n")
        sys.stdout.flush()
        reply(i, {"content": [{"type": "text", "text": r.get("text", "")}]})
        return
    if "rpc_error" in r:
        reply(i, error={"code": -32000, "message": r["rpc_error"]})
    elif "error" in r:
        reply(i, {"content": [{"type": "text", "text": r["error"]}], "isError": True})
    elif "structured" in r:
        content = [{"type": "text", "text": r.get("text", json.dumps(r["structured"]))}]
        reply(i, {"content": content, "structuredContent": r["structured"]})
    else:
        texts = [re.sub(r"\{\{ENV:(\w+)\}\}", lambda m: os.environ.get(m.group(1), ""),
                        x.replace("{{ARGS}}", args)) for x in r.get("texts", [])]
        reply(i, {"content": [{"type": "text", "text": x} for x in texts]})


def main():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        req = json.loads(line)
        method, i = req.get("method"), req.get("id")
        if i is None:
            continue
        if method == "initialize":
            mode = spec.get("init", "ok")
            if mode == "silent":
                continue
            if mode == "garbage":
                sys.stdout.write("hello, I am not an MCP server\n")
                sys.stdout.flush()
                sys.exit(0)
            if mode == "garbage_forever":
                sys.stdout.write("Welcome! Type help for help.\n")
                sys.stdout.flush()
                continue
            if mode == "wrong_id":
                reply(i + 7, {"protocolVersion": "2025-06-18", "capabilities": {},
                              "serverInfo": {"name": "test", "version": "1"}})
                continue
            reply(i, {"protocolVersion": req.get("params", {}).get("protocolVersion", "2025-06-18"),
                      "capabilities": {"tools": {}}, "serverInfo": {"name": "test", "version": "1"}})
        elif method == "tools/list":
            if spec.get("list") == "silent":
                continue
            tools = [describe(t) for t in spec.get("tools", [])]
            size = spec.get("page_size", 0)
            if size:
                start = int((req.get("params") or {}).get("cursor") or 0)
                page = {"tools": tools[start:start + size]}
                if start + size < len(tools):
                    page["nextCursor"] = str(start + size)
                reply(i, page)
            else:
                reply(i, {"tools": tools})
        elif method == "tools/call":
            call(i, req.get("params", {}))
        elif method == "ping":
            reply(i, {})
        else:
            reply(i, error={"code": -32601, "message": f"method not found: {method}"})
    if spec.get("ignore_eof") or spec.get("ignore_term"):
        while True:
            time.sleep(1)


try:
    main()
except BrokenPipeError:
    # The client closed our stdout (gave up on us): that is the end, as on
    # stdin's end. On a loaded machine it can come before our first write.
    os._exit(0)
