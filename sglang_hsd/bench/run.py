"""Run a ``BenchPlan``: each server in turn (started and stopped here, or already running), every
row's client run against it, the results written as they come.

The plain server runs all its rows first, then the HSD server (one server at a time: on a small
host two would share its cores). Around each HSD row ``/server_info`` is read twice, so the row
gets the mean draft length the adaptive controller chose over its decode rounds
(``server_info.rounds_mean_length``; the client's one warm-up request is among them: the server
cannot tell it apart). ``bench.json`` is rewritten after every row with
``"complete": false`` (a stopped run keeps what it measured); the table, ``bench.png`` and
``"complete": true`` come at the end. A tqdm bar on stderr shows the server starts (with the
log's last line) and the rows. A server that fails to start, or a client that fails, marks its
rows with the error and the run goes on; the exit code is then 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from sglang_hsd.bench.client import ClientError, run_client, shown_client_command
from sglang_hsd.bench.plan import BenchPlan, BenchRow, BenchServer
from sglang_hsd.bench.prompts import write_sharegpt_file
from sglang_hsd.bench.record import RunRecord, distribution_version, start_run, vector_extensions
from sglang_hsd.bench.report import format_table, plot_ratios, throughput_ratio, write_json
from sglang_hsd.bench.server_info import read_server_info, rounds_mean_length

SERVER_TITLES = {"plain": "plain server (the target without speculation)",
                 "hsd": "HSD server (as `sglang-hsd serve` starts it)"}


def logs_dir(plan: BenchPlan) -> Path:
    return plan.out / "logs"


def dry_run_text(plan: BenchPlan) -> str:
    """What ``--dry-run`` prints: the two servers' commands and every client command."""
    lines = ["sglang-hsd bench --dry-run: checked; nothing started.", ""]
    lines += [f"note: {note}" for note in plan.notes]
    for server in plan.servers:
        if server.launch is None:
            lines += [f"{SERVER_TITLES[server.tag]}: already running at {server.url}", ""]
        else:
            log = logs_dir(plan) / f"server_{server.tag}.log"
            lines += [f"{SERVER_TITLES[server.tag]}, log {log}:", server.launch.shell_line(), ""]
    lines.append("client runs (SGLang's serving client; bench runs it wrapped to keep each request's "
                 f"accept length), prompts written to {plan.out}/prompts_*.json:")
    for server in plan.servers:
        for row in plan.rows:
            command = shown_client_command(plan.client_spec(row), server.url, logs_dir(plan), _tag(server, row))
            lines += [f"  {server.tag}, {row.label}:", f"    {command}"]
    return "\n".join(lines)


def _tag(server: BenchServer, row: BenchRow) -> str:
    return f"{server.tag}_{row.tag}"


class BenchResults:
    """The rows measured so far and ``bench.json`` (rewritten on every ``save``)."""

    def __init__(self, plan: BenchPlan, run: RunRecord):
        self.plan, self.run = plan, run
        self.sides: dict[BenchRow, dict[str, dict]] = {row: {} for row in plan.rows}

    def add(self, tag: str, row: BenchRow, entry: dict) -> None:
        self.sides[row][tag] = entry
        self.save(complete=False)

    def rows(self) -> list[dict]:
        config = self.plan.config
        out = []
        for row, sides in self.sides.items():
            plain, hsd = sides.get("plain", {}), sides.get("hsd", {})
            ratio = throughput_ratio(plain, hsd) if plain and hsd else None
            out.append({"prompt_set": row.prompt_set, "concurrency": row.concurrency,
                        "temperature": row.temperature, "num_prompts": config.num_prompts,
                        "max_new_tokens": config.max_new_tokens, "plain": plain, "hsd": hsd, "ratio": ratio})
        return out

    def payload(self, complete: bool) -> dict:
        plan = self.plan
        options = {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(plan.config).items()}
        servers = {s.tag: {"url": s.url, "command": s.launch.shell_line() if s.launch else None,
                           "started": s.launch is not None} for s in plan.servers}
        record = {**self.run.finish().as_dict(), "vector_extensions": vector_extensions(),
                  "sglang_hsd_version": distribution_version("sglang-hsd"),
                  "sglang_version": distribution_version("sglang")}
        return {"complete": complete, "rows": self.rows(), "options": options, "servers": servers,
                "tokenizer": str(plan.tokenizer), "notes": list(plan.notes), "record": record}

    def save(self, complete: bool) -> dict:
        payload = self.payload(complete)
        write_json(self.plan.out / "bench.json", payload)
        return payload

    def failed(self) -> bool:
        return any("error" in side for sides in self.sides.values() for side in sides.values()) or \
            any(len(sides) < 2 for sides in self.sides.values())


