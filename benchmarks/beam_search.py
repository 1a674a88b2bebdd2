"""Beam-search evaluation speed: ours vs `transformers` generate, and vs the floor.

Default-size TIGER and Llama (random weights), beam 20, the Office catalogue (the APAO
release's codes if /work/shared/data is there, else random codes), users with their real
histories (up to 20 items), on `--threads` CPU cores.

  (1) ours (`encode` + `beam_search`) vs `hf.generate(num_beams=K, num_return_sequences=K,
      prefix_allowed_tokens_fn=<trie>)`, the way the APAO release evaluates; generate is
      configured so its scores are plain sums of log-probs over exactly T tokens
      (max_new_tokens=T, length_penalty=0), and timed on `--hf-users` users, then scaled;
  (2) ours vs the floor: one history-encoder pass (TIGER) / one history prefill (Llama);
  (3) exact full ranking (`full_scores`) speed on `--full-users` users.
Our evaluation runs in its own process so that its peak RSS is its own; there, ours and
the floor alternate `--repeat` times and the fastest of each counts (the cores may be
shared: `*_cpu_time` ratios use process CPU time, which contention inflates less). The
last line printed is one JSON object.

  python benchmarks/beam_search.py [--users 512] [--backbones tiger llama] [--hf-users 64]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from genrec.sid.codes import SemanticIds  # noqa: E402
from genrec.eval.beam import beam_search  # noqa: E402
from genrec.eval.fullrank import full_scores  # noqa: E402
from genrec.sid.trie import Trie  # noqa: E402
from genrec.models.base import BOS, EOS, PAD  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "apao-office"
HIST = 20


def load_data(users: int, seed: int = 0) -> tuple[SemanticIds, torch.Tensor, torch.Tensor, str]:
    """SIDs and left-padded histories (items before each user's last one, up to HIST)."""
    rng = np.random.default_rng(seed)
    if (DATA / "Office.index.rq-kmeans.json").exists():
        index = json.loads((DATA / "Office.index.rq-kmeans.json").read_text())
        codes = np.array([[int(t.split("_")[1][:-1]) for t in index[str(i)]] for i in range(len(index))])
        seqs = [v[:-1][-HIST:] for v in json.loads((DATA / "Office.inter.json").read_text()).values()][:users]
        source = "Office (APAO release codes, real histories)"
    else:
        codes = rng.integers(256, size=(2420, 4))
        seqs = [list(rng.integers(2420, size=rng.integers(1, HIST + 1))) for _ in range(users)]
        source = "random codes and histories (Office size)"
    sids = SemanticIds(codes, [256] * 4)
    tok = sids.item_tokens()
    L = HIST * sids.num_levels + 1
    history = torch.zeros(len(seqs), L, dtype=torch.long)
    for b, s in enumerate(seqs):
        row = torch.cat([tok[torch.as_tensor(s, dtype=torch.long)].reshape(-1), torch.tensor([EOS])])
        history[b, L - len(row) :] = row
    return sids, history, history != PAD, source


def build(name: str, vocab_size: int, max_positions: int):
    torch.manual_seed(0)
    if name == "tiger":
        from genrec.models.tiger import Tiger

        model = Tiger(vocab_size=vocab_size, max_positions=max_positions)
    else:
        from genrec.models.llama import Llama

        model = Llama(vocab_size=vocab_size, max_positions=max_positions)
    return model.eval()


def batches(n: int, size: int):
    return [slice(lo, min(lo + size, n)) for lo in range(0, n, size)]


@torch.no_grad()
def ours(model, trie, history, mask, beam, batch):
    res = [beam_search(model, model.encode(history[sl], mask[sl]), trie, beam) for sl in batches(len(history), batch)]
    return torch.cat([r.cands for r in res]), torch.cat([r.scores for r in res])


@functools.cache
def hf_of(model):
    """HF's model (T5 / Llama) with a copy of the backbone's weights (`to_hf`): the reference and the floor."""
    return model.to_hf().eval()


@torch.no_grad()
def floor(model, name, history, mask, batch):
    for sl in batches(len(history), batch):
        if name == "tiger":
            hf_of(model).encoder(input_ids=history[sl], attention_mask=mask[sl])
        else:
            hf_of(model)(input_ids=history[sl], attention_mask=mask[sl], use_cache=True, logits_to_keep=1)


@torch.no_grad()
def hf_generate(model, name, sids, trie, history, mask, beam, batch):
    """The APAO release's way: generate with a per-beam Python trie callback."""
    T = sids.num_levels
    cand = sids.cand_tokens().tolist()
    allowed: dict[tuple, list[int]] = {}
    for c in cand:
        for m in range(T):
            allowed.setdefault(tuple(c[:m]), []).append(c[m])
    allowed = {k: sorted(set(v)) for k, v in allowed.items()}
    start = 1 if name == "tiger" else history.shape[1]  # T5: decoder_start token; Llama: the prompt

    def fn(batch_id: int, sent: torch.Tensor) -> list[int]:
        return allowed.get(tuple(sent[start:].tolist()), [EOS])

    out = []
    for sl in batches(len(history), batch):
        gen = hf_of(model).generate(
            input_ids=history[sl],
            attention_mask=mask[sl],
            num_beams=beam,
            num_return_sequences=beam,
            max_new_tokens=T,
            min_new_tokens=T,
            length_penalty=0.0,
            early_stopping=True,
            do_sample=False,
            prefix_allowed_tokens_fn=fn,
            decoder_start_token_id=BOS,
            pad_token_id=PAD,
            eos_token_id=EOS,
            bos_token_id=BOS,
            output_scores=True,
            return_dict_in_generate=True,
        )
        out.append((trie.walk(gen.sequences[:, start:].reshape(-1, beam, T)), gen.sequences_scores.view(-1, beam)))
    return torch.cat([c for c, _ in out]), torch.cat([s for _, s in out])


def timed(f, *args):
    """(result, wall seconds, process CPU seconds)."""
    t, c = time.perf_counter(), time.process_time()
    out = f(*args)
    return out, time.perf_counter() - t, time.process_time() - c


def child(args) -> None:
    """Our evaluation alone (own process): peak RSS after it, then ours and the floor
    alternately, `--repeat` times each (the minimum counts: the cores may be shared)."""
    torch.set_num_threads(args.threads)
    sids, history, mask, _ = load_data(args.users)
    trie = Trie(sids)
    model = build(args.child, sids.vocab_size, history.shape[1] + sids.num_levels + 1)
    ours(model, trie, history[:8], mask[:8], args.beam, args.batch)  # warm-up
    (cands, scores), *t_ours = timed(ours, model, trie, history, mask, args.beam, args.batch)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    floor(model, args.child, history[:8], mask[:8], args.batch)
    t_floor = timed(floor, model, args.child, history, mask, args.batch)[1:]
    for _ in range(args.repeat - 1):
        t_ours = [min(a, b) for a, b in zip(t_ours, timed(ours, model, trie, history, mask, args.beam, args.batch)[1:])]
        t_floor = [min(a, b) for a, b in zip(t_floor, timed(floor, model, args.child, history, mask, args.batch)[1:])]
    torch.save({"cands": cands, "scores": scores, "ours": t_ours, "floor": t_floor, "peak_rss_gb": peak}, args.out)


def run(name: str, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ours.pt")
        cmd = [sys.executable, __file__, "--child", name, "--out", out, "--users", str(args.users)]
        for key in ("beam", "batch", "threads", "repeat"):
            cmd += [f"--{key}", str(getattr(args, key))]
        subprocess.run(cmd, check=True)
        res = torch.load(out)
    sids, history, mask, _ = load_data(args.users)
    trie = Trie(sids)
    model = build(name, sids.vocab_size, history.shape[1] + sids.num_levels + 1)
    n = len(history)
    (sec, cpu), (fsec, fcpu) = res["ours"], res["floor"]
    row = {"users": n, "ours_sec": sec, "ours_users_per_s": n / sec, "peak_rss_gb": res["peak_rss_gb"]}
    row.update(floor_sec=fsec, vs_floor=sec / fsec, vs_floor_cpu_time=cpu / fcpu)
    # transformers generate on a subset, scaled
    h = min(args.hf_users, n)
    hf_generate(model, name, sids, trie, history[:2], mask[:2], args.beam, args.hf_batch)  # warm-up
    (hf, hf_scores), hsec, hcpu = timed(hf_generate, model, name, sids, trie, history[:h], mask[:h], args.beam, args.hf_batch)
    row.update(hf_users=h, hf_sec=hsec, hf_users_per_s=h / hsec, hf_timed_on_subset=h < n)
    row.update(ratio=row["ours_users_per_s"] / row["hf_users_per_s"], ratio_cpu_time=(hcpu / h) / (cpu / n))
    row["lists_agree"] = (res["cands"][:h] == hf).all(1).double().mean().item()
    row["scores_max_abs_diff"] = (res["scores"][:h] - hf_scores).abs().max().item()  # HF's are plain sums too
    # exact full ranking
    f = min(args.full_users, n)
    with torch.no_grad():
        fsec = timed(lambda: full_scores(model, model.encode(history[:f], mask[:f]), trie, args.chunk))[1]
    row.update(full_users=f, full_users_per_s=f / fsec)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--users", type=int, default=512)
    p.add_argument("--backbones", nargs="+", default=["tiger", "llama"], choices=["tiger", "llama"])
    p.add_argument("--beam", type=int, default=20)
    p.add_argument("--batch", type=int, default=256, help="users per beam-search call (ours and floor)")
    p.add_argument("--hf-users", type=int, default=64, help="users timed with HF generate (then scaled)")
    p.add_argument("--hf-batch", type=int, default=32)
    p.add_argument("--full-users", type=int, default=32)
    p.add_argument("--chunk", type=int, default=4096, help="full ranking: (user, prefix) rows per decoder call")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2, help="timings of ours and the floor (min counts)")
    p.add_argument("--child", choices=["tiger", "llama"], help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    torch.set_num_threads(args.threads)
    source = load_data(1)[3]
    result = {"data": source, "beam": args.beam, "threads": args.threads}
    for name in args.backbones:
        result[name] = run(name, args)
        print(name, json.dumps(result[name]), flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
