"""The serving benchmarks' shared plumbing: models, CPU servers, SGLang's client, result rows.

The serving scripts (``bench_sglang_serving``, ``bench_serving_standalone``, ``bench_sglang_load``,
``bench_sglang_tree``, ``profile_server``) differ in their configuration tables, options and
report tables; everything else lives here, once:

* models: :func:`setup_models` (a target with an EAGLE-3 head and exit heads: the tiny random pair
  built here, or a cached model with the heads ``eagle_heads`` trained) and :func:`resolve_models`
  (a target and a separate draft language model);
* servers: :func:`cpu_server` starts one CPU server (the command from
  ``sglang_hsd.sglang_plugin.cpu.cpu_server``), waits for it and kills its process group;
  :func:`measure_rows` runs a list of rows against one server and books each;
* prompts: :func:`write_prompt_file` writes a prompt set in the ShareGPT format SGLang's client reads;
* the client: :func:`run_client` runs ``sglang.benchmark.serving`` unchanged through
  ``PER_REQUEST_CLIENT``, so every request's accept length is kept;
* ``/server_info``: :func:`read_server_info` (SGLang's accept length, the ``hsd`` entry);

  those three live in ``sglang_hsd/bench/`` (``prompts.py``, ``client.py``, ``server_info.py``),
  shared with ``sglang-hsd bench``, and are re-exported here;
* results: :class:`ResultBook` keeps the rows, rewrites the JSON / Markdown (and plot) after every
  row with ``"complete": false`` until the end, and resumes an unfinished run of the same command.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import RunRecord, machine_probe_ms, write_results
# The client, /server_info and prompt files live in the package (``sglang-hsd bench`` runs them
# too); re-exported here for the scripts and tests that import them from this module.
from sglang_hsd.bench.client import (  # noqa: F401
    KEPT_METRICS, ClientError, ClientResult, ClientSpec, client_arguments, mean_se, run_client)
from sglang_hsd.bench.prompts import prompt_file_texts, write_prompt_file  # noqa: F401
from sglang_hsd.bench.server_info import ServerInfo, read_server_info, rounds_mean_length  # noqa: F401
from sglang_hsd.assets.archives import resolve_cache_dir
from sglang_hsd.sglang_plugin.cpu.cpu_server import log_tail, running_server, server_env

# Bulky record fields left out of the progress lines printed after each row.
_NOT_PRINTED = ("client_summary", "server_log_tail", "per_request_accept_length")


# -- models ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelSetup:
    """Target, EAGLE-3 head and exit heads of one benchmark run.

    Fields:
        name: ``tiny`` (built here, random) or a model from the sglang-hsd cache.
        target, head: folders. exit_heads: folder or None (logit lens). exit_layer: L.
        dataset: client ``--dataset-name`` (random token ids for the tiny model, ShareGPT text
            for a real one).
    """

    name: str
    target: Path
    head: Path
    exit_heads: Path | None
    exit_layer: int
    dataset: str


def setup_models(model: str, workdir: Path, exit_layer: int | None = None,
                 exit_heads: str | None = None) -> ModelSetup:
    """``tiny``: a random Llama and a random EAGLE-3 head over half its vocabulary, built in
    ``workdir`` (exit layer 2, logit lens); otherwise the cached ``model`` with its trained heads
    (exit layer 16; ``exit_heads``: a folder, 'none', or None for the trained exit heads)."""
    if model == "tiny":
        from eagle_heads.eagle3 import build_random_eagle3_head
        from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_llama

        config = build_tiny_llama(str(workdir / "target"))
        build_random_eagle3_head(str(workdir / "eagle3"), config,
                                 draft_vocab_size=config.vocab_size // 2)
        return ModelSetup("tiny", workdir / "target", workdir / "eagle3", None, exit_layer or 2,
                          "random")
    cache = resolve_cache_dir()
    target, heads = cache / "models" / model, cache / "heads" / model
    missing = [p for p in (target, heads / "eagle3") if not p.is_dir()]
    if missing:
        raise SystemExit(f"missing {missing}: run `sglang-hsd fetch {model}` and train its "
                         "heads with eagle_heads first")
    exits = Path(exit_heads) if exit_heads else heads / "exit"
    if exit_heads == "none" or not exits.is_dir():
        exits = None
    return ModelSetup(model, target, heads / "eagle3", exits, exit_layer or 16, "sharegpt")


def resolve_models(target: str, draft: str, workdir: Path, tiny: bool) -> tuple[Path, Path]:
    """Folders of a target and its draft language model: cached model names or folders, or
    (``tiny``) a random pair with one vocabulary built in ``workdir``."""
    if tiny:
        from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_draft_pair

        built = build_tiny_draft_pair(str(workdir / "tiny"))
        return Path(built[0]), Path(built[1])
    cache = resolve_cache_dir()
    paths = [Path(m) if Path(m).is_dir() else cache / "models" / m for m in (target, draft)]
    missing = [str(p) for p in paths if not p.is_dir()]
    if missing:
        raise SystemExit(f"missing {missing}: run `sglang-hsd fetch {target}` and "
                         f"`sglang-hsd fetch {draft}`")
    return paths[0], paths[1]


# -- servers -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ServerSpec:
    """One CPU server of a configuration.

    Fields:
        tag: names its log, ``server_<tag>.log`` in the work folder.
        command: the launch command (``cpu_server.cpu_server_command`` and relatives).
        fields: what every record of this server carries (config name, note, shown command...);
            a server that fails gets one record of these fields plus ``error``.
        timeout: seconds to wait for ``/health``.
        env: the server's environment (None: ``cpu_server.server_env()``).
    """

    tag: str
    command: list[str]
    fields: dict
    timeout: float = 600.0
    env: dict | None = None


@dataclass(frozen=True)
class Server:
    """A running server: its base URL and the seconds it took to become healthy."""

    url: str
    startup_s: float


def shown_command(cmd: list[str], workdir: Path) -> str:
    """A server command as result files show it: without the interpreter, with ``~`` and ``$WORK``
    for the home and work folders."""
    return " ".join(cmd[1:]).replace(str(workdir), "$WORK").replace(str(Path.home()), "~")


@contextlib.contextmanager
def cpu_server(spec: ServerSpec, workdir: Path) -> Iterator[Server]:
    """Start ``spec``'s server with its output in ``workdir/server_<tag>.log``, wait until it is
    healthy, yield it, kill its whole process group on exit."""
    started = time.monotonic()
    env = spec.env if spec.env is not None else server_env()
    with running_server(spec.command, env, str(workdir / f"server_{spec.tag}.log"),
                        timeout=spec.timeout) as url:
        yield Server(url, round(time.monotonic() - started, 1))


def measure_rows(spec: ServerSpec, rows: Sequence[dict],
                 measure: Callable[[Server, dict], dict], book: ResultBook, workdir: Path) -> None:
    """Book ``{**spec.fields, **row, "machine_probe_ms": ..., **measure(server, row)}`` for each
    row of ``rows`` not yet in ``book``, all against one server of ``spec``, started only when some
    row is left; ``machine_probe_ms`` is ``common.machine_probe_ms`` timed just before the row.

    A row whose client fails (``ClientError``) is booked with ``error``; a server that does not
    start or fails otherwise ends the configuration with one record of ``spec.fields`` plus
    ``error`` and its log's tail."""
    pending = [row for row in rows if not book.measured({**spec.fields, **row})]
    if not pending:
        return
    log = workdir / f"server_{spec.tag}.log"
    try:
        with cpu_server(spec, workdir) as server:
            for row in pending:
                print(f"[bench] {spec.tag} {json.dumps(row)} ...", flush=True)
                # The server is idle here: the probe times the machine as this row will find it.
                record = {**spec.fields, **row, "machine_probe_ms": machine_probe_ms()}
                try:
                    record.update(measure(server, row))
                except ClientError as err:
                    record["error"] = str(err)
                book.add(record)
    except Exception as err:  # the server did not start or died: one failed record
        book.add({**spec.fields, "error": f"{type(err).__name__}: {err}",
                  "server_log_tail": log_tail(log)})


