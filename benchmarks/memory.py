"""How close is genrec.train's memory estimate (genrec/memory.py) to the peak it then reaches?

Each row is a real `python -m genrec.train` run on the release's Office data (experiment=office_cpu, one process,
one thread, `--steps` training batches, one validation and one test batch) that writes both figures into its
metrics.json: `memory_estimate_gb` (made before the first step: the counted bytes x genrec.memory.ALLOWANCE) and
`peak_rss_gb` (the process's peak resident memory, evaluation included). `ratio` = peak / counted bytes: what
ALLOWANCE has to cover.

    python benchmarks/memory.py                                  # the default rows
    python benchmarks/memory.py --steps 100 --rows "objective=apao_pairwise trainer.batch_size=128"

Rows run one after another (each alone: its peak is its own). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS = ["objective=ce trainer.batch_size=256",
        "objective=apao_pairwise trainer.batch_size=64",
        "objective=apao_pairwise trainer.batch_size=64 trainer.keep_freed_memory=false",
        "objective=apao_pairwise trainer.batch_size=128"]


def measure(row: str, steps: int, data: Path, out: Path) -> dict:
    cmd = [sys.executable, "-m", "genrec.train", "dataset=apao_office", f"dataset.root={data}",
           "experiment=office_cpu", "trainer.devices=1", "trainer.strategy=auto", "trainer.max_epochs=1",
           f"trainer.limit_train_batches={steps}", "trainer.limit_val_batches=1", "trainer.limit_test_batches=1",
           "eval.full_rank=false", "trainer.progress_bar=false", f"hydra.run.dir={out}", *row.split()]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    m = json.loads((out / "metrics.json").read_text())
    from genrec.memory import ALLOWANCE

    counted = m["memory_estimate_gb"] / ALLOWANCE
    return {"row": row, "steps": steps, "peak_rss_gb": m["peak_rss_gb"], "memory_estimate_gb": m["memory_estimate_gb"],
            "counted_gb": round(counted, 2), "ratio": round(m["peak_rss_gb"] / counted, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", nargs="+", default=ROWS, help="overrides of each row, one string per row")
    p.add_argument("--steps", type=int, default=40, help="training batches per row")
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/apao-office")
    a = p.parse_args()
    sys.path.insert(0, str(ROOT))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, row in enumerate(a.rows):
            results.append(measure(row, a.steps, a.data, Path(tmp) / str(i)))
            print(json.dumps(results[-1]), flush=True)
    print(json.dumps({"rows": results}))


if __name__ == "__main__":
    main()
