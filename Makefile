# `make demo` and `make test` each create .venv and install the pinned dependencies first.
VENV ?= .venv
PY := $(VENV)/bin/python
JAXLM := $(VENV)/bin/jaxlm
DEMO_CONFIG ?= configs/bert-tiny.yaml
# every config in configs/ trains in runs/NAME on data/NAME
DEMO_NAME := $(basename $(notdir $(DEMO_CONFIG)))
# pytest-xdist workers, a test file each, handed out in collection order (tests/integration, the slowest, first)
# (a third on two cores only made every test slower: README, Tests)
TEST_WORKERS ?= 2

.PHONY: install demo test clean-demo

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

# JAX's CUDA plugin for `jaxlm compile --topology h100` on machines without a GPU, kept off the venv's path
# (on it, every JAX process would probe for CUDA); the tests and bench/gpu.py --plan put it on PYTHONPATH
$(VENV)/cuda-plugin/.installed: $(VENV)/.installed
	JAX=$$($(PY) -c 'import jax; print(jax.__version__)') && $(PY) -m pip install --quiet --no-deps --upgrade \
		--target $(VENV)/cuda-plugin "jax-cuda12-plugin==$$JAX" "jax-cuda12-pjrt==$$JAX"
	touch $@

install: $(VENV)/.installed $(VENV)/cuda-plugin/.installed

demo: install
	JAX_PLATFORMS=$${JAX_PLATFORMS:-cpu} $(JAXLM) prepare $(DEMO_CONFIG)
	JAX_PLATFORMS=$${JAX_PLATFORMS:-cpu} $(JAXLM) train $(DEMO_CONFIG)
	JAX_PLATFORMS=$${JAX_PLATFORMS:-cpu} $(JAXLM) eval runs/$(DEMO_NAME) --out eval/$(DEMO_NAME)

# MALLOC_ARENA_MAX: with glibc's default arenas for XLA's many threads, tests/integration's evaluation and
# objective files ended with a seventh more memory than with two
test: install
	MALLOC_ARENA_MAX=2 $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile \
		--no-loadscope-reorder tests

clean-demo:
	rm -rf runs/$(DEMO_NAME) data/$(DEMO_NAME) eval/$(DEMO_NAME)
