"""The papers' protocol as the releases run it: model selection on a loss, the release's gradient
clipping, the release's datasets and presets, evaluation scoring modes, the Optuna return value."""

import copy
import math
import re
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from genrec.config_check import ConfigError
from genrec.data.datamodule import SeqDataModule
from genrec.lit import GenRec
from genrec.prepare import prepare
from genrec.train import best_of, run

CONF = str(Path(__file__).parents[1] / "conf")
SHARED = Path(__file__).parents[1].parent / "shared" / "data"


def config(tmp_path: Path, *overrides: str, name: str = "config"):
    with initialize_config_dir(CONF, version_base="1.3"):
        return compose(name, overrides=["experiment=tiny", f"run_dir={tmp_path}/run",
                                        f"data_dir={tmp_path.parent}/data", *overrides])


# ---- model selection ---------------------------------------------------------------------
def test_best_of_honours_the_mode_and_skips_missing_values():
    history = [{"epoch": 0, "loss": 3.0, "ndcg@5": 0.1}, {"epoch": 1, "loss": 2.0, "ndcg@5": 0.3},
               {"epoch": 2, "loss": 2.5, "ndcg@5": 0.3}, {"epoch": 3, "loss": float("nan")}]
    assert best_of(history, "val/loss", "min") == 1
    assert best_of(history, "val/ndcg@5", "max") == 1  # first of the tied epochs
    assert best_of(history, "val/loss", "max") == 0
    assert best_of(history, "val/recall@5", "max") is None


def test_selection_on_the_validation_objective_loss_with_mode_min(tmp_path):
    r = run(config(tmp_path, "trainer.max_epochs=3", "trainer.monitor=val/objective_loss",
                   "trainer.monitor_mode=min", "objective.end_token=false"))
    losses = [h["objective_loss"] for h in r["history"]]
    assert r["best_epoch"] == r["history"][losses.index(min(losses))]["epoch"]
    assert r["val/objective_loss"] == min(losses)
    # CE without eos is exactly the evaluator's teacher-forced loss (both per-token means, eval mode)
    for h in r["history"]:
        assert h["objective_loss"] == pytest.approx(h["loss"], rel=1e-5)
    ckpt = torch.load(r["checkpoint"], map_location="cpu", weights_only=False)
    assert ckpt["epoch"] == r["best_epoch"]


def test_loss_only_validation_trains_the_same_run_without_the_beam_search(tmp_path):
    """trainer.validate=loss (the APAO release's per-epoch evaluation: its loss only) selects and stops on
    the same loss, so the run is the same one, step for step: same epochs, same selected checkpoint, same
    test metrics (the final test always runs the beam search); only the history lacks the beam's metrics."""
    common = ("trainer.max_epochs=3", "trainer.monitor=val/objective_loss", "trainer.monitor_mode=min")
    beam = run(config(tmp_path / "beam", *common))
    loss = run(config(tmp_path / "loss", *common, "trainer.validate=loss"))
    assert [h["epoch"] for h in loss["history"]] == [h["epoch"] for h in beam["history"]]
    for hb, hl in zip(beam["history"], loss["history"]):
        assert hl["objective_loss"] == hb["objective_loss"] and hl["loss"] == hb["loss"]
        assert "recall@5" in hb and not any(k.startswith(("recall@", "ndcg@", "prefix_recall@")) for k in hl)
        assert hl["users"] == hb["users"]
    assert loss["best_epoch"] == beam["best_epoch"]
    test = {k: v for k, v in beam.items() if k.startswith("test/")}
    assert test and {k: loss[k] for k in test} == test


def test_objective_loss_with_end_token_averages_over_eos_too(tmp_path):
    r = run(config(tmp_path, "trainer.max_epochs=1", "trainer.monitor=val/objective_loss",
                   "trainer.monitor_mode=min", "objective.end_token=true"))
    h = r["history"][0]
    assert h["objective_loss"] != pytest.approx(h["loss"], rel=1e-3)  # T + 1 tokens, not T


