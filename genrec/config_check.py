"""Check the composed config before any work starts: a bad value is one line,
`error: <key>=<value>: <what is allowed>`, and exit code 2.

`CHECKS` maps a dotted key to what it allows; a key is checked only where the config has it
(groups differ: `objective.loss` exists for APAO only, `split` for `genrec.evaluate` only).
Adding a key is one line. `CROSS` holds the checks that relate two keys. `REPORT_CHECKS`: genrec.report's keys.
A `-m` sweep checks every job's config before the first one runs (`SweepCheck`, registered in `hydra.callbacks`).
`python -m genrec.config_check <overrides> [-- <overrides> ...]` checks genrec.train command lines without
running them (one `ok` or `error:` line each).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn, Sequence

from hydra.experimental.callback import Callback
from hydra._internal.utils import _locate
from hydra.utils import get_method
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from genrec.data.readers.common import is_reader
from genrec.eval.metrics import lower_is_better
from genrec.models.llama_block import heads_fit
from genrec.runs import held_elsewhere, state_per_micro_batch

Check = Callable[[Any], bool]
CONF = Path(__file__).resolve().parent.parent / "conf"


class ConfigError(ValueError):
    """`key=value: what is allowed`."""


def integer(lo: int = 1) -> tuple[Check, str]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo, f"an integer >= {lo}"


def number(gt: float | None = None, ge: float | None = None, lt: float | None = None,
           le: float | None = None) -> tuple[Check, str]:
    def ok(v):
        return (isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
                and (gt is None or v > gt) and (ge is None or v >= ge)
                and (lt is None or v < lt) and (le is None or v <= le))

    bounds = [f"{op} {b}" for op, b in ((">", gt), (">=", ge), ("<", lt), ("<=", le)) if b is not None]
    return ok, "a number " + " and ".join(bounds)


def one_of(*choices: str) -> tuple[Check, str]:
    return lambda v: v in choices, "one of " + ", ".join(choices)


def or_null(check: tuple[Check, str]) -> tuple[Check, str]:
    return lambda v: v is None or check[0](v), f"{check[1]}, or null"


def integers(lo: int = 1) -> tuple[Check, str]:
    ok = integer(lo)[0]
    return lambda v: isinstance(v, list) and all(map(ok, v)), f"a list of integers >= {lo}"


def share_or_count() -> tuple[Check, str]:  # Lightning's limit_*_batches (0 would skip the stage: refused)
    count, share = integer(1)[0], number(gt=0, le=1)[0]
    return (lambda v: count(v) or isinstance(v, float) and share(v),
            "a share in (0.0, 1.0] or a number of batches >= 1")


POSITIVE, POSITIVE_NUMBER = integer(1), number(gt=0)
BOOL: tuple[Check, str] = (lambda v: isinstance(v, bool), "true or false")
CHECKS: dict[str, tuple[Check, str]] = {
    "seed": integer(0),
    "resume": (lambda v: v is None or isinstance(v, bool) or isinstance(v, str) and bool(v),
               "true, false (or null) or a run dir"),
    "logger.log_model": (lambda v: isinstance(v, bool) or v == "all", "true, false or all (W&B: every checkpoint)"),
    "dataset.strict": BOOL,
    "dataset.kcore": integer(1),
    "dataset.split": one_of("loo", "sliding"),
    "dataset.max_history": POSITIVE,
    "tokenizer.levels": POSITIVE,
    "tokenizer.codebook_size": integer(2),
    "tokenizer.iters": POSITIVE,
    "tokenizer.collision": one_of("extra_token", "merge"),
    "tokenizer.disambiguate": BOOL,
    "embedder.normalize": BOOL,
    "backbone.tie_embeddings": BOOL,
    "protocol.end_token": BOOL,
    "objective.end_token": BOOL,
    "objective.masked": BOOL,
    "objective.correction": BOOL,
    "objective.mask_collisions": BOOL,
    "backbone.d_model": POSITIVE,
    "backbone.num_layers": POSITIVE,
    "backbone.num_decoder_layers": POSITIVE,
    "backbone.num_heads": POSITIVE,
    "backbone.d_ff": POSITIVE,
    "backbone.d_kv": POSITIVE,
    "backbone.hidden_size": POSITIVE,
    "backbone.num_kv_heads": POSITIVE,
    "backbone.intermediate_size": POSITIVE,
    "backbone.dropout": number(ge=0, lt=1),
    "backbone.feed_forward_proj": one_of("relu"),  # TIGER: T5 v1.0's only
    "backbone.memory": one_of("manual", "checkpoint", "none"),  # Llama: checkpoint | none
    "backbone.memory_users": or_null(POSITIVE),
    "backbone.memory_under_autocast": or_null(BOOL),
    "objective.loss": one_of("pointwise", "pairwise", "pairwise_printed"),  # pairwise_printed: formerly listwise
    "objective.weights": one_of("paper", "released", "uniform", "hardmax"),
    "objective.form": one_of("regularizer", "reweight"),
    "objective.negatives.kind": one_of("uniform", "popularity", "hard", "beam"),
    "objective.negatives.refresh_every": POSITIVE,
    "objective.negatives.pool": POSITIVE,
    "objective.num_negatives": POSITIVE,
    "objective.temperature": POSITIVE_NUMBER,
    "objective.prefix_temperature": POSITIVE_NUMBER,
    "objective.beta": number(ge=0),
    "objective.eta": number(ge=0),
    "objective.beta_dpo": POSITIVE_NUMBER,
    "objective.lam": number(ge=0),
    "objective.xi": POSITIVE_NUMBER,
    "objective.beam": or_null(POSITIVE),
    "objective.bear": (lambda v: v is None or isinstance(v, dict), "null or {lam, xi, beam, widths} (lam: 0 = off)"),
    "objective.bear.lam": number(ge=0),
    "objective.bear.xi": POSITIVE_NUMBER,
    "objective.bear.beam": or_null(POSITIVE),
    "objective.widths": or_null(integers(1)),
    "objective.bear.widths": or_null(integers(1)),
    "eval.beam": POSITIVE,
    "eval.chunk": POSITIVE,
    "eval.full_rank": or_null(BOOL),  # null: the run's own (genrec.evaluate)
    "eval.score": or_null(one_of("full", "masked")),  # null: the run's own (genrec.evaluate)
    "eval.temperature": or_null(POSITIVE_NUMBER),
    "trainer.max_epochs": POSITIVE,
    "trainer.patience": integer(0),
    "trainer.batch_size": POSITIVE,
    "trainer.accumulate": POSITIVE,
    "protocol.micro_batches": or_null(POSITIVE),  # a reproduced recipe's micro-batches per step
    "trainer.eval_batch_size": POSITIVE,
    "trainer.gradient_clip": or_null(number(gt=0)),
    "trainer.num_nodes": POSITIVE,
    "trainer.num_workers": integer(0),
    "trainer.check_val_every_n_epoch": POSITIVE,
    "trainer.val_users": or_null(POSITIVE),
    "trainer.length_window": POSITIVE,
    "trainer.limit_train_batches": share_or_count(),
    "trainer.limit_val_batches": share_or_count(),
    "trainer.limit_test_batches": share_or_count(),
    "trainer.log_every_n_steps": POSITIVE,
    "trainer.monitor_mode": one_of("max", "min"),
    "trainer.validate": one_of("beam", "loss"),
    "trainer.clip_on": one_of("mean", "sum"),
    "trainer.memory_check": BOOL,
    "trainer.deterministic": (lambda v: isinstance(v, bool) or v == "warn", "true, false or warn"),
    "trainer.pin_memory": BOOL,
    "trainer.keep_freed_memory": BOOL,
    "trainer.progress_bar": BOOL,
    "optim.lr": POSITIVE_NUMBER,
    "optim.weight_decay": number(ge=0),
    "optim.eps": POSITIVE_NUMBER,
    "optim.betas": (lambda v: isinstance(v, list) and len(v) == 2 and all(number(ge=0, lt=1)[0](b) for b in v),
                    "two numbers in [0, 1)"),
    "optim.warmup": number(ge=0, lt=1),
    "optim.min_lr_ratio": number(ge=0, le=1),
    "optim.cooldown": number(gt=0, le=1),
    "callbacks.ema.decay": number(ge=0, lt=1),  # conf/callbacks/ema.yaml
    "callbacks.ema.update_starting_at_step": or_null(integer(0)),
    "callbacks.late_dropout.start_epoch": integer(0),  # conf/callbacks/late_dropout.yaml
    "callbacks.late_dropout.p": number(ge=0, lt=1),
    "split": one_of("test", "val"),  # genrec.evaluate (val: as the run's own val/ metrics and genrec.report's split)
    "batch_size": POSITIVE,  # genrec.evaluate
}


def _ks_within_beam(cfg: DictConfig) -> str | None:
    ks, beam = _get(cfg, "eval.ks"), _get(cfg, "eval.beam")
    if ks is _ABSENT or not POSITIVE[0](beam):
        return None
    if not (isinstance(ks, list) and ks and all(POSITIVE[0](k) and k <= beam for k in ks)):
        return f"eval.ks={_show(ks)}: a non-empty list of integers from 1 to eval.beam ({beam})"
    return None


MONITOR = re.compile(r"val/(?:(?P<loss>loss|objective_loss|last_batch_loss@[1-9]\d*)|(?P<full>full/)?(?:recall|ndcg)@(?P<k>\d+)"
                     r"|prefix_recall@\d+|pruning_rate@(?P<pk>\d+)|(?P<users>users))")


def _monitor_is_logged(cfg: DictConfig) -> str | None:
    """`trainer.monitor` names a value validation logs, in the direction `trainer.monitor_mode` optimises."""
    monitor, ks, mode = _get(cfg, "trainer.monitor"), _get(cfg, "eval.ks"), _get(cfg, "trainer.monitor_mode")
    if monitor is _ABSENT:
        return None
    m = MONITOR.fullmatch(str(monitor))
    if not m:
        return (f"trainer.monitor={monitor}: val/loss, val/objective_loss, val/last_batch_loss@B, val/recall@k, "
                f"val/ndcg@k, val/prefix_recall@m, or with eval.full_rank=true val/full/recall@k, val/full/ndcg@k, "
                f"val/pruning_rate@k")
    if _get(cfg, "trainer.validate") == "loss" and not (m["users"] or m["loss"]):
        return (f"trainer.monitor={monitor}: trainer.validate=loss logs only val/loss, val/objective_loss, "
                "val/last_batch_loss@B and val/users (monitor one of them, or trainer.validate=beam)")
    k = m["k"] or m["pk"]
    if k and isinstance(ks, list) and int(k) not in ks:
        return f"trainer.monitor={monitor}: a logged validation metric, @k with k in eval.ks ({_show(ks)})"
    if (m["full"] or m["pk"]) and _get(cfg, "eval.full_rank") is not True:
        return f"trainer.monitor={monitor}: logged only with eval.full_rank=true"
    want = "min" if lower_is_better(monitor) else "max"
    if mode in ("max", "min") and mode != want and not m["users"]:
        return f"trainer.monitor_mode={mode}: {monitor} is {'minimised' if want == 'min' else 'maximised'} (use {want})"
    return None


def _heads_fit(cfg: DictConfig) -> str | None:
    """Llama's heads, as the model itself requires them (genrec.models.llama_block.heads_fit)."""
    hidden, heads, kv = (_get(cfg, f"backbone.{k}") for k in ("hidden_size", "num_heads", "num_kv_heads"))
    if not all(POSITIVE[0](v) for v in (hidden, heads, kv)) or heads_fit(hidden, heads, kv):
        return None
    return (f"backbone.num_heads={heads}: a multiple of backbone.num_kv_heads ({kv}) that splits "
            f"backbone.hidden_size ({hidden}) into an even head size (RoPE)")


