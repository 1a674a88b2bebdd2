"""Run `genrec.train` with Hydra's clock pinned to one second (its microseconds left running), as if every process
started in that second: how tests/test_run_dirs.py starts runs "together" whatever the machine's speed.

    python tests/same_second.py [hydra overrides...]
"""

import datetime
import runpy
import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # this checkout's genrec, as `python -m` from its root
import hydra.core.utils  # noqa: E402


class SameSecond(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime.datetime.now(tz).replace(year=2030, month=1, day=1, hour=0, minute=0, second=0)


hydra.core.utils.datetime = SameSecond  # the `${now:...}` resolver's clock
runpy.run_module("genrec.train", run_name="__main__")