@pytest.mark.parametrize("split", ["partial", "whole"])
def test_selection_on_the_last_validation_batch_as_the_release(tmp_path, split):
    """val/last_batch_loss@B: the objective's loss on the examples a sequential loader of B per batch puts
    last (the APAO release selects on it), checked against each example's teacher-forced CE on the final
    weights (CE without eos: the objective is their mean), and selection follows it."""
    probe = config(tmp_path / "probe")
    n = len(SeqDataModule(*_data(probe), 1, 1, 0).splits["valid"])
    size = n // 3 + 1 if split == "partial" else n
    assert split == "whole" or n % size, "the last batch must be a partial one"
    cfg = config(tmp_path, "trainer.max_epochs=3", f"trainer.monitor=val/last_batch_loss@{size}",
                 "trainer.monitor_mode=min", "trainer.validate=loss", "objective.end_token=false",
                 "trainer.patience=1")
    r = run(cfg)
    losses = [h[f"last_batch_loss@{size}"] for h in r["history"]]
    assert r["best_epoch"] == r["history"][losses.index(min(losses))]["epoch"]
    assert r[f"val/last_batch_loss@{size}"] == min(losses)
    assert torch.load(r["checkpoint"], map_location="cpu", weights_only=False)["epoch"] == r["best_epoch"]
    module, dm = _module(cfg)
    final = torch.load(Path(cfg.run_dir) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    module.load_state_dict(final["state_dict"])
    module.eval()
    per_example = module.evaluator.losses(module.backbone, dm.splits["valid"][list(range(n))])["loss"]
    start = (n - 1) // size * size
    assert start == (n // size) * size if split == "partial" else start == 0
    assert losses[-1] == pytest.approx(float(per_example[start:].mean()), rel=1e-5)
    if split == "partial":
        assert losses[-1] != pytest.approx(float(per_example.mean()), rel=1e-3)  # not the whole split's


def test_bad_monitor_mode_is_one_clear_error_before_any_work(tmp_path):
    from genrec.config_check import ConfigError

    with pytest.raises(ConfigError, match="trainer.monitor_mode=up: one of max, min"):
        run(config(tmp_path, "trainer.monitor_mode=up", f"data_dir={tmp_path}/data"))
    assert not (tmp_path / "data").exists()


# ---- the release's gradient clipping -------------------------------------------------------
def _data(cfg) -> tuple:
    data = prepare(cfg, log=lambda m: None)
    return data.seq, data.sids, cfg.dataset.max_history


def _module(cfg) -> tuple[GenRec, SeqDataModule]:
    seq, sids, max_history = _data(cfg)
    t = cfg.trainer
    dm = SeqDataModule(seq, sids, max_history, t.batch_size, t.eval_batch_size, cfg.seed)
    L.seed_everything(cfg.seed, verbose=False)
    return GenRec(cfg, sids, dm.item_counts(), steps_per_epoch=100), dm


def _reference(module: GenRec, batches: list[dict], accumulate: int, clip: float, divide: bool) -> GenRec:
    """Explicit accumulation: backward each micro-batch loss (divided by `accumulate` or not), clip the
    accumulated .grad at norm `clip`, AdamW step (the module's own optimizer and lr schedule, spanning the
    steps taken here, as under the Trainer's `max_steps`)."""
    module = copy.deepcopy(module)
    module.steps_per_epoch, module.cfg.trainer.max_epochs = len(batches) // accumulate, 1
    conf = module.configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    for i in range(0, len(batches), accumulate):
        opt.zero_grad()
        for b in batches[i : i + accumulate]:
            loss, _ = module.objective(b, module.backbone)
            (loss / accumulate if divide else loss).backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
        opt.step()
        sched.step()
    return module


def _flat(module: GenRec) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.backbone.parameters()])


@pytest.mark.parametrize("clip_on", ["sum", "mean"])
def test_clip_on_matches_explicit_accumulation_and_clipping(tmp_path, clip_on):
    A, steps = 2, 3
    cfg = config(tmp_path, "backbone.dropout=0.0", f"trainer.accumulate={A}", "optim.lr=1e-2",
                 f"trainer.clip_on={clip_on}")
    module, dm = _module(cfg)
    batches = [b for _, b in zip(range(steps * A), dm.train_dataloader())]  # epoch 0's order, as fit sees it
    probe = copy.deepcopy(module)
    for b in batches[:A]:
        probe.objective(b, probe.backbone)[0].backward()
    summed = float(torch.cat([p.grad.flatten() for p in probe.parameters() if p.grad is not None]).norm())
    clip = summed / 1.5  # binds on the sum of the first step's gradients, not on their mean (summed / A)
    initial = copy.deepcopy(module)
    trainer = L.Trainer(max_steps=steps, accumulate_grad_batches=A, gradient_clip_val=clip, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0)
    trainer.fit(module, dm)
    want = _flat(_reference(initial, batches, A, clip, divide=clip_on == "mean"))
    other = _flat(_reference(initial, batches, A, clip, divide=clip_on == "sum"))
    got = _flat(module)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert (got - other).abs().max() > 100 * (got - want).abs().max()  # the two semantics really differ here


