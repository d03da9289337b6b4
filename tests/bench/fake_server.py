"""A stand-in for a running SGLang server's ``/server_info`` and ``/health`` (loopback, a thread)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextlib.contextmanager
def fake_sglang(info: Callable[[], dict]) -> Iterator[str]:
    """Serve ``info()`` as JSON at ``/server_info`` (and 200 at ``/health``); yield the base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path not in ("/server_info", "/health"):
                self.send_error(404)
                return
            body = json.dumps(info() if self.path == "/server_info" else {}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def hsd_info(model_path: str, rounds: list[int]) -> Callable[[], dict]:
    """An HSD server's ``/server_info`` whose adaptive controller ran 4 more rounds of length 3 and
    1 more of length 0 at batch 1 on every read (``rounds``: the read count, kept by the caller)."""

    def info() -> dict:
        rounds[0] += 1
        n = rounds[0]
        return {"model_path": model_path, "tokenizer_path": model_path, "speculative_algorithm": "HSD",
                "internal_states": [{"hsd": {"adaptive": {"choices_by_batch_bucket": {"1": {"3": 4 * n, "0": n}}}}}]}

    return info


def plain_info(model_path: str) -> Callable[[], dict]:
    return lambda: {"model_path": model_path, "tokenizer_path": model_path, "speculative_algorithm": None,
                    "internal_states": [{}]}
