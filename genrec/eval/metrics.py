"""Ranking metrics for one held-out target per user, as pure functions of ranks.

A rank is 1-based; 0 means the item was not returned (beam search pruned it).
"""

from __future__ import annotations

import torch


def is_loss(name: str) -> bool:
    """A logged loss: `val/loss`, `val/objective_loss`, `val/last_batch_loss@128`, ..."""
    return name.rsplit("/", 1)[-1].split("@")[0].endswith("loss")


def lower_is_better(name: str) -> bool:
    """Direction of a logged metric (`val/loss`, `val/ndcg@10`, ...): losses and pruning rates are
    minimised, recall / NDCG / prefix recall maximised."""
    return is_loss(name) or name.rsplit("/", 1)[-1].startswith("pruning_rate@")


def hits(rank: torch.Tensor, k: int) -> torch.Tensor:
    return (rank >= 1) & (rank <= k)


def ndcg_gain(rank: torch.Tensor, k: int) -> torch.Tensor:
    """Per user: 1 / log2(rank + 1) if rank <= k, else 0 (one relevant item: IDCG = 1)."""
    return torch.where(hits(rank, k), 1.0 / torch.log2(rank.double().clamp(min=1) + 1), 0.0)


def per_user(rank: torch.Tensor, name: str) -> torch.Tensor:
    """Each user's value of `recall@k` (hit: 0/1) or `ndcg@k` (gain); the metric is their mean."""
    kind, k = name.split("@")
    if kind == "recall":
        return hits(rank, int(k)).double()
    if kind == "ndcg":
        return ndcg_gain(rank, int(k))
    raise ValueError(f"{name}: recall@k or ndcg@k")


def recall(rank: torch.Tensor, k: int) -> float:
    """Recall@k: share of users whose target is in the top k."""
    return hits(rank, k).double().mean().item()


def ndcg(rank: torch.Tensor, k: int) -> float:
    """NDCG@k with one relevant item: the mean of `ndcg_gain`."""
    return ndcg_gain(rank, k).mean().item()


def prefix_recall(prefix_hit: torch.Tensor) -> list[float]:
    """prefix_hit [B, T] (is the target's m-prefix among the beams kept at step m) ->
    the share of users per m = 1..T."""
    return prefix_hit.double().mean(0).tolist()


def pruning_rate(full_rank: torch.Tensor, beam_rank: torch.Tensor, k: int) -> float:
    """PR@k: among users whose target is in the full ranking's top k, the share that beam
    search does not return at all. NaN if no user qualifies."""
    top = hits(full_rank, k)
    if not top.any():
        return float("nan")
    return (beam_rank[top] == 0).double().mean().item()