def test_the_releases_clipped_sum_is_fewer_larger_batches_with_the_mean_clipped_at_c_over_a(tmp_path):
    """experiment=apao_release_cpu: the release steps on the SUM of A micro-batch mean gradients clipped at c,
    i.e. A x (the mean gradient clipped at c / A), and AdamW's step on A x g with eps is its step on g with
    eps / A: one batch of the same A x b examples, its mean gradient clipped at c / A, eps / A, takes the
    same steps."""
    A, b, steps = 4, 8, 3
    cfg = config(tmp_path, "backbone.dropout=0.0", "optim.lr=1e-2")
    module, dm = _module(cfg)
    dm.batch_size = b
    small = [x for _, x in zip(range(steps * A), dm.train_dataloader())]
    train = dm.splits["train"]  # the same A x b examples as one batch (padded to its longest history)
    large = [train[torch.cat([x["index"] for x in small[i:i + A]]).tolist()] for i in range(0, len(small), A)]
    assert large[0]["history"].shape[0] == A * b
    probe = copy.deepcopy(module)
    for x in small[:A]:
        probe.objective(x, probe.backbone)[0].backward()
    clip = float(torch.cat([p.grad.flatten() for p in probe.parameters() if p.grad is not None]).norm()) / 1.5
    release = _flat(_reference(module, small, A, clip, divide=False))
    same_eps = _flat(_reference(module, large, 1, clip / A, divide=True))
    module.cfg.optim.eps /= A
    cpu = _flat(_reference(module, large, 1, clip / A, divide=True))
    unclipped = _flat(_reference(module, large, 1, 1e9, divide=True))
    torch.testing.assert_close(cpu, release, rtol=1e-5, atol=1e-6)
    for other in (unclipped, same_eps):  # the clipping binds here, and so does AdamW's eps
        assert (other - release).abs().max() > 100 * (cpu - release).abs().max()