def _sdpo_has_a_start(cfg: DictConfig) -> str | None:
    """S-DPO fine-tunes a trained run (its frozen reference): init_from or a stage 1."""
    if not str(_get(cfg, "objective._target_")).endswith(".SDPO"):
        return None
    if _get(cfg, "init_from") in (None, _ABSENT) and _get(cfg, "stage1") in (None, _ABSENT):
        return "objective=sdpo: init_from=<a CE run dir or .ckpt> (S-DPO's start and reference), or objective=sdpo_2stage"
    return None


def _stage1_is_an_objective(cfg: DictConfig) -> str | None:
    name = _get(cfg, "stage1")
    names = sorted(p.stem for p in (CONF / "objective").glob("*.yaml"))
    if name in (None, _ABSENT) or name in names:
        return None
    return f"stage1={_show(name)}: an objective of conf/objective/ ({', '.join(names)})"


def _micro_batches_as_the_recipe(cfg: DictConfig) -> str | None:
    """A preset reproducing another code's steps names its micro-batches per optimizer step
    (`protocol.micro_batches`); an objective whose state moves once per micro-batch there (APAO's prefix
    weights) replays those moves only if every micro-batch of ours, on every process, holds a whole number of
    them: protocol.micro_batches = trainer.accumulate x processes x chunks, trainer.batch_size a multiple of
    chunks (e.g. the release's 8 x 128 as 2 x 2 processes x 256, cut into 2 chunks)."""
    want, accumulate = _get(cfg, "protocol.micro_batches"), _get(cfg, "trainer.accumulate")
    target, objective = _get(cfg, "objective._target_"), _get(cfg, "objective")
    counts = all(isinstance(v, int) and v >= 1 for v in (want, accumulate))  # else CHECKS names the bad one
    if not counts or target is _ABSENT or not isinstance(objective, dict):
        return None
    if not (state := state_per_micro_batch(objective)):
        return None
    moves = (f"{target.rsplit('.', 1)[-1]} sets {state} once per micro-batch, "
             f"protocol.micro_batches={want} times per step")
    anyway = "protocol.micro_batches=null to run it anyway, not as the recipe"
    devices, nodes, batch = (_get(cfg, f"trainer.{k}") for k in ("devices", "num_nodes", "batch_size"))
    known = all(isinstance(v, int) and v >= 1 for v in (devices, nodes))
    processes = devices * nodes if known else 1  # "auto", a list of devices: APAO checks at run time
    if want % (accumulate * processes):
        return (f"trainer.accumulate={accumulate}: {moves} in this recipe, not a multiple of trainer.accumulate x "
                f"{processes} process(es) ({anyway})")
    chunks = want // (accumulate * processes)
    if isinstance(batch, int) and batch % chunks:
        return (f"trainer.batch_size={batch}: {moves} in this recipe, i.e. {chunks} equal chunks of each micro-batch "
                f"here ({anyway})")
    return None


