"""W&B offline runs read back from their files: one run per sweep job, sliceable, and the report's run.

wandb >= 0.2x writes no config.yaml / wandb-summary.json offline and no longer ships a Python reader
for the `.wandb` transaction log, so `read_run` parses it: a leveldb-style log (7-byte file header,
32 KiB blocks of records `crc32 u32, length u16, type u8, data`, type FULL=1 FIRST=2 MIDDLE=3 LAST=4)
whose records are `wandb.proto.wandb_internal_pb2.Record` messages.
"""

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).parents[1]
BLOCK = 32768


def records(path: Path):
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # block trailer
            pos += BLOCK - pos % BLOCK
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        buf = data[pos + 7:pos + 7 + n] if kind in (1, 2) else buf + data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            yield rec


def _key(item) -> str:
    return item.key or ".".join(item.nested_key)


def read_run(folder: Path) -> dict:
    """One `offline-run-*` folder -> its group, job type, tags, config, summary, history rows, exit code
    (None: never finished) and the logged tables/images by key ({"columns", "data"} / file path)."""
    run = {"config": {}, "summary": {}, "history": [], "exit_code": None}
    (path,) = folder.glob("run-*.wandb")
    for rec in records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            run.update(id=rec.run.run_id, project=rec.run.project, group=rec.run.run_group,
                       job_type=rec.run.job_type, tags=list(rec.run.tags))
            run["config"].update({_key(u): json.loads(u.value_json) for u in rec.run.config.update})
        elif kind == "config":
            run["config"].update({_key(u): json.loads(u.value_json) for u in rec.config.update})
        elif kind == "summary":
            run["summary"].update({_key(u): json.loads(u.value_json) for u in rec.summary.update})
        elif kind == "history":
            run["history"].append({_key(i): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "exit":
            run["exit_code"] = rec.exit.exit_code
    run["config"].pop("_wandb", None)
    s = run["summary"]
    run["media"] = {k[:-len(".path")]: folder / "files" / v for k, v in s.items() if k.endswith(".path")}
    run["tables"] = {k: json.loads(p.read_text()) for k, p in run["media"].items() if p.name.endswith(".table.json")}
    return run


def flat(d: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}, written as a loop (the reference for the logged config)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def wandb_runs(root: Path) -> list[dict]:
    return [read_run(f) for f in sorted(root.glob("**/wandb/offline-run-*"))]


def env(tmp: Path) -> dict:
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "WANDB_DIR": str(tmp), "WANDB_SILENT": "true"}  # no WANDB_API_KEY: offline


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """Three successful jobs in one process (one `-m` call)."""
    tmp = tmp_path_factory.mktemp("wb")
    out = subprocess.run(
        [sys.executable, "-m", "genrec.train", "-m", "experiment=tiny", "trainer.max_epochs=1", "logger=wandb",
         "objective=ce,apao_pointwise,msl", f"hydra.sweep.dir={tmp}/my_sweep", f"data_dir={tmp}/data"],
        cwd=ROOT, env=env(tmp), capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return tmp / "my_sweep"


def test_every_sweep_job_owns_one_finished_wandb_run(sweep):
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 3
    seen = set()
    for job in jobs:
        (folder,) = job.glob("wandb/offline-run-*")  # the job's own run, in its own dir
        run = read_run(folder)
        metrics = json.loads((job / "metrics.json").read_text())
        assert run["exit_code"] == 0, f"{job.name}: W&B run not finished"
        # Its own config, summary and final table: the numbers of this job's metrics.json.
        own = flat(OmegaConf.to_container(OmegaConf.load(job / "config.yaml")))
        assert {k: v for k, v in run["config"].items() if k.startswith("objective.")} == \
            {k: v for k, v in own.items() if k.startswith("objective.")}
        assert run["summary"]["test/ndcg@5"] == pytest.approx(metrics["test/ndcg@5"])
        final = dict(run["tables"]["final_metrics"]["data"])
        assert final["test/recall@5"] == pytest.approx(metrics["test/recall@5"])
        # Only its own curves: one epoch of validation, not the other jobs' too.
        assert sum("val/ndcg@5" in h for h in run["history"]) == 1
        assert ("train/apao/w1" in str(run["history"])) == (metrics["objective"] == "apao_pointwise")
        seen.add(metrics["objective"])
    assert seen == {"ce", "apao_pointwise", "msl"}
    assert len(wandb_runs(sweep)) == 3


def test_runs_are_grouped_by_sweep_typed_by_cell_and_carry_the_flat_config(sweep):
    for job in sorted(p for p in sweep.iterdir() if p.is_dir()):
        (run,) = wandb_runs(job)
        metrics = json.loads((job / "metrics.json").read_text())
        assert run["group"] == "my_sweep"
        assert run["job_type"] == f"synthetic/tiger_tiny/{metrics['objective']}"
        assert run["tags"] == ["tiny"]  # the experiment preset
        # Every setting its own dotted key, with the job's resolved value, and the job's command line (`command`:
        # its overrides.yaml, which genrec.report needs to read W&B runs written by an older genrec as today's)
        command = OmegaConf.to_container(OmegaConf.load(job / "overrides.yaml"))
        assert run["config"] == {**flat(OmegaConf.to_container(OmegaConf.load(job / "config.yaml"))), "command": command}
        assert run["config"]["trainer.batch_size"] == 64 and "objective" not in run["config"]
        assert f"objective={metrics['objective']}" in command


def test_a_single_run_has_no_group_and_keeps_its_tags(sweep, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "genrec.train", "experiment=tiny", "trainer.max_epochs=1", "logger=wandb",
         "tags=[mine]", f"hydra.run.dir={tmp_path}/single", f"data_dir={sweep.parent}/data"],
        cwd=ROOT, env=env(tmp_path), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (run,) = wandb_runs(tmp_path / "single")
    assert run["group"] == "" and run["job_type"] == "synthetic/tiger_tiny/ce"
    assert run["tags"] == ["mine", "tiny"] and run["exit_code"] == 0


def test_a_fresh_start_in_a_dir_holding_a_run_leaves_its_wandb_run_alone(sweep, tmp_path):
    """resume=true continues the dir's W&B run (tests/test_resume.py); a run started afresh in the same
    dir is refused (tests/test_run_dirs.py) and never logs into the old run's W&B history."""
    cmd = [sys.executable, "-m", "genrec.train", "experiment=tiny", "trainer.max_epochs=1", "logger=wandb",
           "trainer.limit_train_batches=2", f"hydra.run.dir={tmp_path}/again", f"data_dir={sweep.parent}/data"]
    out = subprocess.run(cmd, cwd=ROOT, env=env(tmp_path), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (first,) = wandb_runs(tmp_path / "again")
    out = subprocess.run(cmd, cwd=ROOT, env=env(tmp_path), capture_output=True, text=True, timeout=600)
    assert out.returncode == 2 and "holds another run" in out.stderr, out.stderr[-3000:]
    assert wandb_runs(tmp_path / "again") == [first] and first["exit_code"] == 0


def test_report_logs_the_paper_table_and_plots_as_one_wandb_run(sweep, tmp_path):
    out = tmp_path / "report"
    rep = subprocess.run([sys.executable, "-m", "genrec.report", f"runs=[{sweep}]", f"out={out}", "wandb=true",
                          "metrics=[recall@5,ndcg@5]"], cwd=ROOT, env=env(tmp_path), capture_output=True, text=True,
                         timeout=300)
    assert rep.returncode == 0, rep.stderr[-2000:]
    (run,) = wandb_runs(out)
    (job,) = wandb_runs(sweep / "0_tiger_tiny-ce")
    assert run["job_type"] == "report" and run["project"] == job["project"] and run["group"] == "my_sweep"
    assert run["exit_code"] == 0 and run["config"]["metrics"] == ["recall@5", "ndcg@5"]
    # paper_table: the Table-1 layout, as report's table.csv shows it.
    table = run["tables"]["paper_table"]
    assert table["columns"] == ["Backbone", "Objective", "Seeds", "synthetic recall@5", "synthetic ndcg@5"]
    rows = {r[1]: r[3:] for r in table["data"]}
    assert set(rows) == {"CE", "MSL", "APAO-pointwise"} and {r[0] for r in table["data"]} == {"tiger_tiny"}
    results = [json.loads((j / "metrics.json").read_text()) for j in sweep.iterdir() if j.is_dir()]
    by_objective = {m["objective"]: m for m in results}
    ce, msl = by_objective["ce"], by_objective["msl"]
    assert rows["CE"][0] == f"{ce['test/recall@5']:.4f}"  # one seed: no std; the baseline: no gain
    gain = 100 * (msl["test/ndcg@5"] / ce["test/ndcg@5"] - 1)
    assert rows["MSL"][1] == f"{msl['test/ndcg@5']:.4f} ({gain:+.2f}%)"
    cells = run["tables"]["paper_cells"]
    mean = cells["columns"].index("mean")
    assert sorted(r[mean] for r in cells["data"]) == pytest.approx(sorted(
        m[f"test/{k}"] for m in by_objective.values() for k in ("recall@5", "ndcg@5")))
    # Each PNG of the report as an image of the run.
    pngs = sorted(p.name for p in out.glob("*.png"))
    images = {k: p for k, p in run["media"].items() if k.startswith("plots/")}
    assert pngs and sorted(k[len("plots/"):] + ".png" for k in images) == pngs
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in images.values())


def test_offline_without_a_key_or_a_server_online_with_both(tmp_path, monkeypatch, capsys):
    """WANDB_API_KEY or `wandb login`'s ~/.netrc entry, and a server that answers: online; otherwise offline
    (no server: one line says so) - a run on a node without network never hangs on W&B."""
    import socket

    from genrec.loggers import _offline

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    up = server.getsockname()[1]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    down = closed.getsockname()[1]  # bound, not listening: refuses
    for k in ("WANDB_MODE", "WANDB_API_KEY", "NETRC"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{up}")
    assert _offline(None) is True  # no key anywhere
    (tmp_path / ".netrc").write_text("machine example.org login me password x\nmachine 127.0.0.1\n  login user\n"
                                     "  password 0123abcd\n")
    (tmp_path / ".netrc").chmod(0o640)  # group-readable: Python's netrc module refuses it, W&B reads it
    assert _offline(None) is False  # wandb login's key, server up
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{down}")
    capsys.readouterr()
    assert _offline(None) is True and "did not answer within 3 s: logging offline" in capsys.readouterr().err
    (tmp_path / ".netrc").unlink()
    monkeypatch.setenv("WANDB_API_KEY", "0123abcd")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{up}")
    assert _offline(None) is False
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert _offline(None) is True and _offline(False) is False
    server.close()
    closed.close()


def test_a_server_that_never_answers_costs_the_probe_time_not_a_hang(monkeypatch):
    """Name lookup or connect hanging (a node without network): offline after PROBE_SECONDS; behind a proxy W&B
    connects through it, so no probe."""
    import socket
    import time

    from genrec import loggers

    def hang(*args, **kwargs):
        time.sleep(30)

    for k in ("WANDB_MODE", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "0123abcd")
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.invalid")
    monkeypatch.setattr(socket, "create_connection", hang)
    monkeypatch.setattr(loggers, "PROBE_SECONDS", 0.5)
    start = time.monotonic()
    assert loggers._offline(None) is True and time.monotonic() - start < 2
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example.invalid:3128")
    assert loggers._offline(None) is False
