"""The paired test over users (genrec.report.paired): per-user metric values against explicit formulas, the
randomization p and the bootstrap interval against exact enumeration, and the report's paired.csv and page
section against a brute-force computation from the runs' test_ranks.csv."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import torch

from genrec import report as rep
from genrec.eval import metrics
from genrec.report.paired import bootstrap_ci, sign_flip_p
from test_report import OBJECTIVES, write_eval, write_run
from test_report_page import section, table


def test_per_user_values_are_the_metrics_terms():
    rank = torch.tensor([0, 1, 2, 3, 10, 11, 20, 21, 5])
    for k in (1, 5, 10, 20):
        hit = [1.0 if 1 <= r <= k else 0.0 for r in rank.tolist()]
        gain = [1 / math.log2(r + 1) if 1 <= r <= k else 0.0 for r in rank.tolist()]
        assert metrics.per_user(rank, f"recall@{k}").tolist() == hit
        assert metrics.per_user(rank, f"ndcg@{k}").tolist() == pytest.approx(gain, abs=1e-12)
        assert metrics.recall(rank, k) == pytest.approx(sum(hit) / len(hit))
        assert metrics.ndcg(rank, k) == pytest.approx(sum(gain) / len(gain))
    with pytest.raises(ValueError, match="recall@k or ndcg@k"):
        metrics.per_user(rank, "mrr@10")


@pytest.mark.parametrize("d", [
    [0.3, -0.1, 0.5, 0.0, 1.0, -0.2, 0.4, 0.1, 0.0, 0.6],  # mostly positive
    [1, -1, 1, -1, 0, 0, 1, -1, 1, 0],  # ties: hits minus hits, mean 0.1
    [0.0] * 10,  # no difference: every flip is as far from 0
])
def test_sign_flip_p_is_the_exact_randomization_p(d):
    d = np.array(d, float)
    flips = np.array(list(itertools.product([-1, 1], repeat=len(d))))  # all 1024 sign patterns
    exact = (np.abs((flips * d).mean(1)) >= abs(d.mean()) - 1e-12).mean()
    assert sign_flip_p(d, resamples=20_000) == pytest.approx(exact, abs=0.01)


def test_bootstrap_interval_is_the_exact_bootstrap_distributions():
    d = np.array([-1.3, -0.4, 0.0, 0.2, 0.7, 1.1, 2.0])
    means = np.array(list(itertools.product(d, repeat=len(d)))).mean(1)  # all 7^7 resamples, equally likely
    exact = np.quantile(means, [0.025, 0.975])
    assert bootstrap_ci(d, resamples=20_000) == pytest.approx(tuple(exact), abs=0.03)
    assert np.abs(np.quantile(means, [0.05, 0.95]) - exact).min() > 0.1  # a 90% interval would fail


def write_ranks(run, rank, name="test_ranks.csv", examples=None, users=None):
    """A ranks file as EvalModule.write_ranks writes it; by default one example per user, item = 1000 + user."""
    examples = list(range(len(rank))) if examples is None else examples
    users = examples if users is None else users
    pd.DataFrame({"example": examples, "user": users, "item": [1000 + u for u in users], "rank": rank}).to_csv(
        run / name, index=False)


def test_report_pairs_each_row_with_its_baseline_over_the_same_users(tmp_path):
    """CE seeds 1 and 2 (test_ranks.csv), APAO-pointwise seed 1 (ranks only from its full-rank re-evaluation,
    one user fewer), pairwise seed 1 without ranks: paired.csv and the page's section equal the brute force."""
    rng = np.random.default_rng(0)
    n = 300
    ranks = {("ce", 1): rng.integers(0, 21, n), ("ce", 2): rng.integers(0, 21, n),
             ("pointwise", 1): np.where(rng.random(n) < 0.3, 1, rng.integers(0, 21, n))}
    runs = tmp_path / "runs"
    for (obj, seed), rank in ranks.items():
        run = write_run(runs / f"{obj}-{seed}", "office", "tiger", OBJECTIVES[obj], seed,
                        {"test/recall@10": 0.05, "eval_score": "full"})
        if obj == "ce":
            write_ranks(run, rank)
            write_eval(run, 20, True, {})  # a re-evaluation's ranks: test_ranks.csv wins
            write_ranks(run / "eval", [0] * n, "test-beam20-full.ranks.csv")
        else:  # a run from before test_ranks.csv: its full-rank re-evaluation's; an unknown user last
            write_eval(run, 20, True, {"test/pruning_rate@5": 0.2})
            write_ranks(run / "eval", list(rank[1:]) + [3], "test-beam20-full.ranks.csv", list(range(1, n)) + [n + 5])
            write_ranks(run / "eval", [0] * n, "test-beam10-full.ranks.csv")  # another beam's: not this run's ranks
            write_eval(run, 10, True, {})
    write_run(runs / "pairwise-1", "office", "tiger", OBJECTIVES["pairwise"], 1, {"test/recall@10": 0.05})
    (tmp_path / "intro.md").write_text("x\n")
    (tmp_path / "out").mkdir()
    s = rep.report([runs], tmp_path / "out", ["recall@10", "ndcg@10", "pruning_rate@5"], page=tmp_path / "page.md",
                   page_intro=tmp_path / "intro.md")  # PR@k has no per-user beam value: not paired

    got = pd.read_csv(tmp_path / "out" / "paired.csv")
    assert list(got.objective) == ["APAO-pointwise", "APAO-pointwise"] and list(got.metric) == ["recall@10", "ndcg@10"]
    assert s["paired"][0]["seeds"] == [1] and s["paired"][0]["baseline_seeds"] == [1, 2]
    for row in got.itertuples():
        k = int(row.metric.split("@")[1])
        def value(r):  # explicit per-user formulas
            return 0.0 if not 1 <= r <= k else (1.0 if row.metric.startswith("recall") else 1 / math.log2(r + 1))
        diffs = [value(ranks[("pointwise", 1)][u]) - (value(ranks[("ce", 1)][u]) + value(ranks[("ce", 2)][u])) / 2
                 for u in range(1, n)]  # users both sides have
        assert row.users == n - 1 and row.baseline == "CE"
        assert row.diff == pytest.approx(sum(diffs) / len(diffs), abs=1e-12)
        assert row.lo < row.diff < row.hi and 0 < row.p <= 1
    assert got.p[0] < 0.01  # 30% extra hits at rank 1: far beyond the test set's noise

    shown = table(section((tmp_path / "page.md").read_text(), "Paired test over users"))
    assert [(r["Objective"], r["vs"], r["Seeds"], r["vs seeds"], r["Users"], r["Metric"]) for r in shown] == [
        ("APAO-pointwise", "CE", "1", "1,2", str(n - 1), "recall@10"), ("APAO-pointwise", "CE", "1", "1,2", str(n - 1), "ndcg@10")]
    assert shown[0]["Difference"] == f"{got['diff'][0]:+.4f}" and shown[0]["p"] == "<0.001"
    assert f"paired test: office/tiger/APAO-pointwise and CE share {n - 1} of {n} / {n} examples" in s["notes"]