# ---- the learning-rate schedule ----------------------------------------------------------
def _reference_lr(step: int, total: int, warmup: int, cooldown: float, floor: float) -> float:
    """Linear warm-up over `warmup` steps, then flat at 1, then a cosine from 1 to `floor` over the last
    `cooldown` share of the steps after warm-up (cooldown 1: the cosine spans all of them)."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    decay_steps = cooldown * (total - warmup)
    start = total - decay_steps
    if step < start:
        return 1.0
    t = (step - start) / decay_steps
    return floor + (1 - floor) * (1 + math.cos(math.pi * min(t, 1.0))) / 2


@pytest.mark.parametrize("cooldown, floor", [(1.0, 0.0), (0.2, 0.0), (0.5, 0.1)])
def test_lr_schedule_warms_up_holds_then_cools_down(tmp_path, cooldown, floor):
    cfg = config(tmp_path, "optim.warmup=0.05", f"optim.cooldown={cooldown}", f"optim.min_lr_ratio={floor}")
    module, _ = _module(cfg)  # 100 steps per epoch
    module.cfg.trainer.max_epochs = 2
    sched = module.configure_optimizers()["lr_scheduler"]["scheduler"]
    got = [sched.lr_lambdas[0](s) for s in range(201)]
    want = [_reference_lr(s, 200, 10, cooldown, floor) for s in range(201)]
    assert got == pytest.approx(want, abs=1e-12)
    flat = sum(1 for s in range(10, 200) if want[s] == 1.0)
    assert flat == round((1 - cooldown) * 190) + 1  # flat up to and including the cooldown's first step
    assert got[200] == pytest.approx(floor)


def test_cooldown_outside_zero_one_is_one_clear_error(tmp_path):
    from genrec.config_check import ConfigError

    with pytest.raises(ConfigError, match="optim.cooldown=0"):
        run(config(tmp_path, "optim.cooldown=0", f"data_dir={tmp_path}/data"))
    assert not (tmp_path / "data").exists()


# ---- the release's datasets and presets ----------------------------------------------------
def compose_release(*overrides: str):
    with initialize_config_dir(CONF, version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize("dataset, beta, eta", [("apao_office", 0.3, 1e-4), ("apao_grocery", 0.1, 5e-5),
                                                ("apao_beauty", 0.1, 1e-5), ("apao_yelp", 0.05, 1e-5)])
def test_apao_table1_applies_table5_per_dataset(dataset, beta, eta):
    cfg = compose_release("experiment=apao_table1", f"dataset={dataset}", "objective=apao_pointwise")
    assert (cfg.objective.beta, cfg.objective.eta) == (beta, eta)
    assert cfg.objective.end_token is True and cfg.tokenizer.collision == "merge"
    assert (cfg.trainer.monitor, cfg.trainer.monitor_mode, cfg.trainer.clip_on) == ("val/objective_loss", "min", "sum")
    assert cfg.trainer.validate == "loss"  # the release evaluates its loss alone each epoch
    assert cfg.trainer.batch_size * cfg.trainer.accumulate == 1024


def test_apao_release_cpu_changes_only_how_the_release_recipe_executes():
    """The same 1024 examples per step (2 processes x 256 x 2 against 1 x 128 x 8), their clipped SUM as the
    mean clipped at 1/8 with AdamW's eps / 8 (the test above); the rest is execution."""
    from genrec.runs import flatten

    rel = flatten(OmegaConf.to_container(compose_release("experiment=apao_release", "dataset=apao_office")))
    cpu = flatten(OmegaConf.to_container(compose_release("experiment=apao_release_cpu")))  # trainer.lightning: ${...}
    t = "trainer."
    step = lambda c: c[t + "batch_size"] * c[t + "devices"] * c[t + "accumulate"]  # noqa: E731
    assert step(cpu) == step(rel) == 1024 and rel[t + "clip_on"] == "sum" and cpu[t + "clip_on"] == "mean"
    a = rel[t + "accumulate"] * rel[t + "devices"]  # micro-batch gradients the release sums
    assert cpu[t + "gradient_clip"] == rel[t + "gradient_clip"] / a and cpu["optim.eps"] == rel["optim.eps"] / a
    execution = {"strategy", "accelerator", "devices", "batch_size", "accumulate", "precision", "length_window"}
    assert {k for k in rel.keys() | cpu.keys() if rel.get(k) != cpu.get(k)} == {
        *(t + k for k in execution), t + "clip_on", t + "gradient_clip", "optim.eps", "tags"}


def test_apao_weights_take_the_releases_8_steps_per_step_under_either_split(tmp_path):
    """protocol.micro_batches reaches the objective as the recipe's micro-batches in one of ours, over all
    processes: the release's 8 per step are 1 per micro-batch at 1 x 128 x 8 and 4 at 2 processes x 256 x 2
    (2 chunks each: tests/test_obj_apao.py; office_cpu takes the same steps). Without it the weights step once per
    micro-batch of ours."""
    from genrec.lit import updates_per_micro_batch

    assert updates_per_micro_batch(compose_release("experiment=apao_release", "dataset=apao_office")) == 1
    assert updates_per_micro_batch(compose_release("experiment=apao_release_cpu")) == 4
    assert updates_per_micro_batch(compose_release("experiment=office_cpu")) == 4
    assert updates_per_micro_batch(compose_release("experiment=tiny")) is None
    module, _ = _module(config(tmp_path, "objective=apao_pointwise", "+protocol.micro_batches=8",
                               "trainer.accumulate=2"))
    assert module.objective.ctx.updates_per_micro_batch == 4


def test_apao_presets_leave_other_objectives_and_defaults_alone():
    sdpo = compose_release("experiment=apao_table1", "objective=sdpo_2stage", "backbone=llama")
    assert "beta" not in sdpo.objective and "end_token" not in sdpo.objective  # SDPO takes neither
    assert sdpo.backbone.rms_norm_eps == 1e-5
    plain = compose_release("dataset=apao_office", "objective=apao_pointwise", "backbone=llama")
    assert (plain.objective.beta, plain.objective.end_token, plain.backbone.rms_norm_eps) == (0.1, False, 1e-6)
    assert plain.tokenizer.collision == "merge"  # the dataset brings the release's SIDs
    assert compose_release("dataset=office").tokenizer._target_.endswith("RQKMeans")


