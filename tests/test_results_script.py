"""scripts/results_office.sh's orchestration (rows in two waves, skipping, LIMIT, failures), with
tests/fake_genrec.py standing in for genrec: a copy of the script runs in a scratch tree."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def script(tmp_path: Path, *rows: str, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    (tmp_path / "scripts").mkdir(exist_ok=True)
    shutil.copy(ROOT / "scripts" / "results_office.sh", tmp_path / "scripts")
    calls = tmp_path / "calls.jsonl"
    calls.unlink(missing_ok=True)
    env = {**os.environ, "PY": f"{sys.executable} {ROOT / 'tests' / 'fake_genrec.py'}", "DATA": "/data",
           "FAKE_CALLS": str(calls), **env}
    out = subprocess.run(["bash", "scripts/results_office.sh", *rows], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    return out, [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def trained(calls: list[list[str]]) -> list[str]:
    return [Path(next(a for a in c if a.startswith("hydra.run.dir="))).name for c in calls if c[0] == "genrec.train"]


def test_a_row_that_starts_from_another_trains_after_it_and_done_rows_are_skipped(tmp_path):
    out, calls = script(tmp_path, "tiger-apao_pairwise-s44", "tiger-ce-s44", "tiger-msl-s42", JOBS="2")
    assert out.returncode == 0, out.stderr
    assert sorted(trained(calls)[:2]) == ["tiger-ce-s44", "tiger-msl-s42"] and trained(calls)[2] == "tiger-apao_pairwise-s44"
    pairwise = next(c for c in calls if "objective=apao_pairwise" in c)
    assert "init_from=outputs/results_office/office_cpu/tiger-ce-s44" in pairwise
    assert "experiment=office_cpu" in pairwise
    others = {"tiger-ce-s44": ["masked-t1"], "tiger-msl-s42": ["full-t1", "masked-t1"],  # besides its own scoring
              "tiger-apao_pairwise-s44": ["masked-t1"]}
    for row, scorings in others.items():
        d = tmp_path / "docs" / "results" / "runs" / "office_cpu" / row
        assert {p.name for p in d.iterdir()} == {"metrics.json", "config.yaml", "overrides.yaml", "test_ranks.csv", "eval"}
        assert {p.name for p in (d / "eval").iterdir()} == {f"test-beam20{s}-full.{x}" for s in ["", *(f"-{s}" for s in
                                                            scorings)] for x in ("json", "ranks.csv")}, row
    assert [c[0] for c in calls].count("genrec.report") == 1

    out, calls = script(tmp_path, "tiger-apao_pairwise-s44", "tiger-ce-s44", "tiger-msl-s42")
    assert out.returncode == 0 and [c[0] for c in calls] == ["genrec.report"] and out.stdout.count("skip ") == 3  # done: not even checked


def test_a_row_keeps_the_command_of_its_first_start(tmp_path):
    """A resumed row's docs copy reruns what it ran: genrec's overrides.yaml, not Hydra's of the last start."""
    run = tmp_path / "outputs" / "results_office" / "office_cpu" / "tiger-ce-s42"
    run.mkdir(parents=True)
    (run / "overrides.yaml").write_text("- experiment=office_cpu\n- seed=42\n")
    out, calls = script(tmp_path, "tiger-ce-s42", FULL_RANK="0")
    assert out.returncode == 0 and trained(calls) == ["tiger-ce-s42"], out.stderr
    docs = tmp_path / "docs" / "results" / "runs" / "office_cpu" / "tiger-ce-s42" / "overrides.yaml"
    assert docs.read_text() == "- experiment=office_cpu\n- seed=42\n" != (run / ".hydra" / "overrides.yaml").read_text()


def test_limit_stops_a_row_for_the_next_call_and_its_dependants_wait(tmp_path):
    out, calls = script(tmp_path, "tiger-ce-s44", "tiger-sdpo-s44", LIMIT="1", FAKE_SLOW="5", FULL_RANK="0")
    assert out.returncode == 0, out.stderr
    assert "tiger-ce-s44: stopped after 1s, resumes next call" in out.stdout
    assert "tiger-sdpo-s44: waits for tiger-ce-s44 (not finished)" in out.stdout
    assert trained(calls) == ["tiger-ce-s44"] and not (tmp_path / "docs").exists()


