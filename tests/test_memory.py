"""genrec.memory: what autograd keeps for backward, counted exactly; the estimate's refusal line; a refused
run is refused before training and a checked run trains exactly as an unchecked one."""

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from run_helpers import reproducible

from genrec import memory
from genrec.train import run

CONF = str(Path(__file__).parents[1] / "conf")
GB = 2**30


class TwoLayers(torch.nn.Module):
    """objective(batch, backbone) = sum(relu(x W1) W2): autograd saves x [B, 3] (for W1's gradient), relu's
    output [B, 5] (relu's backward and W2's gradient), nothing else; W1, W2 are parameters (not counted)."""

    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(3, 5)),
                                                torch.nn.Parameter(torch.randn(5, 2))])
        self.register_buffer("steps", torch.zeros(()))  # a training state the forward updates, as APAO's weights

    def objective(self, batch, backbone):
        self.steps += 1
        h = torch.relu(batch["x"] @ backbone[0]) @ backbone[1]
        return h.sum() + torch.rand(()) * 0, {}


@pytest.mark.parametrize("b", [1, 4, 9])
def test_saved_bytes_counts_exactly_what_autograd_keeps(b):
    m = TwoLayers()
    assert memory.saved_bytes(m, {"x": torch.randn(b, 3)}, None) == b * 3 * 4 + b * 5 * 4


def test_saved_bytes_changes_no_weight_gradient_state_or_random_stream():
    m = TwoLayers()
    weights = [p.detach().clone() for p in m.parameters()]
    batch = {"x": torch.randn(4, 3)}
    state = torch.get_rng_state()
    memory.saved_bytes(m, batch, torch.bfloat16)
    assert torch.equal(torch.get_rng_state(), state)  # the objective drew from it inside
    assert all(torch.equal(p, w) and p.grad is None for p, w in zip(m.parameters(), weights))
    assert m.steps == 0


def estimate(**kw):
    e = dict(base=1.0 * GB, weights=0.1 * GB, fixed=0.05 * GB, per_example=0.02 * GB, batch_size=256, allowance=1.5)
    return memory.Estimate(**{**e, **kw})


def test_per_process_is_the_counted_sum_times_the_allowance():
    assert estimate().per_process == pytest.approx(1.5 * (1.0 + 0.1 + 0.05 + 0.02 * 256) * GB)


def test_shortfall_names_the_batch_size_and_one_that_fits():
    e = estimate()
    line = memory.shortfall(e, 2, 16 * GB)
    assert line.startswith("trainer.batch_size=256: this run needs about 9.4 GB per process") and "x 2 processes" in line
    fits = int(line.split("(<= ")[1].split(")")[0])
    assert memory.shortfall(estimate(batch_size=fits), 2, 16 * GB) is None  # the suggestion holds
    assert memory.shortfall(estimate(batch_size=fits + 1), 2, 16 * GB) is not None
    assert memory.shortfall(e, 1, 16 * GB) is None and memory.shortfall(e, 2, None) is None  # unknown: no check


class Probe:
    """A training set of `TwoLayers` examples (memory.estimate reads its lengths and batches of its indices)."""

    lengths = [1, 2, 3, 4, 5, 6, 7, 8]

    def __getitem__(self, idx: list[int]) -> dict:
        return {"x": torch.randn(len(idx), 3)}


def test_weight_averaging_counts_one_more_copy_of_the_weights():
    """callbacks=[default,ema] keeps an averaged copy of the model (conf/callbacks/ema.yaml)."""
    with initialize_config_dir(CONF, version_base="1.3"):
        plain, ema = (compose("config", overrides=["experiment=tiny", *extra]) for extra in ([], ["callbacks=[default,ema]"]))
    m, weights = TwoLayers(), (3 * 5 + 5 * 2) * 4
    assert memory.estimate(plain, m, Probe(), 1).weights == 3 * weights  # gradients, AdamW's two moments
    assert memory.estimate(ema, m, Probe(), 1).weights == 4 * weights
    assert memory.estimate(ema, m, Probe(), 2).weights == 5 * weights  # + DDP's gradient buckets


def config(tmp_path: Path, *overrides: str):
    with initialize_config_dir(CONF, version_base="1.3"):
        return compose("config", overrides=["experiment=tiny", "objective=apao_pairwise", "trainer.max_epochs=1",
                                            f"run_dir={tmp_path}/run", f"data_dir={tmp_path.parent}/data", *overrides])


def test_a_run_that_does_not_fit_is_refused_before_training_and_a_checked_run_trains_as_unchecked(tmp_path,
                                                                                                 monkeypatch):
    checked = run(config(tmp_path / "a"))
    needs = checked["memory_estimate_gb"] * GB
    assert needs > checked["peak_rss_gb"] * GB / 4  # an estimate of this run, not of nothing

    monkeypatch.setattr(memory, "available_bytes", lambda: needs / 2)
    with pytest.raises(memory.MemoryShortfall, match=r"^trainer.batch_size=64: this run needs about .* GB per "
                                                     r"process .*trainer.memory_check=false runs it anyway$"):
        run(config(tmp_path / "b"))
    assert not (tmp_path / "b" / "run" / "checkpoints").exists() and not (tmp_path / "b" / "run" / "config.yaml").exists()

    unchecked = run(config(tmp_path / "c", "trainer.memory_check=false"))  # the same host shortage: not asked
    assert "memory_estimate_gb" not in unchecked
    assert reproducible(unchecked) == reproducible(checked)  # the probe forward changed nothing of the run
    assert json.loads((tmp_path / "c" / "run" / "metrics.json").read_text())["test/users"] == checked["test/users"]
