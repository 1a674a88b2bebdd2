"""APAO: prefix losses against loops, pairwise masking and c_m on a hand-computed case, the
shared encoding, and the adaptive weights (closed forms, checkpointing)."""

import copy
import io
import math

import numpy as np
import pytest
import torch
from obj_helpers import CountingToy, FixedLogits, ToyBackbone, case, make_ctx

from genrec.sid.codes import SemanticIds
from genrec.sid.trie import Trie
from genrec.objectives.apao import APAO, collision_mask

# ---------------------------------------------------------------- pointwise


def _released_w(L, eta):
    raw = [l * math.exp(eta * l) for l in L]
    return [r / sum(raw) for r in raw]


@pytest.mark.parametrize("tau,tau_p", [(1.0, 1.0), (1.5, 2.0)])
def test_pointwise_matches_loop(tau, tau_p):
    sids, trie, batch = case()
    B, T, V = len(batch["target"]), sids.num_levels, sids.vocab_size
    logits = 2 * torch.randn(B, 1, T + 1, V, generator=torch.Generator().manual_seed(3))
    bb = FixedLogits(logits)
    beta, eta = 0.3, 0.7
    obj = APAO("pointwise", "released", beta=beta, eta=eta, prefix_temperature=tau_p, temperature=tau)
    obj.setup(make_ctx(sids), bb)
    loss, terms = obj(batch, bb)
    loss.backward()

    z = logits.clone().requires_grad_()
    s = [
        [z[b, 0, t, y] / tau - torch.logsumexp(z[b, 0, t] / tau, 0) for t, y in enumerate(row)]
        for b, row in enumerate(batch["target"].tolist())
    ]
    ce = -sum(sum(r) for r in s) / (B * T)
    L = [-sum(sum(r[:m]) / m for r in s) / B / tau_p for m in range(1, T + 1)]
    w = _released_w([l.item() for l in L], eta)
    ref = ce + beta * sum(wm * lm for wm, lm in zip(w, L))
    ref.backward()
    for m in range(T):
        assert math.isclose(terms[f"apao/L{m + 1}"].item(), L[m].item(), rel_tol=1e-5)
        assert math.isclose(terms[f"apao/w{m + 1}"].item(), w[m], rel_tol=1e-5)
    assert math.isclose(loss.item(), ref.item(), rel_tol=1e-5)
    assert torch.allclose(bb.logits.grad, z.grad, atol=1e-6)


def test_pointwise_single_forward():
    sids, trie, batch = case()
    bb = CountingToy(sids.vocab_size)
    obj = APAO("pointwise")
    obj.setup(make_ctx(sids), bb)
    obj(batch, bb)
    assert bb.encodes == 1 and bb.prefix_shapes == [(len(batch["target"]), 1, sids.num_levels - 1)]


# ---------------------------------------------------------------- pairwise, hand-computed

# Catalogue (sorted, so candidate id = row): P_1 = 3, P_2 = 5, P_3 = 6 distinct prefixes.
CODES = [(0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0), (1, 1, 1), (2, 0, 1)]
POS = [0, 4]
NEGS = [[1, 2, 1, 3, 5], [3, 0, 5, 3, 1]]
# Row 0, positive 000. Level 1: negs 0,0,0 share the positive's prefix; 1, 2 are new.
# Level 2: 00 (=pos) 01 00 (=pos) 10 20. Level 3: 001 010 001 (= an earlier negative) 100 201.
# Row 1, positive 111. Level 1: 1 (=pos) 0 2 1 (=pos) 0 (= earlier neg). Level 2: 10 00 20 10 00
# (the last two repeat earlier negatives). Level 3: 100 000 201 100 (= earlier) 001.
MASKS = [
    [[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0], [0, 0, 0]],
    [[1, 0, 0], [0, 0, 0], [0, 0, 0], [1, 1, 1], [1, 1, 0]],
]
C = [[(3 - 1) / 2, (5 - 1) / 3, (6 - 1) / 4], [(3 - 1) / 2, (5 - 1) / 3, (6 - 1) / 4]]


