# The two commands: `make demo` (main job on the embedded synthetic trace) and `make test`.
# Both bootstrap .venv themselves; torch==2.13.0 (local CPU wheel) goes in before anything that needs torch.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.jigsaw-installed
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1

.PHONY: demo test test-fast venv accel bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[all,dev]'
	touch $(STAMP)

# The optional compiled build of the hot modules (jigsaw_env/accel.py: the same sources compiled by
# Cython, used only while each source is the one compiled). Rebuilt when one of them or one of the
# .pxd files beside them (Cython's declarations) changes; without Cython or a C compiler it says
# why and the Python sources are used.
ACCEL_SRC := jigsaw_env/placement.py jigsaw_env/las.py jigsaw_env/engine.py jigsaw_env/state.py \
	jigsaw_env/interference.py jigsaw_env/free_running.py jigsaw_env/sim_validation.py jigsaw_env/sim_components.py \
	jigsaw_env/sim_advance.py jigsaw_env/sim_logs.py jigsaw_env/simulator.py jigsaw_env/pairing.py agents/common.py agents/jigsaw.py \
	jigsaw_env/encoder.py jigsaw_env/actions.py jigsaw_env/env.py
ACCEL_PXD := $(wildcard $(ACCEL_SRC:.py=.pxd))
ACCEL_STAMP := $(VENV)/.jigsaw-accel

$(ACCEL_STAMP): $(STAMP) $(ACCEL_SRC) $(ACCEL_PXD)
	$(VENV)/bin/jigsaw accel build --optional
	touch $(ACCEL_STAMP)

venv: $(ACCEL_STAMP)

accel: $(ACCEL_STAMP)

# The main job: FIFO, Tiresias, Gandiva and Jigsaw on the same five crowded synthetic job sets
# (64 GPUs, 500 jobs each, offered load 1.5); the summary table, the paired differences from
# Tiresias, and reports/demo/report.html
DEMO_OUT ?= reports/demo
demo: $(STAMP)
	$(VENV)/bin/jigsaw evaluate --agents fifo,tiresias,gandiva,jigsaw --trace synthetic --gpus 64 --max-jobs 500 \
		--load 1.5 --seeds 5 --baseline tiresias --out $(DEMO_OUT)
	@echo "report: $(DEMO_OUT)/report.html"

# TEST_WORKERS pytest-xdist processes, each running whole test files (--dist loadfile: one Ray
# session per module stays one); TEST_WORKERS=0 runs the suite in this process
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: $(ACCEL_STAMP)
	$(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

# the inner loop: no slow tests, no compiled build (the sources run)
test-fast: $(STAMP)
	JIGSAW_PURE_PYTHON=1 $(PY) -m pytest -q $(XDIST) -m "not slow" $(PYTEST_ARGS)

bench: $(ACCEL_STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) build *.egg-info .accel
