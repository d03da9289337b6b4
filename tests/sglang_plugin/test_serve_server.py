"""End to end on CPU: ``sglang-hsd serve`` with the tiny random pair (``cpu/tiny_models.py``), run
as a user runs it, in a subprocess.

* it becomes healthy and prints the URL, the chat ``curl`` and the benchmark command;
* the printed chat request, sent as printed, is answered through ``/v1/chat/completions``;
* ``/generate`` greedy output equals the target's plain greedy decoding token for token, and the
  answer shows verify rounds (HSD ran);
* Ctrl-C (SIGINT to serve) stops it cleanly: serve exits 0, no process of the server's group is
  left, and the port is free again.

Takes about a minute on 2 cores (one server start).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.sglang_plugin.http_client import post_json

pytest.importorskip("sglang")
pytestmark = [pytest.mark.sglang, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = [1, 40, 41, 42]
MAX_NEW_TOKENS = 12
STARTUP_TIMEOUT = 900  # seconds; ~1 minute on 2 idle cores, several under load
READY_END = "Ctrl-C stops the server."
SHUTDOWN_TIMEOUT = 300  # seconds for serve to stop after Ctrl-C; seconds when idle, longer under load


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_draft_pair

    root = tmp_path_factory.mktemp("serve_server")
    return (root, *build_tiny_draft_pair(str(root)))


def _read_until(lines: queue.Queue, end: str, timeout: float) -> list[str]:
    """Lines of serve's stdout up to and including ``end``; fails on timeout or early exit."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            continue
        if line is None:
            pytest.fail("serve exited before the server was ready:\n" + "\n".join(seen))
        seen.append(line.rstrip("\n"))
        if seen[-1] == end:
            return seen
    pytest.fail(f"serve not ready after {timeout}s:\n" + "\n".join(seen))


def _port_is_free(port: int) -> bool:
    """Whether a new server could listen on ``port`` (SO_REUSEADDR, as uvicorn sets: connections
    the old server closed may linger in TIME_WAIT without holding the port)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _group_is_gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_serve_answers_chat_and_generate_then_stops_on_ctrl_c(pair):
    from sglang_hsd.runtime.model import CausalLM
    from sglang_hsd.runtime.testing import greedy_reference
    from sglang_hsd.sglang_plugin.cpu.cpu_server import free_port

    root, target, draft = pair
    expected = greedy_reference(CausalLM.from_pretrained(target), PROMPT, MAX_NEW_TOKENS)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": ROOT}
    cmd = [sys.executable, "-m", "sglang_hsd.cli", "serve", "--target", target, "--draft", draft,
           "--device", "cpu", "--log", str(root / "server.log"), "--", "--port", str(port),
           "--speculative-num-steps", "3"]
    with open(root / "serve.err", "w") as err:
        # A shell running the suite in the background (``make test &``) ignores SIGINT, and the
        # ignored disposition is inherited: restore the default so serve sees the Ctrl-C.
        serve = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in serve.stdout] + [lines.put(None)],
                     daemon=True).start()
    server_pid = None
    try:
        printed = _read_until(lines, READY_END, STARTUP_TIMEOUT)
        text = "\n".join(printed)
        url = re.search(r"HSD server ready in \d+s: (\S+)", text).group(1)
        server_pid = int(re.search(r"server pid (\d+)", text).group(1))
        assert url == f"http://127.0.0.1:{port}"
        assert "sglang.benchmark.serving --backend sglang --base-url " + url in text
        curl = shlex.split(text[text.index("curl "):].split("\n\n")[0].replace("\\\n", " "))
        assert curl[1] == url + "/v1/chat/completions"
        chat = post_json(url, "/v1/chat/completions", json.loads(curl[curl.index("-d") + 1]))
        assert chat["choices"][0]["message"]["role"] == "assistant"
        assert chat["usage"]["completion_tokens"] > 0
        out = post_json(url, "/generate", {"input_ids": PROMPT, "sampling_params": {
            "max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}})
        assert out["output_ids"] == expected
        assert out["meta_info"]["spec_verify_ct"] >= 1
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=SHUTDOWN_TIMEOUT) == 0
        rest = []
        while (line := lines.get(timeout=10)) is not None:
            rest.append(line.strip())
        assert rest[-1] == "server stopped"
        assert _group_is_gone(server_pid)
        assert _port_is_free(port)
    finally:
        if serve.poll() is None:
            serve.kill()
        if server_pid is not None and not _group_is_gone(server_pid):
            os.killpg(server_pid, signal.SIGKILL)
    log = (root / "server.log").read_text()
    assert "Traceback" not in log