def _hand_case():
    sids = SemanticIds(np.array(CODES), [3, 2, 2])
    tok = sids.cand_tokens()
    bb = CountingToy(sids.vocab_size, seed=3)
    batch = {
        "history": torch.tensor([[0, 0, 3, 6, 8, 1], [3, 7, 9, 5, 6, 1]]),
        "mask": torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool),
        "target": tok[POS],
        "target_cand": torch.tensor(POS),
        "index": torch.arange(2),
    }
    return sids, Trie(sids), bb, batch


def _slow_scores(bb, sids, batch, tau):
    """S^m of every candidate, each scored in its own forward pass (no shared encoding)."""
    tok = sids.cand_tokens()
    out = []
    for b in range(2):
        row = []
        for c in [POS[b]] + NEGS[b]:
            logits = bb.target_logits(batch["history"][b : b + 1], batch["mask"][b : b + 1], tok[c][None])[0]
            s = [torch.log_softmax(logits[t] / tau, 0)[tok[c][t]] for t in range(3)]
            row.append([sum(s[:m]) for m in range(1, 4)])
        out.append(row)
    return out


def test_collision_mask_and_hand_case_masks():
    sids, trie, _, _ = _hand_case()
    cands = torch.tensor([[POS[b]] + NEGS[b] for b in range(2)])
    got = collision_mask(trie.cand_prefix_id[cands][..., 1:])
    assert not got[:, 0].any()
    assert got[:, 1:].tolist() == [[[bool(v) for v in r] for r in row] for row in MASKS]
    assert [trie.num_prefixes(m) for m in (1, 2, 3)] == [3, 5, 6]


@pytest.mark.parametrize("mode", ["pairwise", "pairwise_nomask", "pairwise_nocorr", "pairwise_printed"])
def test_pairwise_hand_case(mode):
    sids, trie, bb, batch = _hand_case()
    beta, eta, tau, tau_p = 0.5, 0.2, 1.3, 0.8
    loss_kind = "pairwise_printed" if mode == "pairwise_printed" else "pairwise"
    obj = APAO(loss_kind, "released", beta=beta, eta=eta, num_negatives=5, temperature=tau, prefix_temperature=tau_p,
               mask_collisions=mode != "pairwise_nomask", correction=mode != "pairwise_nocorr")
    obj.setup(make_ctx(sids), bb)
    obj.negatives.sample = lambda batch, num, backbone=None, enc=None: torch.tensor(NEGS)
    loss, terms = obj(batch, bb)
    # One encoder pass; positive and negatives in one teacher-forced call.
    assert bb.encodes == 1 and bb.prefix_shapes == [(2, 6, 2)]
    params = list(bb.parameters())
    grads = torch.autograd.grad(loss, params)

    S = _slow_scores(bb, sids, batch, tau)
    L, ce = [], 0.0
    for m in range(3):
        total = 0.0
        for b in range(2):
            pos = S[b][0][m] / tau_p
            denom = torch.exp(pos)
            for j in range(5):
                masked = MASKS[b][j][m] if mode != "pairwise_nomask" else 0
                c = 1.0
                if mode == "pairwise":
                    c = C[b][m]
                elif mode == "pairwise_nomask":
                    c = [(3 - 1) / 5, (5 - 1) / 5, (6 - 1) / 5][m]
                if not masked:
                    denom = denom + c * torch.exp(S[b][1 + j][m] / tau_p)
            lm = -torch.log(torch.exp(pos) / denom)
            total = total + (lm if mode == "pairwise_printed" else lm / (m + 1))
        L.append(total / 2)
    for b in range(2):
        ce = ce - S[b][0][2] / (2 * 3)
    w = _released_w([l.item() for l in L], eta)
    ref = ce + beta * sum(wm * lm for wm, lm in zip(w, L))
    for m in range(3):
        assert math.isclose(terms[f"apao/L{m + 1}"].item(), L[m].item(), rel_tol=1e-5), m
    assert math.isclose(terms["apao/ce"].item(), ce.item(), rel_tol=1e-5)
    assert math.isclose(loss.item(), ref.item(), rel_tol=1e-5)
    ref_grads = torch.autograd.grad(ref, params)
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, atol=1e-5)


