# Setup, the main job and the tests. Every target installs what it needs first (idempotent).
SHELL := /bin/bash
VENV := .venv
VENV_LATEST := .venv-latest
PY := $(VENV)/bin/python
MPIRUN := $(VENV)/bin/mpirun --oversubscribe --bind-to none --map-by slot
# One TensorFlow thread per rank, so 2 ranks on 2 cores do not fight over them.
RANK_ENV := -x TF_NUM_INTRAOP_THREADS=1 -x TF_NUM_INTEROP_THREADS=1 -x TF_CPP_MIN_LOG_LEVEL=2
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: install install-latest demo demo-speech demo-oggzip demo-attention blstm sanity gpu-check lint test test-stable test-latest \
	test-quick test-schedulers bench clean

# GPU=1 (make install GPU=1, make demo GPU=1, ...): the CUDA build of TensorFlow 2.15 and Horovod in
# $(VENV) (tools/install_env.sh, flavour gpu; README "GPU install"); make install-latest GPU=1: the CUDA
# build of the newest TensorFlow in $(VENV_LATEST) (flavour latest-gpu, no Horovod: the tf backend reduces).
# Neither needs nvcc. Use another VENV or VENV_LATEST to keep the CPU builds beside them.
FLAVOR := $(if $(GPU),gpu,stable)
INSTALLED := $(VENV)/.installed$(if $(GPU),-gpu)
INSTALLED_LATEST := $(VENV_LATEST)/.installed$(if $(GPU),-gpu)

install: $(INSTALLED)
install-latest: $(INSTALLED_LATEST)

$(INSTALLED): tools/install_env.sh setup.cfg pyproject.toml
	bash tools/install_env.sh $(VENV) $(FLAVOR)
	touch $@

$(INSTALLED_LATEST): tools/install_env.sh setup.cfg pyproject.toml
	bash tools/install_env.sh $(VENV_LATEST) latest$(if $(GPU),-gpu)
	touch $@

# The main job: a real 2-rank data-parallel training run on generated data.
demo: install
	$(MPIRUN) -np 2 $(RANK_ENV) $(PY) rnn.py configs/12ax.py ++use_horovod 1 ++model out/12ax/model

# BLSTM-CTC on spoken digits: synthesises the corpus with espeak-ng when missing (about 15 s, 13 MB),
# then trains with 2 ranks.
demo-speech: install
	@command -v espeak-ng >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  apt-get update -qq && apt-get install -y -qq espeak-ng >/dev/null; } || true
	[ -f data/speech/train.hdf ] && [ -f data/speech/dev.hdf ] || $(PY) demos/make_speech_corpus.py --out data/speech
	$(MPIRUN) -np 2 $(RANK_ENV) $(PY) rnn.py configs/speech_ctc.py ++use_horovod 1

# The same BLSTM-CTC on the same spoken digits kept as RETURNN's LibriSpeech setups keep theirs: Ogg zips
# read by OggZipDataset (MFCCs computed while training), BPE labels; the corpus is made when missing.
demo-oggzip: install
	@command -v espeak-ng >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  apt-get update -qq && apt-get install -y -qq espeak-ng >/dev/null; } || true
	[ -f data/speech_oggzip/train.zip ] && [ -f data/speech_oggzip/bpe.vocab ] || \
	  $(PY) demos/make_oggzip_corpus.py --out data/speech_oggzip
	$(MPIRUN) -np 2 $(RANK_ENV) $(PY) rnn.py configs/speech_ctc_oggzip.py ++use_horovod 1

# An attention encoder-decoder (RETURNN's 2019 LibriSpeech attention network, small) on the same spoken
# digits, labels ending in an end-of-sequence label: trains with 2 ranks, then searches dev with 2 ranks.
demo-attention: install
	@command -v espeak-ng >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  apt-get update -qq && apt-get install -y -qq espeak-ng >/dev/null; } || true
	[ -f data/speech_eos/train.hdf ] && [ -f data/speech_eos/dev.hdf ] || \
	  $(PY) demos/make_speech_corpus.py --out data/speech_eos --eos
	$(MPIRUN) -np 2 $(RANK_ENV) $(PY) rnn.py configs/speech_attention.py ++use_horovod 1
	rm -f out/speech_attention/dev.hyps.txt
	$(MPIRUN) -np 2 $(RANK_ENV) $(PY) rnn.py configs/speech_attention.py ++use_horovod 1 ++task search