@contextlib.contextmanager
def _serving(server: BenchServer, plan: BenchPlan, bar) -> Iterator[str]:
    """Yield ``server``'s URL: a running one's at once; otherwise start it (its process group
    stopped on every way out), with its log's last line on ``bar`` while waiting for /health."""
    if server.launch is None:
        yield server.url
        return
    from sglang_hsd.sglang_plugin.cpu.cpu_server import log_tail, server_process, wait_healthy

    log = logs_dir(plan) / f"server_{server.tag}.log"
    bar.set_description(f"starting the {server.tag} server")
    with server_process(server.launch.command, {**os.environ, **server.launch.env}, str(log)) as proc:
        def on_poll(waited: float) -> None:
            bar.set_postfix_str(f"{waited:.0f}s: {log_tail(log, 1)[-60:]}")

        try:
            wait_healthy(server.url, proc, plan.config.startup_timeout, on_poll)
        except (RuntimeError, TimeoutError) as err:
            raise RuntimeError(f"the {server.tag} server did not start: {err}; log {log}, ending:\n"
                               f"{log_tail(log, 15)}") from None
        bar.set_postfix_str("")
        bar.update(1)
        yield server.url


def _measure(server: BenchServer, url: str, row: BenchRow, plan: BenchPlan) -> dict:
    """One client run of ``row`` against ``server``: the kept metrics, and for HSD the accept
    lengths and the row's mean chosen draft budget. Raises ``ClientError`` /
    ``subprocess.TimeoutExpired`` as ``run_client``."""
    hsd = server.tag == "hsd"
    before = read_server_info(url) if hsd else None
    result = run_client(url, plan.client_spec(row), logs_dir(plan), _tag(server, row), plan.client_timeout)
    entry = {**result.kept(), "client_log": str(result.log)}
    if hsd:
        entry.update(result.accept_length_stats())
        entry["per_request_accept_length"] = result.accept_lengths
        entry["mean_draft_budget"] = rounds_mean_length(before, read_server_info(url))
    return entry


def _measure_server(server: BenchServer, plan: BenchPlan, results: BenchResults, bar) -> None:
    """Every row against ``server``; a failure is booked on the rows it leaves unmeasured."""
    pending = list(plan.rows)
    try:
        with _serving(server, plan, bar) as url:
            while pending:
                row = pending[0]
                bar.set_description(f"{server.tag}: {row.label}")
                try:
                    entry = _measure(server, url, row, plan)
                except ClientError as err:
                    entry = {"error": str(err)}
                results.add(server.tag, pending.pop(0), entry)
                bar.update(1)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
        reason = (f"the client ran past {err.timeout:.0f}s: the server hung" if isinstance(err, subprocess.TimeoutExpired)
                  else str(err))
        print(f"sglang-hsd bench: error: {reason}", file=sys.stderr, flush=True)
        for row in pending:
            results.add(server.tag, row, {"error": reason.splitlines()[0]})
            bar.update(1)


def execute(plan: BenchPlan, command: str) -> int:
    """Run ``plan`` (module docstring); ``command``: the command line to record. Prints the table
    and where the files are; returns 0, or 1 when a server or a client failed."""
    from tqdm.auto import tqdm

    logs_dir(plan).mkdir(parents=True, exist_ok=True)
    for prompts in plan.prompts:
        write_sharegpt_file(prompts.path, list(prompts.texts))
    results = BenchResults(plan, start_run(__file__, command=command))
    for note in plan.notes:
        print(f"note: {note}", flush=True)
    starts = sum(server.launch is not None for server in plan.servers)
    with tqdm(total=starts + len(plan.servers) * len(plan.rows), desc="sglang-hsd bench", unit="step",
              file=sys.stderr, dynamic_ncols=True) as bar:
        for server in plan.servers:
            _measure_server(server, plan, results, bar)
    payload = results.save(complete=True)
    png = plot_ratios(payload["rows"], plan.out / "bench.png", payload["record"])
    print(format_table(payload["rows"]))
    print(f"\nwrote {plan.out / 'bench.json'} and {png}; logs in {logs_dir(plan)}")
    return 1 if results.failed() else 0
