"""Run dirs -> `Run` records: config, metrics, status (ok | failed | running) and the report row label
the run's objective class declares (`Objective.report_row`, `ablations`), suffixed with its recipe (preset)
when that is not the report's main one."""

from __future__ import annotations

import importlib
import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Sequence

import pandas as pd
import yaml
from omegaconf import OmegaConf

from genrec.config_check import CONF, compose_command
from genrec.runs import EXECUTION, defining, flatten, listed, moved_targets, with_added

# Config keys that do not define the experiment (seeds are averaged; the rest: where and how a run executes).
IGNORED = ("seed", "init_from", *EXECUTION)
BOOKKEEPING = ("run_dir", "logger", "hydra")  # where this run wrote, not what it ran (and ${hydra:...} interpolations)
SKIP_DIRS = {".hydra", "checkpoints", "logs", "eval", "wandb", ".git", ".venv", "__pycache__", "data"}
BACKBONE_NAMES = {"tiger": "TIGER", "llama": "Llama"}


@cache
def objective_class(target: str) -> type | None:
    """The class `_target_` names, or None when it cannot be imported (a run of a since-renamed objective)."""
    module, _, name = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def objective_row(obj: dict, protocol: dict | None = None) -> tuple[float, str]:
    """(order, label) of the run's table row: "APAO-pairwise", "S-DPO+BEAR", "BEAR (form=regularizer)", ...
    A config value other than the class's `ablations` default (under the run's preset `protocol`) makes the row
    its own (not a tuned variant)."""
    target = str(obj.get("_target_", "?"))
    cls = objective_class(target)
    if cls is None or not hasattr(cls, "report_row"):
        return 100.0, target.rsplit(".", 1)[-1]
    order, label = cls.report_row(obj)
    flat = flatten(obj)
    defaults = cls.ablation_defaults(protocol or {})
    changed = [f"{k}={flat[k]}" for k, d in defaults.items() if k in flat and flat[k] != d]
    return order, label + (f" ({', '.join(changed)})" if changed else "")


def objective_label(obj: dict) -> str:
    return objective_row(obj)[1]


def axes(obj: dict) -> tuple[tuple[str, str], ...]:
    """The objective class's preferred (rows, cols) heatmap axes."""
    return getattr(objective_class(str(obj.get("_target_", "?"))), "axes", ())


