"""One run per run dir: runs and sweeps started together get their own dirs, a dir in use or holding another run is
never written by a second start, a two-stage run killed in stage 1 resumes there, and neither a resume nor a
refused start leaves a stray dir for a report to list."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from run_helpers import reproducible

ROOT = Path(__file__).parents[1]
TINY = ["experiment=tiny", "trainer.limit_train_batches=6"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def start(cwd: Path, *args: str, kill: tuple[str, int] | None = None, same_second: bool = False
          ) -> subprocess.Popen:
    """`python -m genrec.train` in `cwd` (tests/killpoint.py: killed at a point; tests/same_second.py: Hydra's clock
    pinned to one second), sharing one data cache."""
    entry = ([str(ROOT / "tests" / "killpoint.py"), kill[0], str(kill[1])] if kill
             else [str(ROOT / "tests" / "same_second.py")] if same_second else ["-m", "genrec.train"])
    flags = [a for a in args if a.startswith("-")]  # before the overrides, as Hydra's parser wants them
    overrides = [a for a in args if not a.startswith("-")]
    return subprocess.Popen([sys.executable, *entry, *flags, *TINY, f"data_dir={cwd.parent / 'data'}", *overrides],
                            cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def train(cwd: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return finish(start(cwd, *args, **kw))


def errors(out: subprocess.CompletedProcess) -> list[str]:
    return [line for line in out.stderr.splitlines() if line.startswith("error:")]


def dirs(root: Path) -> list[Path]:
    """Every folder under `root` that a report lists as a run (genrec.report.load: a config.yaml or Hydra's)."""
    return sorted(p.parent for p in root.rglob("config.yaml") if p.parent.name != ".hydra" and "stage1" not in p.parts
                  ) + sorted(p.parent.parent for p in root.rglob(".hydra/config.yaml")
                             if not (p.parent.parent / "config.yaml").exists())


def steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "logs" / "metrics.csv").read_text().splitlines()[1:]
    return [int(line.split(",")[1]) for line in lines]


def test_runs_and_sweeps_started_together_get_their_own_run_dirs(tmp_path):
    """Run dirs were named to the second: two runs started in one second trained into one dir (one metrics.json,
    the other run's gone, their CSV rows interleaved), and two sweeps into one multirun dir."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    train(cwd, "trainer.max_epochs=1", "hydra.run.dir=warm")  # the data stage, built once for all below
    procs = [start(cwd, f"seed={s}", "trainer.max_epochs=1", same_second=True) for s in (1, 2)]
    procs += [start(cwd, "-m", f"seed={s}", "trainer.max_epochs=1", same_second=True) for s in (3, 4)]
    outs = [finish(p) for p in procs]
    assert all(o.returncode == 0 for o in outs), [o.stderr[-2000:] for o in outs]
    runs = [d for d in dirs(cwd) if d.name != "warm"]
    assert sorted(json.loads((d / "metrics.json").read_text())["seed"] for d in runs) == [1, 2, 3, 4]
    assert len({d.parent for d in runs if "multirun" in d.parts}) == 2  # each sweep its own multirun dir
    for d in runs:
        assert steps(d) == sorted(set(steps(d))), f"{d}: rows of two runs in one CSV log"


def test_a_run_dir_in_use_or_holding_a_run_is_never_written_by_another_start(tmp_path):
    """A second start in a dir whose run is alive (a fresh run, or resume=true) stops with one line naming the
    holder, and writes nothing there; once the holder is dead, a fresh run is still refused (the dir holds a run)
    and resume=true continues it."""
    cwd, run = tmp_path / "work", tmp_path / "work" / "run"
    cwd.mkdir()
    holder = start(cwd, "trainer.max_epochs=30", "hydra.run.dir=run")
    deadline = time.time() + 300
    while not (run / "checkpoints" / "last.ckpt").exists():
        assert holder.poll() is None and time.time() < deadline, finish(holder).stderr[-3000:]
        time.sleep(0.2)
    os.kill(holder.pid, signal.SIGSTOP)  # alive, holding the dir, for as long as the two starts below take
    try:
        files = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and ".hydra" not in p.parts}
        for extra in ([], ["resume=true"]):
            out = train(cwd, "trainer.max_epochs=30", "hydra.run.dir=run", *extra)
            assert out.returncode == 2 and len(errors(out)) == 1, out.stderr[-3000:]
            assert "in use by another run" in errors(out)[0] and f"pid {holder.pid}" in errors(out)[0]
            assert "Traceback" not in out.stderr
            now = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and ".hydra" not in p.parts}
            assert now == files  # nothing written, nothing removed (no failed.json either)
    finally:
        holder.kill()
        holder.communicate()
    out = train(cwd, "trainer.max_epochs=30", "hydra.run.dir=run")
    assert out.returncode == 2 and len(errors(out)) == 1 and "holds another run" in errors(out)[0], out.stderr
    assert not (run / "failed.json").exists() and not (run / "metrics.json").exists()
    out = train(cwd, "trainer.max_epochs=30", "hydra.run.dir=run", "resume=true")
    assert out.returncode == 0 and "resume: continuing" in out.stdout, out.stderr[-3000:]
    assert json.loads((run / "metrics.json").read_text())["epochs"] == 30


def test_a_two_stage_run_killed_in_stage_1_resumes_there_and_leaves_no_other_dir(tmp_path):
    """resume=true looked for checkpoints/last.ckpt only: a two-stage run killed in stage 1 (which holds
    stage1/checkpoints/last.ckpt) started over in a new dir, the killed one orphaned."""
    two_stage = ["objective=sdpo_2stage", "trainer.max_epochs=2"]
    (tmp_path / "full").mkdir()
    (tmp_path / "work").mkdir()
    out = train(tmp_path / "full", *two_stage, "hydra.run.dir=run")
    assert out.returncode == 0, out.stderr[-3000:]
    out = train(tmp_path / "work", *two_stage, kill=("train", 8))  # stage 1, epoch 1 (6 steps an epoch)
    assert out.returncode == -9, out.stderr[-3000:]
    [killed] = dirs(tmp_path / "work")
    assert (killed / "stage1" / "checkpoints" / "last.ckpt").exists() and not (killed / "checkpoints").exists()
    out = train(tmp_path / "work", "trainer.max_epochs=2", f"resume={killed}")  # not a two-stage config
    assert out.returncode == 2 and "a two-stage run killed in stage 1" in errors(out)[0], out.stderr[-3000:]
    out = train(tmp_path / "work", *two_stage, "resume=true")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resume: continuing {killed / 'stage1'} after epoch 0" in out.stdout
    assert dirs(tmp_path / "work") == [killed]  # the resume's own Hydra dir is gone
    assert [p for p in killed.parent.iterdir()] == [killed]
    full = tmp_path / "full" / "run"
    for sub in ("stage1", "."):
        got, want = (json.loads((d / sub / "metrics.json").read_text()) for d in (killed, full))
        assert reproducible(got) == reproducible(want)


def test_init_from_weights_that_do_not_fit_is_one_line_and_leaves_no_run_dir(tmp_path):
    """init_from a run of another backbone (before the data stage), or of another vocabulary (once the model is
    built): one line, exit 2, no traceback, no run dir."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    out = train(cwd, "trainer.max_epochs=1", "hydra.run.dir=ce")
    assert out.returncode == 0, out.stderr[-3000:]
    for extra, says in ((["backbone=llama_tiny"], "a genrec.models.tiger.Tiger run"),
                        (["tokenizer.codebook_size=6"], "its weights do not fit this model")):
        out = train(cwd, "trainer.max_epochs=1", f"init_from={cwd / 'ce'}", *extra)
        assert out.returncode == 2 and len(errors(out)) == 1, out.stderr[-3000:]
        assert says in errors(out)[0] and "Traceback" not in out.stderr
        assert dirs(cwd) == [cwd / "ce"]
        assert not (cwd / "outputs").exists() or not any((cwd / "outputs").rglob("*.yaml"))


