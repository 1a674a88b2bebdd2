"""Multi-process runs: the samplers' sharding, and gloo DDP fits on CPU with more ranks than batches."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from genrec.data.datamodule import LengthBatches
from genrec.lit import GenRec
from genrec.train import run
from run_helpers import CPU_DDP, reproducible, run_or_dump

ROOT = Path(__file__).parents[1]


@pytest.mark.parametrize("n", [1, 3, 7, 300])
@pytest.mark.parametrize("world", [1, 2, 4, 5])
def test_eval_shards_cover_every_example_and_no_rank_is_idle(n, world):
    lengths = np.random.default_rng(n).integers(1, 20, n)
    shards = [LengthBatches(lengths, 128, False, 0, r, world) for r in range(world)]
    got = [[b for b in s] for s in shards]
    assert all(len(g) == len(s) >= 1 for g, s in zip(got, shards))  # __len__ is right, nobody is empty
    assert len({len(g) for g in got}) == 1  # every rank runs the same number of steps
    seen = np.concatenate([np.concatenate(g) for g in got])
    assert sorted(set(seen)) == list(range(n))  # every example, repeats only as padding
    assert len(seen) - n < world
    if world == 1:  # one process: all examples once, sorted by length
        assert list(seen) == list(np.argsort(lengths, kind="stable"))


@pytest.mark.parametrize("n", [2, 5, 130, 1000])
@pytest.mark.parametrize("world", [1, 3, 4])
def test_train_shards_are_disjoint_and_equal(n, world):
    lengths = np.random.default_rng(n).integers(1, 20, n)
    shards = [LengthBatches(lengths, 64, True, 0, r, world, window=2, epoch=lambda: 3) for r in range(world)]
    got = [s.batches() for s in shards]
    assert all(len(g) == len(s) >= 1 for g, s in zip(got, shards))
    assert len({len(g) for g in got}) == 1 and len({sum(map(len, g)) for g in got}) == 1
    seen = np.concatenate([np.concatenate(g) for g in got])
    if n >= world:  # disjoint, at most world - 1 left out this epoch
        assert len(set(seen)) == len(seen) and n - len(seen) < world
    else:  # fewer examples than ranks: each rank still gets one (some repeated)
        assert set(seen) == set(range(n)) and len(seen) == world
    assert [list(b) for b in shards[0].batches()] == [list(b) for b in got[0]]  # same (seed, epoch): same


@pytest.mark.parametrize("validate", ["beam", "loss"])
def test_gloo_ddp_more_ranks_than_batches_evaluates_every_user_once(tmp_path, validate):
    """4 CPU processes; 2 training batches of 2048 and 3 eval batches of 128 in one process's
    terms (300 users): every rank still trains and evaluates, every user is counted once, and
    the test metrics are those of a single-process evaluation of the same checkpoint. `devices`
    is the string "4" (like "auto" or a list: not an int): the cosine schedule still spans
    exactly the one step taken (it used to assume one process: 2 steps, ending at lr / 2). Validating the
    losses alone (trainer.validate=loss, experiment=apao_release_cpu) gathers them from every rank too."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run_dir, data_dir = tmp_path / "run", tmp_path / "data"
    out = run_or_dump([sys.executable, "-m", "genrec.train", "experiment=tiny", *CPU_DDP, "trainer.devices='4'",
                       "trainer.precision=32-true",
                       "trainer.max_epochs=1", "optim.warmup=0", "trainer.batch_size=2048", "trainer.eval_batch_size=128",
                       f"hydra.run.dir={run_dir}", f"data_dir={data_dir}", f"trainer.validate={validate}",
                       *(["trainer.monitor=val/objective_loss", "trainer.monitor_mode=min"] if validate == "loss" else [])],
                      cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "sync_dist" not in out.stderr  # metrics come from rows gathered over ranks: no false alarm per metric
    m = json.loads((run_dir / "metrics.json").read_text())
    assert m["test/users"] == 300 and m["val/users"] == 300 and m["val/loss"] > 0
    assert any(k.startswith("val/recall@") for k in m) == (validate == "beam")
    assert m["processes"] == 4 and m["peak_rss_gb"] > 0.1  # the largest of the 4 processes
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 1 and ckpt["optimizer_states"][0]["param_groups"][0]["lr"] == 0.0

    from genrec.evaluate import evaluate

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("evaluate", overrides=[f"ckpt={m['checkpoint']}", "eval.beam=5", "eval.ks=[1,5]",
                                             f"data_dir={data_dir}", "accelerator=cpu"])
    one = evaluate(cfg)
    ranking = [k for k in m if k.startswith("test/") and k != "test/loss"]
    assert {k: one[k] for k in ranking} == pytest.approx({k: m[k] for k in ranking}, rel=1e-6)
    assert one["test/loss"] == pytest.approx(m["test/loss"], rel=1e-4)  # other batches: other padding


def test_gloo_ddp_selects_on_the_release_last_validation_batch(tmp_path):
    """trainer.monitor=val/last_batch_loss@128 under 2 gloo processes (experiment=apao_release_cpu's shape): every
    rank scores the same last batch (users 256-299 of 300, in file order), so the logged value is that batch's
    loss on the final weights, as one process computes it from each user's teacher-forced CE."""
    from genrec.data.datamodule import SeqDataModule
    from genrec.eval.module import EvalModule
    from genrec.prepare import prepare
    from genrec.runs import load_backbone_state, run_config

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run_dir, data_dir = tmp_path / "run", tmp_path / "data"
    out = run_or_dump([sys.executable, "-m", "genrec.train", "experiment=tiny", *CPU_DDP, "trainer.devices=2",
                       "trainer.precision=32-true",
                       "trainer.max_epochs=2", "trainer.validate=loss", "objective.end_token=false",
                       "trainer.monitor=val/last_batch_loss@128", "trainer.monitor_mode=min",
                       f"hydra.run.dir={run_dir}", f"data_dir={data_dir}"],
                      cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    m = json.loads((run_dir / "metrics.json").read_text())
    assert m["processes"] == 2 and len(m["history"]) == 2
    cfg = run_config(run_dir / "config.yaml")
    cfg.data_dir = str(data_dir)
    data = prepare(cfg, log=lambda m: None)
    valid = SeqDataModule(data.seq, data.sids, cfg.dataset.max_history, 1, 1, cfg.seed).splits["valid"]
    assert len(valid) == 300
    module = EvalModule(cfg, data.sids)
    module.backbone.load_state_dict(load_backbone_state(run_dir / "checkpoints" / "last.ckpt"))
    module.eval()
    ce = module.evaluator.losses(module.backbone, valid[list(range(300))])["loss"]
    assert m["history"][-1]["last_batch_loss@128"] == pytest.approx(float(ce[256:].mean()), rel=1e-5)


def test_schedule_spans_the_steps_lightning_takes(tmp_path, monkeypatch):
    """devices=auto, gradient accumulation and a batch limit: the schedule's length is the
    number of optimizer steps the fit takes (2 epochs x 4 / 2)."""
    seen = {}
    configure = GenRec.configure_optimizers

    def spy(self):
        out = configure(self)
        seen["total"], seen["module"] = self.total_steps, self
        return out

    monkeypatch.setattr(GenRec, "configure_optimizers", spy)
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=tiny", f"run_dir={tmp_path}/run", f"data_dir={tmp_path}/data",
                                           "trainer.accelerator=cpu", "trainer.devices=auto", "trainer.accumulate=2",
                                           "trainer.limit_train_batches=4", "trainer.max_epochs=2", "optim.warmup=0"])
    run(cfg)
    trainer = seen["module"].trainer
    assert seen["total"] == trainer.global_step == 4
    assert trainer.optimizers[0].param_groups[0]["lr"] == 0.0  # the cosine ends at the last step