def _reader_is_a_reader(cfg: DictConfig) -> str | None:
    """`dataset.reader._target_` is importable and follows `genrec.data.readers.common.Reader`."""
    target = _get(cfg, "dataset.reader._target_")
    if target is _ABSENT:
        return None
    try:
        fn = get_method(str(target))
    except Exception:
        return f"dataset.reader._target_={target}: not an importable function (e.g. genrec.data.readers.lcrec.read)"
    if not is_reader(fn):
        return f"dataset.reader._target_={target}: a reader takes strict= and returns RawData (genrec.data.readers.common.Reader)"
    return None


def _callbacks_keep_checkpoints(cfg: DictConfig) -> str | None:
    """Resume, the final test and metrics.json need <run dir>/checkpoints (genrec.callbacks.Checkpoints)."""
    callbacks = _get(cfg, "callbacks")
    if callbacks is _ABSENT or any(isinstance(c, dict) and c.get("_target_") == "genrec.callbacks.Checkpoints"
                                   for c in (callbacks or {}).values()):
        return None
    return (f"callbacks=[{','.join(callbacks or {})}]: one of them genrec.callbacks.Checkpoints "
            f"(conf/callbacks/checkpoints.yaml: best.ckpt, last.ckpt), e.g. callbacks=[default,...]")


