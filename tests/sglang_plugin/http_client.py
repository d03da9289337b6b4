"""JSON over HTTP for the server tests (loopback only)."""

from __future__ import annotations

import json
import urllib.request


def post_json(url: str, path: str, payload: dict, timeout: float = 180) -> dict:
    """POST ``payload`` as JSON to ``url + path`` and return the decoded JSON answer."""
    req = urllib.request.Request(url + path, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def get_json(url: str, path: str, timeout: float = 30) -> dict:
    """GET ``url + path`` and return the decoded JSON answer."""
    with urllib.request.urlopen(url + path, timeout=timeout) as resp:
        return json.loads(resp.read())
