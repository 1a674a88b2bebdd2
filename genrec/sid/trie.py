"""A dense prefix tree over the catalogue's codes, as per-level tensors.

Level m holds the P_m distinct m-prefixes (P_0 = 1: the empty prefix) and a child table
`child[m]` [P_m, size_m]: the id of prefix + code c among the (m+1)-prefixes, or -1 if no
item continues that way. Everything is a tensor lookup, so beam search, MSL and BEAR
mask whole batches at once.
"""

from __future__ import annotations

import torch

from genrec.sid.codes import SemanticIds


class Trie:
    def __init__(self, sids: SemanticIds, device: torch.device | str = "cpu") -> None:
        codes = torch.from_numpy(sids.cand_codes)  # [C, T] distinct, sorted
        self.sizes = list(sids.sizes)
        self.offsets = torch.as_tensor(sids.offsets, device=device)
        self.host_offsets = [int(o) for o in sids.offsets]  # for slicing: no device sync per read
        self.vocab_size = sids.vocab_size
        self.num_levels = len(self.sizes)
        # prefix_id[:, m] = id of each candidate's m-prefix among the distinct m-prefixes.
        ids = [torch.zeros(len(codes), dtype=torch.long)]
        for m in range(1, self.num_levels + 1):
            _, inv = torch.unique(codes[:, :m], dim=0, return_inverse=True)
            ids.append(inv)
        self.cand_prefix_id = torch.stack(ids, 1).to(device)  # [C, T + 1]
        self.child = []
        for m in range(self.num_levels):
            table = torch.full((int(ids[m].max()) + 1, self.sizes[m]), -1, dtype=torch.long)
            table[ids[m], codes[:, m]] = ids[m + 1]
            self.child.append(table.to(device))
        # The last level's prefix ids are candidate ids (codes are distinct and sorted).
        assert torch.equal(ids[-1], torch.arange(len(codes)))

    def num_prefixes(self, m: int) -> int:
        """P_m, the number of distinct m-prefixes (P_T = number of candidates)."""
        return self.child[m].shape[0] if m < self.num_levels else len(self.cand_prefix_id)

    def walk(self, tokens: torch.Tensor) -> torch.Tensor:
        """Prefix ids of token sequences [..., m] (-1 once a sequence leaves the trie)."""
        pid = torch.zeros(tokens.shape[:-1], dtype=torch.long, device=tokens.device)
        for m in range(tokens.shape[-1]):
            pid = self.next_id(pid, m, tokens[..., m])
        return pid

    def next_id(self, pid: torch.Tensor, m: int, token: torch.Tensor) -> torch.Tensor:
        """Id of prefix `pid` (level m) extended by `token`; -1 if invalid or pid is -1."""
        code = token - self.offsets[m]
        ok = (pid >= 0) & (code >= 0) & (code < self.sizes[m])
        out = self.child[m][pid.clamp(min=0), code.clamp(0, self.sizes[m] - 1)]
        return torch.where(ok, out, torch.full_like(out, -1))

    def allowed(self, pid: torch.Tensor, m: int) -> torch.Tensor:
        """Bool mask [..., V] of tokens allowed after level-m prefixes `pid` [...]."""
        mask = torch.zeros(*pid.shape, self.vocab_size, dtype=torch.bool, device=pid.device)
        off = self.host_offsets[m]
        mask[..., off : off + self.sizes[m]] = self.child[m][pid.clamp(min=0)] >= 0
        return mask & (pid >= 0)[..., None]

    def target_masks(self, target: torch.Tensor) -> torch.Tensor:
        """For targets [B, T] (token ids): allowed-token masks [B, T, V] after each
        ground-truth prefix (the MSL / BEAR masks)."""
        masks, pid = [], torch.zeros(target.shape[0], dtype=torch.long, device=target.device)
        for m in range(self.num_levels):
            masks.append(self.allowed(pid, m))
            pid = self.next_id(pid, m, target[:, m])
        return torch.stack(masks, 1)