def _targets(node: Any, key: str = "") -> Iterator[tuple[str, dict]]:
    """(dotted key, node) of every node with a `_target_` in a config container (Hydra's own `hydra` left out)."""
    if isinstance(node, list):
        for i, value in enumerate(node):
            yield from _targets(value, f"{key}[{i}]")
    elif isinstance(node, dict):
        if "_target_" in node:
            yield key, node
        for k, value in node.items():
            if key or k != "hydra":
                yield from _targets(value, f"{key}.{k}" if key else str(k))


def _near(name: str, names) -> str:
    close = difflib.get_close_matches(name, list(names), 1)
    return f" (did you mean {close[0]}?)" if close else ""


def _constructor_arguments(cfg: DictConfig) -> str | None:
    """Every key of every node with a `_target_` (objective, backbone, eval, tokenizer, embedder, dataset.reader,
    logger, trainer.lightning, callbacks, ...) is an argument of its target: genrec instantiates each node whole, so
    a typo would fail only once it is built, after the data stage. `_` keys are Hydra's (a `_partial_` node takes the
    same arguments); `**kwargs` take any key, but not `**legacy` (the backbones': saved configs' former keys)."""
    for key, node in _targets(OmegaConf.to_container(cfg)):
        target = node["_target_"]
        try:
            made = _locate(str(target))
        except Exception:
            return f"{key}._target_={target}: an importable class or function"
        try:
            params = inspect.signature(made).parameters
        except (TypeError, ValueError):  # no signature to check against (some builtins)
            continue
        if any(p.kind == p.VAR_KEYWORD and p.name != "legacy" for p in params.values()):
            continue
        for arg in node:
            if not arg.startswith("_") and arg not in params:
                return f"{key}.{arg}: not an argument of {target}" + _near(arg, params)
    return None


