# Every target builds what it needs: on a fresh machine `make train` and `make test` are enough.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# Every install below goes through constraints.txt: the versions the suite was last green
# with, so a fresh clone tests what CI tested (pyproject.toml's dependencies stay ranges for
# whoever installs the package elsewhere). `make constraints` writes it anew from .venv.
INSTALL := $(PIP) install -c constraints.txt

.PHONY: train dist test test-fast test-numerics test-plain constraints lint bench bench-train \
	gpu-check lessons lessons-run clean

$(VENV)/.stamp-base: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(INSTALL) -e .
	touch $@

$(VENV)/.stamp-dev: $(VENV)/.stamp-base
	$(INSTALL) -e '.[dev]'
	touch $@

# The oracle (CPU torch, transformers) is only for tests and benchmarks; see README to skip it.
$(VENV)/.stamp-oracle: $(VENV)/.stamp-base
	$(INSTALL) -e '.[oracle]' || echo "torch or transformers could not be installed: the oracle tests will skip"
	touch $@

train: $(VENV)/.stamp-base
	$(PY) -m decoder.train $(ARGS)

# MPI for the data-parallel tests and runs (the mpich wheel brings mpirun into .venv/bin).
$(VENV)/.stamp-dist: $(VENV)/.stamp-base
	$(INSTALL) -e '.[dist]' || echo "MPI could not be installed: the 2-rank tests will skip"
	touch $@

dist: $(VENV)/.stamp-dist

# --dist worksteal: an idle worker takes queued tests from the busy one, so the long lesson
# notebooks do not leave one core idle at the end (3 min 32 s against about 5 min with the
# default split, 2 cores, 2026-11-27).
test: $(VENV)/.stamp-dev $(VENV)/.stamp-oracle $(VENV)/.stamp-dist
	$(PY) -m pytest -n 2 --dist worksteal $(ARGS)

# The tests that compare two computations adding in another order (marked summation_order),
# again with the BLAS and SIMD kernels of a CPU without AVX-512: CI runs it after `make test`.
test-numerics: $(VENV)/.stamp-dev $(VENV)/.stamp-oracle $(VENV)/.stamp-dist
	$(PY) tests/support/no_avx512.py $(PY) -m pytest -n 2 --dist worksteal -m summation_order $(ARGS)

# The engine's tests again with every fast path off (MINIGRAD_FAST_PATHS=0, see
# minigrad.set_fast_paths): the plain forms a lesson shows must pass them on their own.
test-plain: $(VENV)/.stamp-dev
	MINIGRAD_FAST_PATHS=0 $(PY) -m pytest -n 2 --dist worksteal \
		tests/minigrad tests/standin tests/kernels tests/bench $(ARGS)

# After a deliberate upgrade in .venv (and a green `make test` on it): pin what it holds.
constraints:
	$(PY) tests/support/constraints.py > constraints.txt

# Without the oracle: the torch comparisons skip with a reason.
test-fast: $(VENV)/.stamp-dev
	$(PY) -m pytest -n 2 --dist worksteal $(ARGS)

lint: $(VENV)/.stamp-dev
	$(PY) -m ruff check minigrad decoder tests bench lessons
	$(PY) -m ruff format --check minigrad decoder tests bench lessons

# The quick CPU benchmarks (about a minute); bench/README.md says what each measures.
bench: $(VENV)/.stamp-oracle
	$(PY) bench/overhead.py
	$(PY) bench/fused_ops.py
	$(PY) bench/attention.py

# shakespeare-char trained by minigrad and by nanoGPT in PyTorch (about five minutes), then
# generation against nanoGPT's sampling; bench/profile_step.py splits one step op by op
bench-train: $(VENV)/.stamp-oracle
	$(PY) bench/train_vs_torch.py $(ARGS)
	$(PY) bench/generate_vs_torch.py

# On a machine with an NVIDIA GPU: GPU tests, the GPU benchmarks, compute-sanitizer on the
# kernels, within --budget seconds; writes bench/results/gpu-<gpu name>.md. On a CUDA image
# (python3 with numpy, cupy, torch and pytest; no venv, nothing to install), name its python:
# `make gpu-check GPU_PYTHON=python3`.
$(VENV)/.stamp-gpu: $(VENV)/.stamp-dev $(VENV)/.stamp-oracle
	$(INSTALL) -e '.[gpu]'
	touch $@

gpu-check: $(if $(GPU_PYTHON),,$(VENV)/.stamp-gpu)
	PYTHONPATH=. $(or $(GPU_PYTHON),$(PY)) bench/gpu_check.py $(ARGS)

lessons: $(VENV)/.stamp-dev
	$(VENV)/bin/jupyter notebook lessons/

# Re-execute every lesson in place at its CI size, so the committed outputs match the code.
lessons-run: $(VENV)/.stamp-dev
	cd lessons && LESSON_QUICK=1 MPLBACKEND=Agg OPENBLAS_NUM_THREADS=1 \
		../$(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace [0-9][0-9]_*.ipynb

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
