"""Tiger and Llama against HF's T5 / Llama, and their cached paths against brute force."""

import itertools
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import OmegaConf
from toy import random_batch, random_sids

from genrec.models import llama_block
from genrec.eval.beam import beam_search
from genrec.models.base import BOS, EOS, Backbone
from genrec.models.llama import Llama
from genrec.models.tiger import Tiger
from genrec.sid.trie import Trie

CONF = Path(__file__).parents[1] / "conf" / "backbone"
SIDS = random_sids(60, [6, 5, 4])
V = SIDS.vocab_size
NAMES = ["tiger", "llama"]
TWO_LAYERS = {"tiger": {"num_layers": 2, "num_decoder_layers": 2}, "llama": {}}


def make(name: str, tiny: bool = True, **over) -> Backbone:
    torch.manual_seed(0)
    cfg = OmegaConf.load(CONF / f"{name}{'_tiny' if tiny else ''}.yaml")
    extra = {**TWO_LAYERS[name], **over} if tiny else over
    return instantiate(cfg, vocab_size=V, max_positions=64, **extra).double().eval()


def batch(n: int = 5, seed: int = 0) -> dict:
    return random_batch(SIDS, n, hist_items=4, seed=seed)


def reference(model: Backbone):
    """HF's model with the backbone's weights (`to_hf`: a copy)."""
    return model.to_hf()


def hf_logits(model: Backbone, history, mask, prefix, ref=None) -> torch.Tensor:
    """HF's own forward (`reference`): logits [B, m + 1, V] after each prefix [B, m] token."""
    ref = reference(model) if ref is None else ref
    if isinstance(model, Tiger):
        bos = torch.full((len(prefix), 1), BOS)
        dec = torch.cat([bos, prefix], 1)
        return ref(input_ids=history, attention_mask=mask.long(), decoder_input_ids=dec).logits
    am = torch.cat([mask, torch.ones_like(prefix, dtype=torch.bool)], 1).long()
    pos = (am.cumsum(-1) - 1).masked_fill(am == 0, 1)
    out = ref(input_ids=torch.cat([history, prefix], 1), attention_mask=am, position_ids=pos).logits
    return out[:, history.shape[1] - 1 :]


def random_prefix(B: int, N: int, m: int, seed: int) -> torch.Tensor:
    """Candidate prefixes: real item codes, so candidates of a user share prefixes."""
    g = torch.Generator().manual_seed(seed)
    return SIDS.item_tokens()[torch.randint(60, (B, N), generator=g)][..., :m]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("m", [0, 1, 2])
