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

# The whole test suite (slow real-model tests skip with the command that enables them).
test: setup
	$(VENV)/bin/python -m pytest tests $(PYTEST_ARGS)

test-fast: setup
	$(VENV)/bin/python -m pytest tests -m "not slow" -x $(PYTEST_ARGS)
