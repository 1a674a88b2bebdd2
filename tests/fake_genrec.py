"""Stands in for `python -m genrec.{train,evaluate,report}` (genrec.config_check runs for real) in tests of scripts/results_office.sh: writes what
each would write (run dir files, a full-rank eval, the report's table.md) and logs the call to $FAKE_CALLS.
$FAKE_SLOW: seconds a training call sleeps first; $FAKE_FAIL: a run dir name whose training fails."""

import json
import os
import sys
import time
from pathlib import Path

_, module, *args = sys.argv[1:] if sys.argv[1] == "-m" else ["", *sys.argv[1:]]
kv = dict(a.split("=", 1) for a in args if "=" in a)
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(json.dumps([module, *args]) + "\n")
if module == "genrec.config_check":  # the real check: cheap, and what the script relies on
    os.execv(sys.executable, [sys.executable, "-m", module, *args])
elif module == "genrec.train":
    run = Path(kv["hydra.run.dir"])
    time.sleep(float(os.environ.get("FAKE_SLOW", 0)))
    if run.name == os.environ.get("FAKE_FAIL"):
        sys.exit(1)
    (run / ".hydra").mkdir(parents=True, exist_ok=True)
    command = "".join(f"- {a}\n" for a in args)
    (run / ".hydra" / "overrides.yaml").write_text(command)  # Hydra: every start
    if not (run / "overrides.yaml").exists():  # genrec: the first start
        (run / "overrides.yaml").write_text(command)
    (run / "config.yaml").write_text("seed: 1\n")
    (run / "test_ranks.csv").write_text("user,rank\n0,1\n")
    scoring = {"objective=msl": ("masked", 2.0), "objective=bear": ("masked", 1.0)}  # as their conf/eval/scoring
    score, temperature = next((v for k, v in scoring.items() if k in args), ("full", 1.0))
    (run / "metrics.json").write_text(json.dumps({"test/recall@10": 0.05, "eval_score": score,
                                                  "eval_temperature": temperature}))
elif module == "genrec.evaluate":
    run = Path(kv["ckpt"])
    (run / "eval").mkdir(exist_ok=True)
    scoring = f"-{kv['eval.score']}-t{float(kv['eval.temperature']):g}" if "eval.score" in kv else ""
    (run / "eval" / f"test-beam20{scoring}-full.ranks.csv").write_text("user,rank,full_rank\n0,1,1\n")
    (run / "eval" / f"test-beam20{scoring}-full.json").write_text(json.dumps({"test/pruning_rate@5": 0.3}))
elif module == "genrec.report":
    (Path(kv["out"]) / "table.md").parent.mkdir(parents=True, exist_ok=True)
    (Path(kv["out"]) / "table.md").write_text(f"| rows | {len(list(Path('docs/results/runs').glob('*/*')))} |\n")
