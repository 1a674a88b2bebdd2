"""Data-stage speed on Office: cold (empty cache) and warm (every artefact cached).

Runs `python -m genrec.prepare dataset=lcrec dataset.root=<root> dataset.name=Office` (default
embedder MiniLM, RQ-K-means 3 x 256) twice in subprocesses against one fresh temporary
`data_dir`, timing each command's wall clock (interpreter start-up and imports included).
Targets: cold <= 60 s, warm <= 3 s on 2 CPU cores. The last line printed is one JSON object.

  python benchmarks/data_stage.py [--root ../shared/data/apao-office] [--name Office] [override ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(overrides: list[str], cwd: Path) -> tuple[float, dict]:
    """Wall-clock seconds of one `python -m genrec.prepare` and its JSON summary."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "genrec.prepare", *overrides], cwd=cwd, env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"genrec.prepare failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds, json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "apao-office"))
    ap.add_argument("--name", default="Office")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. tokenizer.iters=10")
    args = ap.parse_args()
    if not (Path(args.root) / f"{args.name}.inter.json").exists():
        sys.exit(f"no {args.name}.inter.json under {args.root}")

    with tempfile.TemporaryDirectory(prefix="genrec-bench-") as tmp:
        tmp = Path(tmp)
        overrides = ["dataset=lcrec", f"dataset.root={args.root}", f"dataset.name={args.name}",
                     f"data_dir={tmp / 'data'}", f"hydra.run.dir={tmp / 'run'}", "hydra.output_subdir=null",
                     *args.overrides]
        load_before = os.getloadavg()[0]
        cold_s, cold = run(overrides, tmp)
        warm_s, warm = run(overrides, tmp)
        load_after = os.getloadavg()[0]

    assert all(warm["cache_hits"].values()), warm["cache_hits"]
    print(f"{args.name}: {cold['users']} users, {cold['items']} items, {cold['interactions']} interactions; "
          f"{cold['unique_codes']} unique codes (T={cold['levels']}, largest collision group before "
          f"disambiguation {cold.get('max_collision_before')})")
    print(f"cold {cold_s:.1f}s (target <= 60 s): " + ", ".join(f"{k} {v:.2f}s" for k, v in cold["timings"].items()))
    print(f"warm {warm_s:.1f}s (target <= 3 s): " + ", ".join(f"{k} {v:.2f}s" for k, v in warm["timings"].items()))
    print(f"{os.cpu_count()} CPUs, load average {load_before:.1f} before, {load_after:.1f} after")
    print(json.dumps({"dataset": args.name, "cold_s": round(cold_s, 2), "warm_s": round(warm_s, 2),
                      "cold_timings": cold["timings"], "warm_timings": warm["timings"],
                      "cold_prepare_s": cold["seconds"], "warm_prepare_s": warm["seconds"],
                      "cpus": os.cpu_count(), "load_before": round(load_before, 2),
                      "load_after": round(load_after, 2)}))


if __name__ == "__main__":
    main()
