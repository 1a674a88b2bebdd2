"""Training cost of each objective relative to CE: Office, default-size TIGER, one run.

Every objective trains (forward + backward + clipping + AdamW, as `genrec.train` does) on the
same `--batches` real Office training batches (epoch 0 of the seeded length-bucketed loader,
picked at evenly spaced quantiles of their width so that they cost what the epoch costs per
example), each objective in its own process so that its peak RSS (ru_maxrss) is its own. The
processes run in `--rounds` rounds, the order rotated each round, and each objective's fastest
round counts (the cores may be shared). Ratios use process CPU time (on `--threads 1` that is the
compute itself, which other processes on the cores inflate least); wall-clock ratios are
reported too. The CE process also times one encoder forward per batch: the floor of any
objective. S-DPO's reference is a frozen copy of the initial backbone (ref_ckpt=null).

Targets: apao-pointwise <= 1.05x CE, bear <= 1.1x CE, apao-pairwise <= 0.8x sdpo (same N) and
<= 12x CE; apao-pairwise (N=100, batch 128) peak RSS <= 4 GB. The last line printed is one JSON
object: {"ratio": {objective: CPU-time ratio over CE}, "peak_rss_gb": {...}, ...}.

  python benchmarks/objectives.py [--batches 4] [--batch-size 128] [--objectives ce msl ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import TrainStep, epoch_batches, head, load_average, office, peak_rss_gb, timed  # noqa: E402

OBJECTIVES = {
    "ce": ["objective=ce"],
    "msl": ["objective=msl"],
    "apao-pointwise": ["objective=apao", "objective.loss=pointwise"],
    "apao-pairwise": ["objective=apao", "objective.loss=pairwise", "objective.num_negatives={N}"],
    "bear": ["objective=bear"],
    "sdpo": ["objective=sdpo", "objective.ref_ckpt=null", "objective.num_negatives={N}"],
}
TARGETS = {  # (objective, bound, reference)
    "apao-pointwise <= 1.05x ce": ("apao-pointwise", 1.05, "ce"),
    "bear <= 1.1x ce": ("bear", 1.1, "ce"),
    "apao-pairwise <= 0.8x sdpo": ("apao-pairwise", 0.8, "sdpo"),
    "apao-pairwise <= 12x ce": ("apao-pairwise", 12.0, "ce"),
}


def child(args) -> None:
    """One objective: warm-up, then the timed batches; prints one JSON line."""
    torch.set_num_threads(args.threads)
    overrides = [o.format(N=args.negatives) for o in OBJECTIVES[args.child]]
    cfg, data, dm = office(["backbone=tiger", *overrides], args.batch_size)
    batches = epoch_batches(dm, args.batches)
    train = TrainStep(cfg, data, dm)
    rss_before = peak_rss_gb()
    train.step(head(batches[-1], 16))  # warm-up
    times = [timed(train.step, b) for b in batches]
    out = {"wall": sum(t[0] for t in times), "cpu": sum(t[1] for t in times),
           "examples": sum(len(b["index"]) for b in batches), "peak_rss_gb": peak_rss_gb(), "rss_before_gb": rss_before,
           "per_batch_cpu": [round(t[1], 3) for t in times]}
    if args.child == "ce":  # the floor: one encoder forward (training mode, graph kept) per batch
        enc = train.module.backbone.encode
        floor = [timed(enc, b["history"], b["mask"]) for b in batches]
        out.update(floor_wall=sum(t[0] for t in floor), floor_cpu=sum(t[1] for t in floor))
        B, N, T = args.batch_size, args.negatives, data.sids.num_levels
        out["encoder_tokens"] = sum(b["history"].numel() for b in batches)
        out["pairwise_decoder_tokens"] = sum(len(b["index"]) for b in batches) * (N + 1) * T  # bos + T - 1 each
    print(json.dumps(out), flush=True)


def run_child(name: str, args) -> dict:
    cmd = [sys.executable, __file__, "--child", name]
    for key in ("batches", "batch_size", "threads", "negatives"):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=4, help="timed batches per objective (after one warm-up)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=list(OBJECTIVES))
    p.add_argument("--negatives", type=int, default=100, help="N for apao-pairwise and sdpo")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=1, help="runs of every objective, order rotated; the fastest counts")
    p.add_argument("--child", choices=list(OBJECTIVES), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    names = list(dict.fromkeys(["ce", *args.objectives]))
    load = [load_average()]
    best: dict[str, dict] = {}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            res = run_child(name, args)
            print(f"round {r} {name}: {json.dumps(res)}", flush=True)
            old = best.get(name)
            best[name] = res if old is None else {**res, "wall": min(old["wall"], res["wall"]),
                                                  "cpu": min(old["cpu"], res["cpu"]),
                                                  "peak_rss_gb": max(old["peak_rss_gb"], res["peak_rss_gb"])}
            load.append(load_average())
    ce = best["ce"]
    ratio = {k: v["cpu"] / ce["cpu"] for k, v in best.items()}
    result = {
        "ratio": {k: round(v, 3) for k, v in ratio.items()},
        "ratio_wall": {k: round(v["wall"] / ce["wall"], 3) for k, v in best.items()},
        "peak_rss_gb": {k: round(v["peak_rss_gb"], 3) for k, v in best.items()},
        "cpu_s_per_1000_examples": {k: round(1000 * v["cpu"] / v["examples"], 2) for k, v in best.items()},
        "encoder_forward_ratio": round(ce["floor_cpu"] / ce["cpu"], 3),
        "pairwise_decoder_to_encoder_tokens": round(ce["pairwise_decoder_tokens"] / ce["encoder_tokens"], 2),
        "targets": {k: round(ratio[o] / ratio[ref], 3) <= bound for k, (o, bound, ref) in TARGETS.items()
                    if o in ratio and ref in ratio},
        "config": {"backbone": "tiger (default size)", "data": "Office (APAO release codes, T=4)",
                   "batch_size": args.batch_size, "batches": args.batches, "examples": ce["examples"],
                   "negatives": args.negatives, "threads": args.threads, "rounds": args.rounds,
                   "load_average_1_5_15": load},
    }
    if "apao-pairwise" in best:
        result["targets"]["apao-pairwise peak_rss_gb <= 4"] = best["apao-pairwise"]["peak_rss_gb"] <= 4
    print("\n| objective | time / CE (CPU) | time / CE (wall) | CPU s / 1000 examples | peak RSS GB |")
    print("|---|---|---|---|---|")
    for k in best:
        print(f"| {k} | {result['ratio'][k]:.2f} | {result['ratio_wall'][k]:.2f} | "
              f"{result['cpu_s_per_1000_examples'][k]:.1f} | {result['peak_rss_gb'][k]:.2f} |")
    print(f"| encoder forward (floor) | {result['encoder_forward_ratio']:.2f} | | | |\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
