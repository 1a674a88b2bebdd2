"""`python -m genrec.report`: conf/report.yaml's settings -> genrec.report.report (+ W&B)."""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from genrec.cli import check_command_line
from genrec.config_check import exit_if_invalid, refuse
from genrec.report import UnknownBaseline, report
from genrec.report.page import rebuild_command
from genrec.report.wandb_runs import resolve, run_group


def reference(path: str | None) -> dict | None:
    """The reference numbers file (`paper=`): {dataset: {backbone: {objective label: {metric: value}}}}.
    ValueError naming the file and the first bad key when it is missing or malformed."""
    if not path:
        return None
    try:
        ref = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as e:  # missing file, YAML syntax (the message names the line)
        raise ValueError(f"paper={path}: {type(e).__name__}: {e}".splitlines()[0]) from e

    def bad(node, keys: list[str]) -> str | None:
        """The first key path that is not dataset.backbone.objective.metric: number."""
        if len(keys) == 4:
            return None if isinstance(node, (int, float)) and not isinstance(node, bool) else ".".join(keys)
        if not isinstance(node, dict) or not node:
            return ".".join(keys) or "(top level)"
        return next((b for k, v in node.items() if (b := bad(v, keys + [str(k)]))), None)

    if where := bad(ref, []):
        raise ValueError(f"paper={path}: expected dataset: backbone: objective: metric: number, not at {where}")
    return ref


@hydra.main(version_base="1.3", config_path="../../conf", config_name="report")
def main(cfg: DictConfig) -> None:
    exit_if_invalid(cfg, report=True)
    runs = [cfg.runs] if isinstance(cfg.runs, str) else list(cfg.runs)
    try:
        paper = reference(cfg.get("paper"))
        sources, runs = runs, resolve(runs, Path(cfg.out))  # wandb:<entity>/<project>[/<group>] -> run dirs
    except ValueError as e:
        refuse(e)
    try:
        s = report(runs, cfg.out, list(cfg.metrics), cfg.baseline, cfg.split, cfg.select, cfg.stale_minutes,
                   paper=paper, page=cfg.page, page_intro=cfg.page_intro,
                   rebuild=rebuild_command(OmegaConf.to_container(cfg, resolve=True)))
    except (FileNotFoundError, UnknownBaseline) as e:
        refuse(e)
    print((Path(cfg.out) / "table.md").read_text())
    print("\n".join(s["notes"] + [f"runs: {s['runs']}", f"wrote {cfg.out}/: " + ", ".join(s["files"])]
                    + ([f"wrote the page {s['page']}"] if "page" in s else [])))
    if cfg.wandb:
        from genrec.loggers import log_report

        group = run_group(sources[0]) if len(sources) == 1 else None  # one sweep: the report joins its runs' group
        print(f"W&B run: {log_report(Path(cfg.out), s, cfg.wandb_project, group)} (offline: `wandb sync` it)")


if __name__ == "__main__":
    check_command_line("report")  # an override that does not compose: one line, exit 2
    main()
