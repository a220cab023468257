"""The command line and config rules of docs/config-and-cli.md, and the console commands."""
import configparser
import importlib
import json
import sys

import pytest

import engine
from engine.config.cli import parse_command_line
from engine.config.loader import Config
from engine.runtime.errors import ConfigError
from helpers import ROOT, run, run_rnn

pytestmark = pytest.mark.tf_latest


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def load(files, overrides):
    return Config.from_sources(files, overrides)


# ----- typing of ++ values -----

def test_override_of_typed_key_is_parsed_as_that_type(tmp_path):
    cfg = write(tmp_path, "c.py", "num_epochs = 5\nlr = 0.1\nuse_horovod = False\nlayers = [1]\n"
                                  "opt = {'class': 'adam'}\nname = 'x'\n")
    c = load([cfg], [("num_epochs", "3"), ("lr", "2"), ("use_horovod", "1"), ("layers", "[2, 3]"),
                     ("opt", "{'class': 'sgd'}"), ("name", "42")])
    assert c.value("num_epochs") == 3 and type(c.value("num_epochs")) is int
    assert c.value("lr") == 2.0 and type(c.value("lr")) is float
    assert c.value("use_horovod") is True
    assert c.value("layers") == [2, 3]
    assert c.value("opt") == {"class": "sgd"}
    assert c.value("name") == "42"  # a str key stays str


@pytest.mark.parametrize("text,expected", [("1", True), ("0", False), ("true", True), ("False", False),
                                           ("yes", True), ("no", False), ("on", True), ("OFF", False)])
def test_bool_spellings(text, expected):
    c = load([], [("flag", text)])
    assert c.bool("flag") is expected
    c2 = Config({"flag": not expected})
    c2.apply_overrides([("flag", text)])
    assert c2.value("flag") is expected


def test_unknown_key_stays_str_and_typed_getters_convert():
    c = load([], [("a", "3"), ("b", "0.5"), ("c", "x,y"), ("d", "{'k': 1}"), ("e", "[1, 2]"), ("f", "abc")])
    assert c.value("a") == "3"
    assert c.int("a") == 3 and c.float("b") == 0.5
    assert c.list("c") == ["x", "y"] and c.list("e") == [1, 2]
    assert c.dict("d") == {"k": 1}
    assert c.typed("a") == 3 and c.typed("e") == [1, 2] and c.typed("f") == "abc"
    assert c.str("a") == "3"
    assert c.int("missing", 7) == 7 and c.bool("missing", True) is True


def test_plus_minus_prefix_loses_one_plus():
    c = load([], [("threshold", "+-0.1")])
    assert c.value("threshold") == "-0.1" and c.float("threshold") == -0.1
    c2 = Config({"threshold": 0.5})
    c2.apply_overrides([("threshold", "+-0.1")])
    assert c2.value("threshold") == -0.1


# ----- load order -----

def test_overrides_apply_before_and_after_files(tmp_path):
    cfg = write(tmp_path, "c.py", "task = 'train'\nseen_task = config.value('task')\nseen_global = task\n")
    c = load([cfg], [("task", "forward")])
    assert c.value("task") == "forward"          # applied after: the override wins
    assert c.value("seen_task") == "forward"     # applied before: config code reads it
    # the file's own assignment ran (and was then overridden)
    c2 = load([cfg], [])
    assert c2.value("task") == "train" and c2.value("seen_task") is None


def test_command_line_task_readable_as_global(tmp_path):
    cfg = write(tmp_path, "c.py", "num_epochs = 2 if task == 'eval' else 9\n")
    assert load([cfg], [("task", "eval")]).value("num_epochs") == 2


def test_several_files_load_in_order(tmp_path):
    a = write(tmp_path, "a.py", "x = 1\ny = 1\n")
    b = write(tmp_path, "b.py", "y = x + 1\n")
    c = load([a, b], [])
    assert (c.value("x"), c.value("y")) == (1, 2)


def test_python_config_keeps_imports_functions_and_file(tmp_path):
    cfg = write(tmp_path, "c.py", "import os\ndef get_model():\n    return 1\nwhere = __file__\n")
    c = load([cfg], [])
    assert c.value("os").__name__ == "os"
    assert c.value("get_model")() == 1
    assert c.value("where") == cfg
    assert not c.has("config") and not c.has("__builtins__")


def test_json_config(tmp_path):
    cfg = write(tmp_path, "c.json", json.dumps({"num_epochs": 4, "task": "train"}))
    c = load([cfg], [("num_epochs", "2")])
    assert c.value("num_epochs") == 2


@pytest.mark.parametrize("name,text", [("c.config", "x = 1 + 1\n"), ("noext", "#!rnn.py\nx = 2\n")])
def test_python_config_without_py_suffix(tmp_path, name, text):
    assert load([write(tmp_path, name, text)], []).value("x") == 2


# ----- command line -----

def test_parse_command_line_splits_files_and_overrides():
    cmd = parse_command_line(["a.py", "b.config", "++task", "eval", "++lr", "+-1"])
    assert cmd.config_files == ["a.py", "b.config"]
    assert cmd.overrides == [("task", "eval"), ("lr", "+-1")]