def test_cfg_job_command_shows_table5_values():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "genrec.train", "experiment=apao_table1", "dataset=apao_office",
                          "objective=apao_pointwise", "--cfg", "job", "--resolve"], cwd=Path(CONF).parent,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    objective = re.search(r"^objective:\n((?:  .*\n)+)", out.stdout, re.M).group(1)  # that block only
    assert "  beta: 0.3\n" in objective and "  eta: 0.0001\n" in objective


@pytest.mark.skipif(not (SHARED / "apao-office").exists(), reason="needs ../shared/data")
def test_apao_office_is_the_release_data_and_either_colliding_item_is_a_hit(tmp_path):
    import numpy as np

    from genrec.eval.evaluator import Evaluator
    from genrec.sid.trie import Trie
    from toy import ToyBackbone

    cfg = compose_release("dataset=apao_office", f"dataset.root={SHARED / 'apao-office'}", f"data_dir={tmp_path}")
    data = prepare(cfg, log=lambda m: None)
    s = data.summary
    assert (s["users"], s["items"], s["interactions"], s["unique_codes"]) == (4905, 2420, 53258, 2415)
    assert s["train_examples"] == 53258 - 3 * 4905  # the release's T5 training pairs
    sids = data.sids
    counts = np.bincount(sids.item_to_cand)
    shared = int(np.flatnonzero(counts == 2)[0])
    i, j = np.flatnonzero(sids.item_to_cand == shared)
    trie = Trie(sids)
    backbone = ToyBackbone(sids.vocab_size).eval()
    tok = sids.item_tokens()
    history = tok[:3].reshape(1, -1).repeat(2, 1)
    batch = {"history": torch.cat([history, torch.ones(2, 1, dtype=torch.long)], 1),
             "mask": torch.ones(2, history.shape[1] + 1, dtype=torch.bool), "target": tok[[i, j]],
             "target_cand": torch.from_numpy(sids.item_to_cand[[i, j]]), "index": torch.arange(2)}
    C = sids.num_candidates  # beam and cap C: the full ranking uncapped
    rows = Evaluator(beam=C, ks=[C], full_rank=True).per_example(backbone, trie, batch)
    assert rows["rank"][0] == rows["rank"][1] >= 1  # one candidate: returned once, a hit for either item
    assert rows["rank"][0] == rows["full_rank"][0]


def test_download_fetches_the_release_files_and_names_what_it_cannot(tmp_path):
    from genrec.data.readers.common import DataError
    from genrec.download import fetch_dataset

    class Response:
        headers: dict = {}

        def __init__(self, body: bytes) -> None:
            self.body = body

        def read(self, n):
            body, self.body = self.body, b""
            return body

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    urls = []
    fetch = lambda url: urls.append(url) or Response(b"{}")  # noqa: E731
    office = compose_release("dataset=apao_office", f"data_dir={tmp_path}")
    paths = fetch_dataset(office, fetch)
    assert [p.name for p in paths] == ["Office.inter.json", "Office.item.json", "Office.index.rq-kmeans.json"]
    assert all(p.parent == tmp_path / "raw" / "apao" / "Office" for p in paths)
    assert all(u.startswith("https://raw.githubusercontent.com/yuyq18/APAO/") for u in urls)
    assert OmegaConf.select(office, "tokenizer.path") == str(paths[2])
    beauty = compose_release("dataset=apao_beauty", f"data_dir={tmp_path}")
    with pytest.raises(DataError, match=r"Beauty.inter.json cannot be downloaded: get it from .* and put it in .*Beauty"):
        fetch_dataset(beauty, fetch)
    assert (tmp_path / "raw" / "apao" / "Beauty" / "Beauty.index.rq-kmeans.json").exists()
    (tmp_path / "raw" / "apao" / "Beauty" / "Beauty.inter.json").write_text("{}")
    fetch_dataset(beauty, fetch)  # in place now: no error


# ---- evaluation scoring: full | masked, temperature -----------------------------------------
def brute_force_scores(backbone, history, mask, sids, score: str, temperature: float) -> torch.Tensor:
    """S(y|x) [B, C] by explicit loops over candidates and steps: log_softmax(z / tau) over the whole
    vocabulary (full) or over the set of codes some candidate continues the prefix with (masked)."""
    cand = [tuple(c) for c in sids.cand_tokens().tolist()]
    enc = backbone.encode(history, mask)
    out = torch.zeros(history.shape[0], len(cand))
    for c, y in enumerate(cand):
        for t in range(len(y)):
            z = backbone.prefix_logits(enc, torch.tensor([[list(y[:t])]] * history.shape[0]))[:, 0, -1].float()
            z = z / temperature
            if score == "masked":
                allowed = sorted({x[t] for x in cand if x[:t] == y[:t]})
                keep = torch.full_like(z, float("-inf"))
                keep[:, allowed] = 0
                z = z + keep
            out[:, c] += torch.log_softmax(z, -1)[:, y[t]]
    return out


