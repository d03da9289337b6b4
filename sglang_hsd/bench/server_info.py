"""What a benchmark reads from a running server's ``/server_info``.

SGLang answers ``/server_info`` with its resolved server arguments (``model_path``,
``tokenizer_path``, ``speculative_algorithm``, ...) and one ``internal_states`` entry per
data-parallel rank; the HSD worker adds its ``hsd`` entry there (KV pool sizes, ``levels``, the
adaptive controller's ``adaptive`` counters, ``draft_copies``, ``draft_lookup``). :class:`ServerInfo`
reads the first entry; :func:`rounds_mean_length` turns two reads around a measured run into the
mean draft length the adaptive controller chose in between; :func:`probe_server` is the short,
failing-loudly read that checks a ``--url-*`` before a benchmark starts.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field

# Seconds a probe of a server given by URL may take: it answers at once when it is up.
PROBE_TIMEOUT = 10.0


@dataclass(frozen=True)
class ServerInfo:
    """What the benchmarks read from ``/server_info``'s first ``internal_states`` entry.

    Fields:
        accept_length: SGLang's ``avg_spec_accept_length`` (its average over the last decode-log
            interval; None without speculation or before one).
        hsd: the HSD worker's ``hsd`` entry (KV pool sizes, ``levels``, ``adaptive``; empty for
            other servers).
    """

    accept_length: float | None
    hsd: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, info: dict) -> ServerInfo:
        state = (info.get("internal_states") or [{}])[0] or {}
        return cls(state.get("avg_spec_accept_length"), state.get("hsd") or {})

    @property
    def mean_chosen_budget(self) -> float | None:
        """The adaptive draft budget's mean over the server's rounds (``hsd.adaptive.mean_steps``);
        None when the server does not report one (fixed budget, or a server without it)."""
        adaptive = self.hsd.get("adaptive")
        value = adaptive.get("mean_steps") if isinstance(adaptive, dict) else None
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def draft_copy(self) -> str | None:
        """The draft model's weight copy in place and the row counts it serves, as one cell
        (``hsd.draft_copies``: e.g. ``int4 (layers 1-16, lm_head 1-8)``); None for a server
        without one. Which copy a start chose moves a round's cost by a fifth on some CPUs, so
        every row records the one it ran with."""
        copies = self.hsd.get("draft_copies")
        if not isinstance(copies, dict) or "precision" not in copies:
            return None
        rows = copies.get("copy_rows") or {}
        served = ", ".join(f"{group} {'all' if last == 'all' else f'1-{last}'}" for group, last in rows.items())
        return f"{copies['precision']} ({served})" if served else str(copies["precision"])

    @property
    def choice_counts(self) -> dict[tuple[str, str], int]:
        """Decode rounds per (batch bucket, length) so far (``hsd.adaptive.choices_by_batch_bucket``;
        empty without it)."""
        adaptive = self.hsd.get("adaptive")
        table = adaptive.get("choices_by_batch_bucket") if isinstance(adaptive, dict) else None
        if not isinstance(table, dict):
            return {}
        return {(str(bucket), str(length)): int(n)
                for bucket, lengths in table.items() if isinstance(lengths, dict)
                for length, n in lengths.items()}


def rounds_mean_length(before: ServerInfo, after: ServerInfo) -> float | None:
    """Mean draft length of the decode rounds an adaptive server ran between two ``/server_info``
    reads (each batch round counted once, whatever its size); None when it reports no choices or
    ran no decode round in between."""
    start = before.choice_counts
    rounds = total = 0
    for key, n in after.choice_counts.items():
        new = n - start.get(key, 0)
        rounds += new
        total += new * int(key[1])
    return total / rounds if rounds > 0 else None


def get_server_info(url: str, timeout: float = 30.0) -> dict:
    """GET ``url/server_info``, decoded."""
    with urllib.request.urlopen(url + "/server_info", timeout=timeout) as resp:
        return json.loads(resp.read())


def read_server_info(url: str, timeout: float = 30.0) -> ServerInfo:
    """GET ``url/server_info``, parsed (:class:`ServerInfo`)."""
    return ServerInfo.parse(get_server_info(url, timeout))


class ServerProbeError(ValueError):
    """A server given by URL that does not answer as an SGLang server; the message names the option."""


def probe_server(url: str, option: str, timeout: float = PROBE_TIMEOUT) -> dict:
    """``url/server_info`` of a server that should already be running, read within ``timeout``
    seconds. Raises ``ServerProbeError`` naming ``option`` (e.g. ``--url-hsd``) when nothing
    answers there, or something that is not SGLang's ``/server_info``."""
    if not url.startswith(("http://", "https://")):
        raise ServerProbeError(f"{option} {url!r}: expected an http:// or https:// URL, e.g. "
                               "http://127.0.0.1:30000")
    try:
        info = get_server_info(url.rstrip("/"), timeout)
    except (urllib.error.URLError, OSError) as err:  # refused, unknown host, timed out, HTTP error
        raise ServerProbeError(f"{option} {url}: no SGLang server answers {url.rstrip('/')}/server_info "
                               f"within {timeout:g}s ({err}); start it first, or check the URL") from None
    except ValueError:
        raise ServerProbeError(f"{option} {url}: /server_info did not answer JSON; is it an SGLang "
                               "server?") from None
    if not isinstance(info, dict) or "model_path" not in info:
        raise ServerProbeError(f"{option} {url}: /server_info has no model_path; is it an SGLang server?")
    return info
