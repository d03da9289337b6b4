"""The serving client, ``/server_info``, prompt files and run record live once, in
``sglang_hsd/bench/``: the benchmark scripts' modules re-export them and keep no copy."""

from __future__ import annotations

from benchmarks import common, serving_client, serving_harness
from sglang_hsd.bench import client, prompts, record, server_info


def test_benchmark_modules_re_export_the_package_objects():
    for name in ("RunRecord", "start_run", "git_commit", "command_line", "cpu_description", "load_average",
                 "png_metadata", "RECORDED_ENV", "CPU_FLAGS"):
        assert getattr(common, name) is getattr(record, name), name
    for name in ("PER_REQUEST_CLIENT", "PER_REQUEST_ENV", "DATASETS_STUB", "mean_se", "read_per_request"):
        assert getattr(serving_client, name) is getattr(client, name), name
    for module, names in ((client, ("ClientSpec", "ClientResult", "ClientError", "client_arguments", "run_client",
                                    "KEPT_METRICS")),
                          (server_info, ("ServerInfo", "read_server_info", "rounds_mean_length")),
                          (prompts, ("write_prompt_file", "prompt_file_texts"))):
        for name in names:
            assert getattr(serving_harness, name) is getattr(module, name), name
