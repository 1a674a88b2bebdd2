"""Time to quality: one training run end to end (data stage, training, validation, final test on
every user), as a user runs it, and the wall time at which it first reaches the target.

    python benchmarks/time_to_quality.py                       # TIGER, CE, apao_office, office_cpu
    python benchmarks/time_to_quality.py --objective apao_pointwise --backbone llama
    python benchmarks/time_to_quality.py --run-dir outputs/ttq/x -- trainer.max_epochs=20   # extra overrides
    python benchmarks/time_to_quality.py --curve <run dir> [<run dir> ...] --plot docs/results/ttq.png

The run is `python -m genrec.train experiment=<preset> ...` in a subprocess; its wall time is the
benchmark's (the process start, imports and the data stage included). Each validation point of
the run's history carries `seconds` (the run's wall time at that point from `genrec.train`'s start,
data stage included, summed over the processes of a resumed run), so the curve is
[[minutes, val recall@10], ...]. `--curve` reads finished or
in-progress runs (metrics.json, else checkpoints/last.ckpt) instead of training, e.g. the paper
recipe running in the background. The target (issue: paper protocol, part 2): test R@10 >= 0.058
and N@10 >= 0.030 within 60 minutes on 2 cores; `minutes_to_target` is the first validation point
at or above both. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = {"recall@10": 0.058, "ndcg@10": 0.030}


def history(run_dir: Path) -> tuple[list[dict], dict | None]:
    """The run's validation history and its final metrics (None while it is still training)."""
    metrics = run_dir / "metrics.json"
    if metrics.exists():
        m = json.loads(metrics.read_text())
        return m["history"], m
    import torch

    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    return ckpt.get("val_history", []), None


def curve(hist: list[dict]) -> list[list[float]]:
    """Validation passes with a recall (trainer.validate=loss logs none: experiment=apao_release needs
    `-- trainer.validate=beam` for a curve)."""
    return [[round(h["seconds"] / 60, 2), round(h["recall@10"], 4)] for h in hist if "seconds" in h and "recall@10" in h]


def minutes_to_target(hist: list[dict]) -> float | None:
    hit = [h for h in hist if "seconds" in h and all(h.get(k, 0) >= v for k, v in TARGET.items())]
    return round(hit[0]["seconds"] / 60, 2) if hit else None


def plot(runs: dict[str, list[list[float]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for label, pts in runs.items():
        if pts:
            ax.plot(*zip(*pts), marker=".", label=label)
    ax.axhline(TARGET["recall@10"], color="grey", ls="--", lw=0.8, label=f"target R@10 {TARGET['recall@10']}")
    ax.axhline(0.0608, color="black", ls=":", lw=0.8, label="paper TIGER-CE test R@10 0.0608")
    ax.set_xlabel("wall time (minutes, 2 CPU cores)")
    ax.set_ylabel("validation recall@10")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    print(f"wrote {out}", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backbone", default="tiger")
    p.add_argument("--objective", default="ce")
    p.add_argument("--dataset", default="apao_office")
    p.add_argument("--experiment", default="office_cpu")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data" / "apao-office"),
                   help="the release's Office files (default: ../shared/data/apao-office)")
    p.add_argument("--run-dir", type=Path, default=None, help="default: outputs/ttq/<time>")
    p.add_argument("--curve", type=Path, nargs="+", default=None, help="read these run dirs instead of training")
    p.add_argument("--plot", type=Path, default=None, help="PNG of val R@10 against wall time")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides (after --)")
    args = p.parse_args()

    if args.curve:
        if bad := [str(d) for d in args.curve if not ((d / "metrics.json").is_file()
                                                     or (d / "checkpoints" / "last.ckpt").is_file())]:
            p.error(f"--curve {' '.join(bad)}: not a run dir (no metrics.json, no checkpoints/last.ckpt)")
        runs = {}
        for d in args.curve:
            hist, final = history(d)
            runs[d.name] = curve(hist)
            print(json.dumps({"run": str(d), "finished": final is not None, "minutes_to_target": minutes_to_target(hist),
                              **({k: final.get(k) for k in ("test/recall@10", "test/ndcg@10")} if final else {})}),
                  file=sys.stderr)
        if args.plot:
            plot(runs, args.plot)
        print(json.dumps({"curves": runs}))
        return

    run_dir = args.run_dir or ROOT / "outputs" / "ttq" / time.strftime("%Y-%m-%d_%H-%M-%S")
    cmd = [sys.executable, "-m", "genrec.train", f"experiment={args.experiment}", f"dataset={args.dataset}",
           f"dataset.root={args.data_root}", f"backbone={args.backbone}", f"objective={args.objective}",
           f"seed={args.seed}", "trainer.progress_bar=false",
           f"hydra.run.dir={run_dir}", *args.overrides]
    print(" ".join(cmd), file=sys.stderr)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    minutes = (time.perf_counter() - start) / 60
    hist, final = history(run_dir)
    if args.plot:
        plot({f"{args.experiment} ({args.backbone}-{args.objective})": curve(hist)}, args.plot)
    print(json.dumps({
        "minutes": round(minutes, 2), "minutes_to_target": minutes_to_target(hist),
        "test/recall@10": final["test/recall@10"], "test/ndcg@10": final["test/ndcg@10"],
        "target": TARGET, "epochs": final["epochs"], "best_epoch": final["best_epoch"],
        "run_dir": str(run_dir), "curve": curve(hist),
    }))


if __name__ == "__main__":
    main()
