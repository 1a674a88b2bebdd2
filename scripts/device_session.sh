#!/usr/bin/env bash
# One device call (after scripts/device_prep.sh here):
#   run(command="bash scripts/device_session.sh", carry=[".whl", ".devdata"], timeout_s=590)
# 1. benchmarks/gpu_check.sh: bf16 training steps, CUDA beam search, Llama, pairwise APAO, peak memory;
# 2. results rows under the release's recipe (RECIPE=apao_release, trainer=gpu, ROWS at once) until DEADLINE
#    seconds after the start; a second call within the machine's 30 s warm window resumes the unfinished ones
#    (SKIP_CHECK=1 skips step 1);
# 3. $OUT/results.tgz: docs/results/runs (commit its new rows) and the rows' logs; $OUT/gpu_check.log.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PY=python3 PYTHON=python3
mkdir -p ../shared/data && ln -sfn "$PWD/.devdata/apao-office" ../shared/data/apao-office  # the rerun lines' path
OUT=${OUT:-/tmp/device-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [[ ${SKIP_CHECK:-0} != 1 ]]; then
  bash benchmarks/gpu_check.sh --out /tmp/gpu-check 2>&1 | tee "$OUT/gpu_check.log"
fi
ROWS=${ROWS:-tiger-ce-s42 tiger-apao_pointwise-s42 llama-ce-s42 llama-apao_pointwise-s42}
left=$(( ${DEADLINE:-560} - (SECONDS - start) ))
if (( left > 30 )); then
  # shellcheck disable=SC2086
  RECIPE=apao_release EXTRA=trainer=gpu JOBS=$(wc -w <<< "$ROWS") LIMIT=$left scripts/results_office.sh $ROWS
fi
tar czf "$OUT/results.tgz" docs/results/runs outputs/results_office/*/*.log 2>/dev/null
echo "device_session: $((SECONDS - start)) s"