def test_a_claim_holds_until_released(tmp_path):
    """A claimed dir is refused to every other process until its holder lets go (a sweep's jobs run in one
    process: each job releases its dir, so a long sweep holds one lock file, not one per job)."""
    from genrec.runs import claim, release_claims

    other = [sys.executable, "-c",
             f"from pathlib import Path; from genrec.runs import claim; claim(Path({str(tmp_path)!r}))"]
    claim(tmp_path)
    claim(tmp_path)  # this process again: still its own
    out = subprocess.run(other, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and f"RunDirInUse: {tmp_path} is in use by another run (pid {os.getpid()})" in out.stderr
    release_claims()
    out = subprocess.run(other, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_a_refused_start_never_removes_a_dir_another_run_holds(tmp_path):
    """A run in its data stage has written only what a refused start's own leftovers are (.hydra/, overrides.yaml,
    .lock): a refused start given the same dir must not take it for its own and remove it."""
    cwd, run = tmp_path / "work", tmp_path / "work" / "run"
    cwd.mkdir()
    hold = f"import time; from pathlib import Path; from genrec.runs import claim; claim(Path({str(run)!r}))"
    holder = subprocess.Popen([sys.executable, "-c", hold + "; print('held', flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        (run / ".hydra").mkdir()
        (run / "overrides.yaml").write_text("[]\n")
        out = train(cwd, "eval.beam=0", f"hydra.run.dir={run}")
        assert out.returncode == 2 and errors(out) == ["error: eval.beam=0: an integer >= 1"], out.stderr[-3000:]
        assert sorted(p.name for p in run.iterdir()) == [".hydra", ".lock", "overrides.yaml"]
    finally:
        holder.kill()
        holder.wait()
    out = train(cwd, "eval.beam=0", f"hydra.run.dir={run}")  # no one holds it: a refused start's dir, removed
    assert out.returncode == 2 and not run.exists()


def test_resume_of_a_finished_run_computes_nothing_and_rewrites_nothing(tmp_path):
    """resume=true on a finished run (its own dir, or a same-config sibling it found) restored it and ran its test
    again, rewriting its metrics.json: under newer code, results of two code versions in one run dir. Now one line
    says it has finished; no compute, its files untouched, no stray dir."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    out = train(cwd, "trainer.max_epochs=1", "hydra.run.dir=runs/a")
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = cwd / "runs" / "a" / "metrics.json"
    before, mtime = metrics.read_bytes(), metrics.stat().st_mtime_ns
    for here in ("runs/b", "runs/a"):  # a sibling, then the run's own dir
        out = train(cwd, "trainer.max_epochs=1", f"hydra.run.dir={here}", "resume=true")
        assert out.returncode == 0 and f"{cwd / 'runs' / 'a'} has finished" in out.stdout, out.stdout + out.stderr
        assert "Restored" not in out.stdout + out.stderr
        assert metrics.read_bytes() == before and metrics.stat().st_mtime_ns == mtime
    assert dirs(cwd) == [cwd / "runs" / "a"]
