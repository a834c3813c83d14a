"""Run the whole LightStream stack on this machine as processes.

    python tools/run_local.py [--model-dir DIR] [--port 8000] [--workers G] [--detokenizers K] [--fronts F]
                              [--log-dir DIR] [-- extra worker flags]

Starts redis-server on a free port unless REDIS_URL is set, then the detokenizer(s),
the router, the worker group(s) and the front end; waits until /health is ready,
prints the URL, and stops everything on Ctrl-C or SIGTERM. Without --model-dir it makes
the tiny demo model (tools/make_tiny_model.py) and serves that.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools import make_tiny_model
from tools.redis_server import RedisServer
from tools.stack import Stack, StackOptions


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", default="", help="Hugging Face model directory; default: the tiny demo model")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--workers", type=int, default=1, help="worker groups (data parallelism)")
    ap.add_argument("--detokenizers", type=int, default=1)
    ap.add_argument("--fronts", type=int, default=1, help="front-end processes sharing --port (SO_REUSEPORT)")
    ap.add_argument("--log-dir", default="", help="write each service's log to DIR/<service>.log")
    ap.add_argument("--worker-arg", action="append", default=[], help="extra flag for each worker (repeatable)")
    ap.add_argument("--router-arg", action="append", default=[], help="extra flag for the router (repeatable)")
    ap.add_argument("--tokenizer-arg", action="append", default=[], help="extra flag for the front end (repeatable)")
    ap.add_argument(
        "--detokenizer-arg", action="append", default=[], help="extra flag for each detokenizer (repeatable)"
    )
    args = ap.parse_args(argv)

    model_dir = args.model_dir
    if not model_dir:
        model_dir = os.path.join(tempfile.gettempdir(), "lightstream-tiny-llama")
        if not os.path.exists(os.path.join(model_dir, "model.safetensors")):
            make_tiny_model.main(["--out", model_dir])
    redis_server = None
    redis_url = os.environ.get("REDIS_URL", "")
    if not redis_url:
        redis_server = RedisServer().start()
        redis_url = redis_server.url
    stack = Stack(
        StackOptions(
            model_dir=model_dir,
            redis_url=redis_url,
            port=args.port,
            workers=args.workers,
            detokenizers=args.detokenizers,
            fronts=args.fronts,
            log_dir=args.log_dir,
            worker_args=args.worker_arg,
            router_args=args.router_arg,
            tokenizer_args=args.tokenizer_arg,
            detokenizer_args=args.detokenizer_arg,
        )
    )
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    try:
        stack.start()
        stack.wait_ready()
        print(f"LightStream is serving {model_dir} at {stack.url} (redis {redis_url})", flush=True)
        print(
            f"try: curl {stack.url}/generate -H 'Content-Type: application/json' "
            '-d \'{"inputs": "What is AI?", "parameters": {"max_new_tokens": 17}}\'',
            flush=True,
        )
        stopping.wait()
    finally:
        stack.stop()
        if redis_server is not None:
            redis_server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
