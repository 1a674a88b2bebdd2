# `make test` / `make run` work on a fresh machine: they build .venv first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TORCH   := torch==2.13.0
# The embedded default dataset: MovieLens-100K inside the recbole wheel (installed without deps).
RECBOLE := recbole==1.2.1
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export WANDB_MODE ?= offline

.PHONY: install test run clean

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps $(RECBOLE)
	touch $@

install: $(BIN)/.installed

test: install
	$(BIN)/python -m pytest -q -p no:cacheprovider --timeout 900

run: install
	$(BIN)/python -m genrec.train experiment=quickstart

# clean: the venv, run outputs and the data-stage cache (data/<stage>/<hash>); keeps downloads (data/raw)
clean:
	rm -rf $(VENV) outputs multirun $(filter-out data/README.md data/raw,$(wildcard data/*))
