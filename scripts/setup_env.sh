#!/usr/bin/env bash
# Create (or refresh) the project's virtualenv on a CPU-only machine.
#
#   bash scripts/setup_env.sh [--with-sglang]
#
# Why a script and not plain `pip install -e .`: an unpinned install of anything that depends on
# torch resolves to the newest CUDA build (several GB). Every pip call here goes through
# scripts/constraints-cpu.txt, which pins the CPU build of torch and the matching triton.
# SGLang 0.5.23 pins a CUDA torch, so it is installed with --no-deps plus its light dependencies.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="${SGLANG_HSD_VENV:-$root/.venv}"
py="${PYTHON:-python3}"
with_sglang=0
for arg in "$@"; do
  case "$arg" in
    --with-sglang) with_sglang=1 ;;
    *) echo "setup_env.sh: unknown argument '$arg' (expected --with-sglang)" >&2; exit 2 ;;
  esac
done

stamp="$venv/.sglang-hsd-setup"
want="$(cat "$here/constraints-cpu.txt" "$root/pyproject.toml" "$0" | sha256sum | cut -c1-16)-sglang$with_sglang"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c "$here/constraints-cpu.txt")
echo "[setup] installing torch (CPU build) and triton into $venv" >&2
"${pip[@]}" "torch==2.13.0+cpu" "triton==3.7.1"
echo "[setup] installing sglang-hsd (editable) with test and bench (matplotlib) extras" >&2
"${pip[@]}" -e "$root[test,bench]"
if [ "$with_sglang" = 1 ]; then
  echo "[setup] installing sglang 0.5.23 (--no-deps) and its light dependencies" >&2
  "${pip[@]}" --no-deps "sglang==0.5.23"
  "${pip[@]}" -r "$here/sglang-light-deps.txt"
fi
echo "$want" > "$stamp"
