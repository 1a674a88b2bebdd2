"""A command line that does not compose (an unknown key, a config group option that does not exist, a sweep value
without `-m`) as one line, `error: <override>: ...`, and exit code 2, before Hydra starts (Hydra's own message
spans 5-15 lines and exits 1). Every entry point calls `check_command_line(<its config name>)` first.

    python -m genrec.train eval.bem=5       ->  error: eval.bem=5: no key eval.bem (did you mean eval.beam?)
    python -m genrec.train objective=apoa   ->  error: objective=apoa: not an option of objective (did you mean
                                                apao?): apao, apao_pairwise, apao_pointwise, bear, ce, ...
"""

from __future__ import annotations

import difflib
import re
import sys
from typing import Callable

from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig

from genrec.config_check import CONF, compose_command, grid_jobs

HYDRA_FLAGS = ("-m", "--multirun")  # any other flag (--cfg, --help, --config-name, ...) is left to Hydra
# The configs of pyproject.toml's cluster extra's Hydra plugins (hydra-submitit-launcher, hydra-optuna-sweeper)
CLUSTER_PLUGINS = ("hydra/launcher/submitit_slurm", "hydra/launcher/submitit_local", "hydra/sweeper/optuna")


def _jobs(overrides: list[str]) -> list[list[str]]:
    """The command lines to compose for a `-m` grid: each value of each swept key in at least one of them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)  # a bad override raises here, named
    grid = grid_jobs(parsed)
    if grid is None:  # not a grid (e.g. Optuna's interval()): its fixed values only
        return [[o.input_line for o in parsed if not o.is_sweep_override()]]
    seen, chosen = set(), []
    for job in grid:
        if not set(job) <= seen:
            chosen.append(job)
            seen |= set(job)
    return chosen or [[]]


def one_line(config_name: str, overrides: list[str], error: Exception) -> str:
    """Hydra's message for `error`, as one line naming the override."""
    message = str(error).split("Config search path")[0]
    if isinstance(error, MissingConfigException) and (m := re.search(r"Could not (find|load) '([^']+)/([^'/]+)'",
                                                                      message)):
        listed, group, option = m.group(1) == "load", m.group(2), m.group(3)  # load: one option of a list
        given = next((o for o in overrides if o.lstrip("+~").split("=")[0] == group), f"{group}={option}")
        if f"{group}/{option}" in CLUSTER_PLUGINS:
            return f'{given}: {group}/{option} is a Hydra plugin that is not installed: pip install ".[cluster]"'
        options = (sorted(f.stem for f in (CONF / group).glob("*.yaml")) if listed
                   else re.findall(r"^\t(\S+)$", message, flags=re.M))
        close = difflib.get_close_matches(option, options, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return f"{given}: {option + ' is ' if listed else ''}not an option of {group}{hint}: {', '.join(options)}"
    if isinstance(error, ConfigCompositionException) and (m := re.match(r"Could not override '([^']+)'", message)):
        key = m.group(1)
        given = next((o for o in overrides if o.split("=")[0] == key), key)
        if "/" in key:
            return f"{given}: no config group {key}"
        parent, _, name = key.rpartition(".")
        try:
            groups = [o for o in overrides if (CONF / o.lstrip("+").split("=")[0].replace(".", "/")).is_dir()]
            node = compose_command(groups, config_name)  # the config's shape: its group choices
            for part in parent.split(".") if parent else []:
                node = node[part]
            keys = list(node.keys()) if isinstance(node, DictConfig) else []
        except Exception:  # e.g. a bad group choice as well: the key alone
            keys = []
        close = difflib.get_close_matches(name, keys, n=1)
        hint = (f" (did you mean {parent + '.' if parent else ''}{close[0]}?)" if close
                else f" ({parent or 'the config'} has {', '.join(map(str, keys))})" if keys else "")
        return f"{given}: no key {key}{hint}; +{given.lstrip('+')} adds one"
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


def check_command_line(config_name: str, argv: list[str] | None = None,
                       check: Callable[[DictConfig], str | None] | None = None) -> None:
    """Compose `config_name` with the command line's overrides (each value of a `-m` grid once; `hydra.*` keys are
    Hydra's own, its `hydra/` groups are composed too); one line and exit 2 if it does not compose, or if `check`
    finds an error in a composed config (e.g. genrec.evaluate's ckpt: so a grid is refused before its first job)."""
    args = sys.argv[1:] if argv is None else argv
    if any(a.startswith("-") and a not in HYDRA_FLAGS for a in args):
        return
    overrides = [a for a in args if a not in HYDRA_FLAGS and not a.lstrip("+~").startswith("hydra.")]
    job = overrides  # what a parse error names (_jobs raises before any job)
    try:
        for job in _jobs(overrides) if any(a in HYDRA_FLAGS for a in args) else [overrides]:
            cfg = compose_command(job, config_name)
            if check and (bad := check(cfg)):
                print(f"error: {bad}", file=sys.stderr)
                sys.exit(2)
    except (ConfigCompositionException, MissingConfigException, OverrideParseException) as e:
        print(f"error: {one_line(config_name, job, e)}", file=sys.stderr)
        sys.exit(2)


def without_run_dir() -> None:
    """For a tool that is not an experiment (its output lives in the data cache): no Hydra run folder under outputs/
    for a report to list, no log file. Set before the command line's own `hydra.*` overrides, which still win."""
    sys.argv[1:1] = ["hydra.run.dir=.", "hydra.output_subdir=null",
                     "hydra/job_logging=none", "hydra/hydra_logging=none"]
