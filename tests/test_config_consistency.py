"""All ranks must run the same config, compared by value (engine/distributed/consistency.py): functions
by their code, objects by their type and attributes, never by address. A recipe with lambdas in dicts
and lists starts on 2 ranks; a real difference stops the job with one message."""
import functools
import textwrap

import pytest

from engine.config.loader import Config
from engine.distributed.consistency import _fingerprint
from helpers import ROOT, run_mpi

# Config code as recipes write it: lambdas in a list (RETURNN's sprintConfigStr) and in a dict (hooks),
# a closure, a partial, an object of a class the config defines, and a module.
RECIPE = textwrap.dedent("""\
    #!rnn.py
    import functools
    import os

    task = "train"
    train = {"class": "Task12AXDataset", "num_seqs": 100, "fixed_random_seed": 1}
    dev = {"class": "Task12AXDataset", "num_seqs": 20, "fixed_random_seed": 2}
    batch_size = 300
    num_epochs = 1
    model = "out/model"
    network = {"lstm": {"class": "rec", "unit": "lstm", "n_out": 4},
               "output": {"class": "softmax", "loss": "ce", "from": "lstm"}}

    def _cf(name):
        return os.path.join("/cache", name)

    _sprint_args = ["--config=training.config", lambda: "--*.corpus.file=" + _cf("corpus.xml.gz")]
    _hooks = {"pre": lambda batch: batch, "scale": functools.partial(pow, 2)}

    class _Schedule:
        def __init__(self, base):
            self.base = base
            self.rule = lambda epoch: base * 0.5 ** epoch

    _schedule = _Schedule(0.01)
    _offset = %s

    def _shifted(x, offset=_offset):
        return x + offset
    """)
RANK = 'int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))'


def load(tmp_path, text, name="c.config"):
    path = tmp_path / name
    path.write_text(text)
    return Config.from_sources([str(path)], [])


def fingerprints(config):
    return {key: _fingerprint(config.value(key)) for key in config.keys()}


@pytest.mark.tf_latest
def test_two_loads_of_a_config_with_lambdas_have_equal_fingerprints(tmp_path):
    a, b = load(tmp_path, RECIPE % "1", "a.config"), load(tmp_path, RECIPE % "1", "b.config")
    assert a.value("_hooks")["pre"] is not b.value("_hooks")["pre"]  # different objects, addresses
    assert fingerprints(a) == fingerprints(b)
    assert "0x" not in "".join(fingerprints(a).values())


@pytest.mark.tf_latest
def test_a_real_difference_changes_the_fingerprint(tmp_path):
    a = fingerprints(load(tmp_path, RECIPE % "1", "a.config"))
    b = fingerprints(load(tmp_path, RECIPE % "2", "b.config"))
    assert {key for key in a if a[key] != b[key]} == {"_offset", "_shifted"}  # a default value differs


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y


class Slotted:
    __slots__ = ("a",)

    def __init__(self, a):
        self.a = a


@pytest.mark.tf_latest
def test_objects_by_type_and_attributes_functions_by_code():
    assert _fingerprint(Point(1, [2])) == _fingerprint(Point(1, [2])) != _fingerprint(Point(1, [3]))
    assert _fingerprint(Slotted(1)) == _fingerprint(Slotted(1)) != _fingerprint(Slotted(2))
    assert _fingerprint(Point(1, 2)) != _fingerprint(Slotted(1))

    def make(value):
        return lambda x: x + value

    assert _fingerprint(make(1)) == _fingerprint(make(1)) != _fingerprint(make(2))  # closure values
    assert _fingerprint(lambda: a + b) != _fingerprint(lambda: a + c)  # noqa: F821  names it reads
    assert _fingerprint(functools.partial(pow, 2)) != _fingerprint(functools.partial(pow, 3))
    cycle: dict = {}
    cycle["self"] = cycle
    assert _fingerprint(cycle) == "{'self': <cycle>}"
    assert _fingerprint(object()) == _fingerprint(object())  # no state, no address


@pytest.mark.mpi
def test_a_recipe_with_lambdas_trains_on_two_ranks(tmp_path):
    path = tmp_path / "recipe.config"
    path.write_text(RECIPE % "1")
    r = run_mpi(2, [str(ROOT / "rnn.py"), str(path), "++use_horovod", "1"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "different configs" not in r.stderr and "finished training after epoch 1" in r.stdout


@pytest.mark.mpi
def test_a_real_difference_stops_the_job_with_one_message(tmp_path):
    path = tmp_path / "recipe.config"
    path.write_text(RECIPE % RANK + "learning_rate = 0.01 * (1 + %s)\n" % RANK)
    r = run_mpi(2, [str(ROOT / "rnn.py"), str(path), "++use_horovod", "1"], cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("run different configs") == 1, r.stderr
    assert "'learning_rate': rank 0: 0.01; rank 1: 0.02" in r.stderr
    for key in ("'_offset'", "'_shifted'"):
        assert key in r.stderr
    for key in ("'_hooks'", "'_sprint_args'", "'_schedule'"):  # equal on both ranks
        assert key not in r.stderr