@pytest.mark.parametrize("score, temperature", [("full", 1.0), ("full", 2.0), ("masked", 1.0), ("masked", 2.0)])
def test_beam_and_full_ranking_score_like_brute_force(score, temperature):
    from toy import ToyBackbone, random_batch, random_sids

    from genrec.eval.beam import beam_search
    from genrec.eval.fullrank import full_scores
    from genrec.sid.trie import Trie

    sids = random_sids(30, [4, 3, 3], seed=3)
    trie, bb = Trie(sids), ToyBackbone(sids.vocab_size, seed=3)
    batch = random_batch(sids, 5, seed=3)
    enc = bb.encode(batch["history"], batch["mask"])
    want = brute_force_scores(bb, batch["history"], batch["mask"], sids, score, temperature)
    torch.testing.assert_close(full_scores(bb, enc, trie, 7, score, temperature), want, rtol=0, atol=1e-5)
    wide = beam_search(bb, enc, trie, sids.num_candidates, score, temperature)  # exact: nothing pruned
    torch.testing.assert_close(wide.scores, want.sort(1, descending=True).values, rtol=0, atol=1e-5)
    torch.testing.assert_close(want.gather(1, wide.cands), wide.scores, rtol=0, atol=1e-5)
    narrow = beam_search(bb, enc, trie, 4, score, temperature)
    torch.testing.assert_close(want.gather(1, narrow.cands), narrow.scores, rtol=0, atol=1e-5)
    other = brute_force_scores(bb, batch["history"], batch["mask"], sids, "full" if score == "masked" else "masked",
                               temperature)
    assert (other - want).abs().max() > 0.1  # the two modes really score differently on this catalogue


def test_scoring_defaults_follow_the_objective_and_are_recorded(tmp_path):
    for objective, want in [("ce", ("full", 1.0)), ("apao_pairwise", ("full", 1.0)), ("sdpo", ("full", 1.0)),
                            ("msl", ("masked", 2.0)), ("bear", ("masked", 1.0))]:
        cfg = compose_release(f"objective={objective}", "eval=bear")
        assert (cfg.eval.score, cfg.eval.temperature) == want, objective
    r = run(config(tmp_path, "trainer.max_epochs=1", "objective=msl"))
    assert (r["eval_score"], r["eval_temperature"]) == ("masked", 2.0)
    from genrec.evaluate import evaluate

    def again(*over):
        with initialize_config_dir(CONF, version_base="1.3"):
            return evaluate(compose("evaluate", overrides=[f"ckpt={tmp_path}/run", "eval.beam=5", "eval.ks=[1,5]",
                                                           f"data_dir={tmp_path.parent}/data", *over]))

    same = again()  # the run's own scoring
    assert (same["eval_score"], same["eval_temperature"]) == ("masked", 2.0)
    assert same["test/ndcg@5"] == pytest.approx(r["test/ndcg@5"], rel=1e-6)
    full = again("eval.score=full", "eval.temperature=1.0")
    assert (full["eval_score"], full["eval_temperature"]) == ("full", 1.0)
    assert (tmp_path / "run" / "eval" / "test-beam5-full-t1.json").exists()
    with pytest.raises(ConfigError, match="eval.score=soft: one of full, masked"):  # before any compute
        again("eval.score=soft")


# ---- sweeps optimise validation, never test ---------------------------------------------------
@pytest.mark.parametrize("monitor, mode", [("val/ndcg@5", "max"), ("val/loss", "min")])
def test_main_returns_the_best_validation_value_not_test(tmp_path, monitor, mode):
    import json

    from genrec.train import main

    cfg = config(tmp_path, "trainer.max_epochs=2", f"trainer.monitor={monitor}", f"trainer.monitor_mode={mode}")
    value = main.__wrapped__(cfg)  # the function Hydra (and its Optuna sweeper) calls
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    key = monitor.split("/", 1)[1]
    values = [h[key] for h in saved["history"]]
    assert value == saved[monitor] == (max(values) if mode == "max" else min(values))
    assert saved[f"test/{key}"] != value  # a different number: the return value is not the test metric