def test_pairwise_with_hard_negatives_still_one_encode():
    sids, trie, batch = case(num_items=30)
    bb = CountingToy(sids.vocab_size)
    obj = APAO("pairwise", num_negatives=4, negatives={"kind": "hard", "pool": 12})
    obj.setup(make_ctx(sids), bb)
    loss, _ = obj(batch, bb)
    B, T = len(batch["target"]), sids.num_levels
    assert bb.encodes == 1 and bb.prefix_shapes == [(B, 12, T - 1), (B, 5, T - 1)]
    assert torch.isfinite(loss)


# ---------------------------------------------------------------- adaptive weights


def _pointwise_setup(weights, eta, **kw):
    sids, trie, batch = case(batch=8)
    bb = CountingToy(sids.vocab_size)
    obj = APAO("pointwise", weights, eta=eta, beta=0.3, **kw)
    obj.setup(make_ctx(sids), bb)
    return obj, bb, trie, batch


def _train(obj, bb, trie, batch, steps, opt=None):
    opt = opt or torch.optim.SGD(bb.parameters(), lr=0.5)
    history = []
    for _ in range(steps):
        loss, terms = obj(batch, bb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(terms)
    return history


def test_paper_weights_closed_form():
    eta = 0.4
    obj, bb, trie, batch = _pointwise_setup("paper", eta)
    T = 3
    assert torch.equal(obj.weights, torch.full((T,), 1 / T, dtype=torch.float64))
    hist = _train(obj, bb, trie, batch, 5)
    Ls = torch.tensor([[h[f"apao/L{m + 1}"].item() for m in range(T)] for h in hist], dtype=torch.float64)
    assert Ls.std(0).max() > 0  # the losses moved, so the test is not trivially uniform
    for k in range(1, 6):  # after k steps: w ∝ exp(eta * sum of the k batches' L), uniform start
        expected = torch.softmax(eta * Ls[:k].sum(0), 0)
        got = torch.tensor([hist[k - 1][f"apao/w{m + 1}"].item() for m in range(T)], dtype=torch.float64)
        assert torch.allclose(got, expected, atol=1e-6)
    assert torch.allclose(obj.weights, torch.softmax(eta * Ls.sum(0), 0), atol=1e-12)
    # The worst prefix gains weight.
    assert obj.weights.argmax() == Ls.sum(0).argmax()


def test_paper_weights_eta_zero_stay_uniform_and_eval_does_not_update():
    obj, bb, trie, batch = _pointwise_setup("paper", 0.0)
    _train(obj, bb, trie, batch, 3)
    assert torch.equal(obj.weights, torch.full((3,), 1 / 3, dtype=torch.float64))
    obj2, bb2, trie, batch = _pointwise_setup("paper", 1.0)
    obj2.eval()
    obj2(batch, bb2)
    with torch.no_grad():
        obj2.train()
        obj2(batch, bb2)
    assert torch.equal(obj2.weights, torch.full((3,), 1 / 3, dtype=torch.float64))


@pytest.mark.parametrize("eta", [0.0, 0.5])
def test_released_weights_per_batch(eta):
    obj, bb, trie, batch = _pointwise_setup("released", eta)
    for h in _train(obj, bb, trie, batch, 3):
        L = [h[f"apao/L{m + 1}"].item() for m in range(3)]
        w = [h[f"apao/w{m + 1}"].item() for m in range(3)]
        assert np.allclose(w, _released_w(L, eta), atol=1e-6)
    if eta == 0:
        assert np.allclose(w, np.array(L) / sum(L), atol=1e-6)


def test_uniform_hardmax_and_drop_prefix():
    obj, bb, trie, batch = _pointwise_setup("uniform", 0.0)
    _, terms = obj(batch, bb)
    assert [terms[f"apao/w{m}"].item() for m in (1, 2, 3)] == pytest.approx([1 / 3] * 3)
    obj, bb, trie, batch = _pointwise_setup("hardmax", 0.0)
    _, terms = obj(batch, bb)
    L = [terms[f"apao/L{m}"].item() for m in (1, 2, 3)]
    assert [terms[f"apao/w{m}"].item() for m in (1, 2, 3)] == [float(i == int(np.argmax(L))) for i in range(3)]
    for weights in ("paper", "released", "uniform", "hardmax"):
        obj, bb, trie, batch = _pointwise_setup(weights, 0.5, drop_prefix=3)
        loss, terms = obj(batch, bb)
        w = [terms[f"apao/w{m}"].item() for m in (1, 2, 3)]
        L = [terms[f"apao/L{m}"].item() for m in (1, 2, 3)]
        assert w[2] == 0 and math.isclose(sum(w), 1, rel_tol=1e-6), weights
        ref = terms["apao/ce"].item() + 0.3 * (w[0] * L[0] + w[1] * L[1])
        assert math.isclose(loss.item(), ref, rel_tol=1e-5)


def test_paper_weights_checkpoint_bit_for_bit():
    obj, bb, trie, batch = _pointwise_setup("paper", 0.7)
    _train(obj, bb, trie, batch, 3)
    assert "weights" in obj.state_dict()
    buf = io.BytesIO()
    torch.save(obj.state_dict(), buf)
    buf.seek(0)
    sids = obj.ctx.sids
    fresh = APAO("pointwise", "paper", eta=0.7, beta=0.3)
    fresh.setup(make_ctx(sids), bb)
    fresh.load_state_dict(torch.load(buf))
    assert torch.equal(fresh.weights, obj.weights) and fresh.weights.dtype == torch.float64
    # Resuming continues the same trajectory, bit for bit.
    bb2 = copy.deepcopy(bb)
    _train(obj, bb, trie, batch, 2)
    _train(fresh, bb2, trie, batch, 2)
    assert torch.equal(fresh.weights, obj.weights)
    # setup() again (e.g. a later stage) keeps the training state.
    fresh.setup(make_ctx(sids), bb2)
    assert torch.equal(fresh.weights, obj.weights)


# ---------------------------------------------------------------- a recipe's micro-batches (protocol.micro_batches)
def _slices(batch: dict, sizes: list[int]) -> list[dict]:
    bounds = np.cumsum([0, *sizes])
    return [{k: v[a:b] for k, v in batch.items()} for a, b in zip(bounds[:-1], bounds[1:])]


def _grad(bb) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in bb.parameters()])


