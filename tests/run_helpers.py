"""Helpers for tests that run genrec: what must be equal between two runs of the same config and seed
(metrics.json without timings), and a subprocess run that shows where a hung run hangs."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest

# A gloo DDP run on CPU, as conf/trainer/ddp.yaml tells CPU users to start one: without DataLoader worker
# processes (2 per rank under ddp.yaml's GPU defaults; with them, 2-4 ranks on 2 cores hung now and then in full
# test runs: once in CI, once in a local run, never in ~90 runs of those commands alone).
CPU_DDP = ("trainer=ddp", "trainer.accelerator=cpu", "trainer.num_workers=0")
TIMINGS = ("seconds", "train_seconds", "peak_rss_gb", "peak_gpu_gb", "memory_estimate_gb", "checkpoint")


def reproducible(metrics: dict) -> dict:
    """metrics.json without wall times and peak memory (top level and per validation point) and the checkpoint path."""
    out = {k: v for k, v in metrics.items() if k not in TIMINGS}
    out["history"] = [{k: v for k, v in h.items() if k not in TIMINGS} for h in metrics.get("history", [])]
    return out


def run_or_dump(cmd: list[str], timeout: float, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True) in its own process group (a DDP run's ranks too), which
    is killed whole however the call ends. Past `timeout`, every process of the group first gets SIGABRT, one at a
    time, which faulthandler turns into each thread's Python stack on stderr, and the test fails with the processes
    and those stacks: where a hang happened, not only that it did."""
    env = {**(os.environ if env is None else env), "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_no_core_files, **kw)
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
            return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            listing = _abort_one_by_one(proc.pid)
            try:
                out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired as e:  # something outside the group holds the pipes
                err = (e.stderr or b"").decode(errors="replace") + "\n(its stderr is still held open)"
            pytest.fail(f"{' '.join(cmd[:4])} ... hung for {timeout:.0f}s; its processes (pid ppid command), "
                        f"aborted in this order:\n{listing}\ntheir stacks:\n{stacks(err)[-12000:]}")
    finally:
        _signal_group(proc, signal.SIGKILL)  # any rank left behind (a failed test, Ctrl-C, a pytest timeout)


def stacks(stderr: str) -> str:
    """The Python stacks faulthandler wrote into `stderr`, without the run's own lines and faulthandler's long
    "Extension modules" lists (a CI log's tail then shows the stacks, not pandas' module names)."""
    keep = ("Fatal Python error", "Thread 0x", "Current thread 0x", "  File ", "(its stderr")
    return "\n".join(line for line in stderr.splitlines() if line.startswith(keep))


def _abort_one_by_one(group: int) -> str:
    """SIGABRT to each process of a process group in turn (in pid order: parents first, as a rule), a moment
    apart, so that their faulthandler stacks do not interleave on the shared stderr; returns the processes, one line
    each."""
    procs = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
            if int(fields[2]) == group:
                command = (stat.parent / "cmdline").read_bytes().decode(errors="replace")
                command = " ".join(command.replace("\0", " ").split())
                procs.append((int(stat.parent.name), int(fields[1]), command[:200]))
    procs.sort()
    for pid, _, _ in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGABRT)
        time.sleep(0.5)
    return "\n".join(f"{pid} {ppid} {command}" for pid, ppid, command in procs)


def _no_core_files() -> None:  # the SIGABRT leaves no core dumps behind
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
