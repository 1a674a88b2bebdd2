#!/usr/bin/env bash
# Before a task's GPU session (the `device` tool, ~40% of tasks, 15 device-minutes): put what the device machine
# lacks into two git-ignored folders that its call carries (carry=[".whl", ".devdata"]):
#   .whl/      hydra-core, omegaconf, antlr4 (its image has torch, lightning, transformers, pandas, not these)
#   .devdata/  the release's Office and Grocery files (../shared, beside the checkout, does not travel)
# then, in that call: bash scripts/device_session.sh
set -euo pipefail
cd "$(dirname "$0")/.."
chmod -R u+w .devdata 2>/dev/null; rm -rf .whl .devdata && mkdir -p .whl .devdata
py=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps "${py[@]}" -d .whl hydra-core==1.3.2 omegaconf==2.3.0
python3 -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3  # sdist only on PyPI: pure Python
cp -r ../shared/data/apao-office ../shared/data/apao-grocery .devdata/
du -sh .whl .devdata
