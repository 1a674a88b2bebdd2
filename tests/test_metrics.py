"""Metrics on hand-computed rank lists."""

from __future__ import annotations

import math

import torch

from genrec.eval import metrics
from genrec.eval.evaluator import Evaluator
from genrec.eval.fullrank import rank_of

RANKS = torch.tensor([1, 3, 0, 10, 6])  # 0 = not returned


def test_recall():
    assert metrics.recall(RANKS, 1) == 1 / 5
    assert metrics.recall(RANKS, 5) == 2 / 5
    assert metrics.recall(RANKS, 10) == 4 / 5
    assert metrics.recall(torch.tensor([0, 0]), 20) == 0.0


def test_ndcg():
    assert math.isclose(metrics.ndcg(RANKS, 1), 1 / 5)
    assert math.isclose(metrics.ndcg(RANKS, 5), (1 + 1 / 2) / 5)  # rank 3: 1 / log2(4)
    assert math.isclose(metrics.ndcg(RANKS, 10), (1 + 1 / 2 + 1 / math.log2(11) + 1 / math.log2(7)) / 5)
    assert metrics.ndcg(torch.tensor([0]), 10) == 0.0


def test_prefix_recall():
    hit = torch.tensor([[True, True, False], [True, False, False], [False, False, False], [True, True, True]])
    assert metrics.prefix_recall(hit) == [3 / 4, 2 / 4, 1 / 4]


def test_pruning_rate():
    full = torch.tensor([1, 2, 5, 1, 30, 3])
    beam = torch.tensor([0, 2, 4, 1, 0, 0])
    assert metrics.pruning_rate(full, beam, 1) == 1 / 2  # users 0 and 3; user 0 pruned
    assert metrics.pruning_rate(full, beam, 3) == 2 / 4  # users 0, 1, 3, 5; users 0 and 5 pruned
    assert metrics.pruning_rate(full, beam, 5) == 2 / 5
    assert metrics.pruning_rate(full, beam, 50) == 3 / 6
    assert math.isnan(metrics.pruning_rate(torch.tensor([7]), torch.tensor([0]), 5))  # nobody qualifies


def test_rank_of_ties_by_candidate_id():
    scores = torch.tensor([[0.5, 0.9, 0.5, 0.1], [0.2, 0.2, 0.2, 0.2]])
    assert rank_of(scores, torch.tensor([2, 0])).tolist() == [3, 1]
    assert rank_of(scores, torch.tensor([0, 3])).tolist() == [2, 4]
    assert rank_of(scores, torch.tensor([3, 1])).tolist() == [4, 2]


def test_summarize_keys_and_values():
    rows = {
        "index": torch.arange(5),
        "rank": RANKS,
        "prefix_hit": torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1], [0, 0]], dtype=torch.bool),
        "full_rank": torch.tensor([1, 2, 4, 10, 6]),
    }
    out = Evaluator(beam=10, ks=(5, 10)).summarize(rows)
    assert set(out) == {f"{p}{m}@{k}" for p in ("", "full/") for m in ("recall", "ndcg") for k in (5, 10)} | {
        "prefix_recall@1",
        "prefix_recall@2",
        "pruning_rate@5",
        "pruning_rate@10",
    }
    assert out["recall@5"] == 2 / 5 and out["full/recall@5"] == 3 / 5 and out["full/recall@10"] == 1.0
    assert out["pruning_rate@5"] == 1 / 3 and out["pruning_rate@10"] == 1 / 5
    assert out["prefix_recall@1"] == 4 / 5 and out["prefix_recall@2"] == 3 / 5
    assert "full/recall@5" not in Evaluator(ks=(5,)).summarize({k: v for k, v in rows.items() if k != "full_rank"})


def test_eval_configs_instantiate():
    from pathlib import Path

    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    conf = Path(__file__).parents[1] / "conf" / "eval"
    beam, bear = (instantiate(OmegaConf.load(conf / f"{n}.yaml")) for n in ("beam", "bear"))
    assert isinstance(beam, Evaluator) and (beam.beam, beam.ks) == (20, [5, 10, 20])
    assert (bear.beam, bear.ks) == (10, [5, 10])
