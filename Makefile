# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export DO_NOT_TRACK := true
export MLFLOW_DISABLE_TELEMETRY := true
export DVC_NO_ANALYTICS := 1
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 120
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

RUN_OUT ?= runs/make-run

.PHONY: run test install pretrain clean-venv

install: $(STAMP)

# The stamp depends on the dependency list only, so a second call installs nothing.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned to the pair whose torchvision imports here (pip takes them from local wheels when present).
	$(BIN)/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/solrl run --preset shapes-tiny --family sol_rl --out $(RUN_OUT)

test: $(STAMP)
	$(BIN)/python -m pytest

pretrain: $(STAMP)
	$(BIN)/solrl pretrain --preset shapes-tiny

clean-venv:
	rm -rf $(VENV)
