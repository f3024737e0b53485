#!/usr/bin/env bash
# The demo: compile the built-in models and print fused vs unfused vs ONNX Runtime and OpenVINO latency.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
mkdir -p bench_out
exec "$VENV_PY" -m benchmarks --csv bench_out/bench.csv --plot bench_out/bench.png "$@"
