"""A bad config value is one line, `error: <key>=<value>: <allowed>`, before any work starts."""

import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from genrec.config_check import CHECKS, errors, trainer_errors

ROOT = Path(__file__).parents[1]
CONF = ROOT / "conf"


def cfg(*overrides: str, name: str = "config"):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose(name, overrides=list(overrides))


def installed(plugin: str) -> bool:
    """Whether Hydra's plugin `plugin` (e.g. hydra_submitit_launcher, of pyproject's cluster extra) is installed."""
    return find_spec("hydra_plugins") is not None and find_spec(f"hydra_plugins.{plugin}") is not None


BAD = [  # (overrides, the one line after "error: ")
    (["trainer.batch_size=abc"], "trainer.batch_size=abc: an integer >= 1"),
    (["trainer.batch_size=0"], "trainer.batch_size=0: an integer >= 1"),
    (["trainer.eval_batch_size=-4"], "trainer.eval_batch_size=-4: an integer >= 1"),
    (["trainer.accumulate=0"], "trainer.accumulate=0: an integer >= 1"),
    (["trainer.max_epochs=0"], "trainer.max_epochs=0: an integer >= 1"),
    (["trainer.limit_train_batches=1.5"],
     "trainer.limit_train_batches=1.5: a share in (0.0, 1.0] or a number of batches >= 1"),
    # 0 batches: no training (the test then finds no checkpoint), no validation (early stopping fails after epoch
    # 1), no test (metrics.json fails after all the training)
    (["trainer.limit_train_batches=0"],
     "trainer.limit_train_batches=0: a share in (0.0, 1.0] or a number of batches >= 1"),
    (["trainer.limit_val_batches=0.0"],
     "trainer.limit_val_batches=0.0: a share in (0.0, 1.0] or a number of batches >= 1"),
    (["trainer.limit_test_batches=0"],
     "trainer.limit_test_batches=0: a share in (0.0, 1.0] or a number of batches >= 1"),
    (["eval.beam=0"], "eval.beam=0: an integer >= 1"),
    (["eval.beam=2.5"], "eval.beam=2.5: an integer >= 1"),
    (["eval.ks=[5,50]"], "eval.ks=[5, 50]: a non-empty list of integers from 1 to eval.beam (20)"),
    (["eval.ks=[0]"], "eval.ks=[0]: a non-empty list of integers from 1 to eval.beam (20)"),
    (["trainer.monitor=val/ndcg@50"], "trainer.monitor=val/ndcg@50: a logged validation metric, @k with k in eval.ks "
                                      "([5, 10, 20])"),
    (["objective=apao", "objective.num_negatives=0"], "objective.num_negatives=0: an integer >= 1"),
    (["backbone.d_model=0"], "backbone.d_model=0: an integer >= 1"),
    (["backbone=llama", "backbone.num_heads=-1"], "backbone.num_heads=-1: an integer >= 1"),
    (["objective=apao", "objective.loss=hinge"], "objective.loss=hinge: one of pointwise, pairwise, pairwise_printed"),
    (["objective=apao", "objective.weights=equal"],
     "objective.weights=equal: one of paper, released, uniform, hardmax"),
    (["objective=bear", "objective.form=penalty"], "objective.form=penalty: one of regularizer, reweight"),
    (["objective=sdpo", "init_from=x", "objective.negatives.kind=random"],
     "objective.negatives.kind=random: one of uniform, popularity, hard, beam"),
    (["objective.temperature=0"], "objective.temperature=0: a number > 0"),
    (["objective=sdpo"], "objective=sdpo: init_from=<a CE run dir or .ckpt> (S-DPO's start and reference), "
                         "or objective=sdpo_2stage"),
    (["objective=apao", "+stage1=cee"], "stage1=cee: an objective of conf/objective/ (apao, apao_pairwise, "
                                         "apao_pointwise, bear, ce, msl, sdpo, sdpo_2stage, sdpo_bear_2stage)"),
    (["objective=sdpo", "init_from=x", "objective.bear=true"],
     "objective.bear=true: null or {lam, xi, beam, widths} (lam: 0 = off)"),
    (["objective=apao", "objective.bear.lam=-0.1"], "objective.bear.lam=-0.1: a number >= 0"),
    (["objective=msl", "objective.temperature=-1.0"], "objective.temperature=-1.0: a number > 0"),
    (["objective=apao", "objective.prefix_temperature=0.0"], "objective.prefix_temperature=0.0: a number > 0"),
    (["dataset.kcore=0"], "dataset.kcore=0: an integer >= 1"),
    (["dataset.split=random"], "dataset.split=random: one of loo, sliding"),
    (["optim.lr=0"], "optim.lr=0: a number > 0"),
    (["eval.score=partial"], "eval.score=partial: one of full, masked, or null"),
    (["eval.temperature=0"], "eval.temperature=0: a number > 0, or null"),
    (["trainer.monitor_mode=up"], "trainer.monitor_mode=up: one of max, min"),
    (["experiment=apao_release", "trainer=ddp", "objective=apao_pointwise"],  # 8 accumulated x 2 GPUs = 16
     "trainer.accumulate=8: APAO sets its prefix weights (objective.weights=released) once per micro-batch, "
     "protocol.micro_batches=8 times per step in this recipe, not a multiple of trainer.accumulate x 2 process(es) "
     "(protocol.micro_batches=null to run it anyway, not as the recipe)"),
    (["experiment=apao_release_cpu", "objective=apao_pointwise", "trainer.batch_size=255"],
     "trainer.batch_size=255: APAO sets its prefix weights (objective.weights=released) once per micro-batch, "
     "protocol.micro_batches=8 times per step in this recipe, i.e. 2 equal chunks of each micro-batch here "
     "(protocol.micro_batches=null to run it anyway, not as the recipe)"),
    (["experiment=apao_release", "protocol.micro_batches=0"], "protocol.micro_batches=0: an integer >= 1, or null"),
    (["trainer.monitor=val/ndgc@10"], "trainer.monitor=val/ndgc@10: val/loss, val/objective_loss, "
     "val/last_batch_loss@B, val/recall@k, val/ndcg@k, val/prefix_recall@m, or with eval.full_rank=true "
     "val/full/recall@k, val/full/ndcg@k, val/pruning_rate@k"),
    (["trainer.monitor=val/last_batch_loss@0", "trainer.monitor_mode=min"], "trainer.monitor=val/last_batch_loss@0: "
     "val/loss, val/objective_loss, val/last_batch_loss@B, val/recall@k, val/ndcg@k, val/prefix_recall@m, or with "
     "eval.full_rank=true val/full/recall@k, val/full/ndcg@k, val/pruning_rate@k"),
    (["trainer.monitor=val/objective_loss"],
     "trainer.monitor_mode=max: val/objective_loss is minimised (use min)"),
    (["trainer.monitor=val/last_batch_loss@128"],
     "trainer.monitor_mode=max: val/last_batch_loss@128 is minimised (use min)"),
    (["trainer.validate=loss"], "trainer.monitor=val/ndcg@10: trainer.validate=loss logs only val/loss, "
     "val/objective_loss, val/last_batch_loss@B and val/users (monitor one of them, or trainer.validate=beam)"),
    (["trainer.validate=metrics"], "trainer.validate=metrics: one of beam, loss"),
    (["trainer.monitor=val/full/recall@10"],
     "trainer.monitor=val/full/recall@10: logged only with eval.full_rank=true"),
    (["backbone.memory_under_autocast=1"], "backbone.memory_under_autocast=1: true or false, or null"),
    (["trainer.clip_on=both"], "trainer.clip_on=both: one of mean, sum"),
    (["trainer.val_users=0"], "trainer.val_users=0: an integer >= 1, or null"),
    (["dataset.reader._target_=genrec.data.readers.lcrec.reed"],
     "dataset.reader._target_=genrec.data.readers.lcrec.reed: not an importable function (e.g. "
     "genrec.data.readers.lcrec.read)"),
    (["dataset.reader._target_=genrec.data.readers.common.find_file"],  # no strict=: not a Reader
     "dataset.reader._target_=genrec.data.readers.common.find_file: a reader takes strict= and returns RawData "
     "(genrec.data.readers.common.Reader)"),
    (["~callbacks.checkpoints"], "callbacks=[early_stopping,validate_last_epoch,epoch_log]: one of them "
     "genrec.callbacks.Checkpoints (conf/callbacks/checkpoints.yaml: best.ckpt, last.ckpt), e.g. callbacks=[default,...]"),
    (["+trainer.lightning.max_tme=00:01:00:00"],
     "trainer.lightning.max_tme: not an argument of lightning.pytorch.Trainer (did you mean max_time?)"),
    (["+callbacks.early_stopping.patiense=3"],
     "callbacks.early_stopping.patiense: not an argument of genrec.callbacks.ResumableEarlyStopping "
     "(did you mean patience?)"),
    (["+callbacks.swa._target_=lightning.pytorch.callbacks.SWA"],
     "callbacks.swa._target_=lightning.pytorch.callbacks.SWA: an importable class or function"),
    # a `+` key of any node with a `_target_`: an argument of its target, else it fails after the data stage
    (["experiment=tiny", "+objective.betta=0.3"], "objective.betta: not an argument of genrec.objectives.ce.CE"),
    (["objective=apao", "+objective.betta=0.3"],
     "objective.betta: not an argument of genrec.objectives.apao.APAO (did you mean beta?)"),
    (["+eval.bem=5"], "eval.bem: not an argument of genrec.eval.evaluator.Evaluator (did you mean beam?)"),
    (["+backbone.foo=1"], "backbone.foo: not an argument of genrec.models.tiger.Tiger"),  # **legacy: old configs'
    (["backbone=llama", "+backbone.hidden=64"],
     "backbone.hidden: not an argument of genrec.models.llama.Llama (did you mean hidden_size?)"),
    (["+tokenizer.level=2"],
     "tokenizer.level: not an argument of genrec.sid.tokenizers.RQKMeans (did you mean levels?)"),
    (["+embedder.foo=1"], "embedder.foo: not an argument of genrec.data.embed.MiniLM"),
    (["+dataset.reader.foo=1"], "dataset.reader.foo: not an argument of genrec.data.readers.recbole.read"),
    (["+logger.foo=1"], "logger.foo: not an argument of lightning.pytorch.loggers.CSVLogger"),
    (["+trainer.lightning.plugins.0.foo=1"],
     "trainer.lightning.plugins[0].foo: not an argument of genrec.callbacks.AtomicCheckpointIO"),
    # groups read key by key (no `_target_`): a key no option of the group has is read by nothing
    (["+optim.lrr=1e-3"], "optim.lrr: not read by genrec, no conf/optim/*.yaml has it (did you mean lr?)"),
    (["+dataset.foo=1"], "dataset.foo: not read by genrec, no conf/dataset/*.yaml has it"),
    (["+trainer.max_epoch=3"],
     "trainer.max_epoch: not read by genrec, no conf/trainer/*.yaml has it (did you mean max_epochs?)"),
    # switches (null: genrec.evaluate's eval.* = the run's own)
    (["eval.full_rank=maybe"], "eval.full_rank=maybe: true or false, or null"),
    (["trainer.deterministic=yes"], "trainer.deterministic=yes: true, false or warn"),
    (["trainer.pin_memory=1"], "trainer.pin_memory=1: true or false"),
    (["resume=1"], "resume=1: true, false (or null) or a run dir"),  # resume=<dir> is fine (tests/test_readme.py)
    (["logger=wandb", "logger.log_model=some"], "logger.log_model=some: true, false or all (W&B: every checkpoint)"),
    (["experiment=office_cpu", "protocol.end_token=no"], "protocol.end_token=no: true or false"),
    (["objective=bear", "objective.masked=yes"], "objective.masked=yes: true or false"),
    (["objective=bear", "objective.widths=[0,5]"], "objective.widths=[0, 5]: a list of integers >= 1, or null"),
    (["objective=apao", "objective.bear.widths=10"], "objective.bear.widths=10: a list of integers >= 1, or null"),
    (["optim.betas=[0.9,1.5]"], "optim.betas=[0.9, 1.5]: two numbers in [0, 1)"),
    (["backbone.feed_forward_proj=gelu"], "backbone.feed_forward_proj=gelu: one of relu"),
    (["backbone=llama", "backbone.num_heads=7"], "backbone.num_heads=7: a multiple of backbone.num_kv_heads (8) "
                                                  "that splits backbone.hidden_size (128) into an even head size (RoPE)"),
    (["backbone=llama", "backbone.num_kv_heads=3"], "backbone.num_heads=8: a multiple of backbone.num_kv_heads (3) "
                                                     "that splits backbone.hidden_size (128) into an even head size (RoPE)"),
    (["backbone=llama", "backbone.hidden_size=120", "backbone.num_kv_heads=4"],  # head size 15: RoPE's shapes fail
     "backbone.num_heads=8: a multiple of backbone.num_kv_heads (4) that splits backbone.hidden_size (120) into an "
     "even head size (RoPE)"),
    (["callbacks.checkpoints._target_=genrec.Checkpoints"],
     "callbacks=[checkpoints,early_stopping,validate_last_epoch,epoch_log]: one of them "
     "genrec.callbacks.Checkpoints (conf/callbacks/checkpoints.yaml: best.ckpt, last.ckpt), e.g. callbacks=[default,...]"),
]


