#!/usr/bin/env bash
# Performance portability: this cinn against a baseline install of cinn, onnxruntime and OpenVINO on the ten CNNs and
# BERT-base, built for the host CPU and again for an AVX2-only CPU (znver3), each engine in its own process, in
# interleaved rounds (cinn-bench --baseline). Writes bench_out/portability-{host,znver3}.{csv,log}.
#
# usage: scripts/portability.sh BASELINE_PYTHON [MODEL ...]
#   BASELINE_PYTHON  the Python of another install of cinn, e.g. made from an older commit with
#                    git worktree add --detach ../base REV && cp -a .venv ../base/.venv &&
#                    (cd ../base && .venv/bin/python -m pip install -e . --no-deps)
#   MODEL            default: the ten CNNs (written once into bench_out/models) and bert_base
# env: ROUNDS (default 6), REPEAT (default 3), WARMUP (default 1), TARGETS (default "llvm;llvm -mcpu=znver3"),
#      PYTHON (default ./.venv/bin/python)
#
# Its time on a 2-core VM, estimated from single compiles and runs of each model on a loaded one: per target, the cold
# compiles of this cinn and of the baseline (about 280 s each for all eleven models) and the workers' start-up (about
# 2 min) take about 12 min; a round of the four engines over all models takes about 30 s (host) to 40 s (znver3) with
# REPEAT=3 and WARMUP=1, so 6 rounds take 3-4 min: about 30 min in all, less on a quiet machine. Each round more adds
# about 70 s (both targets).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ $# -lt 1 ]; then
  echo "usage: $0 BASELINE_PYTHON [MODEL ...]   (see the top of this script)" >&2
  exit 2
fi
BASELINE="$1"
shift
PY="${PYTHON:-$ROOT/.venv/bin/python}"
ROUNDS="${ROUNDS:-6}"
REPEAT="${REPEAT:-3}"
WARMUP="${WARMUP:-1}"
IFS=';' read -r -a TARGETS <<< "${TARGETS:-llvm;llvm -mcpu=znver3}"
OUT=bench_out
MODELS_DIR="$OUT/models"
CNNS=(resnet50 vgg19 densenet121 squeezenet zfnet512 shufflenet inception_v1 inception_v2 bvlc_alexnet mobilenet_v2)

if [ $# -gt 0 ]; then
  models=("$@")
else
  missing=()
  for m in "${CNNS[@]}"; do
    [ -f "$MODELS_DIR/$m.onnx" ] || missing+=("$m")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    "$PY" -m benchmarks.real_models "$MODELS_DIR" "${missing[@]}"
  fi
  models=("${CNNS[@]/#/$MODELS_DIR/}")
  models=("${models[@]/%/.onnx}" bert_base)
fi

status=0
start=$SECONDS
for target in "${TARGETS[@]}"; do
  mcpu="$(sed -n 's/.*-mcpu=\([^ ]*\).*/\1/p' <<< "$target")"
  tag="${mcpu:-host}"
  echo "== $target: ${#models[@]} models, $ROUNDS rounds of $REPEAT runs" >&2
  # one failed target (an engine that fails, outputs that disagree) still lets the other run
  "$PY" -m benchmarks "${models[@]}" --target "$target" --baseline "$BASELINE" --rounds "$ROUNDS" --repeat "$REPEAT" \
    --warmup "$WARMUP" --no-unfused --csv "$OUT/portability-$tag.csv" 2>&1 | tee "$OUT/portability-$tag.log" || status=1
done
echo "== done in $(((SECONDS - start) / 60)) min; tables: $OUT/portability-*.csv" >&2
exit $status
