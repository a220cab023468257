"""No hang by default: a rank that stops answering inside a real 2-rank training run is named in a
warning, then ends the job with one message, with the default stall detection made short by its keys."""
import re
import time

import pytest

from helpers import ROOT, run_mpi
from test_engine_parallel import BACKENDS, base_config

pytestmark = pytest.mark.mpi
SCRIPT = str(ROOT / "tests" / "mpi_scripts" / "engine_train.py")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stalled_rank_is_named_then_ends_the_training_job(tmp_path, backend):
    config = base_config(use_horovod=True, distributed_backend=backend, num_epochs=2,
                         distributed_stall_warning=1, distributed_stall_timeout=4)
    start = time.monotonic()
    result = run_mpi(2, [SCRIPT, str(tmp_path), repr(config), "fail=stall", "fail_rank=1", "fail_step=2"],
                     timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert time.monotonic() - start < 90, output  # start-up, 2 steps, 4 s; nowhere near the 600 s stall
    # rank 1 stalls before its third step; rank 0 waits in that step's gradient reduction. (A warning after
    # 1 s may also name a rank that was merely slow earlier, e.g. while tracing the step.)
    assert output.count("error:") == 1, output
    error = re.search(r"\[rank 0\] error: rank 1 did not reach collective #(\d+) 'allreduce in a "
                      r"tf.function' within 4 s \(distributed_stall_timeout\), where rank 0 waits", output)
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
    result = run_mpi(2, [str(ROOT / "rnn.py"), str(config)], timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert time.monotonic() - start < 60, output
    assert "[rank 0] rnn.py: error: the 2 ranks did not all join the job within 12 s" in output, output
