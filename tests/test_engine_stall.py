"""No hang by default: a rank that stops answering inside a real 2-rank training run is named in a
warning, then ends the job with one message, with the default stall detection made short by its keys.

The limits are short but not tight: a busy 2-core machine may hold one rank back by seconds at start-up
(tracing the step), which must not end the job before the stall the test injects; and a job that does
not end by itself within the bounds here would have waited for the injected 600 s sleep."""
import re
import time

import pytest

from helpers import ROOT, engine_errors, run_mpi
from prerequisites import require_module
from test_engine_parallel import BACKENDS, base_config

pytestmark = pytest.mark.mpi
SCRIPT = str(ROOT / "tests" / "mpi_scripts" / "engine_train.py")
STALL_TIMEOUT = 20  # distributed_stall_timeout where a rank stalls on purpose (the default is 600 s)


@pytest.mark.version_independent  # the watchdog inside tf.function: test_dist_failure, on both
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stalled_rank_is_named_then_ends_the_training_job(tmp_path, backend):
    config = base_config(use_horovod=True, distributed_backend=backend, num_epochs=2,
                         distributed_stall_warning=1, distributed_stall_timeout=STALL_TIMEOUT)
    start = time.monotonic()
    result = run_mpi(2, [SCRIPT, str(tmp_path), repr(config), "fail=stall", "fail_rank=1", "fail_step=2"],
                     timeout=500)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    # start-up, 2 steps, the stall timeout; nowhere near the 600 s stall
    assert time.monotonic() - start < 300, output
    # rank 1 stalls before its third step; rank 0 waits in that step's gradient reduction. (A warning after
    # 1 s may also name a rank that was merely slow earlier, e.g. while tracing the step.)
    assert engine_errors(output) == 1, output
    error = re.search(r"\[rank 0\] error: rank 1 did not reach collective #(\d+) 'allreduce in a "
                      rf"tf.function' within {STALL_TIMEOUT} s \(distributed_stall_timeout\), where rank 0 "
                      r"waits", output)
    assert error, output
    assert output.count(f"stall: rank 1 has not reached collective #{error.group(1)} 'allreduce in a "
                        "tf.function' after 1 s; rank 0 waits there") == 1, output


def test_a_rank_that_never_joins_ends_the_job_instead_of_a_hang(tmp_path):
    """MPI's start waits for every rank, before the stall watchdog exists: rank 1 stuck before it (here in
    its config file, as on a hanging network file system) must still end the job, after the stall timeout
    plus the watchdog's grace (2 + 10.2 s), with one message naming the cause."""
    config = tmp_path / "stuck.py"
    config.write_text(
        "import os, time\n"
        "if os.environ.get('OMPI_COMM_WORLD_RANK') == '1':\n"
        "    time.sleep(600)\n"
        "train = {'class': 'DummyDataset', 'input_dim': 3, 'output_dim': 2, 'num_seqs': 4, 'seq_len': 5}\n"
        "network = {'output': {'class': 'softmax', 'loss': 'ce'}}\n"
        "num_epochs = 1\nuse_horovod = True\ndistributed_backend = 'mpi'\n"
        "distributed_stall_warning = 1\ndistributed_stall_timeout = 2\n")
    start = time.monotonic()
    result = run_mpi(2, [str(ROOT / "rnn.py"), str(config)], timeout=500)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert time.monotonic() - start < 300, output  # start-up and 12 s; not rank 1's 600 s
    assert "[rank 0] rnn.py: error: the 2 ranks did not all join the job within 12 s" in output, output


CHECKPOINT_TIMEOUT = 45  # distributed_checkpoint_timeout of the slow-save runs


