"""What a server that fails to start reports (``cpu_server.running_server``): its exit code, the
free memory and the end of its log, progress-bar redraws dropped. A fake server (a Python one-liner)
stands in for SGLang, so this runs in a second."""

from __future__ import annotations

import sys

import pytest

from sglang_hsd.sglang_plugin.cpu.cpu_server import log_tail, running_server

# Writes a progress bar redrawn in place, a cause, and exits 3 (as SGLang does when it cannot start).
_FAILING_SERVER = ("import sys; sys.stdout.write('Loading: 10%\\rLoading: 100%\\n' + "
                   "''.join(f'line {i}\\n' for i in range(40)) + 'ValueError: no room for the KV cache\\n'); "
                   "sys.exit(3)")


def test_a_server_that_exits_names_its_code_the_free_memory_and_its_log_end(tmp_path):
    log = tmp_path / "server.log"
    with pytest.raises(RuntimeError) as err:
        with running_server([sys.executable, "-c", _FAILING_SERVER, "--port", "1"], {}, str(log), timeout=30):
            pass
    message = str(err.value)
    assert "exited with code 3" in message and "GiB free now" in message
    assert message.endswith("ValueError: no room for the KV cache")
    assert "line 39" in message and "line 9\n" not in message  # the last 30 lines only


def test_log_tail_keeps_each_lines_last_redraw_and_reads_a_missing_log_as_empty(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("a\nLoading: 10%\rLoading: 55%\rLoading: 100%\nb\n")
    assert log_tail(str(log), 2) == "Loading: 100%\nb"
    assert log_tail(str(log), 10) == "a\nLoading: 100%\nb"
    assert log_tail(str(tmp_path / "missing.log")) == ""
