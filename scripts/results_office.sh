#!/usr/bin/env bash
# The runs behind docs/results/office.md (APAO's Office rows, BEAR's pruning effect): one office_cpu run per
# row (~1 h each on 2 CPU cores) plus TIGER-CE with the release's recipe (experiment=apao_release, ~4 h on 2
# cores), resumable, and skipped once its summary is committed:
#   scripts/results_office.sh --list            # rows and whether each is done
#   scripts/results_office.sh                   # every missing row, in order
#   scripts/results_office.sh tiger-ce-s43      # just these rows
# A finished row is re-evaluated with exact full ranking (PR@k); its metrics.json, config.yaml, overrides.yaml
# (the command line: the page's rerun command) and eval/*.json are copied to docs/results/runs/<row>/ (commit
# them; never checkpoints), then the page is rebuilt from docs/results/runs.
# DATA: the release's Office files (default ../shared/data/apao-office).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-$(cd .. && pwd)/shared/data/apao-office}
PY=${PY:-.venv/bin/python}
# office_cpu, selecting on every validation user: its 1000-user sample (the hour's budget) is too noisy to tell
# late epochs apart (README, time to quality); +~6 min per run
CPU="experiment=office_cpu trainer.val_users=null"
APAO_PT="objective=apao_pointwise objective.beta=0.3 objective.eta=1e-4"   # Table 5, Office
declare -A ROWS=(
  [tiger-ce-s42]="$CPU objective=ce seed=42"
  [tiger-ce-s43]="$CPU objective=ce seed=43"
  [tiger-ce-s44]="$CPU objective=ce seed=44"
  [tiger-apao_pointwise-s42]="$CPU $APAO_PT seed=42"
  [tiger-apao_pointwise-s43]="$CPU $APAO_PT seed=43"
  [tiger-apao_pointwise-s44]="$CPU $APAO_PT seed=44"
  [tiger-msl-s42]="$CPU objective=msl seed=42"
  [tiger-bear-s42]="$CPU objective=bear seed=42"
  # APAO-pairwise (100 negatives) costs ~10x CE per epoch: CE -> pairwise fine-tuning (the paper's two-stage
  # setting, Table 3), 4 epochs at lr 2e-4 chosen before any result (the report labels it "(two-stage)")
  [tiger-apao_pairwise-s42]="$CPU objective=apao_pairwise init_from=outputs/results_office/tiger-ce-s42 seed=42 trainer.max_epochs=4 optim.lr=2e-4"
  [tiger-sdpo-s42]="$CPU objective=sdpo init_from=outputs/results_office/tiger-ce-s42 seed=42"
  [llama-ce-s42]="$CPU backbone=llama objective=ce seed=42"
  [llama-ce-s43]="$CPU backbone=llama objective=ce seed=43"
  [llama-apao_pointwise-s42]="$CPU backbone=llama $APAO_PT seed=42"
  [llama-apao_pointwise-s43]="$CPU backbone=llama $APAO_PT seed=43"
  # the decisive check: the release's recipe (effective batch 1024 = 2 processes x 64 x 8 accumulation, lr 5e-4,
  # cosine over 200 epochs, early stopping on the validation loss), with genrec's length-grouped batches (the
  # release draws them uniformly at random: 1.7x the time per epoch here; equal quality at equal epochs under
  # office_cpu through epoch 9). Its epochs 0-5 ran as 1 process x 128 x 8 (the same effective batch).
  [tiger-ce-apao_release-s42]="experiment=apao_release objective=ce seed=42 trainer.length_window=50 trainer.strategy=ddp trainer.accelerator=cpu trainer.devices=2 trainer.batch_size=64"
)
ORDER=(tiger-ce-s42 tiger-apao_pointwise-s42 tiger-msl-s42 tiger-bear-s42 tiger-apao_pairwise-s42 tiger-sdpo-s42 tiger-ce-s43
       tiger-apao_pointwise-s43 tiger-ce-s44 tiger-apao_pointwise-s44 llama-ce-s42 llama-apao_pointwise-s42
       llama-ce-s43 llama-apao_pointwise-s43 tiger-ce-apao_release-s42)

done_row() { [[ -f docs/results/runs/$1/metrics.json ]]; }

if [[ "${1:-}" == "--list" ]]; then
  for row in "${ORDER[@]}"; do printf '%-28s %-5s %s\n' "$row" "$(done_row "$row" && echo done || echo -)" "${ROWS[$row]}"; done
  exit 0
fi
rows=("$@"); [[ ${#rows[@]} -gt 0 ]] || rows=("${ORDER[@]}")
for row in "${rows[@]}"; do
  [[ -n "${ROWS[$row]:-}" ]] || { echo "error: unknown row $row (scripts/results_office.sh --list)" >&2; exit 2; }
  if done_row "$row"; then echo "skip $row (docs/results/runs/$row/metrics.json)"; continue; fi
  run=outputs/results_office/$row
  ref=$(grep -o 'init_from=[^ ]*' <<< "${ROWS[$row]}" | cut -d= -f2 || true)
  if [[ -n "$ref" && ! -f "$ref/checkpoints/best.ckpt" ]]; then
    echo "error: $row needs the CE checkpoint $ref/checkpoints/best.ckpt (run its CE row here first)" >&2; exit 2
  fi
  if [[ ! -f $run/metrics.json ]]; then
    # shellcheck disable=SC2086
    $PY -m genrec.train dataset=apao_office dataset.root="$DATA" ${ROWS[$row]} \
        trainer.progress_bar=false resume=true hydra.run.dir="$run"
  fi
  # exact full ranking of the selected checkpoint on test (PR@k): eval/test-beam20-full.json
  $PY -m genrec.evaluate ckpt="$run" eval.full_rank=true
  mkdir -p docs/results/runs/"$row"/eval
  cp "$run"/metrics.json "$run"/config.yaml docs/results/runs/"$row"/
  cp "$run"/.hydra/overrides.yaml docs/results/runs/"$row"/overrides.yaml
  cp "$run"/eval/*.json docs/results/runs/"$row"/eval/
done
$PY -m genrec.report 'runs=[docs/results/runs]' out=docs/results/office page=docs/results/office.md \
    page_intro=docs/results/office_intro.md paper=docs/results/paper_apao.yaml