@pytest.mark.parametrize("overrides,line", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_value_is_named_with_what_is_allowed(overrides, line):
    assert errors(cfg(*overrides))[0] == line


GROUPS = {g: sorted(p.stem for p in (CONF / g).glob("*.yaml")) for g in ("backbone", "objective", "eval", "dataset",
                                                                        "logger", "tokenizer", "embedder", "trainer")}


def test_every_shipped_config_passes_and_every_checked_key_exists():
    seen = set()
    configs = [cfg(name="evaluate"), cfg("callbacks=[default,lr_monitor,ema,late_dropout]"), *(cfg(f"experiment={p.stem}") for p in (CONF / "experiment").glob("*.yaml"))]
    configs += [cfg(f"{group}={choice}", "init_from=x" if choice == "sdpo" else "seed=42")
                for group, choices in GROUPS.items() for choice in choices]
    for c in configs:
        assert errors(c) == [], errors(c)
        seen |= {k for k in CHECKS if OmegaConf.select(c, k, default="<absent>", throw_on_resolution_failure=False)
                 != "<absent>"}
    assert set(CHECKS) == seen  # no stale key in the table


@pytest.mark.parametrize("overrides", [
    ["experiment=apao_release", "objective=apao_pointwise"],  # the release's 8 micro-batches
    ["experiment=apao_release_cpu", "objective=apao_pointwise"],  # the same 8: 2 accumulated x 2 processes x 2 chunks
    ["experiment=apao_release", "trainer=ddp", "trainer.accumulate=4", "objective=apao_pointwise"],  # 4 x 2 GPUs
    ["experiment=apao_release_cpu", "objective=ce"],  # no state: any split of the step's examples
    ["experiment=apao_release_cpu", "objective=apao_pointwise", "objective.weights=released"],  # per batch, stateless
    ["experiment=apao_release_cpu", "objective=apao_pointwise", "objective.eta=0"],  # weights never move
    ["experiment=apao_release_cpu", "objective=apao_pointwise", "protocol.micro_batches=null"],  # not as the release
    ["experiment=office_cpu", "objective=apao_pointwise"],  # the release's 8 as apao_release_cpu takes them
    ["experiment=tiny", "objective=apao_pointwise"],  # no recipe to hold it to
])
def test_apao_state_per_micro_batch_is_held_only_to_a_recipe_that_counts_them(overrides):
    assert errors(cfg(*overrides)) == []


def _cli(tmp_path: Path, module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args, f"data_dir={tmp_path}/data"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("module,args,line", [
    ("genrec.train", ["experiment=tiny", "trainer.batch_size=abc"], "error: trainer.batch_size=abc: an integer >= 1"),
    ("genrec.train", ["experiment=tiny", "eval.beam=0"], "error: eval.beam=0: an integer >= 1"),
    ("genrec.train", ["experiment=tiny", "+trainer.lightning.max_tme=1"],
     "error: trainer.lightning.max_tme: not an argument of lightning.pytorch.Trainer (did you mean max_time?)"),
    ("genrec.train", ["experiment=tiny", "+objective.betta=0.3"],  # before the data stage, not a TypeError after
     "error: objective.betta: not an argument of genrec.objectives.ce.CE"),
    ("genrec.train", ["-m", "experiment=tiny", "+dataset.reader.foo=1"],
     "error: dataset.reader.foo: not an argument of genrec.data.readers.synthetic.read"),
    # a `hydra/` group: a typo, or a plugin of the cluster extra that is not installed
    pytest.param("genrec.train", ["-m", "hydra/launcher=slrum", "experiment=tiny"],
                 "error: hydra/launcher=slrum: not an option of hydra/launcher (did you mean slurm?): basic, slurm",
                 marks=pytest.mark.skipif(installed("hydra_submitit_launcher"), reason="its options are listed too")),
    pytest.param("genrec.train", ["-m", "hydra/launcher=slurm", "experiment=tiny"],
                 "error: hydra/launcher=slurm: hydra/launcher/submitit_slurm is a Hydra plugin that is not "
                 "installed: pip install \".[cluster]\"",
                 marks=pytest.mark.skipif(installed("hydra_submitit_launcher"), reason="the plugin is installed")),
    # what Lightning's Trainer refuses on this machine: found before the data stage, not after it
    ("genrec.train", ["experiment=tiny", "trainer.devices=0"],
     "error: trainer.devices=0: `Trainer(devices=0)` value is not a valid input using cpu accelerator."),
    ("genrec.train", ["experiment=tiny", "trainer.strategy=dpp"],
     "error: trainer.strategy=dpp: You selected an invalid strategy name: `strategy='dpp'`. It must be either a "
     "string or an instance of `lightning.pytorch.strategies.Strategy`. Example choices: auto, ddp, ddp_spawn, "
     "deepspeed, ... Find a complete list of options in our documentation at https://lightning.ai"),
    pytest.param("genrec.train", ["experiment=tiny", "trainer.accelerator=gpu"],
                 "error: trainer.accelerator=gpu: No supported gpu backend found!",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU machine accepts it")),
    pytest.param("genrec.evaluate", ["ckpt=nowhere", "accelerator=gpu"],
                 "error: accelerator=gpu: No supported gpu backend found!",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU machine accepts it")),
    ("genrec.prepare", ["experiment=tiny", "dataset.kcore=0"], "error: dataset.kcore=0: an integer >= 1"),
    ("genrec.evaluate", ["ckpt=nowhere", "eval.beam=0"], "error: eval.beam=0: an integer >= 1"),
    ("genrec.evaluate", ["ckpt=nowhere", "split=valid"], "error: split=valid: one of test, val"),  # as genrec.report
    # bad input found before any work: a missing run, a missing data file (no run dir left either)
    ("genrec.evaluate", ["ckpt=nowhere"], f"error: ckpt=nowhere: checkpoint {ROOT}/nowhere does not exist"),
    # an override that does not compose (Hydra's own message: 5-15 lines, exit 1), also in a sweep and in every tool
    ("genrec.train", ["experiment=tiny", "eval.bem=5"],
     "error: eval.bem=5: no key eval.bem (did you mean eval.beam?); +eval.bem=5 adds one"),
    ("genrec.train", ["-m", "experiment=tiny", "objective=ce,apoa"],
     "error: objective=apoa: not an option of objective (did you mean apao?): apao, apao_pairwise, apao_pointwise, "
     "bear, ce, msl, sdpo, sdpo_2stage, sdpo_bear_2stage"),
    ("genrec.train", ["experiment=tiny", "callbacks=[default,emaa]"],  # a list of options (Hydra: "Could not load")
     "error: callbacks=[default,emaa]: emaa is not an option of callbacks (did you mean ema?): checkpoints, default, "
     "early_stopping, ema, epoch_log, late_dropout, lr_monitor, validate_last_epoch"),
    ("genrec.train", ["-m", "experiment=tiny", "eval.beam=5,6", "objective.beta=0.1"],
     "error: objective.beta=0.1: no key objective.beta (objective has _target_, temperature, end_token); "
     "+objective.beta=0.1 adds one"),
    ("genrec.prepare", ["experiment=tiny", "eval.beam=5,2"],
     "error: Ambiguous value for argument 'eval.beam=5,2' 1. To use it as a list, use key=[value1,value2] 2. To use "
     "it as string, quote the value: key='value1,value2' 3. To sweep over it, add --multirun to your command line"),
    ("genrec.evaluate", ["ckpt=nowhere", "splt=val"], "error: splt=val: no key splt (did you mean split?); +splt=val "
                                                        "adds one"),
    ("genrec.report", ["metric=[recall@10]"], "error: metric=[recall@10]: no key metric (did you mean metrics?); "
                                               "+metric=[recall@10] adds one"),
    # a sweep stops before its first job: job 0 is fine, job 1 is not
    ("genrec.train", ["-m", "experiment=tiny", "eval.beam=5,2"],
     "error: eval.ks=[1, 5]: a non-empty list of integers from 1 to eval.beam (2)"),
])
def test_cli_prints_one_line_and_does_no_work(tmp_path, module, args, line):
    out = _cli(tmp_path, module, *args, f"hydra.run.dir={tmp_path}/run",
               f"hydra.sweep.dir={tmp_path}/sweep")
    assert out.returncode == 2
    assert out.stderr == line + "\n"
    assert not (tmp_path / "data").exists()  # no data-stage work
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "run" / "checkpoints").exists()
    assert not (tmp_path / "run").exists()  # no run dir left for a report to list as running, then failed


def test_an_evaluate_grid_with_one_bad_ckpt_runs_no_job(tmp_path):
    """`genrec.evaluate -m ckpt=<a run>,<nowhere>`: job 0's run exists (a run dir with config.yaml and a checkpoint
    file), job 1's does not: one line, exit 2, and job 0 never starts (no sweep dir, no evaluation written)."""
    run = tmp_path / "run0"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("seed: 1\n")
    (run / "checkpoints" / "best.ckpt").write_bytes(b"")
    out = _cli(tmp_path, "genrec.evaluate", "-m", f"ckpt={run},{tmp_path}/nowhere", f"hydra.sweep.dir={tmp_path}/sweep")
    assert (out.returncode, out.stderr) == (2, f"error: ckpt={tmp_path}/nowhere: checkpoint {tmp_path}/nowhere does "
                                               "not exist\n")
    assert not (tmp_path / "sweep").exists() and not (run / "eval").exists()
    out = _cli(tmp_path, "genrec.evaluate", "-m", "split=val,test", f"hydra.sweep.dir={tmp_path}/sweep")
    assert (out.returncode, out.stderr[:20]) == (2, "error: ckpt: missing")  # no ckpt at all: not job 0's refusal
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("args,line", [
    # tokenizer=rqkmeans: experiment=tiny's tokenizer.levels are no argument of the release's precomputed IDs
    (["dataset=apao_office", "tokenizer=rqkmeans", "dataset.root=nowhere"],
     "error: missing data file nowhere/Office.inter.json (nor Office."
     "inter.json.gz); set dataset.root or run `python -m genrec.download dataset=<name>`"),
    (["init_from=nowhere"], "error: init_from=nowhere: checkpoint nowhere does not exist"),
    (["resume=nowhere"], "error: resume=nowhere: no checkpoints/last.ckpt under nowhere"),
])
def test_train_on_missing_input_is_one_line_and_leaves_no_run_dir(tmp_path, args, line):
    """genrec.train as genrec.prepare: a missing data file / start run / resume dir found before any training leaves
    no run dir (a report would list it as a failed run), only the line."""
    out = _cli(tmp_path, "genrec.train", "experiment=tiny", *args, f"hydra.run.dir={tmp_path}/run")
    assert (out.returncode, out.stderr) == (2, line + "\n")
    assert not (tmp_path / "run").exists()


def test_a_missing_data_file_is_one_line_and_leaves_no_run_dir(tmp_path):
    out = _cli(tmp_path, "genrec.prepare", "dataset=apao_office", "dataset.root=nowhere", f"hydra.run.dir={tmp_path}/run")
    assert (out.returncode, out.stderr) == (2, "error: missing data file nowhere/Office.inter.json (nor Office.inter."
                                               "json.gz); set dataset.root or run `python -m genrec.download dataset=<name>`\n")
    assert not (tmp_path / "run").exists()
    assert all(p.suffix == ".lock" for p in (tmp_path / "data").rglob("*") if p.is_file())  # no artefact


@pytest.mark.parametrize("overrides", [
    ["objective=bear", "objective.widths=[]"],  # as null: BEAR's own width
    ["trainer.deterministic=warn"], ["trainer=gpu"], ["resume=null"], ["resume=outputs/x"],
    ["trainer.lightning.enable_model_summary=null"],  # Lightning's own keys: Lightning's types
    ["backbone=llama", "backbone.hidden_size=96", "backbone.num_heads=6", "backbone.num_kv_heads=2"],
])
def test_values_the_code_accepts_pass(overrides):
    assert errors(cfg(*overrides)) == []


REPORT_BAD = [
    (["split=valid"], "split=valid: one of test, val (metrics.json's test or best-epoch validation metrics)"),
    (["metrics=[recal@10]"], "metrics=[recal@10]: a non-empty list of recall@k, ndcg@k, full/recall@k, full/ndcg@k, "
                             "prefix_recall@m, pruning_rate@k, loss, objective_loss, last_batch_loss@B, users"),
    (["metrics=recall@10"], "metrics=recall@10: a non-empty list of recall@k, ndcg@k, full/recall@k, full/ndcg@k, "
                            "prefix_recall@m, pruning_rate@k, loss, objective_loss, last_batch_loss@B, users"),
    (["select=val/ndgc@10"], "select=val/ndgc@10: a logged validation key, e.g. val/ndcg@10, or null"),
    (["stale_minutes=abc"], "stale_minutes=abc: a number >= 0"),
    (["wandb=maybe"], "wandb=maybe: true or false"),
]


@pytest.mark.parametrize("overrides,line", REPORT_BAD, ids=[" ".join(o) for o, _ in REPORT_BAD])
def test_a_bad_report_value_is_named(overrides, line):
    assert errors(cfg(*overrides, name="report"), report=True)[0] == line
    good = cfg("metrics=[recall@10,full/ndcg@20,pruning_rate@5,prefix_recall@2,loss,users]", "split=val",
               "select=val/recall@20", name="report")
    assert errors(good, report=True) == []


def test_report_cli_refuses_a_bad_value_before_reading_runs(tmp_path):
    out = subprocess.run([sys.executable, "-m", "genrec.report", "runs=[docs/results/runs]", f"out={tmp_path}/r",
                          "split=valid"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert (out.returncode, out.stderr) == (2, "error: split=valid: one of test, val (metrics.json's test or "
                                               "best-epoch validation metrics)\n")
    assert not (tmp_path / "r").exists()  # no report dir left behind
    out = subprocess.run([sys.executable, "-m", "genrec.report", "runs=[nowhere]", f"out={tmp_path}/r"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert (out.returncode, out.stderr) == (2, "error: no run dirs (config.yaml) under nowhere\n")
    assert not (tmp_path / "r").exists()


def test_a_refused_report_into_the_working_folder_keeps_it(tmp_path):
    """`out=.` in an empty folder: the refusal removes Hydra's log there, never the folder the user works in."""
    out = subprocess.run([sys.executable, "-m", "genrec.report", "out=.", "split=valid"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2 and tmp_path.is_dir()


def test_a_refused_command_in_a_fresh_folder_leaves_it_empty(tmp_path):
    """At Hydra's default run dir (outputs/eval/<time>/ under the working folder) a refusal leaves no empty outputs/
    folders behind either; folders that held something before stay."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "genrec.evaluate", "ckpt=nowhere"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 2 and list(tmp_path.iterdir()) == []
    (tmp_path / "outputs" / "keep").mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "genrec.evaluate", "ckpt=nowhere"], cwd=tmp_path, timeout=300, env=env)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["outputs", "outputs/keep"]


def test_a_refused_command_keeps_a_run_dir_that_holds_a_run(tmp_path):
    """A bad override on an existing run's dir (e.g. a resume) removes nothing of it."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.json").write_text("{}")
    out = _cli(tmp_path, "genrec.train", "experiment=tiny", "eval.beam=0", f"hydra.run.dir={run}")
    assert out.returncode == 2 and (run / "metrics.json").exists() and (run / "checkpoints").is_dir()


def test_config_check_cli_gives_one_verdict_per_command_line(tmp_path):
    """`python -m genrec.config_check a -- b -- c`: one line each, in order; exit 2 if any is bad; hydra.* ignored."""
    out = _cli(tmp_path, "genrec.config_check", "experiment=office_cpu", "objective=apao_pointwise", "hydra.run.dir=x",
               "--", "experiment=apao_release", "trainer=ddp", "objective=apao_pointwise", "--", "objective=nope", "--",
               "experiment=tiny", "eval.beam=0")
    lines = out.stdout.splitlines()
    assert out.returncode == 2 and len(lines) == 4 and lines[0] == "ok", out.stderr
    assert lines[1].startswith("error: trainer.accumulate=8: APAO sets its prefix weights")
    assert lines[2] == ("error: objective=nope: not an option of objective: apao, apao_pairwise, apao_pointwise, bear, "
                        "ce, msl, sdpo, sdpo_2stage, sdpo_bear_2stage")  # as the command line itself says it
    assert lines[3] == "error: eval.beam=0: an integer >= 1"  # (_cli's data_dir= joins the last command line)
    ok = _cli(tmp_path, "genrec.config_check", "experiment=office_cpu", "--", "trainer=gpu")
    assert (ok.returncode, ok.stdout) == (0, "ok\nok\n")  # a GPU command line checks on a CPU machine too


def test_config_check_help_says_how_to_use_it():
    """`--help` was read as an override (error: LexerNoViableAltException: --help)."""
    out = subprocess.run([sys.executable, "-m", "genrec.config_check", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and "python -m genrec.config_check <overrides> [-- <overrides> ...]" in out.stdout


@pytest.mark.parametrize("args", [
    ["+objective.betta=0.3"], ["hydra/launcher=slrum"],
    pytest.param(["hydra/sweeper=optuna"], marks=pytest.mark.skipif(installed("hydra_optuna_sweeper"),
                                                                     reason="the plugin is installed")),
])
def test_config_check_cli_and_train_say_the_same_line(tmp_path, args):
    """genrec.config_check's verdict is the line genrec.train stops with (exit 2, no run dir)."""
    verdict = _cli(tmp_path, "genrec.config_check", "experiment=tiny", *args)
    train = _cli(tmp_path, "genrec.train", "experiment=tiny", *args, f"hydra.run.dir={tmp_path}/run")
    assert verdict.returncode == train.returncode == 2
    assert verdict.stdout == train.stderr and verdict.stdout.startswith("error: ") and verdict.stdout.count("\n") == 1
    assert not (tmp_path / "run").exists() and not (tmp_path / "data").exists()


@pytest.mark.parametrize("overrides,line", [
    (["trainer.lightning.devices=0"],  # set on trainer.lightning itself: named there
     "trainer.lightning.devices=0: `Trainer(devices=0)` value is not a valid input using cpu accelerator."),
    (["trainer=ddp", "trainer.accelerator=cpu", "trainer.precision=bf16-mix"],  # devices=2: "2" is in '32-true' too
     "trainer.precision=bf16-mix: Precision 'bf16-mix' is invalid."),
    (["trainer.accelerator=cpu", "trainer.devices=[0,1]"],  # "cpu" is in the message, devices is wrong
     "trainer.devices=[0, 1]: `devices` selected with `CPUAccelerator` should be an int > 0."),
])
def test_a_refused_trainer_argument_is_named_by_its_own_key(overrides, line):
    assert trainer_errors(cfg(*overrides))[0].startswith(line)
    assert errors(cfg(*overrides)) == []  # the machine-independent check passes it (the CLI's verdict: ok)