def test_a_checkpoint_write_within_its_limit_completes_and_one_beyond_it_ends_the_job_naming_rank_0(tmp_path):
    """Two trainings in one 2-rank job, their checkpoint writes on rank 0 made slower by ``slow_save``, a
    stall timeout of 20 s (a busy machine may keep one rank several seconds behind at start-up) and a
    checkpoint timeout of 45 s: run 0's write outlasts the stall timeout by 5 s and stays within the
    checkpoint timeout by 20 s (the write itself and a busy machine's delays), so it completes; run 1's
    write would take 400 s, and the job ends at the checkpoint timeout."""
    runs = [[base_config(use_horovod=True, distributed_backend="mpi", num_epochs=1, checkpoint_interval=0,
                         model=str(tmp_path / f"run{k}" / "net"), distributed_stall_warning=1,
                         distributed_stall_timeout=STALL_TIMEOUT,
                         distributed_checkpoint_timeout=CHECKPOINT_TIMEOUT), [f"slow_save={seconds}"]]
            for k, seconds in enumerate([STALL_TIMEOUT + 5, 400])]
    start = time.monotonic()
    result = run_mpi(2, [SCRIPT, str(tmp_path), repr(runs)], timeout=500)
    seconds = time.monotonic() - start
    output = result.stdout + result.stderr
    # run 0 completed (its checkpoint, its record), then run 1 started in the same processes
    assert (tmp_path / "run0" / "net.001").exists() and (tmp_path / "run0" / "rank1.npz").exists(), output
    assert "=== run 1" in result.stdout, output
    # the warning comes in each run, saying why the job waits longer
    assert output.count("stall: rank 0 has not reached collective") >= 2, output
    assert output.count(f"The job ends after distributed_checkpoint_timeout = {CHECKPOINT_TIMEOUT} s (a "
                        "checkpoint is being saved).") >= 2, output
    assert result.returncode == 1, output
    assert seconds < 360, output  # start-up, two short trainings, 25 s and 45 s: not the 400 s write
    assert engine_errors(output) == 1, output  # run 1's, the only one
    # the others wait for the write at the barrier after it, which they poll without spinning a core
    assert re.search(r"\[rank 0\] error: rank 0 did not reach collective #\d+ 'barrier' within "
                     rf"{CHECKPOINT_TIMEOUT} s \(distributed_checkpoint_timeout\), where rank 1 waits: a "
                     r"checkpoint is being saved",
                     output), output
    assert not (tmp_path / "run1" / "net.001").exists()


def run_at_thread_level(tmp_path, level: str, backend: str = "mpi", *options: str):
    """A 2-rank training with mpi4py asking MPI for thread level ``level`` (what mpi4py.rc.thread_level
    sets in code); with options, through engine_train.py, else through rnn.py."""
    config = base_config(use_horovod=True, distributed_backend=backend, num_epochs=2,
                         distributed_stall_warning=1, distributed_stall_timeout=STALL_TIMEOUT)
    args = [SCRIPT, str(tmp_path), repr(config), *options]
    if not options:
        (tmp_path / "config.py").write_text("".join(f"{key} = {value!r}\n" for key, value in config.items()))
        args = [str(ROOT / "rnn.py"), str(tmp_path / "config.py")]
    result = run_mpi(2, args, timeout=500, env={"MPI4PY_RC_THREAD_LEVEL": level})
    return result, result.stdout + result.stderr


def test_below_thread_multiple_the_watchdog_keeps_off_mpi_and_the_waiting_rank_ends_the_job(tmp_path):
    start = time.monotonic()
    result, output = run_at_thread_level(tmp_path, "serialized", "mpi", "fail=stall", "fail_rank=1",
                                         "fail_step=2")
    assert result.returncode == 1, output
    assert time.monotonic() - start < 300, output  # not rank 1's 600 s stall
    assert output.count("MPI was initialised with MPI_THREAD_SERIALIZED, not MPI_THREAD_MULTIPLE: the stall "
                        "watchdog's thread does not call MPI") == 1, output  # rank 0's warning, once
    # rank 0 names no other rank (that would take the side channel from the watchdog thread): it ends the
    # job on its own wait, without MPI_Abort, and mpirun ends rank 1
    assert "has not reached collective" not in output and "MPI_ABORT" not in output, output
    assert engine_errors(output) == 1, output
    assert re.search(r"\[rank 0\] error: collective #\d+ 'allreduce in a tf.function' did not complete "
                     rf"within {STALL_TIMEOUT} s \(distributed_stall_timeout\); the ranks that did not "
                     r"arrive cannot be named", output), output
    assert re.search(r"^stall: rank 0 waits in collective #\d+ 'allreduce in a tf.function' for \d+ s "
                     r"\(distributed_stall_warning\)", output, re.M), output


def test_below_serialized_the_mpi_backend_is_refused_with_one_message(tmp_path):
    result, output = run_at_thread_level(tmp_path, "funneled")
    assert result.returncode == 2, output
    assert output.count("error: MPI was initialised with MPI_THREAD_FUNNELED, but the mpi backend calls MPI "
                        "from TensorFlow's threads") == 1, output
    assert "Traceback" not in output


def test_horovod_below_thread_multiple_is_refused_before_it_starts(tmp_path):
    require_module("horovod.tensorflow", "Horovod")
    result, output = run_at_thread_level(tmp_path, "serialized", "horovod")
    assert result.returncode == 2, output
    assert output.count("error: Config key 'distributed_backend' is 'horovod', but MPI was initialised with "
                        "MPI_THREAD_SERIALIZED") == 1, output
    assert "Traceback" not in output
