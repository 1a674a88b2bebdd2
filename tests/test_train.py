"""End-to-end training runs on the synthetic dataset with a tiny TIGER."""

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir

from run_helpers import CPU_DDP, reproducible, run_or_dump

from genrec.eval import metrics
from genrec.train import run

CONF = str(Path(__file__).parents[1] / "conf")
ROOT = Path(__file__).parents[1]


def config(tmp_path: Path, *overrides: str):
    with initialize_config_dir(CONF, version_base="1.3"):
        return compose("config", overrides=["experiment=tiny", f"run_dir={tmp_path}/run",
                                            f"data_dir={tmp_path.parent}/data", *overrides])


def test_fit_lowers_validation_loss_and_writes_run_dir(tmp_path):
    r = run(config(tmp_path, "trainer.max_epochs=3"))
    losses = [h["loss"] for h in r["history"]]
    assert losses[-1] < losses[0] - 0.05, losses
    run_dir = tmp_path / "run"
    saved = json.loads((run_dir / "metrics.json").read_text())
    assert saved["test/users"] == 300 and 0 <= saved["test/recall@5"] <= 1
    assert {"test/recall@5", "test/ndcg@5", "test/prefix_recall@1", "best_epoch", "seconds"} <= set(saved)
    assert (run_dir / "checkpoints" / "last.ckpt").exists() and (run_dir / "checkpoints" / "best.ckpt").exists()
    assert "_target_: genrec.models.tiger.Tiger" in (run_dir / "config.yaml").read_text()


def test_same_config_and_seed_give_identical_metrics(tmp_path):
    a = run(config(tmp_path / "a", "trainer.max_epochs=1"))
    b = run(config(tmp_path / "b", "trainer.max_epochs=1"))
    assert reproducible(a) == reproducible(b)
    c = run(config(tmp_path / "c", "trainer.max_epochs=1", "seed=7"))
    assert reproducible(c) != reproducible(a)
    workers = run(config(tmp_path / "w", "trainer.max_epochs=1", "trainer.num_workers=2"))  # as on a GPU (gpu.yaml)
    assert reproducible(workers) == reproducible(a)


def test_the_last_epoch_is_validated_whatever_the_validation_interval(tmp_path, capsys):
    """Lightning validates when (epoch + 1) % check_val_every_n_epoch == 0: 5 epochs validated every 2 would leave
    the last one (a cooldown's lowest learning rate) out of model selection. Without a progress bar each epoch
    prints one line (callbacks.epoch_log), its validation and whether it is the best so far among them."""
    r = run(config(tmp_path, "trainer.max_epochs=5", "trainer.check_val_every_n_epoch=2",
                   "trainer.limit_train_batches=2", "trainer.monitor=val/loss", "trainer.monitor_mode=min"))
    assert [h["epoch"] for h in r["history"]] == [1, 3, 4]
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("epoch ")]
    assert [x.split(" · ")[0] for x in lines] == [f"epoch {e}/5" for e in range(1, 6)]
    losses = {h["epoch"]: h["loss"] for h in r["history"]}
    for e, line in enumerate(lines):
        assert ("val " in line) == (e in losses), line
        assert line.endswith("min left" if e < 4 else " min"), line
        if e in losses:
            assert f" loss {losses[e]:.4f}" in line
            assert ("(best)" in line) == (losses[e] == min(v for k, v in losses.items() if k <= e)), line


def test_late_dropout_trains_without_dropout_until_its_start_epoch(tmp_path):
    """callbacks=[default,late_dropout]: starting at epoch 0 it is the plain run; starting after the last epoch it is
    the run at dropout 0; starting at epoch 1 of 2 it is neither (epoch 0's validation as dropout 0's, then not)."""
    base = ["trainer.max_epochs=2", "trainer.limit_train_batches=3"]
    late = lambda start: ["callbacks=[default,late_dropout]", f"callbacks.late_dropout.start_epoch={start}"]  # noqa: E731
    plain, none = (reproducible(run(config(tmp_path / n, *base, *x))) for n, x in
                   [("plain", []), ("none", ["backbone.dropout=0.0"])])
    assert plain["history"][0] != none["history"][0]
    assert reproducible(run(config(tmp_path / "l0", *base, *late(0)))) == plain
    switched = reproducible(run(config(tmp_path / "l1", *base, *late(1))))
    assert switched["history"][0] == none["history"][0] and switched["history"][1] not in (plain["history"][1],
                                                                                           none["history"][1])
    assert reproducible(run(config(tmp_path / "l2", *base, *late(2)))) == none


