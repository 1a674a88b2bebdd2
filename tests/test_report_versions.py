"""Runs of one experiment made by different genrec versions are one variant of its row: a config written
before keys were added (tests/data/legacy_run: office_cpu TIGER-CE as genrec wrote it at 9f5772e, before
`trainer.length_window`, `trainer.lightning`, `callbacks`, `backbone.memory` and the move of the tokenizers
to genrec.sid) is completed with today's defaults for its command line (overrides.yaml)."""

import json
import shutil
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from genrec.report.load import load_runs, objective_row
from genrec.report.select import group
from genrec.runs import config_changes

ROOT = Path(__file__).parents[1]
LEGACY = Path(__file__).parent / "data" / "legacy_run"


def todays_run(path: Path, *extra: str) -> Path:
    """A run dir as today's genrec.train writes it for the legacy run's command line (+ extra overrides)."""
    overrides = yaml.safe_load((LEGACY / "overrides.yaml").read_text()) + list(extra)
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    cfg.run_dir = str(path)
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (path / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    metrics = json.loads((LEGACY / "metrics.json").read_text())
    (path / "metrics.json").write_text(json.dumps({**metrics, "seed": cfg.seed}))
    return path


# office_cpu as it was at 9f5772e, on today's command line: the preset has changed since
OFFICE_CPU_V1 = ("trainer.val_users=1000", "trainer.check_val_every_n_epoch=2", "trainer.accumulate=1",
                 "trainer.gradient_clip=1.0", "trainer.max_epochs=28", "optim.lr=1e-3", "optim.warmup=0.02",
                 "optim.cooldown=1.0")


def test_an_older_versions_run_joins_todays_runs_of_its_experiment(tmp_path):
    shutil.copytree(LEGACY, tmp_path / "legacy")
    runs = load_runs([tmp_path / "legacy", todays_run(tmp_path / "s43", "seed=43", *OFFICE_CPU_V1)])
    assert [r.seed for r in runs] == [42, 43]
    assert runs[0].key == runs[1].key
    (variant,) = group(runs)[("apao_office", "tiger", "CE")]
    assert [r.seed for r in variant.runs] == [42, 43]
    assert runs[0].cfg["tokenizer"]["_target_"] == "genrec.sid.tokenizers.Precomputed"  # moved since


def test_a_key_added_since_still_separates_a_changed_experiment(tmp_path):
    """The legacy run predates trainer.length_window (it batched as today's default, 50): a run with
    length_window=1 is another experiment; so is one that changes a key the legacy run has."""
    shutil.copytree(LEGACY, tmp_path / "legacy")
    runs = load_runs([tmp_path / "legacy", todays_run(tmp_path / "lw1", "seed=43", *OFFICE_CPU_V1, "trainer.length_window=1"),
                      todays_run(tmp_path / "lr", "seed=43", *OFFICE_CPU_V1, "optim.lr=5e-4")])
    assert len({r.key for r in runs}) == 3


def test_a_key_added_since_with_a_preset_value_keeps_the_old_behaviour(tmp_path):
    """optim.cooldown came after the legacy run, and today's office_cpu sets it to 0.2; the legacy run ran a
    plain cosine (1.0). Filling the key from today's preset would merge it into a schedule it never ran."""
    shutil.copytree(LEGACY, tmp_path / "legacy")
    legacy, today = load_runs([tmp_path / "legacy", todays_run(tmp_path / "s43", "seed=43", *OFFICE_CPU_V1[:-1])])
    assert legacy.cfg["optim"]["cooldown"] == 1.0 and today.cfg["optim"]["cooldown"] == 0.2
    assert legacy.key != today.key


def test_without_its_command_line_an_older_run_stays_apart(tmp_path):
    shutil.copytree(LEGACY, tmp_path / "legacy")
    (tmp_path / "legacy" / "overrides.yaml").unlink()
    runs = load_runs([tmp_path / "legacy", todays_run(tmp_path / "s43", "seed=43")])
    assert runs[0].key != runs[1].key  # nothing says which defaults it ran with: not merged on a guess
    assert runs[0].cfg["optim"]["cooldown"] == 1.0  # a key added since is known without it (genrec.runs.ADDED)


def written_before(path: Path, as_before) -> Path:
    """Today's run dir `path` with its config.yaml as written before a preset change (`as_before` edits it in place)."""
    cfg = yaml.safe_load((path / "config.yaml").read_text())
    as_before(cfg)
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    return path


def before_and_today(tmp_path: Path, as_before) -> tuple[dict, dict]:
    """CE and APAO-pointwise under today's office_cpu, each also as written before a preset change (`as_before`
    edits a config in place): each run's report key, and what resuming the "before" run today would change."""
    keys, changes = {}, {}
    for objective in ("ce", "apao_pointwise"):
        for when in ("before", "today"):
            path = todays_run(tmp_path / f"{objective}-{when}", f"objective={objective}")
            if when == "before":
                written_before(path, as_before)
                with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
                    today = compose("config", overrides=yaml.safe_load((path / "overrides.yaml").read_text()))
                today.run_dir = str(path)
                changes[objective] = config_changes(path / "config.yaml", today)
            keys[objective, when] = load_runs([path])[0].key
    return keys, changes


def test_the_releases_micro_batch_count_separates_only_the_objectives_it_changes(tmp_path):
    """office_cpu counts the release's 8 micro-batches per step since 2026-12-05 (protocol.micro_batches): APAO's
    prefix weights come from each of them, so an APAO run from before is another experiment and resumes only as it
    ran; CE computes the same either way, so its runs from before join today's and resume."""
    keys, changes = before_and_today(tmp_path, lambda cfg: cfg["protocol"].pop("micro_batches"))
    assert keys["ce", "before"] == keys["ce", "today"] and changes["ce"] == []
    assert keys["apao_pointwise", "before"] != keys["apao_pointwise", "today"]
    assert changes["apao_pointwise"] == ["protocol.micro_batches: None -> 8"]


def with_paper_weights(cfg: dict) -> None:
    """A config as office_cpu wrote it before it asked for the release's prefix weights."""
    del cfg["protocol"]["prefix_weights"]
    if "weights" in cfg["objective"]:
        cfg["objective"]["weights"] = "paper"


def test_the_releases_prefix_weights_separate_only_apao(tmp_path):
    """office_cpu runs APAO's prefix weights as the release's code computes them since 2026-12-05
    (protocol.prefix_weights: released, where objective.weights reads it): an APAO run from before (paper
    weights) is another experiment and resumes only as it ran; a CE run from before joins today's CE."""
    keys, changes = before_and_today(tmp_path, with_paper_weights)
    assert keys["ce", "before"] == keys["ce", "today"] and changes["ce"] == []
    assert keys["apao_pointwise", "before"] != keys["apao_pointwise", "today"]
    assert changes["apao_pointwise"] == ["objective.weights: 'paper' -> 'released'"]


def test_apao_rows_are_named_against_the_weights_their_preset_asks_for(tmp_path):
    """office_cpu asks for the release's prefix weights: its APAO runs with them are the plain row, and a run with
    the paper's weights is its own row (an ablation, not a variant chosen on validation), also one written before
    the preset asked (its key is completed from today's preset); without a preset asking, paper is the plain row."""
    released = todays_run(tmp_path / "released", "objective=apao_pointwise")
    paper = todays_run(tmp_path / "paper", "objective=apao_pointwise", "objective.weights=paper")
    old = written_before(todays_run(tmp_path / "old", "objective=apao_pointwise"), with_paper_weights)
    assert [r.label for r in load_runs([released, paper, old])] == [
        "APAO-pointwise", "APAO-pointwise (weights=paper)", "APAO-pointwise (weights=paper)"]
    assert objective_row({"_target_": "genrec.objectives.apao.APAO", "loss": "pointwise", "weights": "paper"})[1] \
        == "APAO-pointwise"