def test_no_ranks_no_pairs(tmp_path):
    runs = tmp_path / "runs"
    for obj in ("ce", "pointwise"):
        write_run(runs / obj, "office", "tiger", OBJECTIVES[obj], 1, {"test/recall@10": 0.05})
    (tmp_path / "intro.md").write_text("x\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "paired.csv").write_text("an earlier report's\n")
    s = rep.report([runs], tmp_path / "out", ["recall@10"], page=tmp_path / "page.md", page_intro=tmp_path / "intro.md")
    assert s["paired"] == [] and not (tmp_path / "out" / "paired.csv").exists()
    assert "No two rows have per-user ranks yet." in section((tmp_path / "page.md").read_text(), "Paired test over users")


def test_several_examples_of_a_user_are_one_user_and_other_examples_do_not_pair(tmp_path):
    """A sliding-window split scores several examples per user: the test's unit is the user (the mean of their
    examples). An example whose user or held-out item differs between the runs is not the same example."""
    runs = tmp_path / "runs"
    ce = write_run(runs / "ce", "office", "tiger", OBJECTIVES["ce"], 1, {"test/recall@10": 0.05})
    apao = write_run(runs / "apao", "office", "tiger", OBJECTIVES["pointwise"], 1, {"test/recall@10": 0.05})
    users = [0, 0, 1, 1, 1, 2, 3]
    write_ranks(ce, [1, 0, 0, 0, 5, 0, 2], examples=list(range(7)), users=users)
    write_ranks(apao, [1, 1, 0, 3, 0, 0, 2], examples=list(range(7)), users=users[:6] + [4])  # example 6: another user
    s = rep.report([runs], tmp_path / "out", ["recall@10"])
    (row,) = s["paired"]
    assert row["users"] == 3 and row["diff"] == pytest.approx(((1 - 0.5) + (1 / 3 - 1 / 3) + 0) / 3)
    assert any("share 6 of 7 / 7 examples" in n for n in s["notes"])


def test_a_ranks_file_without_a_column_or_a_value_names_itself(tmp_path):
    run = write_run(tmp_path / "ce", "office", "tiger", OBJECTIVES["ce"], 1, {"test/recall@10": 0.05})
    (run / "test_ranks.csv").write_text("example,user,rank\n0,0,1\n")
    with pytest.raises(ValueError, match=f"{run / 'test_ranks.csv'}: no column item"):
        rep.load_runs([run], 30.0)[0].ranks()
    (run / "test_ranks.csv").write_text("example,user,item,rank\n0,0,5,\n")
    with pytest.raises(ValueError, match="empty values in rank"):
        rep.load_runs([run], 30.0)[0].ranks()
