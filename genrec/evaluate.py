"""Re-evaluate a trained run (other beam widths, full ranking, the other split).

    python -m genrec.evaluate ckpt=<run dir or .ckpt> eval.beam=50 eval.full_rank=true
    python -m genrec.evaluate -m ckpt=<run dir> eval.beam=10,20,50,100 'eval.ks=[5,10]'
    python -m genrec.evaluate ckpt=<run dir> eval.score=masked eval.temperature=2.0

Rebuilds the run's data, model and evaluator from its saved `config.yaml` (data artefacts come
from the cache; no training objective: an S-DPO run evaluates without its reference run), loads
the checkpoint's model weights, evaluates, and writes `<run dir>/eval/<split>-beam<K>.json`
(`...-<checkpoint name>.json` for a checkpoint other than the run's selected one, e.g. last.ckpt);
the last line printed is the same JSON object; per user ranks go to `<same name>.ranks.csv`. Every `eval.*`
key (beam, ks, full_rank, chunk, score, temperature) is the run's own unless this command sets it, one by
one or as a preset (`eval=bear`); ks or a scoring other than the run's are named in the file name
(`test-beam20-k5_10-masked-t2-full.json`), so evaluations of other settings never share a file. `split=val`
scores every validation user, also for a run that selected on a `trainer.val_users` sample, into
eval/val-beam<K>...json with `val/` keys (as the run's own validation metrics: `genrec.report split=val` reads them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import hydra
import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from genrec.cli import check_command_line
from genrec.config_check import ConfigError, check, evaluate_keys, refuse, with_eval
from genrec.data.datamodule import SeqDataModule
from genrec.data.readers.common import DataError
from genrec.eval.module import EvalModule
from genrec.prepare import prepare
from genrec.runs import checkpoint_path, load_backbone_state, run_config, write_json


def locate(ckpt: str) -> tuple[Path, Path]:
    """(run dir, checkpoint file) for a run dir or a checkpoint path."""
    try:  # the same lookup as init_from (e.g. S-DPO's stage 1)
        path = checkpoint_path(Path(ckpt).expanduser().resolve())
    except FileNotFoundError as e:
        raise DataError(f"ckpt={ckpt}: {e}") from None
    run_dir = path.parent.parent
    if not (run_dir / "config.yaml").exists():
        raise DataError(f"ckpt={ckpt}: {run_dir / 'config.yaml'} is missing (not a genrec run dir?)")
    return run_dir, path


def number(x: float) -> str:
    """`x` as its shortest exact text, without a trailing `.0` (1.0: `1`, 0.5: `0.5`)."""
    return repr(float(x)).removesuffix(".0")


def evaluate(cfg: DictConfig) -> dict:
    run_dir, ckpt = locate(cfg.ckpt)
    run_cfg = run_config(run_dir / "config.yaml")
    own = {"score": run_cfg.eval.get("score", "full"), "temperature": run_cfg.eval.get("temperature", 1.0)}
    own_ks = sorted(set(run_cfg.eval.ks))
    with open_dict(run_cfg):  # (runs from before eval.score scored `full` at temperature 1)
        run_cfg.eval = OmegaConf.merge(own, run_cfg.eval, evaluate_keys(cfg).eval)
        run_cfg.data_dir = cfg.data_dir
    check(with_eval(cfg, run_cfg.eval))  # e.g. eval.ks beyond the run's beam
    data = prepare(run_cfg, log=lambda m: print(m, file=sys.stderr))
    dm = SeqDataModule(data.seq, data.sids, run_cfg.dataset.max_history, cfg.batch_size, cfg.batch_size,
                       run_cfg.seed)
    module = EvalModule(run_cfg, data.sids)
    module.backbone.load_state_dict(load_backbone_state(ckpt))
    trainer = L.Trainer(accelerator=cfg.accelerator, devices=1, precision=run_cfg.trainer.precision,  # as the run
                        logger=False, enable_model_summary=False, use_distributed_sampler=False)
    split = cfg.split  # test | val: the namespace of the run's own metrics (val/recall@10)
    loader = dm.test_dataloader if split == "test" else dm.val_dataloader
    trainer.test(module, dataloaders=loader(), verbose=False)  # the test step, on the chosen split
    metrics = {f"{split}/{k}": v for k, v in module.last_metrics["test"].items()}
    score, temperature = module.evaluator.score, module.evaluator.temperature
    beam, full = run_cfg.eval.beam, run_cfg.eval.full_rank
    result = {**metrics, "beam": beam, "full_rank": full, "eval_score": score,
              "eval_temperature": temperature, "checkpoint": str(ckpt)}
    # every setting that changes the metrics, its own ks and scoring left out (the names of earlier evaluations)
    ks = sorted(set(module.evaluator.ks))
    at = "" if ks == own_ks else "-k" + "_".join(map(str, ks))
    scoring = "" if (score, temperature) == (own["score"], own["temperature"]) else f"-{score}-t{number(temperature)}"
    other = "" if ckpt == checkpoint_path(run_dir) else f"-{ckpt.stem}"  # not the run's selected checkpoint
    out = run_dir / "eval" / f"{split}-beam{beam}{at}{scoring}{'-full' if full else ''}{other}.json"
    out.parent.mkdir(exist_ok=True)
    write_json(out, result)
    examples = dm.splits["test" if split == "test" else "valid"]  # (the data stage names it `valid`)
    module.write_ranks(out.with_suffix(".ranks.csv"), examples)  # per user: genrec.report's paired test
    return result


def command_error(cfg: DictConfig) -> str | None:
    """The first thing wrong with the command, else None: ckpt missing, a bad value (a null eval key: the run's,
    checked once merged with it), a ckpt that is no run or checkpoint. For every job of a `-m` grid before the
    first one runs (`check_command_line`), and in each job."""
    if OmegaConf.is_missing(cfg, "ckpt") or not cfg.ckpt:
        return ("ckpt: missing: the run to evaluate, ckpt=<run dir or .ckpt> (a run dir: its checkpoints/best.ckpt, "
                "else last.ckpt)")
    try:
        check(cfg, trainer=True)
        locate(str(cfg.ckpt))
    except (ConfigError, DataError) as e:
        return str(e)
    return None


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    if bad := command_error(cfg):
        refuse(bad)
    try:
        result = evaluate(cfg)
    except (DataError, ConfigError) as e:  # a missing run; an eval key that does not fit the run's (eval.ks > beam)
        refuse(e)
    print(json.dumps(result))


if __name__ == "__main__":
    check_command_line("evaluate", check=command_error)  # a bad override or ckpt: one line, exit 2, before any job
    torch.set_float32_matmul_precision("high")  # as genrec.train: the same float32 matmuls as the run
    main()
