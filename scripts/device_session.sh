#!/usr/bin/env bash
# One device call (after scripts/device_prep.sh here):
#   run(command="bash scripts/device_session.sh", carry=[".whl", ".devdata"], timeout_s=600)
# 1. benchmarks/gpu_check.sh (SKIP_CHECK=1 skips it): bf16 training steps, CUDA beam search, Llama, pairwise
#    APAO, peak memory: $OUT/gpu_check.log;
# 2. ROWS under the release's recipe (RECIPE=apao_release, trainer=gpu, all at once), stopped DEADLINE seconds
#    after the start (default 540, inside the tool's 600); only finished rows count: checkpoints (55 MB+) cannot
#    come back, and the machine is bare again after its 30 s warm window;
# 3. $OUT/results.tgz: docs/results/runs (commit the new rows, then rebuild the page here) and the rows' logs.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
DEADLINE=${DEADLINE:-540}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PY=python3 PYTHON=python3
if [[ ! -e ../shared/data/apao-office ]]; then  # the rows record ../shared/data/apao-office, as every checkout has it
  mkdir -p ../shared/data && ln -s "$PWD/.devdata/apao-office" ../shared/data/apao-office
fi
OUT=${OUT:-/tmp/device-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [[ ${SKIP_CHECK:-0} != 1 ]]; then
  timeout -k 10 $((DEADLINE - 60)) bash benchmarks/gpu_check.sh --out /tmp/gpu-check 2>&1 | tee "$OUT/gpu_check.log"
fi
ROWS=${ROWS:-tiger-ce-s42 tiger-apao_pointwise-s42}
left=$((DEADLINE - 30 - (SECONDS - start)))  # 30 s for the archive
if (( left > 60 )); then
  # shellcheck disable=SC2086
  RECIPE=apao_release EXTRA=trainer=gpu JOBS=$(wc -w <<< "$ROWS") PAGE=0 \
      timeout -k 10 "$left" scripts/results_office.sh $ROWS
fi
tar czf "$OUT/results.tgz" docs/results/runs outputs/results_office/*/*.log 2>/dev/null
echo "device_session: $((SECONDS - start)) s"
