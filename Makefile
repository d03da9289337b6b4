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

# The whole test suite (slow real-model tests skip with the command that enables them), one
# worker per core (TEST_WORKERS=0: in this process); a file's tests share a worker, so its
# module-scoped fixtures (tiny servers) start once.
TEST_WORKERS ?= auto
test: setup
	$(VENV)/bin/python -m pytest tests -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-fast: setup
	$(VENV)/bin/python -m pytest tests -m "not slow" -x $(PYTEST_ARGS)
