"""CPU proxies for GPU runs: bf16 autocast (this CPU runs bf16 natively) against float32."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf
from toy import random_batch, random_sids

import genrec.models.head as head
from genrec.eval.beam import beam_search, level_logprobs
from genrec.eval.fullrank import full_scores
from genrec.sid.trie import Trie
from genrec.evaluate import evaluate
from genrec.objectives.apao import prefix_sums
from genrec.objectives.negatives import hash32
from genrec.train import run

ROOT = Path(__file__).parents[1]
CONF = ROOT / "conf"


def _bf16_head_case(monkeypatch):
    monkeypatch.setattr(head, "CHUNK", 16)  # 40 rows: several chunks
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 32, generator=g)
    proj = torch.nn.Linear(32, 32)  # fp32 parameters, as under mixed precision
    w = (torch.randn(64, 32, generator=g) * 2).requires_grad_()
    rows, tokens = torch.randint(40, (5, 9), generator=g), torch.randint(64, (5, 9), generator=g)
    coef = torch.randn(5, 9, generator=g)
    return x, proj, w, rows, tokens, coef


def test_head_logprobs_under_bf16_autocast_match_float32(monkeypatch):
    """Autocast makes h bf16; the normalisers and their gradients must still be float32 math on
    those h values (not bf16 logits in forward and fp32 ones in backward)."""
    x, proj, w, rows, tokens, coef = _bf16_head_case(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = proj(x)
        assert h.dtype == torch.bfloat16
        out = head.head_logprobs(h, w, rows, tokens)
    h.retain_grad()
    (out * coef).sum().backward()  # Lightning runs backward outside the autocast context

    h32 = h.detach().float().requires_grad_()  # the same hidden values, everything else float32
    w32 = w.detach().clone().requires_grad_()
    ref = torch.log_softmax(h32 @ w32.T, -1)[rows, tokens]
    (ref * coef).sum().backward()
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=0)
    torch.testing.assert_close(w.grad, w32.grad, atol=2e-5, rtol=1e-5)
    # h's gradient is bf16 (two bf16 terms summed): compared as a whole, at bf16's resolution.
    assert (h.grad.float() - h32.grad).norm() < 4e-3 * h32.grad.norm()


@pytest.mark.parametrize("name", ["tiger", "llama"])
def test_beam_and_full_rank_scores_under_bf16_autocast_are_not_coarsened(name):
    """Scores come from float32 logits: bf16 logits put ~0.016 between representable values at
    |z| ~ 3, so dozens of the 256 codes of a level tie and the ranking coarsens."""
    sids = random_sids(400, [256, 8], seed=1)
    torch.manual_seed(0)
    cfg = OmegaConf.load(CONF / "backbone" / f"{name}_tiny.yaml")
    model = instantiate(cfg, vocab_size=sids.vocab_size, max_positions=64).eval()
    with torch.no_grad():  # a spread of logits like a trained model's
        w = model.embed.weight  # tied to the head; pad rows are zero
        w.mul_(30 / w.norm(dim=1, keepdim=True).clamp(min=1e-6))
    b, trie = random_batch(sids, 8, hist_items=3), Trie(sids)

    def scores(bf16: bool):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16), torch.no_grad():
            enc = model.encode(b["history"], b["mask"])
            first = level_logprobs(model.step(model.start(enc), None, None)[0][:, 0], trie, 0)  # [B, 256]
            return first, beam_search(model, enc, trie, 20), full_scores(model, enc, trie)

    first, beam, full = scores(True)
    first32, beam32, full32 = scores(False)
    ties = [len(r) - len(r.unique()) for r in first]
    assert max(ties) <= 1, ties  # float32 logits: (almost) no two of 256 codes tie
    assert first.dtype == beam.scores.dtype == full.dtype == torch.float32
    # bf16 activations still move scores a little, but the rankings agree closely.
    torch.testing.assert_close(full, full32, atol=0.1, rtol=0)
    agree = (full.argsort(1, descending=True)[:, :20] == full32.argsort(1, descending=True)[:, :20]).float().mean()
    assert agree > 0.5, agree
    assert (beam.cands[:, :5] == beam32.cands[:, :5]).float().mean() > 0.7


def _config(tmp_path, *overrides: str):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("config", overrides=["experiment=tiny", f"run_dir={tmp_path}/run",
                                            f"data_dir={tmp_path.parent}/data", "trainer.accelerator=cpu",
                                            *overrides])


def test_reevaluation_of_a_bf16_run_reproduces_its_test_metrics(tmp_path):
    r = run(_config(tmp_path, "trainer.max_epochs=1", "trainer.precision=bf16-mixed"))
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("evaluate", overrides=[f"ckpt={tmp_path}/run", "eval.beam=5", "eval.ks=[1,5]",
                                             f"data_dir={tmp_path.parent}/data", "accelerator=cpu", "batch_size=128"])
    again = evaluate(cfg)  # the run's eval batch size: the same batches, so the same numbers
    assert {k: v for k, v in again.items() if k.startswith("test/")} == {k: v for k, v in r.items()
                                                                       if k.startswith("test/")}


FITS = {"ce": [], "msl": [], "apao_pointwise": [], "apao_pairwise": ["objective.num_negatives=8"], "bear": [],
        "sdpo_2stage": ["objective.num_negatives=3"]}


@pytest.mark.parametrize("backbone", ["tiger_tiny", "llama_tiny"])
@pytest.mark.parametrize("objective", list(FITS))
def test_bf16_mixed_fit_of_every_objective(tmp_path, objective, backbone):
    """A non-finite training loss would stop the run (`NonFiniteLoss`); metrics.json is written."""
    run(_config(tmp_path, f"objective={objective}", f"backbone={backbone}", "trainer.precision=bf16-mixed",
                    "trainer.max_epochs=1", "trainer.limit_train_batches=3", "trainer.limit_test_batches=1",
                    "trainer.limit_val_batches=1", *FITS[objective]))
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["test/users"] == 128 and math.isfinite(saved["test/loss"]) and math.isfinite(saved["val/loss"])


def test_embedder_uses_this_ranks_gpu(monkeypatch):
    from genrec.data import embed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for var in ("LOCAL_RANK", "SLURM_LOCALID"):
        monkeypatch.delenv(var, raising=False)
    assert embed._device(None) == "cuda:0" and embed._device("cpu") == "cpu"
    monkeypatch.setenv("SLURM_LOCALID", "2")  # srun
    assert embed._device(None) == "cuda:2"
    monkeypatch.setenv("LOCAL_RANK", "3")  # torchrun / Lightning's launcher
    assert embed._device(None) == "cuda:3"


def test_apao_prefix_sums_are_running_sums():
    x = torch.randn(4, 3, 5, dtype=torch.float64)
    ref = torch.stack([x[..., : t + 1].sum(-1) for t in range(5)], -1)
    torch.testing.assert_close(prefix_sums(x), ref, atol=1e-12, rtol=0)


def test_hash32_mixes_python_int_keys_on_the_host_to_the_same_values():
    idx, slot = torch.arange(50)[:, None], torch.arange(4)[None]
    for seed, period in [(0, 0), (42, 3), (-1, 2**40)]:
        host = hash32(seed, period, idx, slot)
        device = hash32(torch.tensor(seed), torch.tensor(period), idx, slot)  # all tensors: the old path
        assert torch.equal(host, device)
    assert hash32(5, 6).dtype == torch.long and int(hash32(5, 6)) == int(hash32(torch.tensor(5), torch.tensor(6)))


def test_tiger_memory_saving_blocks_run_under_bf16_autocast(monkeypatch):
    """Under bf16-mixed the hand-written blocks stay on (in float32, autocast off inside): logits
    and gradients as float32 training gives, to bf16's resolution elsewhere in the network. (GPU
    default; on CPU they are used under autocast only when asked: `memory_under_autocast`.)"""
    from genrec.models import tiger_backward

    calls = []
    for cls in (tiger_backward.EncoderBlock, tiger_backward.CandidateBlock):
        monkeypatch.setattr(cls, "apply", (lambda f: lambda *a: calls.append(f) or f(*a))(cls.apply))
    sids = random_sids(60, [6, 5, 4])
    b = random_batch(sids, 6, hist_items=4)
    prefix = sids.item_tokens()[torch.randint(60, (6, 5), generator=torch.Generator().manual_seed(3))][..., :2]

    def fit_step(bf16: bool, lean: int | None):
        torch.manual_seed(0)
        model = instantiate(OmegaConf.load(CONF / "backbone" / "tiger_tiny.yaml"), vocab_size=sids.vocab_size,
                            max_positions=64, dropout=0.0, memory="manual" if lean else "none", memory_users=lean,
                            memory_under_autocast=True).train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model.prefix_logprobs(model.encode(b["history"], b["mask"]), prefix, torch.cat(
                [prefix, prefix[..., :1]], -1))
        out.sum().backward()
        return out.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])

    ref_out, ref_grad = fit_step(False, None)
    calls.clear()
    out, grad = fit_step(True, 2)
    assert len(calls) == 1 + 3  # the encoder block, and the decoder block on 3 groups of 2 users
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref_out, atol=0.05, rtol=0)
    assert (grad - ref_grad).norm() < 0.03 * ref_grad.norm()
    autocast_out, autocast_grad = fit_step(True, None)  # autograd keeping every activation, same autocast
    assert (out - ref_out).abs().max() <= 2 * (autocast_out - ref_out).abs().max() + 1e-3


def test_tiger_uses_autograd_under_cpu_autocast_by_default(monkeypatch):
    """CPU bf16: bf16 autograd beats the float32 hand-written blocks on speed, so by default they are off."""
    from genrec.models import tiger_backward

    calls = []
    monkeypatch.setattr(tiger_backward.EncoderBlock, "apply", lambda *a: calls.append(a))
    sids = random_sids(60, [6, 5, 4])
    b = random_batch(sids, 6, hist_items=4)
    model = instantiate(OmegaConf.load(CONF / "backbone" / "tiger_tiny.yaml"), vocab_size=sids.vocab_size,
                        max_positions=64).train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model.encode(b["history"], b["mask"]).states.sum().backward()
    assert not calls


@pytest.mark.parametrize("group", ["gpu", "ddp"])
def test_gpu_trainer_configs_compose_and_lightning_accepts_them(group):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        t = compose("config", overrides=[f"trainer={group}"]).trainer
    assert t.precision == "bf16-mixed" and t.accelerator == "gpu" and t.pin_memory and not t.keep_freed_memory
    assert t.strategy == ("ddp" if group == "ddp" else "auto")
    text = (CONF / "trainer" / f"{group}.yaml").read_text()
    own = [ln for ln in text.splitlines() if ln and not ln.startswith(("#", " ", "defaults"))]
    assert group == "ddp" or all("#" in ln for ln in own), own  # every GPU default says why
    # conf/trainer's Lightning node as genrec.train builds it, on the CPU (1 device) this test has
    built = instantiate(t.lightning, accelerator="cpu", devices=1, strategy="auto", logger=False)
    assert (built.precision, built.accumulate_grad_batches) == (t.precision, t.accumulate)


def test_gpu_check_script_runs_its_steps_on_cpu_and_refuses_without_cuda(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    script = str(ROOT / "benchmarks" / "gpu_check.sh")
    out = subprocess.run(["bash", script, "--cpu-smoke", "--out", str(tmp_path)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for step in ("tiger_ce", "llama_ce", "apao_pairwise"):
        assert result[step]["s_per_epoch"] > 0 and result[step]["eval_users_per_s"] > 0, result
    assert result["tiger_ce"]["epochs"] == 2 and result["beam20_users_per_s"] > 0
    if not torch.cuda.is_available():
        refused = subprocess.run(["bash", script, "--out", str(tmp_path)], env=env, capture_output=True, text=True)
        assert refused.returncode == 2 and "no CUDA device" in refused.stderr and refused.stdout == ""


def test_gpu_check_real_data_configs_compose():
    """The overrides the script passes on a GPU machine (it cannot run them here)."""
    real = ["dataset=lcrec", "dataset.root=/data/apao-office", "dataset.name=Office", "tokenizer=precomputed",
            "trainer.progress_bar=false", "data_dir=/tmp/d", "run_dir=/tmp/r"]
    with initialize_config_dir(str(CONF), version_base="1.3"):
        for extra in (["trainer=gpu", "backbone=tiger", "objective=ce"], ["trainer=gpu", "backbone=llama"],
                      ["trainer=gpu", "objective=apao_pairwise"], ["trainer=ddp", "trainer.devices=2"]):
            cfg = compose("config", overrides=[*real, *extra])
            assert cfg.trainer.precision == "bf16-mixed" and cfg.eval.beam == 20
