#!/usr/bin/env bash
# Every objective with both backbones (default sizes) for a couple of batches on a dataset:
#   scripts/smoke_objectives.sh                                   # ml100k
#   scripts/smoke_objectives.sh dataset=lcrec dataset.root=../shared/data/apao-office dataset.name=Office tokenizer=precomputed
# A sweep: failures are recorded per job (failed.json) and reported by Hydra at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m genrec.train -m "$@" \
  backbone=tiger,llama objective=ce,msl,apao_pointwise,apao_pairwise,bear,sdpo_2stage \
  trainer.max_epochs=1 trainer.limit_train_batches=2 trainer.limit_val_batches=1 trainer.limit_test_batches=1 \
  trainer.batch_size=64 trainer.accumulate=1 trainer.progress_bar=false \
  hydra.sweep.dir=outputs/smoke/'${now:%Y-%m-%d_%H-%M-%S.%f}'
