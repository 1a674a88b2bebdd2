"""Exact full ranking for PR@k: the capped search (`top_rank`) vs scoring every candidate (`full_scores`).

A trained run's weights matter here (a peaked model leaves little above the beam's floor), so it takes
a run dir; the users are the first `--users` of the chosen split, in the evaluator's batches. Both
methods run on the same encodings after the same beam search; the ranks they give must agree up to
the cap (max ks + 1), exactly in float32 (under the run's bf16 autocast both read float32 logits of bf16
hidden states, so near-ties may order differently: `agree_share`). Times are the fastest of `--repeat` alternating rounds, process CPU time beside
wall time. The last line printed is one JSON object.

  python benchmarks/full_rank.py --run outputs/ttq/office_cpu-v2-s42 [--users 256] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from genrec.data.datamodule import SeqDataModule  # noqa: E402
from genrec.eval.beam import beam_search  # noqa: E402
from genrec.eval.fullrank import full_scores, rank_of, top_rank  # noqa: E402
from genrec.eval.module import EvalModule  # noqa: E402
from genrec.prepare import prepare  # noqa: E402
from genrec.runs import checkpoint_path, load_backbone_state, run_config  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run", type=Path, required=True, help="a trained run dir (its selected checkpoint)")
    p.add_argument("--users", type=int, default=256)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--split", default="test", choices=["test", "valid"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    cfg = run_config(args.run / "config.yaml")
    data = prepare(cfg, log=lambda m: print(m, file=sys.stderr))
    dm = SeqDataModule(data.seq, data.sids, cfg.dataset.max_history, args.batch, args.batch, cfg.seed)
    module = EvalModule(cfg, data.sids)
    module.backbone.load_state_dict(load_backbone_state(checkpoint_path(args.run)))
    module.eval()
    bb, trie, ev = module.backbone, module.trie, module.evaluator
    cap = max(ev.ks)
    if ev.beam < cap:
        sys.exit(f"the run's eval.beam={ev.beam} < max(eval.ks)={cap}: the evaluator scores every candidate there")
    loader = dm.test_dataloader() if args.split == "test" else dm.val_dataloader()
    batches = []
    for b in loader:
        batches.append(b)
        if sum(len(x["index"]) for x in batches) >= args.users:
            break

    def exhaustive(enc, target, res):
        return rank_of(full_scores(bb, enc, trie, ev.chunk, ev.score, ev.temperature), target).clamp(max=cap + 1)

    def capped(enc, target, res):
        return top_rank(bb, enc, trie, target, res.scores[:, cap - 1], cap, ev.chunk, ev.score, ev.temperature)

    bf16 = str(cfg.trainer.precision).startswith("bf16")  # as genrec.evaluate: the run's precision
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        prepared = []
        for b in batches:
            enc = bb.encode(b["history"], b["mask"])
            prepared.append((enc, b["target_cand"], beam_search(bb, enc, trie, ev.beam, ev.score, ev.temperature)))
        best = {"full_scores": (float("inf"), float("inf")), "top_rank": (float("inf"), float("inf"))}
        ranks = {}
        for _ in range(args.repeat):
            for name, f in (("full_scores", exhaustive), ("top_rank", capped)):
                w0, c0 = time.perf_counter(), time.process_time()
                ranks[name] = torch.cat([f(*x) for x in prepared])
                w, c = time.perf_counter() - w0, time.process_time() - c0
                best[name] = (min(best[name][0], w), min(best[name][1], c))
    same = ranks["full_scores"] == ranks["top_rank"]
    agree = bool(same.all())
    users = len(ranks["top_rank"])
    out = {"users": users, "split": args.split, "beam": ev.beam, "cap": cap, "threads": args.threads,
           "precision": "bf16 autocast" if bf16 else "float32", "ranks_agree": agree,
           "agree_share": round(float(same.double().mean()), 4), "within_cap": round(float((ranks["top_rank"] <= cap).double().mean()), 4),
           **{f"{k}_s_per_1000_users": round(v[0] / users * 1000, 2) for k, v in best.items()},
           "speedup": round(best["full_scores"][0] / best["top_rank"][0], 2),
           "speedup_cpu_time": round(best["full_scores"][1] / best["top_rank"][1], 2)}
    print(json.dumps(out))
    if not agree and not bf16:  # under bf16 the two may order near-ties differently (batch-shape rounding)
        sys.exit("the capped search disagrees with full ranking")


if __name__ == "__main__":
    main()