def _release_step(obj, bb, micro_batches):
    """The release: one objective call per micro-batch, its prefix weights stepping on each, the parameters
    fixed within the optimizer step; each micro-batch's loss and its own gradient."""
    losses, grads = [], []
    for mb in micro_batches:
        bb.zero_grad()
        loss, _ = obj(mb, bb)
        loss.backward()
        losses.append(loss.detach())
        grads.append(_grad(bb))
    return torch.stack(losses), torch.stack(grads)


def _recipe_apao(sids, bb, updates=None, weights="paper"):
    obj = APAO("pointwise", weights, eta=0.5, beta=0.3)
    ctx = make_ctx(sids)
    ctx.updates_per_micro_batch = updates
    obj.setup(ctx, bb)
    return obj


@pytest.mark.parametrize("weights", ["paper", "released"])
@pytest.mark.parametrize("n, chunks", [(8, 2), (10, 4)])
def test_prefix_weights_follow_each_recipe_micro_batch(n, chunks, weights):
    """One micro-batch of ours holding `chunks` of the recipe's (protocol.micro_batches / trainer.accumulate): the
    loss and its gradient are the recipe's, each chunk weighted by its own w (unequal chunks: by their share of the
    examples). `paper`: w takes the recipe's sequential steps, each chunk weighted by w after its own step;
    `released` (what the APAO release's code runs): w recomputed from each chunk's losses alone."""
    sids, _, batch = case(batch=n)
    bb = ToyBackbone(sids.vocab_size)
    release, ours = _recipe_apao(sids, bb, None, weights), _recipe_apao(sids, bb, chunks, weights)
    sizes = [len(c) for c in torch.arange(n).tensor_split(chunks)]
    share = torch.tensor(sizes, dtype=torch.float32) / n
    for _ in range(2):  # paper: the weights carry over from step to step
        losses, grads = _release_step(release, bb, _slices(batch, sizes))
        bb.zero_grad()
        loss, terms = ours(batch, bb)
        loss.backward()
        torch.testing.assert_close(loss.detach(), (share * losses).sum())
        torch.testing.assert_close(_grad(bb), (share[:, None] * grads).sum(0))
        torch.testing.assert_close(ours.weights, release.weights, rtol=0, atol=1e-12)
        if weights == "paper":
            assert [terms[f"apao/w{m}"].item() for m in (1, 2, 3)] == pytest.approx(ours.weights.tolist())
    once, fresh = _recipe_apao(sids, bb, None, weights), _recipe_apao(sids, bb, chunks, weights)
    assert abs(once(batch, bb)[0].item() - fresh(batch, bb)[0].item()) > 1e-4  # one w per micro-batch of ours differs
    with torch.no_grad():  # validation never steps them
        before = ours.weights.clone()
        ours(batch, bb)
    assert torch.equal(ours.weights, before)


