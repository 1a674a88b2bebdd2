"""Beam search, full ranking and the evaluator against slow, obviously-correct references."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from toy import ToyBackbone, random_batch, random_sids

from genrec.sid.codes import SemanticIds
from genrec.eval.beam import beam_search
from genrec.eval.evaluator import Evaluator
from genrec.eval.fullrank import TOLERANCE, full_scores, rank_of, top_rank
from genrec.sid.trie import Trie
from genrec.models.base import Backbone


def reference_beam(backbone, history, mask, sids, beam):
    """Python loops over users and beams; every beam scored with prefix_logits; Python's
    stable sort over (beam, token) order breaks ties."""
    T = sids.num_levels
    cand = [tuple(c) for c in sids.cand_tokens().tolist()]
    valid = {c[:m] for c in cand for m in range(T + 1)}
    lists, scores = [], []
    for b in range(history.shape[0]):
        enc = backbone.encode(history[b : b + 1], mask[b : b + 1])
        beams = [((), torch.tensor(0.0))]
        for m in range(T):
            grown = []
            for prefix, s in beams:
                logits = backbone.prefix_logits(enc, torch.tensor([[list(prefix)]], dtype=torch.long))[0, 0, -1]
                logp = torch.log_softmax(logits.float(), -1)
                for tok in range(backbone.vocab_size):
                    if prefix + (tok,) in valid:
                        grown.append((prefix + (tok,), s + logp[tok]))
            beams = sorted(grown, key=lambda x: -x[1].item())[:beam]
        lists.append([cand.index(p) for p, _ in beams])
        scores.append([s.item() for _, s in beams])
    return lists, scores


def brute_scores(backbone, history, mask, sids):
    """Teacher forcing of every candidate with prefix_logits: [B, C]."""
    y = sids.cand_tokens()
    enc = backbone.encode(history, mask)
    B = history.shape[0]
    logits = backbone.prefix_logits(enc, y[None, :, :-1].expand(B, -1, -1))  # [B, C, T, V]
    logp = torch.log_softmax(logits.float(), -1)
    return logp.gather(-1, y[None, :, :, None].expand(B, -1, -1, 1))[..., 0].sum(-1)


def setup(sizes, items, batch=6, seed=0):
    sids = random_sids(items, sizes, seed=seed)
    return sids, Trie(sids), ToyBackbone(sids.vocab_size, seed=seed), random_batch(sids, batch, seed=seed)


@pytest.mark.parametrize(
    "sizes,items,beam", [([4, 4, 4], 40, 3), ([4, 4, 4], 40, 7), ([3, 3, 3, 3], 30, 5), ([5, 2], 7, 4)]
)
def test_beam_matches_reference_loop(sizes, items, beam):
    sids, trie, bb, batch = setup(sizes, items)
    res = beam_search(bb, bb.encode(batch["history"], batch["mask"]), trie, beam)
    lists, scores = reference_beam(bb, batch["history"], batch["mask"], sids, beam)
    assert res.cands.tolist() == lists
    torch.testing.assert_close(res.scores, torch.tensor(scores), rtol=0, atol=1e-5)
    # prefix ids are the prefixes of the kept beams; every returned item is a real, distinct candidate
    assert [p.shape[1] for p in res.prefix_ids] == [min(beam, trie.num_prefixes(m)) for m in range(1, len(sizes) + 1)]
    assert ((res.cands >= 0) & (res.cands < sids.num_candidates)).all()
    assert all(len(set(row)) == len(row) for row in res.cands.tolist())
    for m, p in enumerate(res.prefix_ids[:-1], 1):
        kept = trie.cand_prefix_id[res.cands, m]
        assert (kept[..., None] == p[:, None, :]).any(-1).all()  # each final item descends from a kept prefix


@pytest.mark.parametrize("sizes,items", [([4, 4, 4], 40), ([3, 3, 3, 3], 30), ([5, 2], 7)])
def test_wide_beam_is_full_ranking(sizes, items):
    sids, trie, bb, batch = setup(sizes, items, batch=5, seed=1)
    C = sids.num_candidates
    enc = bb.encode(batch["history"], batch["mask"])
    full = full_scores(bb, enc, trie, chunk=2)  # one prefix per step call
    torch.testing.assert_close(full, brute_scores(bb, batch["history"], batch["mask"], sids), rtol=0, atol=1e-5)
    torch.testing.assert_close(full_scores(bb, enc, trie, chunk=10**6), full, rtol=0, atol=1e-6)  # one block
    res = beam_search(bb, enc, trie, beam=C + 3)
    order = full.sort(dim=1, descending=True, stable=True)
    assert res.cands[:, :C].tolist() == order.indices.tolist()
    torch.testing.assert_close(res.scores[:, :C], order.values, rtol=0, atol=1e-5)
    assert (res.cands[:, C:] == -1).all() and torch.isinf(res.scores[:, C:]).all()
    # beam scores are the model's S(y|x) of the returned items
    small = beam_search(bb, enc, trie, beam=4)
    torch.testing.assert_close(small.scores, full.gather(1, small.cands), rtol=0, atol=1e-5)


@dataclass
class Enc:
    mask: torch.Tensor


class TableBackbone(Backbone):
    """Logits from a fixed table keyed by the prefix (default: uniform)."""

    def __init__(self, vocab_size: int, table: dict[tuple, list[float]]) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.table = table

    def encode(self, history, mask):
        return Enc(mask)

    def prefix_logits(self, enc, prefix):
        B, N, m = prefix.shape
        out = torch.zeros(B, N, m + 1, self.vocab_size)
        for b in range(B):
            for n in range(N):
                for j in range(m + 1):
                    key = tuple(prefix[b, n, :j].tolist())
                    out[b, n, j] = torch.tensor(self.table.get(key, [0.0] * self.vocab_size))
        return out


def test_ties_are_broken_by_beam_then_token():
    sids = random_sids(20, [3, 3, 3], seed=2)
    trie, bb = Trie(sids), TableBackbone(sids.vocab_size, {})  # uniform: every item ties
    batch = random_batch(sids, 2)
    enc = bb.encode(batch["history"], batch["mask"])
    assert beam_search(bb, enc, trie, 20).cands.tolist() == [list(range(20))] * 2  # lexicographic codes
    lists, _ = reference_beam(bb, batch["history"], batch["mask"], sids, 4)
    assert beam_search(bb, enc, trie, 4).cands.tolist() == lists
    assert rank_of(full_scores(bb, enc, trie), torch.tensor([0, 7])).tolist() == [1, 8]
    floor = beam_search(bb, enc, trie, 10).scores[:, 9]  # every item ties with the floor: all of them expanded
    assert top_rank(bb, enc, trie, torch.tensor([0, 7]), floor, 10).tolist() == [1, 8]
    assert top_rank(bb, enc, trie, torch.tensor([12, 3]), floor, 10).tolist() == [11, 4]  # 13th: beyond the cap


def spec_example():
    """Items A=(0,0), B=(1,0), C=(1,1). P(a0)=.4 < P(a1)=.6, but A's second token is sure:
    S(A)=log .4 > S(B)=S(C)=log .3. Beam K=1 keeps a1 at step 1 and prunes A."""
    sids = SemanticIds(np.array([[0, 0], [1, 0], [1, 1]]), [2, 2])
    ninf = float("-inf")
    lp = np.log
    table = {
        (): [ninf, ninf, ninf, lp(0.4), lp(0.6), ninf, ninf],
        (3,): [ninf, ninf, ninf, ninf, ninf, 0.0, ninf],
        (4,): [ninf, ninf, ninf, ninf, ninf, lp(0.5), lp(0.5)],
    }
    return sids, TableBackbone(sids.vocab_size, table)


def test_spec_example_pruning():
    sids, bb = spec_example()
    trie = Trie(sids)
    tok = sids.cand_tokens()
    target = torch.tensor([0, 1])  # user 0 wants A, user 1 wants B
    mask = torch.ones(2, 2, dtype=torch.bool)
    batch = {"history": tok[target], "mask": mask, "target": tok[target], "target_cand": target,
             "index": torch.tensor([5, 6])}
    enc = bb.encode(batch["history"], batch["mask"])
    full = full_scores(bb, enc, trie)
    torch.testing.assert_close(full[0], torch.tensor(np.log([0.4, 0.3, 0.3]), dtype=torch.float))
    assert rank_of(full, target).tolist() == [1, 2]  # B ties with C; lower id first
    assert beam_search(bb, enc, trie, 1).cands.tolist() == [[1], [1]]  # tie B/C -> lower token
    ev = Evaluator(beam=1, ks=(1, 2), full_rank=True)
    rows = ev.per_example(bb, trie, batch)
    assert rows["index"].tolist() == [5, 6]
    assert rows["rank"].tolist() == [0, 1]
    assert rows["full_rank"].tolist() == [1, 2]
    assert rows["prefix_hit"].tolist() == [[False, False], [True, True]]
    out = ev.summarize(rows)
    assert out["recall@1"] == 0.5 and out["full/recall@1"] == 0.5 and out["full/recall@2"] == 1.0
    assert out["pruning_rate@1"] == 1.0 and out["pruning_rate@2"] == 0.5
    assert out["prefix_recall@1"] == 0.5 and out["prefix_recall@2"] == 0.5
    wide = Evaluator(beam=2, ks=(1, 2), full_rank=True).per_example(bb, trie, batch)  # the capped search
    assert wide["rank"].tolist() == [1, 2] and wide["prefix_hit"].all()
    assert wide["full_rank"].tolist() == [1, 2]  # B ties with C: the lower id first


def test_evaluator_rows_agree_with_beam_and_full_ranking():
    sids, trie, bb, batch = setup([4, 4, 4], 40, batch=8, seed=3)
    C = sids.num_candidates
    rows = Evaluator(beam=5, full_rank=True, chunk=3).per_example(bb, trie, batch)
    target = batch["target_cand"]
    lists, _ = reference_beam(bb, batch["history"], batch["mask"], sids, 5)
    assert rows["rank"].tolist() == [lst.index(t) + 1 if t in lst else 0 for lst, t in zip(lists, target.tolist())]
    brute = brute_scores(bb, batch["history"], batch["mask"], sids)
    assert rows["full_rank"].tolist() == [int((brute[b] > brute[b, t]).sum()) + 1 for b, t in enumerate(target)]
    returned = rows["rank"] > 0
    assert (rows["full_rank"][returned] >= rows["rank"][returned]).all()  # pruned items can only rank above
    assert torch.equal(rows["prefix_hit"][:, -1], returned)
    # the teacher-forced CE row is the target's exact log-prob over T tokens, from the same encoding
    torch.testing.assert_close(rows["loss"], -brute[torch.arange(len(target)), target].float() / sids.num_levels)
    wide = Evaluator(beam=C, full_rank=True).per_example(bb, trie, batch)  # beam >= max(ks): capped search
    assert torch.equal(wide["rank"].clamp(max=21), wide["full_rank"]) and wide["prefix_hit"].all()
    out = Evaluator(beam=C, ks=(10, 20, 40), full_rank=True).summarize(wide)
    assert all(out[f"pruning_rate@{k}"] == 0.0 for k in (10, 20, 40))
    assert out["recall@20"] == out["full/recall@20"] == (wide["full_rank"] <= 20).double().mean().item()
    top = rows["full_rank"] <= 20
    pr = Evaluator(beam=5, ks=(20,), full_rank=True).summarize(rows)["pruning_rate@20"]
    assert top.any() and pr == (rows["rank"][top] == 0).double().mean().item()


def capped_brute_rank(scores: torch.Tensor, target: torch.Tensor, cap: int) -> list[int]:
    """Explicit loops: 1 + the candidates scoring above the target (ties: lower id first), cap + 1 beyond cap."""
    out = []
    for b, t in enumerate(target.tolist()):
        ahead = sum(1 for c, v in enumerate(scores[b].tolist()) if v > scores[b, t] or (v == scores[b, t] and c < t))
        out.append(min(ahead + 1, cap + 1))
    return out


@pytest.mark.parametrize("sizes,items,cap", [([4, 4, 4], 40, 3), ([4, 4, 4], 40, 10), ([3, 3, 3, 3], 60, 5),
                                             ([5, 2], 7, 4), ([5, 2], 7, 9)])
@pytest.mark.parametrize("score,temperature", [("full", 1.0), ("masked", 2.0)])
def test_top_rank_is_the_capped_full_ranking(sizes, items, cap, score, temperature):
    """The floor is the beam's cap-th best score (-inf where the catalogue has fewer items); every user's
    target is tried, and the beam's own items as targets, so ranks 1..cap and beyond all occur."""
    sids, trie, bb, batch = setup(sizes, items, batch=8, seed=5)
    enc = bb.encode(batch["history"], batch["mask"])
    full = full_scores(bb, enc, trie, score=score, temperature=temperature)
    res = beam_search(bb, enc, trie, max(cap, 5), score, temperature)
    floor = res.scores[:, cap - 1]
    targets = [batch["target_cand"], res.cands[:, 0], res.cands[:, min(cap, res.cands.shape[1]) - 1].clamp(min=0)]
    seen = set()
    for target in targets:
        for chunk in (1, 4096):  # one (user, prefix) row per step call, or all at once
            got = top_rank(bb, enc, trie, target, floor, cap, chunk, score, temperature)
            assert got.tolist() == capped_brute_rank(full, target, cap)
        seen |= set(got.tolist())
    assert 1 in seen and (cap + 1 in seen or items <= cap)
    no_floor = top_rank(bb, enc, trie, batch["target_cand"], torch.full_like(floor, float("-inf")), items, 3, score,
                        temperature)
    assert no_floor.tolist() == rank_of(full, batch["target_cand"]).tolist()  # uncapped: the full ranking


