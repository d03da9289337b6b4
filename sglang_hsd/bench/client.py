"""SGLang's serving benchmark client, run unchanged, with every request's accept length kept.

``sglang.benchmark.serving`` prints and writes only run-wide figures, and its accept length comes
from ``/server_info`` (SGLang's average over the last decode-log interval of 40 steps: missing for
short runs). SGLang does return each request's ``spec_accept_length`` in its ``meta_info``
(completion tokens / verify passes, bonus token included), and the client keeps it on every
``RequestFuncOutput``. ``PER_REQUEST_CLIENT`` runs the client's own ``cli_main`` with its
``calculate_metrics`` wrapped to write those per-request values to the file named by
``PER_REQUEST_ENV``; ``read_per_request`` reads them back and ``mean_se`` summarises them.

:func:`run_client` runs it once for a :class:`ClientSpec` (``[sys.executable, "-c",
PER_REQUEST_CLIENT, <the client's own arguments>]`` with ``PER_REQUEST_ENV`` set) and returns a
:class:`ClientResult`. ``sglang-hsd bench`` and the serving scripts of ``benchmarks/`` share it.
"""

from __future__ import annotations

import json
import math
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from sglang_hsd.sglang_plugin.cpu.cpu_server import log_tail, server_env

PER_REQUEST_ENV = "SGLANG_HSD_BENCH_PER_REQUEST"
# ``datasets`` (imported by SGLang's benchmark package for MMMU only) is stubbed when absent;
# every client script starts with this.
DATASETS_STUB = """
import importlib.util, sys, types
if importlib.util.find_spec("datasets") is None:
    stub = types.ModuleType("datasets")
    def load_dataset(*args, **kwargs):
        raise RuntimeError("the 'datasets' package is not installed (import stub)")
    stub.load_dataset = load_dataset
    sys.modules["datasets"] = stub
"""
PER_REQUEST_CLIENT = DATASETS_STUB + """
import json, os
import sglang.benchmark.serving as serving
original = serving.calculate_metrics
def calculate_metrics(input_requests, outputs, *args, **kwargs):
    rows = [{"success": o.success, "output_len": o.output_len,
             "accept_length": o.spec_accept_length} for o in outputs]
    with open(os.environ["%s"], "w") as handle:
        json.dump(rows, handle)
    return original(input_requests, outputs, *args, **kwargs)
serving.calculate_metrics = calculate_metrics
sys.argv[0] = "sglang.benchmark.serving"
serving.cli_main()
""" % PER_REQUEST_ENV

# Fields of the client's result line that go into the result rows.
KEPT_METRICS = (
    "completed", "duration", "total_output_tokens", "request_throughput", "output_throughput",
    "mean_e2e_latency_ms", "median_tpot_ms", "median_itl_ms", "accept_length",
)


def read_per_request(path: Path) -> list[float]:
    """Accept lengths of the successful requests that reported one (no speculation: empty)."""
    rows = json.loads(Path(path).read_text())
    return [r["accept_length"] for r in rows if r["success"] and r["accept_length"]]


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and its standard error (sample standard deviation / sqrt(n)); nan where undefined."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n == 1:
        return mean, math.nan
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


class ClientError(RuntimeError):
    """SGLang's client failed (a failed row, not a failed server)."""


@dataclass(frozen=True)
class ClientSpec:
    """One run of SGLang's serving client (``sglang.benchmark.serving --backend sglang``).

    Fields:
        model: the target folder (``--model`` and ``--tokenizer``).
        dataset_path: a ShareGPT-format prompt file (``prompts.write_prompt_file``).
        dataset_name: ``sharegpt`` (the file's prompts) or ``random`` (random token ids, drawn
            from the file's text, ``input_len`` of them scaled by ``random_range_ratio``).
        context_len: ``sharegpt``: prompts longer than this minus ``output_len`` are skipped.
        extra_request_body: more sampling parameters of every request (``ignore_eos``, ``top_p``).
    """

    model: Path
    dataset_path: Path
    num_prompts: int
    output_len: int
    temperature: float
    max_concurrency: int
    dataset_name: str = "sharegpt"
    input_len: int = 32
    random_range_ratio: float = 1.0
    context_len: int = 2048
    extra_request_body: dict | None = None
    seed: int = 0