@pytest.mark.parametrize("devices, world", [(-1, 4), ("auto", 4), ([0, 2], 2), ("0,1,2", 3)])
def test_schedule_length_follows_lightnings_world_size(tmp_path, devices, world):
    """On a machine that reports 4 GPUs (mocked: nothing runs on them), `devices` in any of
    Lightning's forms sizes the LR schedule from this rank's share of the examples."""
    from unittest import mock

    import lightning as L
    import lightning.fabric.accelerators.cuda as fabric_cuda
    import lightning.pytorch.accelerators.cuda as pl_cuda

    from genrec.data.datamodule import SeqDataModule
    from genrec.prepare import prepare

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=tiny", f"run_dir={tmp_path}/run", f"data_dir={tmp_path}/data",
                                           "trainer.max_epochs=3"])
    data = prepare(cfg)
    dm = SeqDataModule(data.seq, data.sids, cfg.dataset.max_history, 64, 128, cfg.seed)
    module = GenRec(cfg, data.sids, dm.item_counts())
    with mock.patch.object(fabric_cuda, "num_cuda_devices", lambda: 4), \
            mock.patch.object(pl_cuda.CUDAAccelerator, "is_available", staticmethod(lambda: True)), \
            mock.patch("torch.cuda.device_count", lambda: 4), mock.patch("torch.cuda.is_available", lambda: True):
        trainer = L.Trainer(accelerator="gpu", devices=devices, strategy="ddp", max_epochs=3, accumulate_grad_batches=2,
                            logger=False, use_distributed_sampler=False)
        with mock.patch.object(type(trainer.strategy), "root_device", new_callable=mock.PropertyMock,
                               return_value=torch.device("cpu")):
            trainer.strategy.connect(module)
            trainer._data_connector.attach_data(module, datamodule=dm)
            trainer.state.fn = "fit"
            module.trainer = trainer
            module.configure_optimizers()
    assert trainer.world_size == world
    per_rank_batches = -(-(len(dm.splits["train"]) // world) // 64)  # ceil(share / batch size)
    assert module.total_steps == 3 * -(-per_rank_batches // 2)


def test_val_users_validates_a_fixed_sample_and_tests_everyone(tmp_path):
    """`trainer.val_users`: every validation epoch scores the same seeded k users (cheaper model
    selection); the final test still scores every user."""
    from genrec.data.datamodule import SeqDataModule
    from genrec.prepare import prepare

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=tiny", f"run_dir={tmp_path}/run", f"data_dir={tmp_path}/data",
                                           "trainer.val_users=50"])
    data = prepare(cfg)
    full = SeqDataModule(data.seq, data.sids, cfg.dataset.max_history, 64, 128, cfg.seed)
    dm = SeqDataModule(data.seq, data.sids, cfg.dataset.max_history, 64, 128, cfg.seed, val_users=50)
    picked = {tuple(p) for p in dm.splits["valid"].pairs}
    assert len(picked) == 50 and picked <= {tuple(p) for p in full.splits["valid"].pairs}
    assert len(dm.splits["test"]) == len(full.splits["test"]) == 300
    r = run(cfg)
    assert [h["users"] for h in r["history"]] == [50.0, 50.0] and r["test/users"] == 300


def test_length_window_one_gives_uniformly_random_batches(tmp_path):
    """`trainer.length_window=1` (the APAO release's HF Trainer: random batches): each training batch is a
    consecutive slice of the epoch's seeded permutation, not a group of similar history lengths (the default)."""
    from genrec.data.datamodule import SeqDataModule
    from genrec.prepare import prepare

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=tiny", f"run_dir={tmp_path}/run", f"data_dir={tmp_path}/data",
                                           "trainer.length_window=1"])
    data = prepare(cfg)
    dm = SeqDataModule(data.seq, data.sids, cfg.dataset.max_history, 16, 128, cfg.seed,
                       length_window=cfg.trainer.length_window)
    n, lengths = len(dm.splits["train"]), dm.splits["train"].lengths
    perm = np.random.default_rng([cfg.seed, 0]).permutation(n)
    want = {frozenset(perm[i : i + 16].tolist()) for i in range(0, n, 16)}
    got = list(dm.train_dataloader().sampler)
    assert {frozenset(b) for b in got} == want
    grouped = SeqDataModule(data.seq, data.sids, cfg.dataset.max_history, 16, 128, cfg.seed).train_dataloader().sampler
    spread = lambda batches: np.mean([np.ptp(lengths[list(b)]) for b in batches])  # noqa: E731
    assert spread(grouped) < spread(got)  # the default groups lengths; window 1 does not