@dataclass
class Run:
    path: Path
    cfg: dict
    metrics: dict | None
    status: str  # ok | failed | running
    backbone: str  # the hydra choice name when known
    error: str | None = None  # failed.json's message
    recipe: str = ""  # " [apao_release]": its preset (`tags`) when not the report's main one (mark_recipes)
    dataset: str = field(init=False)
    order: float = field(init=False)
    label: str = field(init=False)
    seed: int = field(init=False)
    flat: dict = field(init=False)  # the config minus IGNORED: runs with equal `flat` differ only by seed
    key: str = field(init=False)

    def __post_init__(self):
        self.dataset = str(self.cfg["dataset"].get("name", "?"))
        self.order, self.label = objective_row(self.cfg["objective"], self.cfg.get("protocol"))
        cls = objective_class(str(self.cfg["objective"].get("_target_", "?")))
        if (self.cfg.get("init_from") or self.cfg.get("stage1")) and not getattr(cls, "fine_tunes", False):
            self.order, self.label = self.order + 0.01, self.label + " (two-stage)"  # started from a trained run
        self.seed = self.cfg.get("seed", 0)
        flat = {k: v for k, v in flatten(self.cfg).items() if not listed(k, IGNORED)}
        self.flat = defining(flat, self.cfg["objective"])
        self.key = json.dumps(self.flat, sort_keys=True, default=str)

    @property
    def monitor(self) -> str:
        return self.cfg.get("trainer", {}).get("monitor", "val/ndcg@10")

    def eval_files(self, split: str = "*") -> list[tuple[Path, dict]]:
        """Re-evaluations of the run's selected checkpoint written by genrec.evaluate, (file, contents):
        eval/<split>-beam<K>[-full].json (not another checkpoint's, `...-last.json`). Validation files written
        before genrec.evaluate named the split `val` (valid-beam<K>..., `valid/` keys) read as `val` ones."""
        mine = Path(str((self.metrics or {}).get("checkpoint", "best.ckpt"))).name
        names = ["val", "valid"] if split == "val" else [split]
        files = sorted(f for name in names for f in (self.path / "eval").glob(f"{name}-beam*.json"))
        return [(f, {k.replace("valid/", "val/", 1) if k.startswith("valid/") else k: v for k, v in j.items()})
                for f in files if (j := read_json(f)) and Path(str(j.get("checkpoint", mine))).name == mine]

    def evals(self, split: str = "*") -> list[dict]:
        return [j for _, j in self.eval_files(split)]

    @property
    def scoring(self) -> tuple[str, float]:
        """The run's own (eval.score, eval.temperature): its metrics.json's, else its config's."""
        m, e = self.metrics or {}, self.cfg.get("eval", {})
        return str(m.get("eval_score", e.get("score", "full"))), float(m.get("eval_temperature",
                                                                            e.get("temperature", 1.0)))

    def scoring_of(self, e: dict) -> tuple[str, float]:
        """(eval.score, eval.temperature) of a re-evaluation `e`; what its file does not say is the run's own."""
        own = self.scoring
        return str(e.get("eval_score", own[0])), float(e.get("eval_temperature", own[1]))

    def at_own_beam(self, e: dict) -> bool:
        return e.get("beam") == self.cfg["eval"].get("beam")

    def own_scoring(self, e: dict) -> bool:
        """A re-evaluation `e` at the run's own beam and scoring (score and temperature)."""
        return self.at_own_beam(e) and self.scoring_of(e) == self.scoring

    def by_scoring(self, split: str = "test") -> dict[tuple[str, float], dict]:
        """Values per scoring (score, temperature): the run's own (`values`, its own full-rank re-evaluation's keys
        winning: the same one-process evaluation as the others) and each other scoring of its full-rank
        re-evaluations at its own beam (`genrec.evaluate ... eval.score=masked eval.full_rank=true`)."""
        out = {self.scoring: dict(self.values)}
        for e in self.evals(split):
            if e.get("full_rank") and self.at_own_beam(e):
                k = self.scoring_of(e)
                out[k] = {**out[k], **e} if k == self.scoring else e
        return out

    @cached_property
    def values(self) -> dict:
        """metrics.json plus the metric keys it lacks (e.g. test/pruning_rate@k) from the run's full-rank
        re-evaluation at its own beam and scoring (eval/<split>-beam<K>-full.json); metrics.json wins."""
        full = [e for e in self.evals() if e.get("full_rank") and self.own_scoring(e)]
        return {k: v for e in full for k, v in e.items() if "/" in k} | (self.metrics or {})

    def ranks(self, split: str = "test") -> pd.DataFrame | None:
        """Per example (`example`, `user`, `item`, `rank`[, `full_rank`]) of the selected checkpoint on `split`: the
        final test's <split>_ranks.csv, else a re-evaluation's at the run's own beam and scoring
        (eval/<name>.ranks.csv); None without one. A file lacking a column or a value is a ValueError naming it."""
        files = [self.path / f"{split}_ranks.csv"] + [f.with_suffix(".ranks.csv") for f, e in self.eval_files(split)
                                                      if self.own_scoring(e)]
        f = next((f for f in files if f.exists()), None)
        if f is None:
            return None
        ranks = pd.read_csv(f)
        cols = ["example", "user", "item", "rank"]
        if missing := [c for c in cols if c not in ranks]:
            raise ValueError(f"{f}: no column {', '.join(missing)} (genrec.eval.module.EvalModule.write_ranks)")
        if ranks[cols].isna().any().any():
            raise ValueError(f"{f}: empty values in {', '.join(c for c in cols if ranks[c].isna().any())}")
        return ranks

    @cached_property
    def log(self) -> pd.DataFrame:
        """logs/metrics.csv (Lightning's CSVLogger): one row per logging step, NaN where a key was not logged."""
        f = self.path / "logs" / "metrics.csv"
        return pd.read_csv(f) if f.exists() else pd.DataFrame()


def mark_recipes(runs: list[Run]) -> None:
    """Runs of different experiment presets (config `tags`) are different rows, never tuning variants of one:
    the most common tags are the main recipe; another run's label gets " [<tags>]" and sorts after its base row."""
    tags = [tuple(r.cfg.get("tags") or ()) for r in runs]
    main = Counter(tags).most_common(1)[0][0] if runs else ()
    for r, t in zip(runs, tags):
        if t != main:
            r.recipe = f" [{','.join(t) or 'no tags'}]"
            r.label, r.order = r.label + r.recipe, r.order + 0.001


def base_label(label: str) -> str:
    """The label without its recipe suffix: "CE [apao_release]" -> "CE"."""
    return re.sub(r" \[[^\]]*\]$", "", label)