@dataclass(frozen=True)
class ClientResult:
    """What one client run returned: its result line (``metrics``), the accept length of every
    successful request that reported one (``accept_lengths``, empty without speculation) and the
    client's log."""

    metrics: dict
    accept_lengths: list[float]
    log: Path

    def kept(self) -> dict:
        """The result line's :data:`KEPT_METRICS`."""
        return {k: self.metrics.get(k) for k in KEPT_METRICS}

    def accept_length_stats(self) -> dict:
        """Per-request accept length: ``accept_length_mean`` and ``accept_length_se``."""
        mean, se = mean_se(self.accept_lengths)
        return {"accept_length_mean": mean, "accept_length_se": se}

    def summary(self) -> str:
        """The client's printed result table (from its '====' line to the end)."""
        text = self.log.read_text(errors="replace")
        start = text.find("============ Serving Benchmark Result")
        return text[start:].strip() if start >= 0 else log_tail(self.log, 40)


def client_arguments(spec: ClientSpec, url: str, output_file: Path) -> list[str]:
    """The client's own command-line arguments for ``spec`` against ``url``."""
    if spec.dataset_name == "random":
        data = ["--random-input-len", str(spec.input_len), "--random-output-len",
                str(spec.output_len), "--random-range-ratio", f"{spec.random_range_ratio:g}"]
    else:
        data = ["--sharegpt-output-len", str(spec.output_len), "--sharegpt-context-len",
                str(spec.context_len)]
    body = (["--extra-request-body", json.dumps(spec.extra_request_body)]
            if spec.extra_request_body else [])
    return ["--backend", "sglang", "--base-url", url, "--model", str(spec.model),
            "--tokenizer", str(spec.model), "--dataset-name", spec.dataset_name, *data,
            "--dataset-path", str(spec.dataset_path), "--num-prompts", str(spec.num_prompts),
            "--max-concurrency", str(spec.max_concurrency), "--temperature", str(spec.temperature),
            *body, "--seed", str(spec.seed), "--disable-tqdm", "--output-file", str(output_file)]


def client_files(workdir: Path, tag: str) -> tuple[Path, Path, Path]:
    """A client run's result line, log and per-request rows: ``workdir/client_<tag>.{jsonl,log,
    per_request.json}``."""
    return (workdir / f"client_{tag}.jsonl", workdir / f"client_{tag}.log",
            workdir / f"client_{tag}.per_request.json")


def shown_client_command(spec: ClientSpec, url: str, workdir: Path, tag: str) -> str:
    """The client run of :func:`run_client` as a user would type it: ``python -m
    sglang.benchmark.serving ...`` (what ``PER_REQUEST_CLIENT`` runs, minus the wrapper that
    keeps each request's accept length)."""
    output_file = client_files(workdir, tag)[0]
    return shlex.join([sys.executable, "-m", "sglang.benchmark.serving",
                       *client_arguments(spec, url, output_file)])


def run_client(url: str, spec: ClientSpec, workdir: Path, tag: str,
               timeout: float) -> ClientResult:
    """Run the client once (``workdir/client_<tag>.{log,jsonl}``, per-request rows in
    ``client_<tag>.per_request.json``). Raises ``ClientError`` when it fails, and
    ``subprocess.TimeoutExpired`` past ``timeout`` seconds (a hung server, not a failed row)."""
    output_file, log, per_request = client_files(workdir, tag)
    output_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-c", PER_REQUEST_CLIENT, *client_arguments(spec, url, output_file)]
    with open(log, "w") as handle:
        proc = subprocess.run(cmd, env={**server_env(), PER_REQUEST_ENV: str(per_request)},
                              stdout=handle, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0 or not output_file.is_file():
        raise ClientError(f"client exited {proc.returncode}; see {log}")
    metrics = json.loads(output_file.read_text().strip().splitlines()[-1])
    return ClientResult(metrics, read_per_request(per_request), log)
