"""Helpers for tests that run genrec: what must be equal between two runs of the same config and seed
(metrics.json without timings), and a subprocess run that shows where a hung run hangs."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess

import pytest

TIMINGS = ("seconds", "train_seconds", "peak_rss_gb", "peak_gpu_gb", "memory_estimate_gb", "checkpoint")


def reproducible(metrics: dict) -> dict:
    """metrics.json without wall times and peak memory (top level and per validation point) and the checkpoint path."""
    out = {k: v for k, v in metrics.items() if k not in TIMINGS}
    out["history"] = [{k: v for k, v in h.items() if k not in TIMINGS} for h in metrics.get("history", [])]
    return out


def run_or_dump(cmd: list[str], timeout: float, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True) in its own process group (a DDP run's ranks too), which
    is killed whole however the call ends. Past `timeout`, every process of the group first gets SIGABRT, which
    faulthandler turns into each thread's Python stack on stderr, and the test fails with that stderr: where a hang
    happened, not only that it did."""
    env = {**(os.environ if env is None else env), "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_no_core_files, **kw)
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
            return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGABRT)
            try:
                out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired as e:  # something outside the group holds the pipes
                err = (e.stderr or b"").decode(errors="replace") + "\n(its stderr is still held open)"
            pytest.fail(f"{' '.join(cmd[:4])} ... hung for {timeout:.0f}s; its processes' stacks:\n{err[-20000:]}")
    finally:
        _signal_group(proc, signal.SIGKILL)  # any rank left behind (a failed test, Ctrl-C, a pytest timeout)


def _no_core_files() -> None:  # the SIGABRT leaves no core dumps behind
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
