"""The data stage: raw files -> sequences + splits -> item embeddings -> semantic IDs.

    python -m genrec.prepare dataset=lcrec dataset.root=../shared/data/apao-office dataset.name=Office

Each artefact is cached under `data_dir` by a hash of the config that made it and of the raw
files it read (see `genrec.data.store`), so a sweep over objectives re-uses one tokenisation. Prints a
summary; the last line is one JSON object for scripts.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import hydra
import numpy as np
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from genrec.cli import check_command_line, without_run_dir
from genrec.config_check import exit_if_invalid, refuse
from genrec.data.preprocess import (SeqData, build_sequences, item_texts, leave_one_out, sliding_window,
                                    template_fields)
from genrec.data.readers.common import DataError
from genrec.sid.codes import SemanticIds
from genrec.data.store import cached, read_meta

SPLITS = ("loo", "sliding")


@dataclass
class Prepared:
    seq: SeqData
    sids: SemanticIds
    summary: dict = field(default_factory=dict)


def _plain(node) -> dict:
    return OmegaConf.to_container(node, resolve=True)


def prepare(cfg: DictConfig, log=print) -> Prepared:
    """Build (or load from cache) every data-stage artefact for `cfg`."""
    ds, root = cfg.dataset, cfg.data_dir
    if ds.split not in SPLITS:
        raise DataError(f"dataset.split={ds.split!r} is not one of {', '.join(SPLITS)}")
    template_fields(ds.text_template)  # a malformed template fails before any data is read
    timings, hits = {}, {}
    start = time.time()

    def build_sequences_stage(tmp):
        try:
            raw = instantiate(ds.reader, strict=ds.strict)
        except InstantiationException as e:  # Hydra wraps the reader's DataError
            if isinstance(e.__cause__, DataError):
                raise e.__cause__ from None
            raise
        users, items, flat, times, offsets = build_sequences(raw, int(ds.kcore), where=f"dataset {ds.name}")
        splits = leave_one_out(offsets) if ds.split == "loo" else sliding_window(offsets, times)
        if not len(splits["train"]):
            raise DataError(f"dataset {ds.name}: no training examples after the split; check dataset.kcore/split")
        SeqData(users, items, item_texts(items, raw.meta, ds.text_template), flat, offsets, splits).save(tmp)
        return {"bad_records": raw.report.total, "read_report": raw.report.summary()}

    seq_cfg = {k: _plain(ds)[k] for k in ("reader", "kcore", "split", "text_template")}
    seq_path, hits["sequences"] = cached(root, "sequences", seq_cfg, build_sequences_stage, inputs=True)
    seq = SeqData.load(seq_path)
    timings["sequences"] = time.time() - start
    report = read_meta(seq_path).get("read_report", "")
    if report and report != "no bad records":
        if ds.strict:  # the cached artefact was built by a non-strict run
            raise DataError(f"{report} (dataset.strict=true; set it to false to skip bad records)")
        log(f"[data] {report}")

    tokenizer = instantiate(cfg.tokenizer)
    emb_key = None
    if tokenizer.needs_embeddings:
        if len(set(seq.item_text)) == 1 < seq.num_items:
            raise DataError(f"dataset {ds.name}: every item's text is {seq.item_text[0]!r} (no item metadata?): text "
                            "embeddings would give every item one semantic ID; fix dataset.text_template or use "
                            "tokenizer=precomputed")
        t = time.time()

        def build_embeddings(tmp):
            embedder = instantiate(cfg.embedder)
            emb = embedder(seq.item_text)
            np.save(tmp / "embeddings.npy", emb)
            return {"shape": list(emb.shape), "compute_dtype": str(getattr(embedder, "dtype", "float32"))}

        emb_path, hits["embeddings"] = cached(root, "embeddings", {"sequences": seq_path.name,
                                                                   "embedder": _plain(cfg.embedder)}, build_embeddings)
        emb_key = emb_path.name
        timings["embeddings"] = time.time() - t

    t = time.time()

    def build_sids(tmp):
        emb = np.load(emb_path / "embeddings.npy") if emb_key else None
        sids = tokenizer(emb, seq.item_ids)
        sids.save(tmp)
        return {**tokenizer.facts, **sids.stats()}

    sid_path, hits["sids"] = cached(root, "sids", {"sequences": seq_path.name, "embeddings": emb_key,
                                                   "tokenizer": _plain(cfg.tokenizer)}, build_sids, inputs=True)
    sids = SemanticIds.load(sid_path)
    if len(sids.codes) != seq.num_items:
        raise DataError(f"semantic IDs at {sid_path} cover {len(sids.codes)} items, the dataset has {seq.num_items}")
    timings["sids"] = time.time() - t
    facts = {k: v for k, v in read_meta(sid_path).items() if k.endswith("_before")}
    summary = {"dataset": ds.name, **seq.stats(), **sids.stats(), **facts,
               "cache_hits": hits, "timings": {k: round(v, 3) for k, v in timings.items()},
               "seconds": round(time.time() - start, 3), "artefacts": str(sid_path)}
    return Prepared(seq, sids, summary)


def print_summary(s: dict) -> None:
    print(f"dataset      {s['dataset']}: {s['users']} users, {s['items']} items, {s['interactions']} interactions, "
          f"density {s['density']:.5f}")
    print("splits       " + ", ".join(f"{k[:-9]} {v}" for k, v in s.items() if k.endswith("_examples")))
    usage = ", ".join(f"{u:.0%}" for u in s["codebook_usage"])
    print(f"semantic IDs T={s['levels']} sizes {s['codebook_sizes']}, codebook usage {usage}; "
          f"{s['unique_codes']} unique codes, collision rate {s['collision_rate']:.4f}, "
          f"largest collision group {s['max_collision']} (before disambiguation: "
          f"{s.get('unique_codes_before', '?')} unique, largest group {s.get('max_collision_before', '?')})")
    stages = ", ".join(f"{k} {v:.2f}s{' (cached)' if s['cache_hits'].get(k) else ''}" for k, v in s["timings"].items())
    print(f"timings      {stages}; total {s['seconds']:.2f}s")


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    exit_if_invalid(cfg)
    try:
        prepared = prepare(cfg)
    except DataError as e:
        refuse(e)
    print_summary(prepared.summary)
    print(json.dumps(prepared.summary))


if __name__ == "__main__":
    check_command_line("config")  # an override that does not compose: one line, exit 2
    without_run_dir()
    main()