def test_help_and_version():
    r = run_rnn(["--help"])
    assert r.returncode == 0 and "usage: rnn.py" in r.stdout
    for key in ("batch_size", "horovod_reduce_type", "learning_rate_control", "log_verbosity"):
        assert key in r.stdout
    r = run_rnn(["--version"])
    assert r.returncode == 0 and engine.__version__ in r.stdout


def console_commands() -> dict[str, str]:
    """setup.cfg's console_scripts: command -> "module:function"."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options.entry_points"]["console_scripts"].splitlines()
    pairs = (line.split("=") for line in lines if line.strip())
    return {name.strip(): target.strip() for name, target in pairs}


def test_console_commands_run_their_main_functions(capsys):
    """What pip installs as `rnn-engine`, `hdf-dump`, ...: each target imports and answers --help."""
    commands = console_commands()
    assert set(commands) == {"rnn-engine", "hdf-dump", "dump-dataset", "make-hostfile", "supervise",
                             "plot-learning-curve", "merge-timeline", "profile-ops", "gen-returnn-keys",
                             "audio-to-hdf",
                             "export-returnn-checkpoint", "mpirun-guard"}
    for name, target in commands.items():
        module, function = target.split(":")
        main = getattr(importlib.import_module(module), function)
        try:
            status = main(["--help"])
        except SystemExit as exc:  # argparse ends --help with exit status 0
            status = exc.code
        assert status == 0, name
        assert "usage:" in capsys.readouterr().out, name


@pytest.mark.parametrize("script", sorted(path.stem for path in (ROOT / "tools").glob("*.py")))
def test_tool_scripts_are_wrappers_of_the_commands(script):
    r = run([sys.executable, str(ROOT / "tools" / f"{script}.py"), "--help"])
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr
    module, function = console_commands()[script.replace("_", "-")].split(":")
    assert f"from {module} import {function}" in (ROOT / "tools" / f"{script}.py").read_text()


# ----- errors: one paragraph, non-zero exit, no traceback -----

def assert_clean_error(r, *fragments):
    assert r.returncode != 0
    assert "Traceback" not in r.stderr, r.stderr
    for fragment in fragments:
        assert fragment in r.stderr, r.stderr
    assert r.stderr.count("rnn.py: error:") == 1


def test_error_missing_config_file(tmp_path):
    r = run_rnn([str(tmp_path / "nope.py")])
    assert_clean_error(r, "nope.py", "does not exist")
    assert r.returncode == 2


def test_error_syntax_names_file_and_line(tmp_path):
    cfg = write(tmp_path, "bad.py", "a = 1\nb = (\nc = 3\n")
    assert_clean_error(run_rnn([cfg]), "bad.py", "syntax error at line")


def test_error_in_config_code_names_line(tmp_path):
    cfg = write(tmp_path, "bad.py", "a = 1\nb = undefined_name + 1\n")
    assert_clean_error(run_rnn([cfg]), "bad.py", "line 2", "NameError")


def test_error_bad_json(tmp_path):
    cfg = write(tmp_path, "bad.json", '{"a": 1,, }')
    assert_clean_error(run_rnn([cfg]), "bad.json", "not valid JSON", "line 1")


def test_error_override_without_value(tmp_path):
    cfg = write(tmp_path, "c.py", "x = 1\n")
    assert_clean_error(run_rnn([cfg, "++num_epochs"]), "'++num_epochs' has no value")


def test_error_value_does_not_parse_for_type(tmp_path):
    cfg = write(tmp_path, "c.py", "num_epochs = 5\n")
    assert_clean_error(run_rnn([cfg, "++num_epochs", "three"]), "num_epochs", "'three'", "int")


def test_error_typed_getter_names_key():
    with pytest.raises(ConfigError, match="'batch_size'.*'lots'.*int"):
        Config({"batch_size": "lots"}).int("batch_size")
    with pytest.raises(ConfigError, match="'max_seqs' must be int"):
        Config({"max_seqs": [1]}).int("max_seqs")


def test_error_unknown_task(tmp_path):
    cfg = write(tmp_path, "c.py", "task = 'dance'\n")
    assert_clean_error(run_rnn([cfg]), "'task'", "'dance'", "train", "forward")


def test_error_unknown_option():
    assert_clean_error(run_rnn(["c.py", "--frobnicate"]), "--frobnicate")


def test_traceback_shown_with_debug(tmp_path):
    cfg = write(tmp_path, "c.py", "task = 'dance'\ndebug = True\n")
    r = run_rnn([cfg])
    assert r.returncode != 0 and "Traceback" in r.stderr and "'dance'" in r.stderr


# ----- the key registry -----

def test_getters_fall_back_to_the_listed_default_and_help_lists_every_key():
    from engine.config import keys
    from engine.config.cli import help_text

    empty = Config({})
    assert empty.int("num_epochs") == 5 and empty.str("task") == "train"
    assert empty.float("learning_rate") == 1.0
    assert empty.int("num_epochs", 7) == 7  # an explicit default still wins
    assert empty.bool("my_own_flag") is False and empty.int("my_own_number") is None  # not listed
    assert empty.list("log") == [] and empty.list("log") is not keys.KEYS["log"].default
    text = help_text()
    for name in keys.KEYS:
        assert f"  {name} " in text, name