def test_top_rank_expands_exactly_the_prefixes_above_the_floor():
    """The search's cost: at each level the step call holds, per user, the prefixes scoring >= the floor
    (brute force: each distinct prefix teacher-forced), padded to the widest user; no other prefix."""
    sids, trie, bb, batch = setup([16, 16, 16], 1000, batch=4, seed=6)
    bb.out.weight.data *= 3  # peaked, as a trained model is
    enc = bb.encode(batch["history"], batch["mask"])
    floor = beam_search(bb, enc, trie, 5).scores[:, 4]
    widths = []
    step = bb.step

    def counting(state, tokens, parents):
        if tokens is not None:
            widths.append(tokens.shape[1])
        return step(state, tokens, parents)

    bb.step = counting
    top_rank(bb, enc, trie, batch["target_cand"], floor, 5)
    codes = sids.cand_tokens()
    want = []
    for m in (1, 2):
        prefixes = torch.unique(codes[:, :m], dim=0)  # [P_m, m]
        logits = bb.prefix_logits(enc, prefixes[None, :, :-1].expand(4, -1, -1))
        logp = torch.log_softmax(logits.float(), -1).gather(-1, prefixes[None, :, :, None].expand(4, -1, -1, 1))
        above = logp[..., 0].sum(-1) >= floor[:, None] - TOLERANCE  # [B, P_m]
        want.append(int(above.sum(1).max()))
    assert widths == want, (widths, want)
    assert sum(want) < (trie.num_prefixes(1) + trie.num_prefixes(2)) / 3  # vs full ranking's rows


