"""Every `python -m genrec.<x>` line of the README's bash blocks composes and passes the config check, each job
of a `-m` grid included: such a command copied from the README never fails on its config (placeholders such as
`<run dir>` are filled with a path). Commands inside prose or behind a launcher (`srun ...`) are not read."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser

from genrec.config_check import errors

ROOT = Path(__file__).parents[1]
CONFIG = {"genrec.train": "config", "genrec.prepare": "config", "genrec.download": "config",
          "genrec.evaluate": "evaluate", "genrec.report": "report"}
FLAGS = {"-m", "--multirun", "--cfg", "job", "--resolve"}


def readme_commands() -> list[tuple[str, list[str]]]:
    """(module, overrides) of each `python -m genrec.<x>` line in the README's bash blocks (continuations joined,
    comments dropped, `<placeholder>` values replaced by a path)."""
    text = (ROOT / "README.md").read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(re.sub(r"<[^>]*>", "outputs/x", line), comments=True)
            if words[:2] != ["python", "-m"] or words[2] not in CONFIG:
                continue
            out.append((words[2], [w for w in words[3:] if w not in FLAGS]))
    return out


COMMANDS = readme_commands()


def test_the_readme_shows_commands_of_every_entry_point():
    assert {m for m, _ in COMMANDS} >= {"genrec.train", "genrec.evaluate", "genrec.report", "genrec.prepare"}


@pytest.mark.parametrize("module, args", COMMANDS, ids=[" ".join([m, *a])[:80] for m, a in COMMANDS])
def test_readme_command_composes_and_passes_the_config_check(module, args):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        parsed = OverridesParser.create(config_loader=loader).parse_overrides(args)
        jobs = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
        assert jobs
        for job in jobs:
            cfg = compose(CONFIG[module], overrides=list(job))
            assert errors(cfg) == [], (job, errors(cfg))