@functools.cache
def _option_keys(group: str) -> frozenset[str]:
    """The keys the options of conf/<group>/ set."""
    return frozenset(k for p in (CONF / group).glob("*.yaml") for k in OmegaConf.load(p) if k != "defaults")


def _group_keys(cfg: DictConfig) -> str | None:
    """Groups genrec reads key by key (no `_target_`) take only keys an option of theirs sets: a `+` key no
    option has (`+optim.lrr=...`) is read by no code."""
    for group in ("dataset", "optim", "trainer"):
        node, known = cfg.get(group), _option_keys(group)
        for key in node.keys() if isinstance(node, DictConfig) else []:
            if key not in known:
                return f"{group}.{key}: not read by genrec, no conf/{group}/*.yaml has it" + _near(key, known)
    return None


CROSS: list[Callable[[DictConfig], str | None]] = [_ks_within_beam, _monitor_is_logged, _heads_fit, _sdpo_has_a_start,
                                                   _micro_batches_as_the_recipe, _stage1_is_an_objective, _reader_is_a_reader,
                                                   _callbacks_keep_checkpoints, _constructor_arguments,
                                                   _group_keys]

REPORT_METRIC = re.compile(r"(?:full/)?(?:recall|ndcg)@[1-9]\d*|(?:prefix_recall|pruning_rate|last_batch_loss)@[1-9]\d*"
                           r"|(?:objective_)?loss|users")
REPORT_CHECKS: dict[str, tuple[Check, str]] = {  # genrec.report's keys (conf/report.yaml)
    "metrics": (lambda v: isinstance(v, list) and bool(v) and all(REPORT_METRIC.fullmatch(str(m)) for m in v),
                "a non-empty list of recall@k, ndcg@k, full/recall@k, full/ndcg@k, prefix_recall@m, pruning_rate@k, "
                "loss, objective_loss, last_batch_loss@B, users"),
    "split": (one_of("test", "val")[0], "one of test, val (metrics.json's test or best-epoch validation metrics)"),
    "wandb": BOOL,
    "baseline": (lambda v: isinstance(v, str) and bool(v), "an objective's row label, e.g. ce"),
    "select": or_null((lambda v: isinstance(v, str) and bool(MONITOR.fullmatch(v)), "a logged validation key, "
                       "e.g. val/ndcg@10")),
    "stale_minutes": number(ge=0),
}

_ABSENT = object()


