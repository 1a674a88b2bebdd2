#!/usr/bin/env bash
# GPU check, under 10 minutes on one GPU; the last line printed is one JSON object:
#   1. TIGER-CE on apao_office (the release's files and SIDs, collisions merged), 5 epochs, trainer=gpu (bf16-mixed): s/epoch
#      (training only, the median of epochs 2-5; the paper: 15 s on an A100) and beam-20
#      evaluation users/s (validation, median);
#   2. Llama-CE, 2 epochs: s/epoch;
#   3. pairwise APAO (100 negatives), 1 epoch: s/epoch and peak GPU memory (max_memory_allocated);
#   4. with >= 2 GPUs: the same TIGER-CE, 1 epoch, 2-process DDP: every test user counted once.
#
#   bash benchmarks/gpu_check.sh [--root ../shared/data/apao-office] [--out /tmp/genrec-gpu-check]
#   bash benchmarks/gpu_check.sh --cpu-smoke     # the same steps on experiment=tiny, CPU (seconds)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
SMOKE=0
ROOT=""
OUT=${TMPDIR:-/tmp}/genrec-gpu-check
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-smoke) SMOKE=1 ;;
    --root) ROOT=$2; shift ;;
    --out) OUT=$2; shift ;;
    *) echo "gpu_check.sh: unknown argument $1 (--cpu-smoke, --root DIR, --out DIR)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$SMOKE" = 0 ]; then
  if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check.sh: no CUDA device visible to torch (use --cpu-smoke to check the steps on CPU)" >&2
    exit 2
  fi
  if [ -z "$ROOT" ]; then
    for d in shared/data/apao-office ../shared/data/apao-office; do [ -d "$d" ] && ROOT=$d && break; done
  fi
  if [ ! -f "$ROOT/Office.inter.json" ]; then
    echo "gpu_check.sh: Office data not found (--root DIR with Office.inter.json, Office.index.rq-kmeans.json)" >&2
    exit 2
  fi
  ROOT=$(cd "$ROOT" && pwd)
fi
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline
SMOKE=$SMOKE ROOT=$ROOT OUT=$OUT "$PY" - <<'EOF'
import json, os, shutil, statistics, subprocess, sys, time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from genrec.lit import GenRec
from genrec.train import run

smoke, out = os.environ["SMOKE"] == "1", Path(os.environ["OUT"])
cuda = torch.cuda.is_available() and not smoke
if smoke:
    base = ["experiment=tiny", "trainer.accelerator=cpu", "trainer.precision=bf16-mixed", "trainer.limit_train_batches=3"]
else:
    torch.set_float32_matmul_precision("high")  # as `python -m genrec.train`
    base = ["dataset=apao_office", f"dataset.root={os.environ['ROOT']}", "trainer.progress_bar=false"]
base.append(f"data_dir={out}/data")

marks: list[tuple[str, float]] = []  # (hook, time) of training / validation epoch boundaries


def clocked(name: str, after: bool = False) -> None:
    hook = getattr(GenRec, name)

    def timed(self, *args):
        if self.trainer.sanity_checking:
            return hook(self, *args)
        if after:
            hook(self, *args)
        if cuda:
            torch.cuda.synchronize()
        marks.append((name, time.perf_counter()))
        return None if after else hook(self, *args)

    setattr(GenRec, name, timed)


for name in ("on_train_epoch_start", "on_validation_epoch_start"):
    clocked(name)
clocked("on_validation_epoch_end", after=True)


def fit(tag: str, *overrides: str) -> dict:
    """One in-process `genrec.train` run: s/epoch (training), validation users/s, peak GPU memory."""
    marks.clear()
    shutil.rmtree(out / tag, ignore_errors=True)  # a fresh timed run each call (genrec never trains into a used dir)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with initialize_config_dir(str(Path("conf").resolve()), version_base="1.3"):
        cfg = compose("config", overrides=[*base, *([] if smoke else ["trainer=gpu"]), f"run_dir={out}/{tag}",
                                           *overrides])
    r = run(cfg)
    t = {}
    for (a, ta), (b, tb) in zip(marks, marks[1:]):
        t.setdefault((a, b), []).append(tb - ta)
    train = t[("on_train_epoch_start", "on_validation_epoch_start")]
    evals = t[("on_validation_epoch_start", "on_validation_epoch_end")]
    res = {"epochs": r["epochs"], "s_per_epoch": round(statistics.median(train[1:] or train), 2),
           "eval_users_per_s": round(r["val/users"] / statistics.median(evals), 1),
           f"test_recall@{cfg.eval.ks[-1]}": round(r[f"test/recall@{cfg.eval.ks[-1]}"], 4),
           "wall_s": r["seconds"]}
    if cuda:
        res["peak_gpu_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    print(f"gpu_check: {tag}: {res}", file=sys.stderr)
    return res


start = time.time()
result = {"device": torch.cuda.get_device_name() if cuda else "cpu (smoke)", "torch": torch.__version__}
result["tiger_ce"] = fit("tiger_ce", "backbone=tiger" if not smoke else "backbone=tiger_tiny",
                         "objective=ce", f"trainer.max_epochs={2 if smoke else 5}")
result["beam20_users_per_s"] = result["tiger_ce"]["eval_users_per_s"]
result["llama_ce"] = fit("llama_ce", "backbone=llama" if not smoke else "backbone=llama_tiny",
                         "objective=ce", "trainer.max_epochs=2")
result["apao_pairwise"] = fit("apao_pairwise", "backbone=tiger" if not smoke else "backbone=tiger_tiny",
                              "objective=apao_pairwise", "trainer.max_epochs=1",
                              *(["objective.num_negatives=8"] if smoke else []))
gpus = torch.cuda.device_count() if cuda else 0
if gpus >= 2:
    run_dir = out / "ddp"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "genrec.train", *base, "backbone=tiger", "objective=ce", "trainer=ddp",
           "trainer.devices=2", "trainer.max_epochs=1", f"hydra.run.dir={run_dir}"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        result["ddp2"] = {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
    else:
        m = json.loads((run_dir / "metrics.json").read_text())
        result["ddp2"] = {"test_users": m["test/users"], "val_users": m["val/users"], "wall_s": m["seconds"]}
else:
    result["ddp2"] = f"skipped: {gpus} GPU(s)"
result["total_s"] = round(time.time() - start, 1)
print(json.dumps(result))
EOF
