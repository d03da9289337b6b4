# Two entry points for a fresh machine; both create .venv on first use (CPU-only recipe in
# scripts/setup_env.sh). Override the interpreter with PYTHON=..., the venv with SGLANG_HSD_VENV=...
VENV ?= $(if $(SGLANG_HSD_VENV),$(SGLANG_HSD_VENV),.venv)
PYTEST_ARGS ?=

.PHONY: setup demo test test-fast

setup:
	bash scripts/setup_env.sh --with-sglang

# The main job on the embedded default.
demo: setup
	$(VENV)/bin/sglang-hsd demo

# The whole test suite (slow real-model tests skip with the command that enables them), in this
# process by default. TEST_WORKERS=auto spreads test files over the cores (a file's tests share a
# worker, so its module-scoped tiny servers start once): 25-26 minutes on 2 cores, against 37 for
# CI's serial run with set-up; but servers then start side by side, and one once hung past 600 s.
TEST_WORKERS ?= 0
test: setup
	$(VENV)/bin/python -m pytest tests -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-fast: setup
	$(VENV)/bin/python -m pytest tests -m "not slow" -x $(PYTEST_ARGS)