@cache
def shipped_labels() -> tuple[str, ...]:
    """The row labels of conf/objective's configs, each composed as `genrec.train objective=<name>` composes it."""
    labels = set()
    for p in sorted((CONF / "objective").glob("*.yaml")):
        cfg = compose_command([f"objective={p.stem}"])
        protocol = cfg.get("protocol")
        labels.add(objective_row(OmegaConf.to_container(cfg.objective, resolve=True),
                                 OmegaConf.to_container(protocol, resolve=True) if protocol is not None else None)[1])
    return tuple(sorted(labels))


def is_row_label(name: str) -> bool:
    """Whether `name` (any case) is a shipped objective's row label, or one of its variants ("BEAR (form=...)")."""
    def bare(label: str) -> str:  # without its recipe and variant suffixes, lower case
        return re.sub(r" \(.*\)$", "", base_label(label)).lower()

    return bare(name) in {bare(lab) for lab in shipped_labels()}


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def find_run_dirs(root: Path) -> list[Path]:
    """Dirs holding config.yaml (or .hydra/config.yaml: a job that died before writing it), not descended into."""
    if (root / "config.yaml").exists() or (root / ".hydra" / "config.yaml").exists():
        return [root]
    if not root.is_dir():
        return []
    return [d for c in sorted(root.iterdir()) if c.is_dir() and c.name not in SKIP_DIRS for d in find_run_dirs(c)]


def _choice(path: Path, group: str) -> str | None:
    f = path / ".hydra" / "hydra.yaml"
    return OmegaConf.select(OmegaConf.load(f), f"hydra.runtime.choices.{group}") if f.exists() else None


def overrides_of(path: Path) -> list[str] | None:
    """The run's command line: overrides.yaml (committed beside metrics.json) or Hydra's .hydra/overrides.yaml."""
    f = next((f for f in (path / "overrides.yaml", path / ".hydra" / "overrides.yaml") if f.exists()), None)
    return [str(o) for o in yaml.safe_load(f.read_text()) or []] if f else None


@cache
def composed(overrides: tuple[str, ...]) -> dict | None:
    """The config this genrec composes for a command line, unresolved; None when it no longer composes."""
    try:
        return OmegaConf.to_container(compose_command(overrides), resolve=False)
    except Exception:
        return None


def with_current_defaults(cfg: dict, overrides: list[str]) -> dict:
    """A config written by an older genrec, completed with the keys added since at the values the same command
    line composes today (a new key's default keeps the old behaviour; `with_added` first sets the keys whose
    preset values do not), so that its runs and today's runs of one experiment are one variant; keys the run
    has keep its values."""
    base = composed(tuple(overrides))
    if base is None:
        return cfg
    base = {k: v for k, v in base.items() if k not in BOOKKEEPING}
    return OmegaConf.to_container(OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(cfg)), resolve=False)


def load_run(path: Path, stale_minutes: float = 30.0) -> Run | None:
    f = path / "config.yaml" if (path / "config.yaml").exists() else path / ".hydra" / "config.yaml"
    raw = moved_targets(OmegaConf.to_container(OmegaConf.load(f)))
    if not isinstance(raw, dict) or not all(isinstance(raw.get(k), dict) for k in ("dataset", "backbone", "objective")):
        return None  # some other config.yaml
    for k in BOOKKEEPING:  # .hydra/config.yaml: interpolations only a Hydra app resolves
        raw.pop(k, None)
    raw = with_added(raw)
    if (overrides := overrides_of(path)) is not None:
        raw = with_current_defaults(raw, overrides)
    cfg = OmegaConf.create(raw)
    try:
        cfg = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # an interpolation this process cannot resolve: keep it as written
        cfg = OmegaConf.to_container(cfg, resolve=False)
    metrics, failed = read_json(path / "metrics.json"), read_json(path / "failed.json")
    if metrics is not None or failed is not None:  # train.py writes failed.json when a run raises
        status = "ok" if metrics is not None else "failed"
    else:
        files = [p for d in (path, path / "logs", path / "checkpoints") if d.is_dir() for p in d.iterdir()]
        newest = max((p.stat().st_mtime for p in files), default=0.0)
        status = "running" if time.time() - newest < stale_minutes * 60 else "failed"
    backbone = ((metrics or {}).get("backbone") or _choice(path, "backbone")
                or str(cfg["backbone"].get("_target_", "?")).rsplit(".", 1)[-1].lower())
    return Run(path, cfg, metrics, status, backbone, (failed or {}).get("error") if metrics is None else None)


def load_runs(paths: Sequence[str | Path], stale_minutes: float = 30.0) -> list[Run]:
    """The loader: run dirs under `paths` (a W&B loader would return the same Run records)."""
    dirs = dict.fromkeys(d.resolve() for p in paths for d in find_run_dirs(Path(p)))
    return [r for d in dirs if (r := load_run(d, stale_minutes)) is not None]
