"""Negative samplers: never the target, a pure function of (seed, epoch, example index),
redrawn across epochs, and the right distributions."""

import numpy as np
import pytest
import torch
from obj_helpers import ToyBackbone, case, make_ctx

from genrec.models.base import token_logprobs
from genrec.objectives.negatives import Negatives, hash32


def _sampler(kind, sids, seed=0, counts=None, **kw):
    s = Negatives(kind, **kw)
    s.setup(make_ctx(sids, seed=seed, item_counts=counts))
    return s


def _batch(targets, index=None):
    targets = torch.as_tensor(targets)
    return {"target_cand": targets, "index": torch.arange(len(targets)) if index is None else torch.as_tensor(index)}


def _draw(s, batch, num, backbone=None):
    enc = None
    if backbone is not None:
        n = len(batch["index"])
        enc = backbone.encode(torch.full((n, 2), 3), torch.ones(n, 2, dtype=torch.bool))
    return s.sample(batch, num, backbone, enc)


@pytest.mark.parametrize("kind", ["uniform", "popularity", "hard"])
def test_never_target_and_deterministic_per_example(kind):
    sids, _, _ = case(num_items=30)
    C = sids.num_candidates
    counts = np.random.default_rng(0).integers(0, 50, C)
    bb = ToyBackbone(sids.vocab_size) if kind == "hard" else None
    s = _sampler(kind, sids, counts=counts, pool=20)
    targets = torch.arange(200) % C
    negs = _draw(s, _batch(targets), 8, bb)
    assert negs.shape == (200, 8) and negs.min() >= 0 and negs.max() < C
    assert not (negs == targets[:, None]).any()
    # Same rows whatever the batch order or split (DDP / shuffling).
    perm = torch.randperm(200, generator=torch.Generator().manual_seed(1))
    assert torch.equal(_draw(s, _batch(targets[perm], perm), 8, bb), negs[perm])
    halves = [_draw(s, _batch(targets[i : i + 100], torch.arange(i, i + 100)), 8, bb) for i in (0, 100)]
    assert torch.equal(torch.cat(halves), negs)
    # A fresh sampler with the same seed draws the same; another seed does not.
    assert torch.equal(_draw(_sampler(kind, sids, counts=counts, pool=20), _batch(targets), 8, bb), negs)
    assert not torch.equal(_draw(_sampler(kind, sids, seed=1, counts=counts, pool=20), _batch(targets), 8, bb), negs)


@pytest.mark.parametrize("kind", ["uniform", "popularity"])
def test_redrawn_each_epoch_and_refresh_every(kind):
    sids, _, _ = case(num_items=30)
    s = _sampler(kind, sids)
    b = _batch(torch.arange(64) % sids.num_candidates)
    first = _draw(s, b, 10)
    s.set_epoch(1)
    second = _draw(s, b, 10)
    assert (first != second).float().mean() > 0.5
    s.set_epoch(0)
    assert torch.equal(_draw(s, b, 10), first)
    slow = _sampler(kind, sids, refresh_every=2)
    draws = []
    for epoch in range(3):
        slow.set_epoch(epoch)
        draws.append(_draw(slow, b, 10))
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])


def test_uniform_distribution():
    sids, _, _ = case(num_items=12, sizes=(3, 2, 2))
    C = sids.num_candidates
    s = _sampler("uniform", sids)
    negs = _draw(s, _batch(torch.full((4000,), 5)), 6).flatten()
    freq = torch.bincount(negs, minlength=C).double() / negs.numel()
    assert freq[5] == 0
    expected = torch.full((C,), 1 / (C - 1), dtype=torch.float64)
    expected[5] = 0
    assert (freq - expected).abs().max() < 0.01  # 24k draws: sd of a share ~ 0.002


def test_popularity_distribution():
    sids, _, _ = case(num_items=10, sizes=(3, 2, 2))
    C = sids.num_candidates
    counts = np.arange(C) * 3
    s = _sampler("popularity", sids, counts=counts, alpha=0.5)
    target = 4
    negs = _draw(s, _batch(torch.full((5000,), target)), 8).flatten()
    freq = torch.bincount(negs, minlength=C).double() / negs.numel()
    w = (torch.tensor(counts, dtype=torch.float64) + 1) ** 0.5
    w[target] = 0
    assert (freq - w / w.sum()).abs().max() < 0.01


def test_hard_are_the_top_scoring_of_the_pool():
    sids, _, _ = case(num_items=30)
    bb = ToyBackbone(sids.vocab_size, seed=4)
    s = _sampler("hard", sids, pool=15)
    targets = torch.arange(5) * 3
    b = _batch(targets)
    history, mask = torch.full((5, 2), 3), torch.ones(5, 2, dtype=torch.bool)
    negs = s.sample(b, 4, bb, bb.encode(history, mask))
    pool = _sampler("uniform", sids).uniform(b["index"], targets, 15)
    tok = sids.cand_tokens()
    for i in range(5):
        scores = []
        for c in pool[i].tolist():  # score every pool member on its own
            logits = bb.target_logits(history[i : i + 1], mask[i : i + 1], tok[c][None])
            scores.append(token_logprobs(logits, tok[c][None]).sum().item())
        best = sorted(range(15), key=lambda j: -scores[j])[:4]
        assert sorted(negs[i].tolist()) == sorted(pool[i][best].tolist())