def _get(cfg: DictConfig, key: str) -> Any:
    try:
        value = OmegaConf.select(cfg, key, default=_ABSENT)
    except Exception:  # an interpolation that only resolves inside the running job (${hydra:...})
        return _ABSENT
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def _show(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(map(_show, v)) + "]"
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def with_eval(cfg: DictConfig, eval_cfg: dict | DictConfig) -> DictConfig:
    """A copy of `cfg` with its `eval` replaced (the other keys kept)."""
    out = cfg.copy()
    with open_dict(out):
        out.eval = eval_cfg
    return out


def evaluate_keys(cfg: DictConfig) -> DictConfig:
    """genrec.evaluate's config (it has `ckpt`) with only the `eval.*` keys its command sets: a null one is the
    run's own (checked again once merged with the run's). Any other config as it is."""
    if "ckpt" not in cfg.keys() or not isinstance(cfg.get("eval"), DictConfig):  # (a `???` ckpt is not `in` cfg)
        return cfg
    return with_eval(cfg, {k: v for k, v in cfg.eval.items() if v is not None})


def errors(cfg: DictConfig, report: bool = False) -> list[str]:
    """Every bad value as `key=value: what is allowed`, table order, then the cross checks (`report`:
    genrec.report's config, REPORT_CHECKS)."""
    cfg = evaluate_keys(cfg)
    checks, cross_checks = (REPORT_CHECKS, []) if report else (CHECKS, CROSS)
    out = []
    for key, (ok, allowed) in checks.items():
        value = _get(cfg, key)
        if value is not _ABSENT and not ok(value):
            out.append(f"{key}={_show(value)}: {allowed}")
    return out + [e for e in (cross(cfg) for cross in cross_checks) if e]


DEVICE_ARGS = ("accelerator", "devices", "strategy", "precision", "num_nodes")


def bare_trainer(args: dict):
    """Lightning's Trainer of these device arguments alone (no logger, callbacks or output): what they resolve to
    on this machine (accelerator, number of processes), or Lightning's exception."""
    import warnings

    import lightning as L

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return L.Trainer(**args, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)


def device_args(cfg: DictConfig) -> dict:
    """The Trainer's device arguments of genrec.train's `trainer.lightning` or genrec.evaluate's keys."""
    node = _get(cfg, "trainer.lightning")
    node = node if isinstance(node, dict) else {k: v for k in DEVICE_ARGS if (v := _get(cfg, k)) is not _ABSENT}
    return {k: node[k] for k in DEVICE_ARGS if k in node}


def trainer_errors(cfg: DictConfig) -> list[str]:
    """What Lightning's Trainer refuses of the accelerator, devices, strategy, precision and num_nodes (genrec.train's
    `trainer.lightning`, genrec.evaluate's `accelerator`) on THIS machine (devices=0, a misspelt precision,
    accelerator=gpu without a GPU), found by building a bare Trainer from them: before the data stage rather than
    after it. Not part of `errors`: a GPU command line checks fine on a CPU machine (genrec.config_check's CLI)."""
    args = device_args(cfg)
    if not args:
        return []
    import logging

    def refused(some: dict) -> str | None:
        try:
            bare_trainer(some)
        except Exception as e:
            return " ".join(str(e).split())
        return None

    log = logging.getLogger("lightning.pytorch")
    level = log.level
    log.setLevel(logging.ERROR)  # no "GPU available: ..." lines twice
    try:
        for i, key in enumerate(args):  # name the first argument whose addition Lightning refuses
            if (reason := refused(dict(list(args.items())[: i + 1]))) is not None:
                source = next((k for k in (f"trainer.{key}", key) if _get(cfg, k) == args[key]),
                              f"trainer.lightning.{key}")
                return [f"{source}={_show(args[key])}: {reason}"]
    finally:
        log.setLevel(level)
    return []


def check(cfg: DictConfig, trainer: bool = False, report: bool = False) -> None:
    """Raise ConfigError with the first bad value; `trainer`: also what the Trainer refuses on this machine
    (genrec.train, genrec.evaluate); `report`: genrec.report's keys."""
    bad = errors(cfg, report) or (trainer_errors(cfg) if trainer else [])
    if bad:
        raise ConfigError(bad[0])


def exit_if_invalid(cfg: DictConfig, trainer: bool = False, report: bool = False) -> None:
    """The entry points' first step: one line on stderr and exit code 2, no traceback, no run dir left."""
    try:
        check(cfg, trainer, report)
    except ConfigError as e:
        refuse(e)


def refuse(error: Exception | str) -> NoReturn:
    """Stop a single run on bad config or input: `error: ...` on stderr, exit code 2, no run dir left."""
    forget_run_dir()
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


def forget_run_dir() -> None:
    """Remove the run dir Hydra made for a refused single run if it holds only Hydra's own files (.hydra/, its
    processes' *.log) and genrec.train's record of its command (overrides.yaml) and claim (.lock), so no report lists
    it as a running, later failed, run. A dir holding anything else, or that another live run holds (a run in its
    data stage has written nothing else yet), is kept."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode == RunMode.MULTIRUN:
        return
    hydra = HydraConfig.get()
    out = Path(hydra.runtime.output_dir)
    if out.resolve() == Path.cwd().resolve():  # e.g. `genrec.report out=.`: never the folder the user works in
        return
    ours = (".hydra", "overrides.yaml", ".lock")
    if out.is_dir() and all(p.name in ours or p.suffix == ".log" for p in out.iterdir()) and not held_elsewhere(out):
        shutil.rmtree(out, ignore_errors=True)
        cwd = Path.cwd().resolve()
        for parent in out.resolve().parents:  # outputs/eval/ left empty by it, up to the working folder
            if parent == cwd or cwd not in parent.parents or any(parent.iterdir()):
                break
            parent.rmdir()


class SweepCheck(Callback):
    """Checks every job of a `-m` sweep before the first one runs (basic sweeper grids; other
    sweepers choose values while they run, and each job checks its own config)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.override_parser.overrides_parser import OverridesParser

        loader = GlobalHydra.instance().config_loader()
        params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
        overrides = params + list(config.hydra.overrides.task)
        try:
            jobs = grid_jobs(OverridesParser.create(config_loader=loader).parse_overrides(overrides)) or []
        except Exception:  # not parsed here: check what is fixed already
            jobs = []
        for job in jobs or [None]:  # not a grid (e.g. Optuna's interval()): what is fixed already
            exit_if_invalid(config if job is None else loader.load_sweep_config(config, job))


def grid_jobs(parsed: list) -> list[list[str]] | None:
    """The jobs (each a list of `key=value`) of the basic sweeper's grid over parsed overrides; None where they are
    not a grid (e.g. Optuna's interval())."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    try:
        return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    except Exception:
        return None


def compose_command(overrides: Sequence[str], config_name: str = "config") -> DictConfig:
    """The config (genrec.train's; `config_name`: another tool's) for a command line's overrides (hydra.* left out),
    unresolved; Hydra's exception when it does not compose. Inside a Hydra app (python -m genrec.report) conf/ is
    already its config path."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    args = [o for o in overrides if not o.lstrip("+~").startswith("hydra.")]
    if GlobalHydra.instance().is_initialized():
        return compose(config_name, overrides=args)
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose(config_name, overrides=args)


def verdict(overrides: list[str]) -> str:
    """`ok` or `error: ...` for genrec.train's config of one command line."""
    from genrec.cli import one_line

    try:
        cfg = compose_command(overrides)
    except Exception as e:  # a bad override, named as the command line itself names it
        return f"error: {one_line('config', overrides, e)}"
    bad = errors(cfg)
    return f"error: {bad[0]}" if bad else "ok"


def main(args: list[str]) -> None:
    """One line per command line (`a=1 b=2 -- a=3`: two), `ok` or `error: ...`; exit code 2 if any is bad.
    Single runs: a `-m` grid's jobs are checked by genrec.train itself."""
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        sys.exit(0)
    commands, current = [], []
    for a in args + ["--"]:
        if a == "--":
            commands.append(current)
            current = []
        else:
            current.append(a)
    lines = [verdict(c) for c in [c for c in commands if c] or [[]]]  # no arguments: the default config
    print("\n".join(lines))
    sys.exit(2 if any(line != "ok" for line in lines) else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