def _train_cmd(run_dir: Path, data_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "genrec.train", "experiment=tiny", "trainer.max_epochs=4",
            f"hydra.run.dir={run_dir}", f"data_dir={data_dir}", *extra]


def test_ddp_two_cpu_processes_evaluate_every_user_once(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = run_or_dump(_train_cmd(tmp_path / "ddp", tmp_path / "data", *CPU_DDP, "trainer.max_epochs=1"), cwd=ROOT,
                      env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    m = json.loads((tmp_path / "ddp" / "metrics.json").read_text())
    assert m["test/users"] == 300 and m["val/users"] == 300
    assert list(pd.read_csv(tmp_path / "ddp" / "test_ranks.csv").example) == list(range(300))  # gathered, once each


def test_nan_loss_stops_with_a_clear_error(tmp_path):
    out = subprocess.run(_train_cmd(tmp_path / "nan", tmp_path / "data", "optim.lr=1e30", "trainer.gradient_clip=null"),
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 2
    assert "non-finite loss" in out.stderr and "step" in out.stderr and "Traceback" not in out.stderr


def test_config_typo_lists_valid_options():
    out = subprocess.run([sys.executable, "-m", "genrec.train", "objective=apoa"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "apao" in out.stderr and "bear" in out.stderr  # Hydra lists the available options


def evaluate_tiny(tmp_path: Path, ckpt: str) -> dict:
    """genrec.evaluate of a tiny run at beam 5 (ks 1, 5)."""
    from genrec.evaluate import evaluate

    with initialize_config_dir(CONF, version_base="1.3"):
        return evaluate(compose("evaluate", overrides=[f"ckpt={ckpt}", "eval.beam=5", "eval.ks=[1,5]",
                                                       f"data_dir={tmp_path.parent}/data"]))


def ranking(metrics: dict) -> dict:
    """The test ranking metrics (the loss may differ in the last bits: other eval batches, other padding)."""
    return {k: v for k, v in metrics.items() if k.startswith("test/") and k != "test/loss"}


def test_evaluate_reproduces_test_metrics_and_reruns_other_beams(tmp_path):
    r = run(config(tmp_path, "trainer.max_epochs=1"))
    from genrec.evaluate import evaluate

    with initialize_config_dir(CONF, version_base="1.3"):
        same = compose("evaluate", overrides=[f"ckpt={tmp_path}/run", "eval.beam=5", "eval.ks=[1,5]",
                                              f"data_dir={tmp_path.parent}/data"])
        wide = compose("evaluate", overrides=[f"ckpt={tmp_path}/run", "eval.beam=60", "eval.ks=[1,5]",
                                              "eval.full_rank=true", f"data_dir={tmp_path.parent}/data"])
    a = evaluate(same)
    # Same ranking metrics; the loss may differ in the last bits (other eval batch size, other padding).
    assert {k: v for k, v in a.items() if k.startswith("test/")} == pytest.approx(
        {k: v for k, v in r.items() if k.startswith("test/")}, rel=1e-5)
    b = evaluate(wide)  # beam >= catalogue: beam search is exact, nothing is pruned
    assert b["test/recall@5"] == b["test/full/recall@5"] and b["test/pruning_rate@5"] == 0
    assert (tmp_path / "run" / "eval" / "test-beam60-full.json").exists()

    # per user (the report's paired test): the final test's ranks give its metrics, the re-evaluation's are equal
    ranks = pd.read_csv(tmp_path / "run" / "test_ranks.csv")
    assert list(ranks.columns) == ["example", "user", "item", "rank"] and list(ranks.example) == list(range(300))
    assert ranks.user.nunique() == 300  # leave-one-out: one test example per user
    rank = torch.as_tensor(ranks["rank"].to_numpy())
    for k in (1, 5):
        assert metrics.per_user(rank, f"recall@{k}").mean().item() == pytest.approx(r[f"test/recall@{k}"], rel=1e-9)
        assert metrics.per_user(rank, f"ndcg@{k}").mean().item() == pytest.approx(r[f"test/ndcg@{k}"], rel=1e-9)
    assert pd.read_csv(tmp_path / "run" / "eval" / "test-beam5.ranks.csv").equals(ranks)
    full = pd.read_csv(tmp_path / "run" / "eval" / "test-beam60-full.ranks.csv")
    assert list(full.columns) == ["example", "user", "item", "rank", "full_rank"] and full["rank"].min() >= 1  # exact
    assert (full["full_rank"] == full["rank"].clip(upper=6)).all()  # full ranks beyond max(ks) = 5 read 6


def test_evaluate_without_eval_keys_evaluates_as_the_run_did(tmp_path):
    """The run's own evaluator (its beam, ks, full ranking) unless this command sets a key: a BEAR-protocol run
    (beam 10, ks [5, 10]) is not silently re-scored at beam 20; `eval=<preset>` takes a preset's keys."""
    r = run(config(tmp_path, "trainer.max_epochs=1", "eval.beam=6", "eval.ks=[2,5]"))
    from genrec.evaluate import evaluate

    def again(*over):
        with initialize_config_dir(CONF, version_base="1.3"):
            return evaluate(compose("evaluate", overrides=[f"ckpt={tmp_path}/run", f"data_dir={tmp_path.parent}/data",
                                                           *over]))

    own = again()
    assert own["beam"] == 6 and not own["full_rank"] and ranking(own) == pytest.approx(ranking(r), rel=1e-5)
    assert set(ranking(own)) == set(ranking(r))  # the run's ks: @2 and @5
    assert (tmp_path / "run" / "eval" / "test-beam6.json").exists()
    wide = again("eval.beam=8")  # one key set: the rest (ks) stays the run's
    assert wide["beam"] == 8 and "test/recall@2" in wide and "test/recall@10" not in wide
    preset = again("eval=bear")  # conf/eval/bear.yaml: beam 10, ks [5, 10]
    assert preset["beam"] == 10 and "test/recall@10" in preset and "test/recall@2" not in preset


def test_evaluate_sweep_over_beams_runs_every_job(tmp_path):
    """The README's `genrec.evaluate -m ... eval.beam=...` (the sweep's config check sees the null eval keys that mean
    the run's own, not bad values)."""
    run(config(tmp_path, "trainer.max_epochs=1"))
    out = subprocess.run([sys.executable, "-m", "genrec.evaluate", "-m", f"ckpt={tmp_path}/run", "eval.beam=5,7",
                          f"data_dir={tmp_path.parent}/data", f"hydra.sweep.dir={tmp_path}/sweep"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "run" / "eval").glob("*.json")) == ["test-beam5.json", "test-beam7.json"]
    assert "test/recall@1" in json.loads((tmp_path / "run" / "eval" / "test-beam7.json").read_text())  # the run's ks


def test_evaluating_another_checkpoint_of_a_run_keeps_the_selected_ones_file(tmp_path):
    """eval/<split>-beam<K>.json is the run's selected checkpoint's (the report reads it as the run's); another
    checkpoint of the run (last.ckpt) gets its own file, named after it."""
    run(config(tmp_path, "trainer.max_epochs=2"))
    evaluate_tiny(tmp_path, f"{tmp_path}/run")
    evaluate_tiny(tmp_path, f"{tmp_path}/run/checkpoints/last.ckpt")
    out = tmp_path / "run" / "eval"
    assert sorted(p.name for p in out.iterdir()) == ["test-beam5-last.json", "test-beam5-last.ranks.csv",
                                                     "test-beam5.json", "test-beam5.ranks.csv"]
    assert json.loads((out / "test-beam5.json").read_text())["checkpoint"].endswith("best.ckpt")
    assert json.loads((out / "test-beam5-last.json").read_text())["checkpoint"].endswith("last.ckpt")


def test_evaluate_the_validation_split_writes_what_the_report_reads_as_val(tmp_path):
    """`split=val` writes eval/val-beam<K>[-full].json with `val/` keys, the
    namespace of the run's own validation metrics and of `genrec.report split=val`, which reads them (PR@k)."""
    r = run(config(tmp_path, "trainer.max_epochs=1"))
    from genrec import report as rep
    from genrec.evaluate import evaluate

    with initialize_config_dir(CONF, version_base="1.3"):
        val = evaluate(compose("evaluate", overrides=[f"ckpt={tmp_path}/run", "split=val", "eval.full_rank=true",
                                                      f"data_dir={tmp_path.parent}/data"]))
    assert sorted(p.name for p in (tmp_path / "run" / "eval").iterdir()) == ["val-beam5-full.json",
                                                                             "val-beam5-full.ranks.csv"]
    assert val["val/users"] == 300 and "val/pruning_rate@5" in val and not [k for k in val if k.startswith("valid")]
    assert val["val/recall@5"] != r["test/recall@5"] or val["val/ndcg@5"] != r["test/ndcg@5"]  # not the test split
    s = rep.report([tmp_path / "run"], tmp_path / "report", ["recall@5", "pruning_rate@5"], split="val")
    assert {c["metric"]: c["mean"] for c in s["cells"]}["pruning_rate@5"] == val["val/pruning_rate@5"]


def test_evaluate_a_run_whose_config_names_a_since_moved_module(tmp_path):
    """Runs written before genrec/data/sid.py moved to genrec/sid/tokenizers.py name the old path in config.yaml."""
    r = run(config(tmp_path, "trainer.max_epochs=1"))
    cfg_file = tmp_path / "run" / "config.yaml"
    assert "_target_: genrec.sid.tokenizers." in cfg_file.read_text()
    cfg_file.write_text(cfg_file.read_text().replace("_target_: genrec.sid.tokenizers.", "_target_: genrec.data.sid."))
    assert ranking(evaluate_tiny(tmp_path, f"{tmp_path}/run")) == pytest.approx(ranking(r), rel=1e-5)


def test_evaluation_does_not_import_training_code():
    code = ("import sys, genrec.evaluate; "
            "print(sorted(m for m in sys.modules if m in ('genrec.train', 'genrec.lit') or m.startswith('genrec.objectives')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


def test_evaluate_sdpo_run_after_its_reference_run_moved(tmp_path):
    """Evaluation builds data + model + evaluator only: S-DPO's reference (stage 1) is not needed."""
    r = run(config(tmp_path, "objective=sdpo_2stage", "trainer.max_epochs=1"))
    stage1 = tmp_path / "run" / "stage1"
    assert (stage1 / "checkpoints" / "best.ckpt").exists()
    stage1.rename(tmp_path / "moved")
    assert ranking(evaluate_tiny(tmp_path, f"{tmp_path}/run")) == pytest.approx(ranking(r), rel=1e-5)


def test_two_stage_pipeline_ce_then_any_objective(tmp_path):
    """`+stage1=ce`: CE (composed conf/objective/ce.yaml) into <run dir>/stage1, then the run's objective
    starts from its best checkpoint (init_from, saved in config.yaml). With a vanishing learning rate
    stage 2 keeps stage 1's weights, so it ranks exactly as stage 1 does; from scratch it would not."""
    r = run(config(tmp_path, "objective=apao_pointwise", "+stage1=ce", "trainer.max_epochs=1"))
    stage1 = tmp_path / "run" / "stage1"
    first = json.loads((stage1 / "metrics.json").read_text())
    assert first["objective"] == "ce" and "genrec.objectives.ce.CE" in (stage1 / "config.yaml").read_text()
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert f"init_from: {stage1}" in saved and "stage1: ce" in saved
    frozen = run(config(tmp_path / "b", "objective=apao_pointwise", f"init_from={stage1}", "trainer.max_epochs=1",
                        "optim.lr=1e-12"))
    ranks = [k for k in first if k.startswith(("test/recall@", "test/ndcg@"))]
    assert {k: frozen[k] for k in ranks} == {k: first[k] for k in ranks}
    assert {k: r[k] for k in ranks} != {k: first[k] for k in ranks}  # stage 2 did train


# trainer.<key>=<value> -> the Lightning Trainer attribute it must set (conf/trainer/default.yaml's `lightning`)
USER_KEYS = [("trainer.max_epochs=3", "max_epochs", 3), ("trainer.accumulate=3", "accumulate_grad_batches", 3),
             ("trainer.gradient_clip=0.5", "gradient_clip_val", 0.5), ("trainer.precision=bf16-mixed", "precision",
                                                                        "bf16-mixed"),
             ("trainer.check_val_every_n_epoch=2", "check_val_every_n_epoch", 2),
             ("trainer.limit_train_batches=7", "limit_train_batches", 7),
             ("trainer.limit_val_batches=0.5", "limit_val_batches", 0.5),
             ("trainer.limit_test_batches=3", "limit_test_batches", 3), ("trainer.log_every_n_steps=9",
                                                                         "log_every_n_steps", 9)]


def test_trainer_and_callbacks_built_from_the_keys_users_type(tmp_path):
    import torch
    from lightning.pytorch.strategies import DDPStrategy

    from genrec.callbacks import AtomicCheckpointIO, Checkpoints, ResumableEarlyStopping
    from genrec.train import build_trainer

    deterministic = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        cfg = config(tmp_path, *(o for o, _, _ in USER_KEYS), "trainer.progress_bar=false", "trainer.patience=3",
                     "trainer.monitor=val/loss", "trainer.monitor_mode=min", "trainer.deterministic=warn")
        t = build_trainer(cfg, tmp_path / "run")
        for override, attr, value in USER_KEYS:
            assert getattr(t, attr) == value, override
        assert t.progress_bar_callback is None and t.num_sanity_val_steps == 0 and t.logger.save_dir == cfg.run_dir
        assert torch.is_deterministic_algorithms_warn_only_enabled()  # deterministic=warn reached Lightning
        assert t.default_root_dir == str(tmp_path / "run") and isinstance(t.strategy.checkpoint_io, AtomicCheckpointIO)
        (ckpt,) = [c for c in t.callbacks if isinstance(c, Checkpoints)]
        (stop,) = [c for c in t.callbacks if isinstance(c, ResumableEarlyStopping)]
        assert (ckpt.monitor, ckpt.mode, stop.monitor, stop.mode, stop.patience) == ("val/loss", "min", "val/loss",
                                                                                      "min", 3)
        assert build_trainer(config(tmp_path, "trainer.progress_bar=true"), tmp_path).progress_bar_callback is not None
        ddp = build_trainer(config(tmp_path, "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
                                   "trainer.precision=32-true"), tmp_path / "ddp")
        assert isinstance(ddp.strategy, DDPStrategy) and ddp.num_devices == 2
        assert isinstance(ddp.strategy.checkpoint_io, AtomicCheckpointIO)
    finally:
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])


def test_a_callback_is_one_yaml_in_conf_callbacks(tmp_path):
    """conf/callbacks/lr_monitor.yaml, added on the command line, logs the learning rate; checkpoints stay."""
    import pandas as pd

    run(config(tmp_path, "callbacks=[default,lr_monitor]", "trainer.max_epochs=1", "trainer.limit_train_batches=3", "trainer.log_every_n_steps=1",
               "optim.warmup=0.5"))
    logged = pd.read_csv(tmp_path / "run" / "logs" / "metrics.csv")
    lr = logged.filter(like="lr-AdamW").dropna(how="all")
    # 3 steps, warm-up int(0.5 * 3) = 1 step: (0 + 1) / (1 + 1), then the cosine from 1 at progress 0 and 1/2
    assert lr.to_numpy().ravel().tolist() == pytest.approx([3e-3 * f for f in (0.5, 0.5, 1.0, 1.0, 0.5, 0.5)])
    assert (tmp_path / "run" / "checkpoints" / "best.ckpt").exists()


class RecordSteps(L.Callback):
    """The raw weights after each optimizer step (test helper: `+callbacks.record._target_=test_train.RecordSteps`)."""

    steps: list[dict[str, torch.Tensor]] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_step > len(self.steps):
            self.steps.append({k: p.detach().clone() for k, p in module.named_parameters()})


def test_ema_weights_are_what_selection_checkpoints_and_the_test_see(tmp_path):
    """callbacks=[default,ema]: best.ckpt holds the moving average of the weights after each optimizer step (checked
    against that average computed here), and the run's test scores those weights, as genrec.evaluate of best.ckpt
    does (Lightning's own callback reloads the raw weights for `trainer.test(ckpt_path=...)`)."""
    RecordSteps.steps.clear()
    r = run(config(tmp_path, "callbacks=[default,ema]", "callbacks.ema.decay=0.9", "trainer.max_epochs=2",
                   "trainer.limit_train_batches=4", "+callbacks.record._target_=test_train.RecordSteps"))
    assert len(RecordSteps.steps) == 8
    upto = RecordSteps.steps[: 4 * (r["best_epoch"] + 1)]  # the steps up to the selected epoch's end
    average = dict(upto[0])
    for step in upto[1:]:
        average = {k: 0.9 * a + 0.1 * step[k] for k, a in average.items()}
    saved = torch.load(tmp_path / "run" / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)
    for k, a in average.items():
        torch.testing.assert_close(saved["state_dict"][k], a, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(saved["current_model_state"][k], upto[-1][k])  # for resume
    assert ranking(evaluate_tiny(tmp_path, str(tmp_path / "run" / "checkpoints" / "best.ckpt"))) == \
        pytest.approx(ranking(r), rel=1e-5)


def test_a_ddp_rank_killed_leaves_failed_json_saying_a_peer_died(tmp_path):
    """Rank 0 is SIGKILLed mid-epoch (as an OOM kill ended it): rank 1 only sees gloo's "connection reset by
    peer", and its failed.json and stderr say that another process died first, where to look, how to resume."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "tests")}
    out = run_or_dump(_train_cmd(tmp_path / "killed", tmp_path / "data", *CPU_DDP,
                                 "objective._target_=rank_faults.KilledOnRankZero"), cwd=ROOT, env=env, timeout=300)
    assert out.returncode != 0
    failed = json.loads((tmp_path / "killed" / "failed.json").read_text())
    assert "another process of this run died" in failed["hint"] and "resume=true" in failed["hint"], failed
    assert failed["error"].startswith("RuntimeError") and "peer" in failed["error"].lower(), failed
    assert failed["hint"] in out.stderr, out.stderr[-3000:]


def test_nan_loss_on_one_ddp_rank_stops_every_rank_with_the_error(tmp_path):
    """The loss turns NaN on rank 1 only: both ranks stop at the same step with the non-finite-loss error
    (a rank that raised alone left the other in a collective: a hang on NCCL, a peer error on gloo)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "tests")}
    out = run_or_dump(_train_cmd(tmp_path / "nan", tmp_path / "data", *CPU_DDP,
                                 "objective._target_=rank_faults.NanOnRankOne"), cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "non-finite loss at epoch 0, by step 2" in out.stderr and "Traceback" not in out.stderr, out.stderr[-3000:]
    failed = json.loads((tmp_path / "nan" / "failed.json").read_text())
    assert failed["error"].startswith("NonFiniteLoss: non-finite loss at epoch 0, by step 2")