# A BLSTM on HDF corpora that hdf_dump writes, 2 ranks.
blstm: install
	@mkdir -p data
	[ -f data/train.hdf ] || $(PY) tools/hdf_dump.py "DummyDataset:input_dim=40,output_dim=10,num_seqs=800,seq_len=60,fixed_random_seed=1" data/train.hdf
	[ -f data/dev.hdf ] || $(PY) tools/hdf_dump.py "DummyDataset:input_dim=40,output_dim=10,num_seqs=100,seq_len=60,fixed_random_seed=1" data/dev.hdf
	$(MPIRUN) -np 2 $(RANK_ENV) $(PY) rnn.py configs/blstm_hdf.py ++use_horovod 1

# The first check on a new cluster: every rank reports, every backend reduces exactly.
sanity: install
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH bash demos/demo-horovod-mpi.sh 2

# The first check on a GPU node (at most 8 minutes with one GPU): GPU against CPU, cuDNN against the
# engine's LSTM kernel, mixed precision against float32, the tf backend with NCCL, 2 ranks sharing the GPU.
# Without a GPU it runs the same checks on the CPU with a small model (dry mode; CI runs it so).
gpu-check: install
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) benchmarks/gpu_check.py

# Style and static checks (flake8, configured in setup.cfg).
lint: install
	$(VENV)/bin/flake8 rnn.py engine tools benchmarks demos tests

# All tests on TensorFlow 2.15 + Horovod (but the few marked newest_tf_only), then those marked tf_latest
# (what can differ between TensorFlow versions) on the newest TensorFlow. Three pytest workers on 2 cores:
# tests that wait out a timeout or a cut link leave the CPU idle, which a third fills (test-stable on a
# fresh clone: 17:22 against 19:04 with two; docs/performance.md). Each suite prints its 15 slowest tests
# and its time.
PYTEST := pytest -n 3 --dist worksteal --durations=15
test:  # both suites, the second also when the first fails (-k); fails when either does
	@$(MAKE) --no-print-directory -k test-stable test-latest

test-stable: install
	@TIMEFORMAT='test-stable (TensorFlow 2.15 + Horovod): %0R s'; time $(VENV)/bin/$(PYTEST) -m "not newest_tf_only" tests

test-latest: install-latest
	@TIMEFORMAT='test-latest (newest TensorFlow): %0R s'; time $(VENV_LATEST)/bin/$(PYTEST) \
	  -m "tf_latest and not version_independent and (not mpi or tf_latest_mpi)" tests

# The inner loop (about 2 minutes): single-process tests on TensorFlow 2.15, no mpirun, nothing marked slow.
# It leaves out every multi-rank test (collectives, failures, stalls, resume across ranks), the multi-host
# and link-rate tests, the recipes' training runs, one process's kill-and-resume runs and the newest-TensorFlow
# run: `make test` runs them.
test-quick: install
	@TIMEFORMAT='test-quick: %0R s'; time ENGINE_TESTS_NO_MPIRUN=1 $(VENV)/bin/$(PYTEST) -m "not mpi and not slow" tests

# Jobs submitted to real SLURM and Grid Engine daemons on this machine (tests/schedulers; installs
# slurm-wlm, munge and gridengine with apt-get when missing, as root; 2 minutes on a quiet machine, 8-9 on a busy one). A test whose
# scheduler cannot be installed or started skips with the reason, or fails in CI (CI=true).
test-schedulers: install
	@TIMEFORMAT='test-schedulers: %0R s'; time ENGINE_SCHEDULER_TESTS=1 $(VENV)/bin/pytest tests/schedulers

# All benchmarks, one after the other (about an hour on 2 cores, and bench_multihost's about 35 minutes as
# root; docs/performance.md): medians of interleaved runs with ranges, and a verdict line per target. Run
# it on a quiet machine.
bench: install
	$(PY) benchmarks/bench_data.py
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) benchmarks/bench_allreduce.py
	$(PY) benchmarks/bench_lstm.py
	$(PY) benchmarks/bench_amp.py
	$(PY) benchmarks/bench_train.py
	$(PY) benchmarks/bench_returnn.py
	$(PY) benchmarks/bench_ctc.py
	$(PY) benchmarks/bench_forward.py
	$(PY) benchmarks/bench_search_ranks.py
	$(PY) benchmarks/bench_wire_sum.py
	$(PY) benchmarks/bench_wire_guard.py
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) benchmarks/bench_chaos.py
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) benchmarks/bench_multihost.py

clean:
	rm -rf out data