def test_a_hung_run_fails_with_every_process_stack():
    """run_or_dump (the DDP tests' subprocess runner): a run that outlives its timeout fails the test with the Python
    stack of each of its processes, the launched child's too, as a hung rank would show it; only the stacks, so a CI
    log's tail shows them (not the run's own lines, nor faulthandler's list of loaded extension modules)."""
    child = "import time, numpy\ndef child_waits(): time.sleep(120)\nchild_waits()"
    parent = (f"import subprocess, sys, time\nkid = subprocess.Popen([sys.executable, '-c', {child!r}])\n"
              "print('a line of the run itself', file=sys.stderr, flush=True)\n"
              "def parent_waits(): time.sleep(120)\nparent_waits()")
    with pytest.raises(pytest.fail.Exception) as failed:
        run_or_dump([sys.executable, "-c", parent], timeout=10)  # room for both to start on a loaded machine
    assert "hung for 10s" in str(failed.value)
    assert "parent_waits" in str(failed.value) and "child_waits" in str(failed.value)
    listing, shown = str(failed.value).split("their stacks:", 1)
    assert "a line of the run itself" not in shown and "Extension modules" not in shown
    assert "child_waits()" in listing.splitlines()[-1]  # the processes, parent first, as they were aborted
    assert all(re.fullmatch(r'  File ".+", line \d+ in \S+', line) for line in shown.splitlines() if "File" in line)
    assert shown.index("child_waits") > shown.index("parent_waits")  # one whole stack after the other


