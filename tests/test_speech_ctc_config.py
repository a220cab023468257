"""``configs/speech_ctc.py``, the BLSTM-CTC recipe of ``make demo-speech`` as RETURNN configs write it
(max-pool time reduction, a ctc softmax with ``darc1``, an ``edit_distance`` layer only on eval, ``nadam``,
``gradient_noise``, ``newbob_multi_epoch``): every key gets a verdict and none stops it, and it trains
as written, only its corpus swapped for a small generated one (the same paths, 40-dim input, 10 labels),
on 1 rank and on 2 ranks with real mpirun, the dev label error falling below 0.3 in 8 epochs."""
import re
import shutil
import sys

import pytest

from helpers import ROOT, run, run_mpi, run_rnn

pytestmark = [pytest.mark.slow]
CONFIG = ROOT / "configs" / "speech_ctc.py"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with data/speech/{train,dev}.hdf (labels as frames: 40-dim, 10 labels, pool-friendly
    lengths) and the config, so that the config's relative paths find them."""
    root = tmp_path_factory.mktemp("speech")
    (root / "data" / "speech").mkdir(parents=True)
    for split, seqs, seed in (("train", 240, 1), ("dev", 40, 2)):
        spec = (f"LabelFramesDataset:num_seqs={seqs},num_labels=10,input_dim=40,min_labels=2,max_labels=4,"
                f"min_frames=8,max_frames=12,fixed_random_seed={seed}")
        out = root / "data" / "speech" / f"{split}.hdf"
        r = run([sys.executable, str(ROOT / "tools" / "hdf_dump.py"), spec, str(out)])
        assert r.returncode == 0, r.stdout + r.stderr
    shutil.copy(CONFIG, root / "speech_ctc.py")
    return root


def dev_errors(stdout):
    return [float(e) for e in re.findall(r"^dev: score \S+ error (\S+)", stdout, re.M)]


def test_check_gives_every_key_a_verdict_and_none_stops_it(workdir):
    r = run_rnn(["speech_ctc.py", "--check"], cwd=workdir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Training would start" in r.stdout, r.stdout


def test_it_trains_as_written_on_one_rank(workdir):
    r = run_rnn(["speech_ctc.py", "++num_epochs", "8", "++model", str(workdir / "one" / "model")],
                cwd=workdir, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    errors = dev_errors(r.stdout)
    assert len(errors) == 8 and errors[-1] < 0.3, r.stdout  # 1.0 (all blank) at the start
    assert "ignored" not in r.stdout + r.stderr


@pytest.mark.mpi
def test_it_trains_as_written_on_two_ranks(workdir):
    r = run_mpi(2, [str(ROOT / "rnn.py"), "speech_ctc.py", "++use_horovod", "1", "++num_epochs", "8",
                    "++model", str(workdir / "two" / "model")], cwd=workdir, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    errors = dev_errors(r.stdout)
    assert len(errors) == 8 and errors[-1] < 0.3, r.stdout  # 1.0 (all blank) at the start