def test_top_rank_falls_back_when_fewer_than_cap_items_reach_the_floor():
    """A floor that fewer than `cap` items reach (as when another batch shape, e.g. under bf16, scores the
    beam's cap-th item a little lower): an unfound target's rank is unknown, so those users are searched
    again without a floor; the ranks stay exact."""
    sids, trie, bb, batch = setup([4, 4, 4], 60, batch=8, seed=8)
    enc = bb.encode(batch["history"], batch["mask"])
    full = full_scores(bb, enc, trie)
    res = beam_search(bb, enc, trie, 5)
    floor = res.scores[:, 4] + 0.5  # only the top 1-4 items reach it
    for target in (batch["target_cand"], res.cands[:, 3]):  # the 4th best: often below this floor
        got = top_rank(bb, enc, trie, target, floor, 5)
        assert got.tolist() == capped_brute_rank(full, target, 5)
    assert (got == 4).any()


@pytest.mark.parametrize("beam", [5, 20])
def test_evaluator_full_rank_rows_with_the_capped_search(beam):
    """beam >= max(ks): full_rank rows come from `top_rank` (capped at max(ks) + 1); the metrics equal
    those of the exhaustive ranking."""
    sids, trie, bb, batch = setup([4, 4, 4], 60, batch=8, seed=7)
    ev = Evaluator(beam=beam, ks=(1, 5), full_rank=True)
    rows = ev.per_example(bb, trie, batch)
    brute = brute_scores(bb, batch["history"], batch["mask"], sids)
    exact = torch.tensor([int((brute[b] > brute[b, t]).sum()) + 1 for b, t in enumerate(batch["target_cand"])])
    assert rows["full_rank"].tolist() == exact.clamp(max=6).tolist()
    assert (exact > 6).any()  # the cap binds for some user
    want = ev.summarize({**rows, "full_rank": exact})
    assert ev.summarize(rows) == want