def test_ddp_resume_true_continues_the_killed_run_beside_it_on_every_rank(tmp_path):
    """`resume=true` in a new run dir finds the killed run beside it: both DDP processes continue that run, and it
    ends with the metrics of the run never killed. (Rank 1, which Lightning starts by running the command again,
    used to search by itself, found the run held by rank 0, started fresh, and the two ranks hung.) The kill comes
    after the first epoch's last.ckpt and before the run ends (both asserted), not at a chosen step."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "genrec.train", "experiment=tiny", *CPU_DDP, "trainer.devices=2",
            "trainer.max_epochs=3", "trainer.limit_train_batches=4", f"data_dir={tmp_path / 'data'}"]
    full = tmp_path / "full" / "run"
    out = run_or_dump([*args, f"hydra.run.dir={full}"], cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    killed = tmp_path / "runs" / "a"
    proc = subprocess.Popen([*args, f"hydra.run.dir={killed}"], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(3000):
            if (killed / "checkpoints" / "last.ckpt").exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (killed / "metrics.json").exists(), "the run ended before the kill"
    ckpt = torch.load(killed / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["epoch"] < 2
    out = run_or_dump([*args, f"hydra.run.dir={tmp_path / 'runs' / 'b'}", "resume=true"], cwd=ROOT, env=env,
                      timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resume: continuing {killed}" in out.stderr + out.stdout and "starting fresh" not in out.stderr + out.stdout
    assert not (tmp_path / "runs" / "b").exists()  # nothing was trained there, by any rank
    assert reproducible(json.loads((killed / "metrics.json").read_text())) == \
        reproducible(json.loads((full / "metrics.json").read_text()))


def test_resume_true_on_ranks_above_0_takes_rank_0s_choice_else_a_held_run(tmp_path, monkeypatch):
    """find_resume_dir beside a killed-then-claimed run `a` (another live process holds it, as rank 0 does once it
    resumed it): rank 0 leaves it (a live run is not to resume); a rank > 0 takes rank 0's choice when rank 0
    started it (GENREC_RESUME_DIR, "" = none), and without one (a cluster's launcher started it) takes `a` anyway."""
    from genrec import train as T

    runs = tmp_path / "runs"
    (runs / "a" / "checkpoints").mkdir(parents=True)
    (runs / "a" / "checkpoints" / "last.ckpt").write_bytes(b"")
    (runs / "a" / ".hydra").mkdir()
    (runs / "a" / ".hydra" / "config.yaml").write_text(f"resume: false\nrun_dir: {runs / 'a'}\nseed: 1\n")
    cfg = OmegaConf.create({"resume": True, "run_dir": str(runs / "b"), "seed": 1})
    hold = (f"import time; from pathlib import Path; from genrec.runs import claim; claim(Path({str(runs / 'a')!r})); "
            "print('held', flush=True); time.sleep(300)")
    holder = subprocess.Popen([sys.executable, "-c", hold], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        monkeypatch.delenv(T.RESUME_CHOICE, raising=False)
        assert T.find_resume_dir(cfg) is None  # rank 0
        monkeypatch.setattr(T.rank_zero_only, "rank", 1)
        assert T.find_resume_dir(cfg) == runs / "a"  # no choice passed down
        monkeypatch.setenv(T.RESUME_CHOICE, "")
        assert T.find_resume_dir(cfg) is None
        monkeypatch.setenv(T.RESUME_CHOICE, str(tmp_path / "elsewhere"))
        assert T.find_resume_dir(cfg) == tmp_path / "elsewhere"
    finally:
        holder.kill()
        holder.wait()