def test_a_row_whose_start_is_committed_but_not_on_this_machine_is_refused_before_any_run(tmp_path):
    """CE s44's summary is in docs (so it is never retrained), but its run dir, the checkpoint S-DPO starts
    from, is gone (a new machine): the dependant would wait forever, so the call stops at once and says how."""
    done = tmp_path / "docs" / "results" / "runs" / "office_cpu" / "tiger-ce-s44"
    done.mkdir(parents=True)
    (done / "metrics.json").write_text("{}")
    out, calls = script(tmp_path, "tiger-ce-s42", "tiger-sdpo-s44", FULL_RANK="0")
    assert out.returncode == 2 and trained(calls) == [], out.stderr
    line, = out.stderr.strip().splitlines()
    assert line.startswith("error: tiger-sdpo-s44 starts from tiger-ce-s44's run, and "
                           "outputs/results_office/office_cpu/tiger-ce-s44 has no finished run here")
    assert "genrec.train dataset=apao_office" in line and "hydra.run.dir=outputs/results_office/office_cpu/tiger-ce-s44" in line
    run = tmp_path / "outputs" / "results_office" / "office_cpu" / "tiger-ce-s44"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text("{}")  # retrained there: S-DPO now runs
    out, calls = script(tmp_path, "tiger-sdpo-s44", FULL_RANK="0")
    assert out.returncode == 0 and trained(calls) == ["tiger-sdpo-s44"], out.stderr


def test_a_failed_row_fails_the_call_after_the_others_finish(tmp_path):
    out, calls = script(tmp_path, "tiger-ce-s42", "tiger-msl-s42", RECIPE="apao_release", FAKE_FAIL="tiger-ce-s42")
    assert out.returncode == 1 and "1 row(s) failed" in out.stderr
    assert (tmp_path / "docs" / "results" / "runs" / "apao_release" / "tiger-msl-s42" / "metrics.json").exists()
    assert "experiment=apao_release" in next(c for c in calls if c[0] == "genrec.train")
    out, _ = script(tmp_path, "nope")
    assert out.returncode == 2 and "unknown row nope" in out.stderr


def test_the_readme_copy_of_the_table_is_replaced_between_its_markers(tmp_path):
    readme = "# x\nabove\n<!-- office-table -->\nold table\n<!-- /office-table -->\nbelow\n"
    (tmp_path / "README.md").write_text(readme)
    out, _ = script(tmp_path, "tiger-ce-s42", FULL_RANK="0")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "README.md").read_text() == readme.replace("old table", "| rows | 1 |")
    out, _ = script(tmp_path, "tiger-msl-s42", FULL_RANK="0")
    assert (tmp_path / "README.md").read_text() == readme.replace("old table", "| rows | 2 |")


def test_a_row_the_config_check_refuses_stops_every_row_before_any_run_and_page_0_skips_the_page(tmp_path):
    # the release recipe's 8 accumulated micro-batches on each of 2 GPUs: 16 steps of APAO's weights, not 8
    out, calls = script(tmp_path, "tiger-ce-s42", "tiger-apao_pointwise-s42", RECIPE="apao_release",
                        EXTRA="trainer=ddp")
    assert out.returncode == 2 and trained(calls) == [], out.stderr
    assert out.stderr.strip().startswith("error: tiger-apao_pointwise-s42: trainer.accumulate=8: APAO sets its "
                                         "prefix weights (objective.weights=released) once per micro-batch")
    assert [c[0] for c in calls] == ["genrec.config_check"]  # one check of both rows, before any run
    out, calls = script(tmp_path, "tiger-ce-s42", RECIPE="apao_release_cpu", PAGE="0", FULL_RANK="0")
    assert out.returncode == 0 and trained(calls) == ["tiger-ce-s42"], out.stderr
    train = next(c for c in calls if c[0] == "genrec.train")
    assert "experiment=apao_release_cpu" in train and "genrec.report" not in [c[0] for c in calls]
    assert (tmp_path / "docs" / "results" / "runs" / "apao_release_cpu" / "tiger-ce-s42" / "metrics.json").exists()


def test_list_says_which_rows_are_done_and_which_the_config_check_refuses(tmp_path):
    done = tmp_path / "docs" / "results" / "runs" / "apao_release_cpu" / "tiger-ce-s42"
    done.mkdir(parents=True)
    (done / "metrics.json").write_text("{}")
    out, calls = script(tmp_path, "--list", RECIPE="apao_release_cpu", EXTRA="trainer.batch_size=255")
    state = {line.split()[0]: line.split()[1] for line in out.stdout.splitlines()}
    assert out.returncode == 0 and state["tiger-ce-s42"] == "done" and state["tiger-msl-s42"] == "-"
    assert state["tiger-apao_pointwise-s42"] == state["llama-apao_pointwise-s43"] == "no"
    assert "no    error: trainer.batch_size=255: APAO sets" in out.stdout
    assert [c[0] for c in calls] == ["genrec.config_check"]  # one process for every row not done
    assert "objective=ce" not in calls[0][:calls[0].index("--")]  # the done CE s42 row is not checked


def test_a_bad_scoring_is_refused_before_any_row_trains(tmp_path):
    out, calls = script(tmp_path, "tiger-ce-s43", SCORINGS="full:1 masked")
    assert out.returncode == 2 and calls == [], out.stderr
    assert out.stderr.strip() == "error: SCORINGS=full:1 masked: 'masked' is not <full|masked>:<temperature>, e.g. masked:1"
