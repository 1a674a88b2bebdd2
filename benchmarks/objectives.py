"""Training cost of each objective relative to CE: Office, a default-size backbone (TIGER unless `--backbone llama`).

Every objective trains (forward + backward + clipping + AdamW, as `genrec.train` does) on the
same `--batches` real Office training batches (epoch 0 of the seeded length-bucketed loader,
picked at evenly spaced quantiles of their width so that they cost what the epoch costs per
example), each objective alone in its own process, as a training run has it: its peak RSS
(ru_maxrss, taken after a warm-up step on the widest batch) is its own, and so is the state of
its allocator (which matters: glibc unmaps every freed tensor over 32 MB and the kernel zero-fills
the pages again at the next step; `sys_share` reports that kernel time). The cores may be
shared: a process repeats its batches for `--min-seconds`, each batch's fastest pass counting,
and `--rounds` > 1 reruns every process, the order rotated, the fastest counting. Ratios are
over CE's process and use process CPU time (with the default `--threads 1` that is the compute
itself, which other processes inflate least); wall-clock ratios are reported too. The CE process
also times one encoder forward per batch: the floor of any objective. S-DPO's reference is a
frozen copy of the initial backbone (no init_from).

Targets: apao-pointwise <= 1.05x CE, bear <= 1.1x CE, apao-pairwise <= 0.8x sdpo (same N) and
<= 12x CE; apao-pairwise (N=100, batch 128) peak RSS <= 4 GB. The last line printed is one JSON
object: {"ratio": {objective: CPU-time ratio over CE}, "peak_rss_gb": {...}, ...}.

  python benchmarks/objectives.py [--backbone tiger] [--batches 3] [--batch-size 128] [--objectives ce msl ...]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import TrainStep, best_times, epoch_batches, load_average, office, peak_rss_gb  # noqa: E402

OBJECTIVES = {
    "ce": ["objective=ce"],
    "msl": ["objective=msl"],
    "apao-pointwise": ["objective=apao", "objective.loss=pointwise"],
    "apao-pairwise": ["objective=apao", "objective.loss=pairwise", "objective.num_negatives={N}"],
    # the same with autograd keeping every activation (TIGER: no hand-written block backward; Llama: no recompute)
    "apao-pairwise-autograd": ["objective=apao", "objective.loss=pairwise", "objective.num_negatives={N}", "{KEEP}"],
    "bear": ["objective=bear"],
    "sdpo": ["objective=sdpo", "objective.num_negatives={N}"],
    # the listwise prefix loss over the model's own beam (width N + 1) against the same loss over uniform negatives
    "apao-printed": ["objective=apao", "objective.loss=pairwise_printed", "objective.num_negatives={N}"],
    "apao-printed-beam": ["objective=apao", "objective.loss=pairwise_printed", "objective.negatives.kind=beam",
                          "objective.num_negatives={N}"],
}
TARGETS = {  # (objective, bound, reference)
    "apao-pointwise <= 1.05x ce": ("apao-pointwise", 1.05, "ce"),
    "bear <= 1.1x ce": ("bear", 1.1, "ce"),
    "apao-pairwise <= 0.8x sdpo": ("apao-pairwise", 0.8, "sdpo"),
    "apao-pairwise <= 12x ce": ("apao-pairwise", 12.0, "ce"),
}


def child(args) -> None:
    """One objective alone, as a training run has it: a warm-up step on the widest batch (its
    peak is the objective's peak RSS), then passes over the batches until `--min-seconds` have
    gone by, each batch's fastest pass counting. Prints one JSON line."""
    torch.set_num_threads(args.threads)
    keep = "backbone.memory=none"
    overrides = [o.format(N=args.negatives, KEEP=keep) for o in OBJECTIVES[args.child]]
    cfg, data, dm = office([f"backbone={args.backbone}", *overrides], args.batch_size)
    batches = epoch_batches(dm, args.batches)
    train = TrainStep(cfg, data, dm)
    rss_before = peak_rss_gb()
    train.step(max(batches, key=lambda b: b["history"].shape[1]))  # warm-up, and the largest allocations
    peak = peak_rss_gb()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    wall, cpu, passes = best_times(train.step, batches, args.min_seconds)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    out = {"wall": wall, "cpu": cpu, "passes": passes, "examples": sum(len(b["index"]) for b in batches),
           "peak_rss_gb": peak, "rss_before_gb": rss_before, "load_average": load_average(),
           # kernel time (mostly zero-filling pages the allocator unmapped and maps again)
           "sys_share": (r1.ru_stime - r0.ru_stime) / (r1.ru_stime - r0.ru_stime + r1.ru_utime - r0.ru_utime)}
    if args.child == "ce":  # the floor: one encoder forward per batch (training mode, graph kept)
        backbone = train.module.backbone
        out["floor_wall"], out["floor_cpu"], _ = best_times(lambda b: backbone.encode(b["history"], b["mask"]),
                                                            batches, args.min_seconds / 3)
        out["encoder_tokens"] = sum(b["history"].numel() for b in batches)
        T = data.sids.num_levels  # a pairwise step decodes bos + T - 1 tokens for each of 1 + N candidates
        out["pairwise_decoder_tokens"] = out["examples"] * (args.negatives + 1) * T
    print(json.dumps(out), flush=True)


def target(value: float, bound: float) -> dict:
    return {"value": round(value, 3), "met": value <= bound}


def run_child(name: str, args) -> dict:
    cmd = [sys.executable, __file__, "--child", name]
    for key in ("backbone", "batches", "batch_size", "threads", "negatives", "min_seconds"):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backbone", default="tiger", choices=["tiger", "llama"], help="default-size backbone")
    p.add_argument("--batches", type=int, default=3, help="timed batches per objective (after a warm-up step)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=list(OBJECTIVES))
    p.add_argument("--negatives", type=int, default=100, help="N for apao-pairwise, apao-printed(-beam) and sdpo")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: per-core numbers)")
    p.add_argument("--min-seconds", type=float, default=20.0,
                   help="repeat the batches within a process until this much time has passed; each batch's best counts")
    p.add_argument("--rounds", type=int, default=1, help="processes per objective, order rotated; the fastest counts")
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
            best[name] = res if old is None else {**res, **{k: min(old[k], res[k]) for k in ("wall", "cpu")},
                                                  "peak_rss_gb": max(old["peak_rss_gb"], res["peak_rss_gb"])}
            load.append(load_average())
    ce = best["ce"]
    ratio = {k: v["cpu"] / ce["cpu"] for k, v in best.items()}
    result = {
        "ratio": {k: round(v, 3) for k, v in ratio.items()},
        "ratio_wall": {k: round(v["wall"] / ce["wall"], 3) for k, v in best.items()},
        "peak_rss_gb": {k: round(v["peak_rss_gb"], 3) for k, v in best.items()},
        "cpu_s_per_1000_examples": {k: round(1000 * v["cpu"] / v["examples"], 2) for k, v in best.items()},
        "sys_share": {k: round(v["sys_share"], 3) for k, v in best.items()},
        "encoder_forward_ratio": round(ce["floor_cpu"] / ce["cpu"], 3),
        "pairwise_decoder_to_encoder_tokens": round(ce["pairwise_decoder_tokens"] / ce["encoder_tokens"], 2),
        "targets": {k: target(ratio[o] / ratio[ref], bound)
                    for k, (o, bound, ref) in TARGETS.items() if o in ratio and ref in ratio},
        "config": {"backbone": f"{args.backbone} (default size)", "data": "Office (APAO release codes, T=4)",
                   "batch_size": args.batch_size, "batches": args.batches, "examples": ce["examples"],
                   "negatives": args.negatives, "threads": args.threads, "min_seconds": args.min_seconds,
                   "rounds": args.rounds, "load_average_1_5_15": load},
    }
    if "apao-pairwise" in best:
        result["targets"]["apao-pairwise peak_rss_gb <= 4"] = target(best["apao-pairwise"]["peak_rss_gb"], 4.0)
    print("\n| objective | time / CE (CPU) | time / CE (wall) | CPU s / 1000 examples | peak RSS GB | kernel share |")
    print("|---|---|---|---|---|---|")
    for k in best:
        print(f"| {k} | {result['ratio'][k]:.2f} | {result['ratio_wall'][k]:.2f} | "
              f"{result['cpu_s_per_1000_examples'][k]:.1f} | {result['peak_rss_gb'][k]:.2f} | "
              f"{result['sys_share'][k]:.2f} |")
    print(f"| encoder forward (floor) | {result['encoder_forward_ratio']:.2f} | | | | |\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