def test_prefix_logits_match_hf_and_per_candidate(name, m):
    model, b = make(name), batch()
    enc = model.encode(b["history"], b["mask"])
    assert enc.mask.shape == b["mask"].shape and enc.mask.dtype == torch.bool
    prefix = random_prefix(5, 4, m, seed=m)
    out = model.prefix_logits(enc, prefix)
    assert out.shape == (5, 4, m + 1, V)
    for n in range(4):
        ref = hf_logits(model, b["history"], b["mask"], prefix[:, n])
        torch.testing.assert_close(out[:, n], ref, atol=1e-5, rtol=0)
        alone = model.prefix_logits(enc, prefix[:, n : n + 1])[:, 0]
        torch.testing.assert_close(out[:, n], alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_target_logits_and_default_size(name):
    b = batch()
    for model in (make(name), make(name, tiny=False)):
        out = model.target_logits(b["history"], b["mask"], b["target"])
        assert out.shape == (5, 3, V)
        ref = hf_logits(model, b["history"], b["mask"], b["target"][:, :-1])
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_left_padding_does_not_change_logits(name):
    model, b = make(name), batch()
    pad = lambda x: torch.cat([torch.zeros_like(x[:, :3]), x], 1)  # noqa: E731
    prefix = random_prefix(5, 3, 2, seed=1)
    a = model.prefix_logits(model.encode(b["history"], b["mask"]), prefix)
    c = model.prefix_logits(model.encode(pad(b["history"]), pad(b["mask"])), prefix)
    torch.testing.assert_close(a, c, atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_step_reorders_beams_like_teacher_forcing(name):
    model, b = make(name), batch()
    enc = model.encode(b["history"], b["mask"])
    g = torch.Generator().manual_seed(0)
    state, ref_state = model.start(enc), Backbone.start(model, enc)
    logits, state = model.step(state, None, None)
    ref, ref_state = Backbone.step(model, ref_state, None, None)
    assert logits.shape == (5, 1, V)
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=0)
    beams = [[[] for _ in range(1)] for _ in range(5)]  # explicit per-user, per-beam prefixes
    for K_prev, K in [(1, 3), (3, 4), (4, 2)]:
        parents = torch.randint(K_prev, (5, K), generator=g)  # duplicates, drops, re-orders
        tokens = torch.randint(3, V, (5, K), generator=g)
        beams = [[beams[u][int(parents[u, k])] + [int(tokens[u, k])] for k in range(K)] for u in range(5)]
        logits, state = model.step(state, tokens, parents)
        ref, ref_state = Backbone.step(model, ref_state, tokens, parents)
        assert logits.shape == (5, K, V)
        torch.testing.assert_close(logits, ref, atol=1e-5, rtol=0)
        rows = torch.arange(5).repeat_interleave(K)  # every (user, beam) as its own HF row
        teacher = hf_logits(model, b["history"][rows], b["mask"][rows], torch.tensor(sum(beams, [])))[:, -1]
        torch.testing.assert_close(logits.reshape(5 * K, V), teacher, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_step_leaves_its_state_reusable(name):
    """Exact full ranking steps one state several times (one call per block of children):
    a second branch from the same state gives the reference logits, and the first is unchanged."""
    model, b = make(name), batch()
    enc = model.encode(b["history"], b["mask"])
    g = torch.Generator().manual_seed(1)
    _, state = model.step(model.start(enc), None, None)
    _, ref_state = Backbone.step(model, Backbone.start(model, enc), None, None)
    tokens, parents = torch.randint(3, V, (5, 3), generator=g), torch.zeros(5, 3, dtype=torch.long)
    _, state = model.step(state, tokens, parents)
    _, ref_state = Backbone.step(model, ref_state, tokens, parents)
    sizes = (40, 2)  # 40 beams: Tiger's many-beam path
    branches = [(torch.randint(3, V, (5, K), generator=g), torch.randint(3, (5, K), generator=g)) for K in sizes]
    first = model.step(state, *branches[0])[0]
    for tok, par in branches:
        out, _ = model.step(state, tok, par)
        torch.testing.assert_close(out, Backbone.step(model, ref_state, tok, par)[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(model.step(state, *branches[0])[0], first, atol=0, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_gradients_match_hf(name):
    """d/dθ of a loss on prefix_logits equals the same loss through the HF forward (one HF pass per
    candidate; T5LayerNorm back-propagates through float32, hence the float32-level tolerance)."""
    model, b = make(name), batch()
    prefix = random_prefix(5, 3, 2, seed=2)
    w = torch.randn(5, 3, 3, V, dtype=torch.float64)

    hf = reference(model)
    names = model.hf_names()

    def grads(loss, module):
        module.zero_grad()
        loss.backward()
        return dict(module.named_parameters())

    ours = {n: p.grad.clone() for n, p in grads(
        (model.prefix_logits(model.encode(b["history"], b["mask"]), prefix) * w).sum(), model).items()}
    ref = torch.stack([hf_logits(model, b["history"], b["mask"], prefix[:, n], hf) for n in range(3)], 1)
    hf_params = grads((ref * w).sum(), hf)
    theirs = {n: hf_params[names[n]].grad for n in names}
    for n, g in ours.items():
        assert torch.isfinite(g).all() and g.abs().sum() > 0, n
        torch.testing.assert_close(g, theirs[n], atol=1e-5, rtol=1e-5, msg=n)


def test_llama_bf16_training_attention_matches_a_float64_reference(monkeypatch):
    """Llama's history prefill attention when training in bf16 on CPU (explicit softmax(q k^T / sqrt(d)) v, not
    SDPA, whose CPU backward is slow): its output and q/k/v gradients are a float64 per-row loop's to bf16 rounding,
    as close as SDPA's bf16 kernel is; left-padded rows (pads see only themselves) included. The model's training
    encoding under bf16 autocast equals its no-grad (SDPA) one to bf16 rounding."""
    g = torch.Generator().manual_seed(0)
    B, H, S, d = 3, 2, 7, 8
    q, k, v = (torch.randn(B, H, S, d, generator=g).bfloat16().requires_grad_() for _ in range(3))
    real = torch.arange(S)[None] >= torch.tensor([0, 2, 5])[:, None]  # left padding
    mask = (torch.ones(S, S, dtype=torch.bool).tril() & (real[:, None] | torch.eye(S, dtype=torch.bool)))[:, None]
    w = torch.randn(B, H, S, d, generator=g, dtype=torch.float64)

    def reference(q, k, v):
        out = torch.zeros(B, H, S, d, dtype=torch.float64)
        for b_, h, i in itertools.product(range(B), range(H), range(S)):
            keys = mask[b_, 0, i].nonzero()[:, 0]
            a = (k[b_, h, keys] @ q[b_, h, i] / d**0.5).softmax(0)
            out[b_, h, i] = a @ v[b_, h, keys]
        return out

    def run(f, *x):
        y = f(*x)
        grads = torch.autograd.grad((y.double() * w).sum(), x)
        return y.detach().double(), grads
    ref, ref_grads = run(reference, *(x.detach().double().requires_grad_() for x in (q, k, v)))
    ours, grads = run(lambda *x: llama_block.prefill_attention(*x, mask, 0.0, True), q, k, v)
    sdpa, sdpa_grads = run(lambda *x: F.scaled_dot_product_attention(*x, mask), q, k, v)
    for a, b_, c in zip((ours, *grads), (ref, *ref_grads), (sdpa, *sdpa_grads)):
        err, sdpa_err = (a.double() - b_).abs().max(), (c.double() - b_).abs().max()
        assert err <= max(2 * sdpa_err, 2**-8 * b_.abs().max())

    model, b = make("llama"), batch()
    pad = lambda x: torch.cat([torch.zeros_like(x[:, :3]), x], 1)  # noqa: E731
    model.float()
    calls, fused = [], F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(a[0].dtype) or fused(*a, **kw))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            sdpa = model.encode(pad(b["history"]), pad(b["mask"])).logits.float()
        assert len(calls) == len(model.layers)  # inference: SDPA
        explicit = model.encode(pad(b["history"]), pad(b["mask"])).logits.detach().float()
        assert len(calls) == len(model.layers)  # training under autocast (q, k float32 after rotary): explicit
    assert (explicit - sdpa).abs().max() < 2**-7 * sdpa.abs().max()  # two bf16 roundings


@pytest.mark.parametrize("N", [1, 5])
def test_tiger_training_graph_cross_attention(N):
    """Few decoder queries per user (1 + N m = 3 here) attend to the encoder states directly (`Block.absorbed_cross`:
    no K/V projected); more (11) take each decoder layer's K/V from the encoder's one projection by unbinding it: an
    index (SelectBackward) would zero-fill a gradient of all layers' K/V per layer in backward (~8% of a CE step)."""
    model, b = make("tiger", memory="none"), batch()
    model.train()
    enc = model.encode(b["history"], b["mask"])
    out = model.prefix_logits(enc, random_prefix(5, N, 2, seed=0))
    seen, todo = set(), [out.grad_fn]
    while todo:
        f = todo.pop()
        if f is not None and f not in seen:
            seen.add(f)
            todo += [g for g, _ in f.next_functions]
    kinds = [type(f).__name__ for f in seen]
    absorbed = N == 1
    assert "SelectBackward0" not in kinds and kinds.count("UnbindBackward0") == (0 if absorbed else 1 + len(model.decoder))


@pytest.mark.parametrize("memory", ["manual", "none"])
def test_tiger_encoding_used_without_gradients_first_still_trains_the_encoder(memory):
    """An objective may score candidates on the training encoding under no_grad first (hard / beam negatives), then
    with gradients: the second scoring must reach the encoder (a K/V projection cached by the first had no graph)."""
    model, b = make("tiger", memory=memory), batch()
    model.train()
    enc = model.encode(b["history"], b["mask"])
    prefix = random_prefix(5, 6, 3, seed=0)  # 1 + 6 x 3 queries per user: the projected K/V
    tokens = torch.cat([prefix, torch.full_like(prefix[..., :1], EOS)], -1)
    with torch.no_grad():
        model.prefix_logprobs(enc, prefix, tokens)
        beam_search(model, enc, Trie(SIDS), beam=3)
    model.prefix_logprobs(enc, prefix, tokens).sum().backward()
    for name, w in [("encoder", model.encoder[0].ff.wi.weight), ("cross.k", model.decoder[0].cross.k.weight)]:
        assert w.grad is not None and w.grad.abs().sum() > 0, name


def test_absorbed_cross_attention_is_the_projected_one():
    """`Block.absorbed_cross` (queries meet the encoder states through W_k, W_v) against `projected_cross` (K/V
    projected first), masked keys included: the same outputs and gradients (the states' and the weights'; float64),
    dropout off."""
    model, b = make("tiger", dropout=0.0), batch()
    enc = model.encode(b["history"], b["mask"])
    blk, h = model.decoder[1], torch.randn(5, 7, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    k, v = model.cross_kv(enc)[1]
    w = torch.randn(5, 7, 32, dtype=torch.float64)
    outs = []
    for cross in (blk.absorbed_cross(enc.states, enc.mask), blk.projected_cross(k, v, enc.mask)):
        model.zero_grad()
        out = cross(blk.cross, h)
        grads = torch.autograd.grad((out * w).sum(), [enc.states, blk.cross.k.weight, blk.cross.v.weight,
                                                      blk.cross.q.weight], retain_graph=True)
        outs.append((out, grads))
    assert not b["mask"].all()  # some keys are masked
    torch.testing.assert_close(outs[0], outs[1], atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_train_mode_forward_and_backward(name):
    model, b = make(name, dropout=0.3), batch()
    prefix = random_prefix(5, 6, 2, seed=3)
    model.eval()
    evaluated = model.prefix_logits(model.encode(b["history"], b["mask"]), prefix)
    model.train()
    out = model.prefix_logits(model.encode(b["history"], b["mask"]), prefix)
    assert out.shape == (5, 6, 3, V) and torch.isfinite(out).all()
    assert not torch.allclose(out, evaluated)  # dropout is active
    torch.log_softmax(out, -1).mean().backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
    logits, state = model.step(model.start(model.encode(b["history"], b["mask"])), None, None)
    logits, _ = model.step(state, torch.full((5, 2), 4), torch.zeros(5, 2, dtype=torch.long))
    assert logits.shape == (5, 2, V) and torch.isfinite(logits).all()


@pytest.mark.parametrize("name, memory, dropout, N, m, users", [
    ("tiger", "manual", 0.3, 6, 2, 5), ("tiger", "manual", 0.3, 2, 3, 5), ("tiger", "manual", 0.0, 4, 1, 2),
    ("tiger", "checkpoint", 0.3, 6, 2, 5), ("llama", "checkpoint", 0.3, 4, 2, 5), ("llama", "checkpoint", 0.0, 4, 2, 2)])
def test_memory_saving_candidate_paths_match_autograd(name, memory, dropout, N, m, users):
    """TIGER's candidate blocks with the hand-written backward (`memory=manual`), and TIGER's and
    Llama's candidate layers recomputed in backward (`checkpoint`), give the logits and every parameter gradient of
    autograd keeping every activation: with dropout (the same draws) for one call on all 5 users,
    and for calls on 2, 2, 1 users (each call draws its own masks, so p = 0). T5's norms take their
    variance in float32, hence the float32-level tolerance on gradients."""

    def run(saving):
        model, b = make(name, dropout=dropout, memory=memory, memory_users=users), batch()
        model.train()
        torch.manual_seed(1)
        enc = model.encode(b["history"], b["mask"])  # the same encoder path in both runs: the same draws
        model.memory = memory if saving else "none"
        out = model.prefix_logits(enc, random_prefix(5, N, m, seed=3))
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=out.dtype)).sum().backward()
        return out.detach(), {n: p.grad for n, p in model.named_parameters()}

    (out, grads), (saving_out, saving_grads) = run(False), run(True)
    torch.testing.assert_close(saving_out, out, atol=1e-12, rtol=0)
    for n, g in grads.items():
        assert g is not None and g.abs().sum() > 0, n
        torch.testing.assert_close(saving_grads[n], g, atol=1e-7 * g.abs().max().item(), rtol=0, msg=n)


def test_tiger_encoder_block_gradcheck_with_dropout(monkeypatch):
    """`EncoderBlock`'s hand-written backward against finite differences (float64), with dropout
    (the same masks in every evaluation: the seeds come from torch's RNG, reset each call), padded
    keys and a position bias that receives its gradient. The norms' variance runs in float64 here
    (T5 takes it in float32, too coarse for finite differences)."""
    import genrec.models.tiger_backward as tb
    from genrec.models.tiger_backward import EncoderBlock

    monkeypatch.setattr(tb, "_rstd", lambda z, eps: torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + eps))

    g = torch.Generator().manual_seed(0)
    B, L, D, H, d, F = 2, 5, 6, 2, 3, 8
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[0, :2] = False  # left padding
    shapes = [(D,), (3 * H * d, D), (D, H * d), (D,), (F, D), (D, F)]
    weights = [torch.randn(s, dtype=torch.float64, generator=g, requires_grad=True) for s in shapes]
    x = torch.randn(B, L, D, dtype=torch.float64, generator=g, requires_grad=True)
    bias = torch.randn(1, H, L, L, dtype=torch.float64, generator=g, requires_grad=True)

    def block(x, bias, *w):
        torch.manual_seed(7)
        return EncoderBlock.apply(x, bias, mask, 0.3, 1e-6, *w)

    out = block(x, bias, *weights)
    assert not torch.equal(out, EncoderBlock.apply(x, bias, mask, 0.0, 1e-6, *weights))  # dropout is active
    assert torch.autograd.gradcheck(block, (x, bias, *weights))


@pytest.mark.parametrize("memory, dropout", [("manual", 0.0), ("checkpoint", 0.0), ("checkpoint", 0.3)])
def test_tiger_memory_saving_encoder_matches_autograd(memory, dropout):
    """The training encoder (`EncoderBlock`s, or checkpointed blocks) equals autograd through the
    `Block`s in training mode: the encoding and every encoder parameter's gradient (autograd back-propagates
    through the norms' float32 variance, hence the float32-level tolerance on gradients). At dropout 0.3 (the same
    draws) the blocks take the explicit attention, with the stack's `KeyBias` built outside the recomputed layers."""

    def run(lean):
        model, b = make("tiger", dropout=dropout, memory=(memory if lean else "none")), batch()
        model.train()
        torch.manual_seed(1)
        enc = model.encode(b["history"], b["mask"])
        kv = model.cross_kv(enc)
        w = torch.randn(kv.shape, generator=torch.Generator().manual_seed(2), dtype=kv.dtype)
        ((kv * w).sum() + enc.states.square().sum()).backward()
        return enc.states.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    (states, grads), (ref, ref_grads) = run(True), run(False)
    torch.testing.assert_close(states, ref, atol=1e-10, rtol=0)
    assert grads.keys() == ref_grads.keys() and any("relative_attention_bias" in n for n in grads)
    for n, g in ref_grads.items():
        torch.testing.assert_close(grads[n], g, atol=1e-7 * g.abs().max().item(), rtol=0, msg=n)


def test_tiger_float64_trains_under_bf16_autocast():
    """Autocast leaves float64 alone: the encoder's `KeyBias` term must follow q's dtype (float64), not autocast's."""
    model, b = make("tiger", dropout=0.3, memory="none"), batch()
    model.train()
    with torch.autocast("cpu", torch.bfloat16):
        out = model.prefix_logits(model.encode(b["history"], b["mask"]), random_prefix(5, 6, 2, seed=3))
    out.sum().backward()
    assert out.dtype == torch.float64 and model.encoder[0].attn.bias.relative_attention_bias.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("N", [6, 1])
def test_tiger_training_attention_matches_sdpa(monkeypatch, N):
    """Training with dropout (or in bf16 on CPU) computes attention explicitly (the 1-byte dropout masks; SDPA's slow
    bf16 CPU backward): the encoder's with its bias and key mask added inside the q k^T matmul (`KeyBias`), the
    decoder's cross-attention, the dropout scale folded into o's weight, and one candidate's (N = 1) causal
    self-attention as the encoder's; with every dropout keeping everything it must equal the eval path (SDPA, which
    `test_prefix_logits_match_hf_and_per_candidate` checks against HF): outputs and every parameter's gradient (the
    position biases' included)."""
    import genrec.models.dropout as dropout_module
    import genrec.models.t5_block as block_module
    import genrec.models.tiger as tiger_module

    model, b = make("tiger", dropout=0.3, memory="none"), batch()
    prefix = random_prefix(5, N, 2, seed=3)
    weight = torch.randn(5, N, 3, model.embed.weight.shape[0], generator=torch.Generator().manual_seed(4),
                         dtype=torch.float64)

    def run():
        model.zero_grad()
        out = model.prefix_logits(model.encode(b["history"], b["mask"]), prefix)
        (out * weight).sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    model.eval()
    evaluated, eval_grads = run()
    keep_all = lambda x, p, training=True: x  # noqa: E731
    monkeypatch.setattr(dropout_module, "dropout", keep_all)
    monkeypatch.setattr(tiger_module, "dropout", keep_all)
    monkeypatch.setattr(block_module, "dropout", keep_all)
    monkeypatch.setattr(block_module, "relu_dropout_unscaled", lambda x, p, training=True: (x.relu(), 1.0))
    monkeypatch.setattr(block_module, "dropout_unscaled", lambda x, p, training=True: (x / 2, 2.0))  # x 2: in o
    model.train()
    out, grads = run()
    torch.testing.assert_close(out, evaluated, atol=1e-10, rtol=0)
    for n, g in eval_grads.items():
        assert g.abs().sum() > 0, n
        torch.testing.assert_close(grads[n], g, atol=1e-9, rtol=1e-9, msg=n)


@pytest.mark.parametrize("name, over", [("tiger", {}), ("tiger", {"memory_users": 2}), ("llama", {})])
@pytest.mark.parametrize("m", [0, 2])
def test_prefix_logprobs_equal_log_softmax_of_prefix_logits(name, over, m):
    """The backbones' own `prefix_logprobs` (no logits tensor) against log_softmax + gather of
    `prefix_logits`, in training mode with dropout (the same draws), with temperature: values
    and every parameter's gradient."""
    N, tau = 4, 2.0
    prefix = random_prefix(5, N, m, seed=4)
    tokens = SIDS.item_tokens()[torch.randint(60, (5, N), generator=torch.Generator().manual_seed(5))][..., : m + 1]
    coef = torch.randn(5, N, m + 1, dtype=torch.float64, generator=torch.Generator().manual_seed(6))

    def run(fast):
        model, b = make(name, dropout=0.3, **over), batch()
        model.train()
        torch.manual_seed(1)
        enc = model.encode(b["history"], b["mask"])
        if fast:
            s = model.prefix_logprobs(enc, prefix, tokens, tau)
        else:
            s = torch.log_softmax(model.prefix_logits(enc, prefix) / tau, -1).gather(-1, tokens[..., None])[..., 0]
        (s * coef).sum().backward()
        return s.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    (s, grads), (ref, ref_grads) = run(True), run(False)
    assert s.shape == (5, N, m + 1) and s.dtype == torch.float64
    torch.testing.assert_close(s, ref, atol=1e-10, rtol=0)
    assert grads.keys() == ref_grads.keys()
    for n, g in ref_grads.items():
        torch.testing.assert_close(grads[n], g, atol=1e-9 * max(g.abs().max().item(), 1), rtol=0, msg=n)


def test_tiger_loads_an_hf_t5_and_gives_its_logits():
    """`Tiger.from_hf` on an HF T5 (its own random init, 2 + 3 layers): the same logits as HF's
    forward (eval, float64), and `to_hf` gives back HF's state dict."""
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(3)
    cfg = T5Config(vocab_size=V, d_model=16, num_layers=2, num_decoder_layers=3, d_ff=24, d_kv=8, num_heads=2,
                   relative_attention_num_buckets=8, relative_attention_max_distance=20, decoder_start_token_id=BOS)
    t5 = T5ForConditionalGeneration(cfg).double().eval()
    model, b = Tiger.from_hf(t5).eval(), batch()
    prefix = random_prefix(5, 1, 3, seed=2)[:, 0]
    dec = torch.cat([torch.full((5, 1), BOS), prefix], 1)
    ref = t5(input_ids=b["history"], attention_mask=b["mask"].long(), decoder_input_ids=dec).logits
    ours = model.prefix_logits(model.encode(b["history"], b["mask"]), prefix[:, None])[:, 0]
    torch.testing.assert_close(ours, ref, atol=1e-12, rtol=0)
    back = model.to_hf().state_dict()
    for k, v in t5.state_dict().items():
        assert torch.equal(back[k], v), k


def assert_loads_into_zeroed(old: dict, model, fresh) -> None:
    """`old` loaded into `fresh` (all parameters zeroed first) gives `model`'s state exactly."""
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    fresh.load_state_dict(old)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k


def test_tiger_loads_checkpoints_with_hf_names():
    """A state dict saved when Tiger wrapped HF's T5 (`hf.<HF name>`) loads into the same weights."""
    model = make("tiger")
    old = {"hf." + hf: model.state_dict()[ours] for ours, hf in model.hf_names().items()}
    old["hf.lm_head.weight"] = old["hf.shared.weight"]  # tied copies were saved too
    assert_loads_into_zeroed(old, model, make("tiger", dropout=0.2))


@pytest.mark.parametrize("tie, kv_heads", [(True, 1), (False, 2)])
def test_llama_loads_an_hf_llama_and_gives_its_logits(tie, kv_heads):
    """`Llama.from_hf` on an HF LlamaForCausalLM (its own random init, 3 layers, grouped-query
    attention or not, tied head or not): HF's logits on left-padded histories + targets (eval,
    float64), and `to_hf` gives back HF's state dict."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=kv_heads, max_position_embeddings=64, tie_word_embeddings=tie,
                      rope_parameters={"rope_type": "default", "rope_theta": 100.0}, rms_norm_eps=1e-5)
    hf = LlamaForCausalLM(cfg).double().eval()
    model, b = Llama.from_hf(hf).eval(), batch()
    assert (model.head is None) == tie and model.layers[0].attn.n_rep == 4 // kv_heads
    prefix = random_prefix(5, 1, 3, seed=2)[:, 0]
    ours = model.prefix_logits(model.encode(b["history"], b["mask"]), prefix[:, None])[:, 0]
    torch.testing.assert_close(ours, hf_logits(model, b["history"], b["mask"], prefix, hf), atol=1e-12, rtol=0)
    back = model.to_hf().state_dict()
    for k, v in hf.state_dict().items():
        assert torch.equal(back[k], v), k


def test_llama_draws_hf_initial_weights_and_loads_checkpoints_with_hf_names():
    """A seed gives the weights HF's Llama draws (so runs reproduce those made when Llama wrapped
    HF's model), and a state dict saved then (`hf.<HF name>`, tied head included) loads into them."""
    from transformers import LlamaForCausalLM

    model = make("llama")
    torch.manual_seed(0)
    hf = LlamaForCausalLM(model.llama_config).double()
    old = {"hf." + k: v for k, v in hf.state_dict().items()}
    assert "hf.lm_head.weight" in old
    for ours, theirs in model.hf_names().items():
        assert torch.equal(model.state_dict()[ours], hf.state_dict()[theirs]), ours
    assert_loads_into_zeroed(old, model, make("llama", dropout=0.2))


@pytest.mark.parametrize("hidden,heads,kv", [(120, 8, 4), (128, 7, 7), (128, 8, 3)])
def test_llama_refuses_heads_that_do_not_fit(hidden, heads, kv):
    """Head size odd (RoPE rotates pairs: 120 / 8 = 15 failed only at the first forward), or kv heads not dividing heads."""
    with pytest.raises(ValueError, match="even head size"):
        Llama(vocab_size=20, max_positions=16, hidden_size=hidden, num_layers=1, num_heads=heads, num_kv_heads=kv,
              intermediate_size=16)


def dropout_logits(model: Backbone, train: bool) -> torch.Tensor:
    """Prefix logits of a fixed batch in train or eval mode, dropout masks fixed by the seed."""
    b, prefix = batch(), random_prefix(5, 6, 2, seed=3)
    model.train(train)
    torch.manual_seed(1)
    return model.prefix_logits(model.encode(b["history"], b["mask"]), prefix)


@pytest.mark.parametrize("name", ["tiger", "llama"])
def test_set_dropout_switches_every_dropout_of_the_backbone(name):
    """`set_dropout(model, 0)` (callbacks.late_dropout's first epochs): training-mode logits equal eval-mode logits
    (no dropout left anywhere, the hand-written encoder blocks included); set back, they differ again."""
    from genrec.models.dropout import set_dropout

    model = make(name, dropout=0.3)
    logits = partial(dropout_logits, model)
    evaluated = logits(False)
    assert not torch.allclose(logits(True), evaluated)
    set_dropout(model, 0.0)
    torch.testing.assert_close(logits(True), evaluated, atol=1e-10, rtol=0)
    set_dropout(model, 0.3)
    assert not torch.allclose(logits(True), evaluated)
    assert {m.p for m in model.modules() if isinstance(getattr(m, "p", None), float)} == {0.3}


@pytest.mark.parametrize("name", ["tiger", "llama"])
def test_set_dropout_raises_a_rate_given_as_an_int(name):
    """`backbone.dropout=0` reaches the backbone as the int 0: late dropout must still be able to raise it."""
    from genrec.models.dropout import set_dropout

    model = make(name, dropout=0)
    logits = partial(dropout_logits, model)
    evaluated = logits(False)
    torch.testing.assert_close(logits(True), evaluated, atol=1e-10, rtol=0)
    set_dropout(model, 0.3)
    assert not torch.allclose(logits(True), evaluated)
