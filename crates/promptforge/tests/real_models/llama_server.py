"""Serves a GGUF model over llama.cpp's OpenAI-compatible HTTP API on
127.0.0.1, through the xllamacpp wheel (llama.cpp's server embedded, no
compiler needed). A host file starts it with `spawn`:

    spawn = ["VENV/bin/python", "llama_server.py", "--model", "M.gguf", "--port", "{port}"]

It runs until SIGTERM or SIGINT; with --pid-file it writes its pid there
(the tests kill it mid-run through that).
"""
import argparse
import os
import signal
import sys
import threading

import xllamacpp


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="the GGUF file")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ctx", type=int, default=4096, help="context window in tokens")
    parser.add_argument("--threads", type=int, default=1,
                        help="one thread is the fastest on a two-core machine")
    parser.add_argument("--pid-file")
    args = parser.parse_args()
    if not os.path.isfile(args.model):
        print(f"llama_server.py: no model file at {args.model}", file=sys.stderr)
        return 2

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.port = args.port
    params.use_jinja = True
    params.n_ctx = args.ctx
    params.offline = True
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.n_parallel = 1

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = xllamacpp.Server(params)
    if args.pid_file:
        with open(args.pid_file, "w", encoding="utf-8") as f:
            f.write(str(os.getpid()))
    print(f"llama_server.py: serving {args.model} on 127.0.0.1:{args.port}", file=sys.stderr, flush=True)
    stop.wait()
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
