#!/usr/bin/env bash
# The release's recipe (experiment=apao_release) on the release's Office data, TIGER-CE, seed 42, to early
# stopping: the check that genrec reproduces the paper's 0.0608 independent of any CPU shortcut. About 45
# epochs, hours on 2 CPU cores: it runs in the background and continues from last.ckpt when started again
# (e.g. in the next session). Progress: tail outputs/paper_recipe/office-tiger-ce-s42.log, or
#   python benchmarks/time_to_quality.py --curve outputs/paper_recipe/office-tiger-ce-s42
# When it finishes, commit its metrics.json + config.yaml under docs/results/runs/paper-recipe-tiger-ce-s42/.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-$(cd .. && pwd)/shared/data/apao-office}
RUN=outputs/paper_recipe/office-tiger-ce-s42
mkdir -p outputs/paper_recipe
OMP_NUM_THREADS=${THREADS:-1} nohup .venv/bin/python -m genrec.train experiment=apao_release dataset=apao_office \
  dataset.root="$DATA" objective=ce seed=42 trainer.progress_bar=false resume=true hydra.run.dir="$RUN" \
  >> "$RUN.log" 2>&1 &
echo "started (pid $!): $RUN, log $RUN.log"