def _recipe_worker(rank: int, world: int, init: str, chunks: int, size: int, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    sids, _, batch = case(batch=world * chunks * size)
    bb = ToyBackbone(sids.vocab_size)
    ours = _recipe_apao(sids, bb, updates=world * chunks)
    mine = {k: v[rank * chunks * size:(rank + 1) * chunks * size] for k, v in batch.items()}
    got = []
    for _ in range(2):
        bb.zero_grad()
        loss, _ = ours(mine, bb)
        loss.backward()
        got.append((loss.detach(), _grad(bb), ours.weights.clone()))
    torch.save(got, f"{out}.{rank}")
    torch.distributed.destroy_process_group()


def test_paper_weights_step_through_every_process_chunks_in_rank_order(tmp_path):
    """2 gloo processes x 2 chunks (experiment=apao_release_cpu's split of the release's 8 micro-batches): each
    process's loss and gradient are its chunks' share of the recipe's, and the weights on both are the recipe's
    after all 4 sequential steps."""
    world, chunks, size = 2, 2, 3
    torch.multiprocessing.spawn(_recipe_worker, args=(world, f"file://{tmp_path}/init", chunks, size,
                                                      str(tmp_path / "out")), nprocs=world)
    sids, _, batch = case(batch=world * chunks * size)
    bb = ToyBackbone(sids.vocab_size)
    release = _recipe_apao(sids, bb)
    micro = _slices(batch, [size] * world * chunks)
    for step in range(2):
        losses, grads = _release_step(release, bb, micro)
        for rank in range(world):
            loss, grad, weights = torch.load(tmp_path / f"out.{rank}")[step]
            part = slice(rank * chunks, (rank + 1) * chunks)
            torch.testing.assert_close(loss, losses[part].mean())
            torch.testing.assert_close(grad, grads[part].mean(0))
            torch.testing.assert_close(weights, release.weights, rtol=0, atol=1e-12)
