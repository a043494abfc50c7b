#!/usr/bin/env python3
"""A local OpenAI-compatible chat-completions mock for the `promptforge test`
benchmark: every POST gets the same one-round answer. Prints its port, then
serves until killed. With `--load N J URL` it is instead the bare baseline:
N requests to URL from J threads over keep-alive connections, printing the
requests per second the mock serves."""
import http.client
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANSWER = json.dumps({
    "id": "bench", "object": "chat.completion", "model": "mock-1",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "pong"}}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    def log_message(self, *args):
        pass


def load(n, threads, url):
    host, port = url.split("//")[1].split(":")
    body = json.dumps({"model": "mock-1", "messages": [{"role": "user", "content": "ping"}]})
    counter = iter(range(n))
    lock = threading.Lock()

    def worker():
        conn = http.client.HTTPConnection(host, int(port))
        while True:
            with lock:
                if next(counter, None) is None:
                    return
            conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
            conn.getresponse().read()

    began = time.monotonic()
    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    spent = time.monotonic() - began
    print(f"bare mock: {n} requests, {threads} threads: {spent:.2f} s, {n / spent:.0f} requests/s")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--load":
        load(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    else:
        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        print(server.server_address[1], flush=True)
        server.serve_forever()
