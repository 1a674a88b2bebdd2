"""Training throughput (samples/s) of each backbone at the default size on Office, CPU.

CE training steps (forward + backward + clipping + AdamW, as `genrec.train` runs them) on real
Office training batches: epoch 0 of the seeded length-bucketed train loader, `--batches` of them
picked at evenly spaced quantiles of their width (so the sample costs what the epoch costs per
example), after a warm-up step. Also the padding efficiency (real history tokens / padded history
tokens over a whole epoch) of our length-bucketed batches vs random batches, and the throughput on
`--random-batches` random batches, and (`--bf16`, default on) the same bucketed batches with the forward
under CPU bf16 autocast (`trainer.precision=bf16-mixed`, as experiment=office_cpu trains), timed in the same
run, as a ratio to float32; for Llama also bf16 with its training prefill attention in SDPA, as before
2026-12-05 (`genrec.models.llama_block.prefill_attention`: SDPA's CPU backward), as a ratio; for TIGER
also bf16 at dropout 0 (`--dropout0`: what dropping dropout would buy, e.g. callbacks.late_dropout's first
epochs), with `t5_block.Block.attention` explicit (now) and in SDPA (before 2026-12-06; in CE training it served the
decoder's cross-attention then, only the encoder's self-attention since 2026-12-07), as ratios; and TIGER bf16 with
the dropout and training attention of before 2026-12-07 (bool-mask products, the feed-forward's 1/(1-p) on d_ff
elements, float32-promoted attention scores, the decoder's cross-attention over K/V projected from the encoder states
instead of the states themselves), as a ratio, and the ratio the cross-attention alone makes; and as of commit
55f4dfe (`bf16_vs_55f4dfe_cpu`: torch products with numpy-converted masks, relu and dropout in separate passes, per
layer the position bias and the key mask applied to the scores out of place, the attention dropout's scale on the
probabilities), as a ratio; and (`bf16_one_sequence_decoder_vs_candidates_cpu`) CE's decoder as it ran before 2026-12-07 pm, one
candidate through the candidates' self-attention pattern instead of one causal sequence, as a ratio. For the bf16
step also its matmul FLOPs (forward and backward, torch's FlopCounterMode) per CPU second, as a share of one large
bf16 matmul's on this CPU (`bf16_of_matmul_peak`: the roofline; what is left above it is all a faster step could
gain while the model's arithmetic stays the same). The cores
may be shared: the batches are repeated for `--min-seconds` and each batch's fastest pass counts;
samples per CPU second (process time) is
the number contention distorts least. The last line printed is one JSON object.

  python benchmarks/training.py [--batches 6] [--batch-size 256] [--backbones tiger llama] [--threads 1] [--no-bf16]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

from genrec.models import dropout as dropout_module
from genrec.models import llama_block, t5_block, tiger
from genrec.models.base import BOS

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    TrainStep, best_times, epoch_batches, load_average, matmul_peak_gflops, office, padding_efficiency, peak_rss_gb,
    step_flops)


T5_ATTENTION = t5_block.Block.attention


def mask_product_dropout(self, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
    """`dropout._KeepScale.forward`/`backward` before 2026-12-07: a product with the bool mask (torch copies it into
    x's dtype first)."""
    self.save_for_backward(keep)
    self.scale = scale
    return x.mul(keep).mul_(scale)


def mask_product_backward(self, grad: torch.Tensor):
    (keep,) = self.saved_tensors
    return grad.mul(keep).mul_(self.scale), None, None


def converted_mask_dropout(self, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
    """`dropout._KeepScale.forward`/`backward` as of 55f4dfe: a torch product with the mask converted by numpy."""
    self.save_for_backward(keep)
    self.scale = scale
    y = x.mul(dropout_module.as_dtype(keep, x.dtype))
    return y if scale == 1.0 else y.mul_(scale)


def converted_mask_backward(self, grad: torch.Tensor):
    (keep,) = self.saved_tensors
    g = grad.mul(dropout_module.as_dtype(keep, grad.dtype))
    return g if self.scale == 1.0 else g.mul_(self.scale), None, None


def float32_score_attention(block: t5_block.Block, q, k, v, bias, mask):
    """TIGER's training attention before 2026-12-07: the float32 bias promoted bf16 scores (softmax, dropout and
    their backward) to float32."""
    s = (q @ k.transpose(-1, -2) + bias.bias) if bias is not None else q @ k.transpose(-1, -2)
    y = block.drop(s.masked_fill(~mask[:, None, None], float("-inf")).softmax(-1)) @ v
    return y.transpose(1, 2).flatten(-2), 1.0


def separate_bias_attention(block: t5_block.Block, q, k, v, bias, mask):
    """TIGER's training attention as of 55f4dfe: per layer the bias added to the bf16 scores, then the mask (out of
    place), the dropout's scale on the probabilities."""
    s = q @ k.transpose(-1, -2)
    s = (s if bias is None else s + bias.bias.to(s.dtype)).masked_fill(~mask[:, None, None], float("-inf"))
    y = block.drop(s.softmax(-1)) @ v
    return y.transpose(1, 2).flatten(-2), 1.0


def no_added_bias():
    """`Tiger.encode` without building `KeyBias.added` (unused by the attention of the baselines)."""
    return mock.patch.object(tiger, "KeyBias", lambda bias, mask, dtype=None: t5_block.KeyBias(bias, mask))


def separate_relu_dropout():
    """The feed-forward's relu, then dropout (with its scale left for after wo), as before 2026-12-07 pm."""
    return mock.patch.object(t5_block, "relu_dropout_unscaled", lambda x, p, training=True: (
        dropout_module.dropout_unscaled(x.relu(), p, training)))


def before_20261207(absorb: bool = False) -> list:
    """The patches that restore TIGER's CPU dropout and training attention as they were before 2026-12-07 (with
    `absorb`: all but the cross-attention, which meets the encoder states directly since then)."""
    old = [mock.patch.object(dropout_module._KeepScale, "forward", staticmethod(mask_product_dropout)),
           mock.patch.object(dropout_module._KeepScale, "backward", staticmethod(mask_product_backward)),
           mock.patch.object(t5_block, "relu_dropout_unscaled", lambda x, p, training=True: (
               dropout_module.dropout(x.relu(), p, training), 1.0)),  # the scale on d_ff elements, before wo
           mock.patch.object(t5_block.Block, "attention", float32_score_attention), no_added_bias()]
    return old if absorb else [mock.patch.object(tiger, "absorbs", lambda *a: False), *old]


def as_of_55f4dfe() -> list:
    """The patches that restore TIGER's CPU dropout and training attention as of commit 55f4dfe (2026-12-07 am):
    dropout's torch product with a converted mask, relu and dropout in separate passes, per layer the bias added
    and the mask applied to the scores out of place, the attention dropout's scale on the probabilities."""
    return [mock.patch.object(dropout_module._KeepScale, "forward", staticmethod(converted_mask_dropout)),
            mock.patch.object(dropout_module._KeepScale, "backward", staticmethod(converted_mask_backward)),
            separate_relu_dropout(), mock.patch.object(t5_block.Block, "attention", separate_bias_attention),
            no_added_bias()]


def candidate_decode(self: tiger.Tiger, enc: tiger.TigerEncoding, prefix: torch.Tensor) -> torch.Tensor:
    """`Tiger._decode` for CE before 2026-12-07 pm: one candidate (N = 1) through the candidates' self-attention
    pattern (`Tiger._candidate_attention`: bos apart, q/k/v per part) instead of one causal sequence."""
    B, N, m = prefix.shape
    x0 = self._dropout(self.embed(prefix.new_full((B, 1, 1), BOS)))
    x = self._dropout(self.embed(prefix))
    bias = self._self_bias(0, m + 1, x)
    z = torch.cat([x0.reshape(B, 1, -1), x.reshape(B, N * m, x.shape[-1])], 1)
    absorbed = tiger.absorbs(z.shape[1], enc.mask.shape[1], self.d_kv)
    crosses = [blk.absorbed_cross(enc.states, enc.mask) for blk in self.decoder] if absorbed else [
        blk.projected_cross(k, v, enc.mask) for blk, (k, v) in zip(self.decoder, self.cross_kv(enc))]
    for blk, cross in zip(self.decoder, crosses):
        z = blk(z, self._candidate_attention(blk, bias, N, m), cross)
    return self._head_input(z)


def sdpa_cross_attention(block: t5_block.Block, q, k, v, bias, mask):
    """TIGER's decoder attention through SDPA (its eval path), as training at dropout 0 ran before 2026-12-06."""
    training, block.training = block.training, False
    try:
        return T5_ATTENTION(block, q, k, v, bias, mask)
    finally:
        block.training = training


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=6, help="timed length-bucketed batches per backbone")
    p.add_argument("--random-batches", type=int, default=3, help="timed random batches per backbone (0: none)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--backbones", nargs="+", default=["tiger", "llama"], choices=["tiger", "llama"])
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: per-core numbers)")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                   help="also time the bucketed batches under bf16 autocast (ratio to float32)")
    p.add_argument("--dropout0", action=argparse.BooleanOptionalAction, default=True,
                   help="TIGER bf16 also at dropout 0, with and without SDPA in the cross-attention")
    p.add_argument("--min-seconds", type=float, default=30.0, help="repeat each batch set this long; best pass counts")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    load = [load_average()]
    cfgs = {b: office([f"backbone={b}", "objective=ce"], args.batch_size) for b in args.backbones}
    _, data, dm = cfgs[args.backbones[0]]
    lengths, T = dm.splits["train"].lengths, data.sids.num_levels
    bucketed, random = epoch_batches(dm, args.batches), epoch_batches(dm, args.random_batches, bucketed=False)
    best: dict[str, dict] = {}
    for b in args.backbones:
        train = TrainStep(*cfgs[b])
        train.step(max(bucketed + random, key=lambda x: x["history"].shape[1]))  # warm-up: the widest batch
        best[b] = {"bucketed": best_times(train.step, bucketed, args.min_seconds),
                   "random": best_times(train.step, random, args.min_seconds / 2) if random else None,
                   "params_m": round(sum(w.numel() for w in train.module.backbone.parameters()) / 1e6, 2)}
        if args.bf16:
            train = TrainStep(*cfgs[b], bf16=True)
            train.step(max(bucketed, key=lambda x: x["history"].shape[1]))
            best[b]["bf16"] = best_times(train.step, bucketed, args.min_seconds)
            best[b]["bf16_flops"] = step_flops(train.step, bucketed)
            if b == "llama":  # the same step with SDPA's backward in the prefill (genrec before 2026-12-05)
                def sdpa(q, k, v, mask, p, training):
                    return F.scaled_dot_product_attention(q, k, v, mask, dropout_p=p if training else 0.0)
                with mock.patch.object(llama_block, "prefill_attention", sdpa):
                    train.step(max(bucketed, key=lambda x: x["history"].shape[1]))
                    best[b]["bf16_sdpa"] = best_times(train.step, bucketed, args.min_seconds)
            for key, patches in [("bf16_before_20261207", before_20261207(False)),
                                 ("bf16_before_20261207_but_absorbed", before_20261207(True)),
                                 ("bf16_55f4dfe", as_of_55f4dfe()),
                                 ("bf16_candidate_decoder", [mock.patch.object(tiger.Tiger, "_decode", candidate_decode)])]:
                if b != "tiger":  # the same step with the dropout and attention of before 2026-12-07 / 55f4dfe
                    break
                with contextlib.ExitStack() as stack:
                    for patch in patches:
                        stack.enter_context(patch)
                    train.step(max(bucketed, key=lambda x: x["history"].shape[1]))
                    best[b][key] = best_times(train.step, bucketed, args.min_seconds)
            if b == "tiger" and args.dropout0:  # dropout 0, and so with SDPA's
                train = TrainStep(*office(["backbone=tiger", "objective=ce", "backbone.dropout=0.0"], args.batch_size),
                                  bf16=True)  # backward in the cross-attention (genrec before 2026-12-06)
                for key, attention in [("bf16_p0", T5_ATTENTION), ("bf16_p0_sdpa", sdpa_cross_attention)]:
                    with mock.patch.object(t5_block.Block, "attention", attention):
                        train.step(max(bucketed, key=lambda x: x["history"].shape[1]))
                        best[b][key] = best_times(train.step, bucketed, args.min_seconds)
        load.append(load_average())
        print(f"{b}: {json.dumps(best[b])}", flush=True)
    n_bucketed, n_random = (sum(len(x["index"]) for x in xs) for xs in (bucketed, random))
    result = {"matmul_peak_gflops_bf16": round(matmul_peak_gflops(torch.bfloat16), 1), "padding_efficiency": {
        "bucketed": round(padding_efficiency(lengths, args.batch_size, T, dm.seed), 3),
        "random": round(padding_efficiency(lengths, args.batch_size, T, dm.seed, bucketed=False), 3)}}
    for b, t in best.items():
        wall, cpu, passes = t["bucketed"]
        row = {"samples_per_s": round(n_bucketed / wall, 1), "samples_per_cpu_s": round(n_bucketed / cpu, 1),
               "epoch_s": round(len(lengths) * wall / n_bucketed, 1),
               "epoch_cpu_s": round(len(lengths) * cpu / n_bucketed, 1), "params_m": t["params_m"], "passes": passes}
        if t["random"]:
            row["random_samples_per_s"] = round(n_random / t["random"][0], 1)
            row["random_samples_per_cpu_s"] = round(n_random / t["random"][1], 1)
            row["speedup_vs_random_cpu"] = round(row["samples_per_cpu_s"] / row["random_samples_per_cpu_s"], 2)
        if t.get("bf16"):
            row["bf16_samples_per_s"] = round(n_bucketed / t["bf16"][0], 1)
            row["bf16_samples_per_cpu_s"] = round(n_bucketed / t["bf16"][1], 1)
            row["bf16_speedup_cpu"] = round(row["bf16_samples_per_cpu_s"] / row["samples_per_cpu_s"], 2)
            row["bf16_matmul_gflops_per_cpu_s"] = round(t["bf16_flops"] / t["bf16"][1] / 1e9, 1)
            row["bf16_of_matmul_peak"] = round(row["bf16_matmul_gflops_per_cpu_s"] / result["matmul_peak_gflops_bf16"], 3)
        if t.get("bf16_before_20261207"):
            row["bf16_vs_before_20261207_cpu"] = round(t["bf16_before_20261207"][1] / t["bf16"][1], 2)
            row["bf16_absorbed_cross_vs_projected_cpu"] = round(
                t["bf16_before_20261207"][1] / t["bf16_before_20261207_but_absorbed"][1], 2)
            row["bf16_vs_55f4dfe_cpu"] = round(t["bf16_55f4dfe"][1] / t["bf16"][1], 2)
            row["bf16_one_sequence_decoder_vs_candidates_cpu"] = round(t["bf16_candidate_decoder"][1] / t["bf16"][1], 2)
        if t.get("bf16_p0"):
            row["bf16_dropout0_samples_per_cpu_s"] = round(n_bucketed / t["bf16_p0"][1], 1)
            row["bf16_dropout0_vs_dropout_cpu"] = round(t["bf16"][1] / t["bf16_p0"][1], 2)
            row["bf16_dropout0_explicit_vs_sdpa_cpu"] = round(t["bf16_p0_sdpa"][1] / t["bf16_p0"][1], 2)
        if t.get("bf16_sdpa"):
            row["bf16_sdpa_samples_per_cpu_s"] = round(n_bucketed / t["bf16_sdpa"][1], 1)
            row["bf16_explicit_vs_sdpa_cpu"] = round(t["bf16_sdpa"][1] / t["bf16"][1], 2)
        result[b] = row
    result["config"] = {"data": "Office (APAO release codes, T=4)", "objective": "ce", "batch_size": args.batch_size,
                        "train_examples": len(lengths), "batches": args.batches, "examples": n_bucketed,
                        "random_batches": args.random_batches, "random_examples": n_random, "threads": args.threads, "bf16": args.bf16,
                        "min_seconds": args.min_seconds, "peak_rss_gb": round(peak_rss_gb(), 2),
                        "load_average_1_5_15": load}
    print("\n| backbone | params (M) | samples/s | samples / CPU s | epoch (CPU s) | random batches: samples / CPU s "
          "| bf16: samples / CPU s (× float32) |")
    print("|---|---|---|---|---|---|---|")
    for b in best:
        r = result[b]
        print(f"| {b} | {r['params_m']} | {r['samples_per_s']} | {r['samples_per_cpu_s']} | {r['epoch_cpu_s']} | "
              f"{r.get('random_samples_per_cpu_s', '')} | "
              + (f"{r['bf16_samples_per_cpu_s']} (×{r['bf16_speedup_cpu']})" if "bf16_speedup_cpu" in r else "") + " |")
    pe = result["padding_efficiency"]
    print(f"\npadding efficiency: length-bucketed {pe['bucketed']:.3f}, random {pe['random']:.3f}\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
