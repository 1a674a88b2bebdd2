"""genrec.evaluate's result files: one per setting that changes the metrics, the defaults under their old names;
a missing `ckpt` is one line before any work."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from genrec.evaluate import evaluate
from genrec.train import run

ROOT = Path(__file__).parents[1]
CONF = str(ROOT / "conf")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A one-epoch tiny run (eval: beam 5, ks [1, 5], full scoring at temperature 1)."""
    d = tmp_path_factory.mktemp("evaluate")
    with initialize_config_dir(CONF, version_base="1.3"):
        cfg = compose("config", overrides=["experiment=tiny", "trainer.max_epochs=1", f"run_dir={d}/run",
                                           f"data_dir={d}/data"])
    run(cfg)
    return d / "run"


def evaluate_run(run_dir: Path, *overrides: str) -> dict:
    with initialize_config_dir(CONF, version_base="1.3"):
        return evaluate(compose("evaluate", overrides=[f"ckpt={run_dir}", f"data_dir={run_dir.parent}/data",
                                                       *overrides]))


def saved(run_dir: Path, name: str) -> set[str]:
    return {k for k in json.loads((run_dir / "eval" / name).read_text()) if k.startswith("test/recall@")}


def test_other_ks_get_their_own_file_and_the_run_s_own_keep_the_default_name(tiny_run):
    """`eval.ks=[1]` after the run's own ks does not overwrite eval/test-beam5.json; the run's ks in another order
    are the run's own (the same metrics, the same file); ks and scoring are both named, before `-full`."""
    evaluate_run(tiny_run)
    evaluate_run(tiny_run, "eval.ks=[1]")
    evaluate_run(tiny_run, "eval.ks=[5,1]")
    evaluate_run(tiny_run, "eval.ks=[5]", "eval.score=masked", "eval.temperature=2", "eval.full_rank=true")
    assert sorted(p.name for p in (tiny_run / "eval").glob("*.json")) == [
        "test-beam5-k1.json", "test-beam5-k5-masked-t2-full.json", "test-beam5.json"]
    assert saved(tiny_run, "test-beam5.json") == {"test/recall@1", "test/recall@5"}
    assert saved(tiny_run, "test-beam5-k1.json") == {"test/recall@1"}
    assert (tiny_run / "eval" / "test-beam5-k1.ranks.csv").exists()


def test_temperatures_that_round_alike_get_their_own_files(tiny_run):
    """The temperature in the name is exact: 1.5 and 1.5000001 (both `1.5` at 6 digits) are two files."""
    evaluate_run(tiny_run, "split=val", "eval.temperature=1.5")
    evaluate_run(tiny_run, "split=val", "eval.temperature=1.5000001")
    assert sorted(p.name for p in (tiny_run / "eval").glob("val-*.json")) == [
        "val-beam5-full-t1.5.json", "val-beam5-full-t1.5000001.json"]


@pytest.mark.parametrize("args", [[], ["ckpt=null"], ["-m", "eval.beam=3,4"]], ids=["no-ckpt", "null", "sweep"])
def test_evaluate_without_ckpt_is_one_line_naming_what_to_pass(tmp_path, args):
    out = subprocess.run([sys.executable, "-m", "genrec.evaluate", *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.startswith("error: ckpt: ") and "ckpt=<run dir or .ckpt>" in out.stderr, out.stderr[-2000:]
    assert len(out.stderr.splitlines()) == 1
    if "-m" not in args:  # (a sweep: its first job refuses, after Hydra's `Launching 2 jobs` lines and sweep dir)
        assert out.stdout == "" and list(tmp_path.iterdir()) == []  # no run dir left