def test_hash32_is_well_spread():
    h = hash32(0, 0, torch.arange(10000)[:, None], torch.arange(4)[None])
    assert h.min() >= 0 and h.max() < 2**32
    assert len(torch.unique(h)) > 39990
    top = (h >> 28).flatten()  # high bits roughly uniform over 16 buckets
    freq = torch.bincount(top, minlength=16).double() / top.numel()
    assert (freq - 1 / 16).abs().max() < 0.01


@pytest.mark.parametrize("name", ["apao", "sdpo"])
def test_objectives_redraw_on_epoch_start(name):
    from genrec.objectives.apao import APAO
    from genrec.objectives.sdpo import SDPO

    sids, _, batch = case(num_items=30, batch=16)
    obj = APAO(num_negatives=6) if name == "apao" else SDPO(num_negatives=6)
    obj.setup(make_ctx(sids), ToyBackbone(sids.vocab_size))
    first = obj.negatives.sample(batch, 6)
    obj.on_epoch_start(1)
    assert obj.negatives.epoch == 1 and not torch.equal(obj.negatives.sample(batch, 6), first)


def _exact_scores(bb, sids, history, mask) -> torch.Tensor:
    """[B, C] every candidate's full-item log-prob S^T, each scored on its own (explicit loop)."""
    tok = sids.cand_tokens()
    return torch.tensor([[token_logprobs(bb.target_logits(history[i:i + 1], mask[i:i + 1], tok[c][None]),
                                         tok[c][None]).sum().item() for c in range(sids.num_candidates)]
                         for i in range(len(history))])


def test_beam_are_the_models_own_best_items_other_than_the_target():
    from genrec.eval.beam import beam_search

    sids, trie, _ = case(num_items=30)
    C = sids.num_candidates
    bb = ToyBackbone(sids.vocab_size, seed=4)
    s = _sampler("beam", sids)
    history = torch.randint(3, sids.vocab_size, (6, 2), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(6, 2, dtype=torch.bool)
    enc = bb.encode(history, mask)
    exact = _exact_scores(bb, sids, history, mask)
    targets = exact.argsort(1, descending=True)[torch.arange(6), torch.arange(6) % 3]  # the model's 1st, 2nd or 3rd
    b = _batch(targets)
    ranked = [[c for c in exact[i].argsort(descending=True).tolist() if c != targets[i]] for i in range(6)]
    # width C covers the catalogue (exact): every other item, best first, as brute force ranks them
    assert s.sample(b, C - 1, bb, enc).tolist() == ranked
    # a narrow beam: what that beam returns (width num + 1), the target left out, in the beam's order
    beam = beam_search(bb, enc, trie, 5).cands
    assert s.sample(b, 4, bb, enc).tolist() == [[c for c in beam[i].tolist() if c != targets[i]][:4] for i in range(6)]
    # a target the beam never keeps (the model's worst item): the beam's first num items, in order
    worst = exact.argmin(1)
    assert not (beam == worst[:, None]).any()
    assert s.sample(_batch(worst), 4, bb, enc).tolist() == beam[:, :4].tolist()
    # more negatives than other items: the beam's all, then uniform draws (never the target)
    wide = s.sample(b, C + 5, bb, enc)
    assert wide[:, : C - 1].tolist() == ranked and not (wide == targets[:, None]).any()
    assert torch.equal(wide[:, C - 1:], s.uniform(b["index"], targets, C + 5)[:, C - 1:])


def test_beam_searches_as_the_evaluator_scores():
    """eval.score=masked (MSL/BEAR-style scoring, here at temperature 2): the negatives are that beam's items."""
    from dataclasses import replace

    from genrec.eval.beam import beam_search

    sids, trie, _ = case(num_items=30)
    bb = ToyBackbone(sids.vocab_size, seed=5)
    history, mask = torch.full((8, 2), 3), torch.ones(8, 2, dtype=torch.bool)
    history[:, 0] = torch.arange(8) + 3
    enc, targets = bb.encode(history, mask), torch.full((8,), sids.num_candidates - 1)
    got = {}
    for score, t in [("full", 1.0), ("masked", 2.0)]:
        s = Negatives("beam")
        s.setup(replace(make_ctx(sids), eval_score=score, eval_temperature=t))
        got[score] = s.sample(_batch(targets), 3, bb, enc)
        beam = beam_search(bb, enc, trie, 4, score, t).cands
        assert got[score].tolist() == [[c for c in beam[i].tolist() if c != targets[i]][:3] for i in range(8)]
    assert not torch.equal(got["full"], got["masked"])  # the two scorings rank differently here