# -- /server_info ------------------------------------------------------------------------------

LOOKUP_COUNTERS = ("forwards", "chain_forwards", "rows", "chain_rows", "proposed", "accepted")


def lookup_delta(before: ServerInfo, after: ServerInfo) -> dict | None:
    """The change of the lookup level's counters (``hsd.draft_lookup``, ``--hsd-draft-lookup``)
    between two ``/server_info`` reads: draft forwards and rows run against what the chain's
    steps would have run, copies proposed and accepted; None for a server without the lookup."""
    end = after.hsd.get("draft_lookup") or {}
    if not end.get("enabled"):
        return None
    start = before.hsd.get("draft_lookup") or {}
    return {key: end[key] - start.get(key, 0) for key in LOOKUP_COUNTERS}


def start_torch_profile(url: str, steps: int, timeout: float = 600.0) -> None:
    """POST ``url/start_profile``: torch.profiler (CPU) over the scheduler's next ``steps`` forward
    steps, the trace written to the server's ``SGLANG_TORCH_PROFILER_DIR``."""
    body = json.dumps({"num_steps": steps, "activities": ["CPU"]}).encode()
    request = urllib.request.Request(url + "/start_profile", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        resp.read()


# -- result rows -------------------------------------------------------------------------------

def row_key(row: dict) -> tuple:
    """A serving row's identity: (config, prompt set, temperature, concurrency)."""
    return (row.get("config"), row.get("prompt_set"), row.get("temperature"),
            row.get("concurrency"))


def throughput_ratios(rows: Sequence[dict], baseline: str,
                      key: Callable[[dict], tuple] = row_key) -> list[float | None]:
    """Each row's output tok/s over that of the ``baseline`` configuration's row with the same key
    but for the configuration (None where either is missing or failed)."""
    base = {key(r)[1:]: r.get("output_throughput") for r in rows
            if r.get("config") == baseline and "error" not in r}
    out = []
    for r in rows:
        reference, value = base.get(key(r)[1:]), r.get("output_throughput")
        out.append(value / reference if reference and value is not None and "error" not in r
                   else None)
    return out


def fmt(value, digits: int = 2) -> str:
    """A table cell: ``n/a`` for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def mean_se_cell(mean: float | None, se: float | None, digits: int = 2) -> str:
    """``mean ± se`` (just the mean without a standard error; ``n/a`` without a mean)."""
    if mean is None or mean != mean:
        return "n/a"
    return f"{mean:.{digits}f} ± {se:.{digits}f}" if se is not None and se == se else f"{mean:.{digits}f}"


PARTIAL_NOTE = ("\n**Partial run**: the rows above are those measured so far; the run was stopped "
                "(or is still going) before every configuration ran.\n")


class ResultBook:
    """The rows of one run and their result files ``<stem>.{json,md}`` (and ``<stem>.png``).

    Every :meth:`add` rewrites the files with ``meta["complete"] = False`` (a stopped run keeps
    what it measured); :meth:`finish` writes them with True. A run whose JSON file holds an
    unfinished run of the same command resumes it: its successful rows are kept (in
    ``meta["resumed"]``: how many, and that run's start and commit) and :meth:`measured` says
    they need not run again; its failed rows run again.

    Args:
        stem: result files' path without suffix.
        run: this run's record (``common.start_run``).
        meta: the results' ``meta`` (``complete`` is added).
        render: (rows, meta) -> the Markdown table.
        key: a row's identity (default :func:`row_key`).
        annotate: rows -> rows as written (derived fields such as ratios), applied on every write.
        plot: (rows, meta, png path, run) -> None, called on every write (None: no plot).
        resume: False: start afresh whatever the JSON file holds.
    """

    def __init__(self, stem: Path, run: RunRecord, meta: dict,
                 render: Callable[[list[dict], dict], str],
                 key: Callable[[dict], tuple] = row_key,
                 annotate: Callable[[list[dict]], list[dict]] | None = None,
                 plot: Callable[[list[dict], dict, Path, RunRecord], None] | None = None,
                 resume: bool = True):
        self.stem, self.run, self.meta, self.render = Path(stem), run, dict(meta), render
        self.key, self.annotate, self.plot = key, annotate, plot
        self.rows: list[dict] = self._resumed_rows() if resume else []

    def _resumed_rows(self) -> list[dict]:
        path = self.stem.with_name(self.stem.name + ".json")
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            return []
        previous = saved.get("run") or {}
        if saved.get("meta", {}).get("complete", True) or previous.get("command") != self.run.command:
            return []
        rows = [r for r in saved.get("results", []) if "error" not in r]
        self.meta["resumed"] = {"rows": len(rows), "started": previous.get("started"),
                                "commit": previous.get("commit")}
        print(f"[bench] resuming {path}: {len(rows)} rows measured on {previous.get('started')}",
              flush=True)
        return rows

    def measured(self, row: dict) -> bool:
        """Whether a successful row with ``row``'s key is in the book."""
        key = self.key(row)
        return any(self.key(r) == key and "error" not in r for r in self.rows)

    def add(self, record: dict) -> None:
        """Book one row and rewrite the files (incomplete)."""
        self.rows.append(record)
        print(json.dumps({k: v for k, v in record.items() if k not in _NOT_PRINTED}), flush=True)
        self.save(complete=False)

    def save(self, complete: bool) -> str:
        """Write the files; returns the Markdown table."""
        rows = self.annotate(list(self.rows)) if self.annotate else list(self.rows)
        meta = {**self.meta, "complete": complete}
        table = self.render(rows, meta)
        if not complete:
            table += PARTIAL_NOTE
        write_results(self.stem, {"meta": meta, "results": rows}, table, self.run)
        if self.plot is not None and rows:
            self.plot(rows, meta, self.stem.with_name(self.stem.name + ".png"), self.run)
        return table

    def finish(self) -> str:
        """Write the files as complete; returns the Markdown table."""
        return self.save(complete=True)

    def failed(self) -> bool:
        """Whether any row failed."""
        return any("error" in r for r in self.rows)