def test_listwise_is_now_pairwise_printed():
    from genrec.objectives.apao import APAO

    with pytest.raises(ValueError, match="objective.loss=listwise is now called pairwise_printed"):
        APAO(loss="listwise")
    assert APAO(loss="pairwise_printed").loss == "pairwise_printed"


# ---- BEAR's lam is the paper's lambda -----------------------------------------------------------
@pytest.mark.parametrize("end_token", [False, True])
def test_bear_lam_has_the_papers_strength(end_token):
    """The paper: L = L_SFT + lam * L_reg with L_SFT = -sum_t log p(y_t) (every response token, eos
    included) and L_reg = sum_t log sigmoid((log beta_t^B - s_t) / xi). genrec's loss is that divided by
    the n scored tokens, so the gradient times n is the paper's, for the same lam."""
    from obj_helpers import FixedLogits, allowed_tokens, case, make_ctx

    from genrec.models.base import EOS
    from genrec.objectives.bear import BEAR

    sids, trie, batch = case(num_items=22, sizes=(4, 3, 3), batch=7)
    B, T, V = len(batch["target"]), sids.num_levels, sids.vocab_size
    logits = 2 * torch.randn(B, 1, T + 1, V, generator=torch.Generator().manual_seed(4))
    lam, xi, width = 0.5, 2.0, 2
    bb = FixedLogits(logits)
    obj = BEAR("regularizer", lam, xi, beam=width, end_token=end_token)
    obj.setup(make_ctx(sids, eval_beam=width), bb)
    obj(batch, bb)[0].backward()
    z = logits.clone().requires_grad_()
    paper = 0
    for b in range(B):
        y = batch["target"][b].tolist() + ([EOS] if end_token else [])
        for t in range(len(y)):
            logp = torch.log_softmax(z[b, 0, t], -1)
            paper = paper - logp[y[t]] / B
            if t < T:  # the regularizer covers the item's codes
                ok = sorted((logp[a].item() for a in allowed_tokens(sids, y[:t])), reverse=True)
                beta = ok[min(width, len(ok)) - 1]
                paper = paper + lam * torch.nn.functional.logsigmoid((beta - logp[y[t]]) / xi) / B
    paper.backward()
    n = T + int(end_token)
    torch.testing.assert_close(bb.logits.grad * n, z.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("objective, key", [("bear", "beam"), ("sdpo", "bear.beam"), ("apao", "bear.beam")])
def test_objective_beam_is_the_eval_beam_in_the_saved_config(objective, key):
    """B (BEAR's top-B, and BEAR's term in S-DPO / APAO) is the evaluation beam by interpolation, so the
    run's resolved config.yaml records it and re-evaluating at another width cannot change it."""
    with initialize_config_dir(CONF, version_base="1.3"):
        extra = ["init_from=x"] if objective == "sdpo" else []
        cfg = compose("config", [f"objective={objective}", "eval=bear", *extra])
        wide = compose("config", [f"objective={objective}", "eval.beam=50", *extra])
    assert OmegaConf.select(OmegaConf.create(OmegaConf.to_container(cfg.objective, resolve=True)), key) == 10
    assert OmegaConf.select(OmegaConf.create(OmegaConf.to_container(wide.objective, resolve=True)), key) == 50


def test_bear_table_sweeps_the_papers_four_rows():
    """experiment=bear_table trains CE, BEAR, S-DPO and S-DPO+BEAR (the BEAR paper's table), each labelled so."""
    from genrec.report.load import objective_label

    with initialize_config_dir(CONF, version_base="1.3"):
        swept = compose("config", overrides=["experiment=bear_table"], return_hydra_config=True)
    objectives = str(swept.hydra.sweeper.params.objective).split(",")
    labels = {}
    for o in objectives:
        cfg = compose_release("experiment=bear_table", f"objective={o}")
        labels[objective_label(OmegaConf.to_container(cfg.objective, resolve=True))] = cfg
    assert set(labels) == {"CE", "BEAR", "S-DPO", "S-DPO+BEAR"}
    assert labels["S-DPO+BEAR"].stage1 == "ce" and labels["S-DPO+BEAR"].objective.bear.lam > 0
    assert labels["S-DPO"].stage1 == "ce" and labels["S-DPO"].objective.bear.lam == 0
    assert all(c.eval.beam == 10 for c in labels.values())  # the BEAR protocol's beam