# --- the fast backbones: cached step vs the reference step and the reference loop -------------


def fast_backbones(V):
    out = []
    if importlib.util.find_spec("genrec.models.tiger"):
        from genrec.models.tiger import Tiger

        out.append(Tiger(V, max_positions=64, d_model=32, d_ff=64, d_kv=8, num_heads=2, num_layers=2, dropout=0.0))
    if importlib.util.find_spec("genrec.models.llama"):
        from genrec.models.llama import Llama

        out.append(Llama(V, max_positions=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1))
    return out


def test_fast_backbones():
    sids = random_sids(40, [4, 4, 4], seed=4)
    trie, batch = Trie(sids), random_batch(sids, 4, hist_items=4, seed=4)
    backbones = fast_backbones(sids.vocab_size)
    if not backbones:
        pytest.skip("no fast backbone yet")
    for bb in backbones:
        bb.eval()
        enc = bb.encode(batch["history"], batch["mask"])
        res = beam_search(bb, enc, trie, 5)
        lists, scores = reference_beam(bb, batch["history"][:2], batch["mask"][:2], sids, 5)
        assert res.cands[:2].tolist() == lists, type(bb).__name__
        torch.testing.assert_close(res.scores[:2], torch.tensor(scores), rtol=0, atol=1e-4)
        for beam in (3, 8):
            res = beam_search(bb, enc, trie, beam)
            ref = beam_search(RefStep(bb), enc, trie, beam)  # Backbone.step over prefix_logits
            assert torch.equal(ref.cands, res.cands)
            torch.testing.assert_close(ref.scores, res.scores, rtol=0, atol=1e-4)
        full = full_scores(bb, enc, trie, chunk=9)  # two prefixes per step call
        torch.testing.assert_close(full, brute_scores(bb, batch["history"], batch["mask"], sids), rtol=0, atol=1e-4)
        for cap in (1, 5):
            target = torch.tensor([0, 7, 13, 39])
            floor = beam_search(bb, enc, trie, 8).scores[:, cap - 1]
            got = top_rank(bb, enc, trie, target, floor, cap, chunk=9)
            assert got.tolist() == capped_brute_rank(full, target, cap), type(bb).__name__


class RefStep(Backbone):
    """A fast backbone with its cached step replaced by the reference `Backbone.step`."""

    def __init__(self, inner: Backbone) -> None:
        super().__init__()
        self.inner = inner
        self.vocab_size = inner.vocab_size

    def encode(self, history, mask):
        return self.inner.encode(history, mask)

    def prefix_logits(self, enc, prefix):
        return self.inner.prefix_logits(enc, prefix)
