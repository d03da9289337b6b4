"""SGLang's serving benchmark client, run unchanged, with every request's accept length kept.

``sglang.benchmark.serving`` prints and writes only run-wide figures, and its accept length comes
from ``/server_info`` (SGLang's average over the last decode-log interval of 40 steps: missing for
short runs). SGLang does return each request's ``spec_accept_length`` in its ``meta_info``
(completion tokens / verify passes, bonus token included), and the client keeps it on every
``RequestFuncOutput``. ``PER_REQUEST_CLIENT`` runs the client's own ``cli_main`` with its
``calculate_metrics`` wrapped to write those per-request values to the file named by
``PER_REQUEST_ENV``; ``read_per_request`` reads them back and ``mean_se`` summarises them.

Use: ``[sys.executable, "-c", PER_REQUEST_CLIENT, <the client's own arguments>]`` with
``PER_REQUEST_ENV`` set in the client's environment.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

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
