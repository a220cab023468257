"""Every name a config uses gets a verdict (engine/config/key_check.py): config keys, layer options, dataset
options; ``rnn.py --check``; RETURNN's names as generated from its source (gen-returnn-keys)."""
import subprocess
import sys
import textwrap

import pytest

from engine.config import keys, no_effect, returnn_names_table as returnn_keys
from engine.config.key_check import EXEMPT, IMPLEMENTED, NO_EFFECT, NOT_IMPLEMENTED, UNKNOWN
from engine.config.loader import Config
from engine.main import main
from engine.runtime.errors import ConfigError, DataError
from engine.tasks.check import check_at_start, collect
from engine.tools import gen_returnn_keys
from helpers import ROOT, child_env, run_rnn

pytestmark = [pytest.mark.tf_latest, pytest.mark.usefixtures("fresh_log")]  # each test sees the notes anew

NETWORK = {"lstm": {"class": "rec", "unit": "lstm", "n_out": 4},
           "output": {"class": "softmax", "loss": "ce", "from": "lstm"}}
BASE = {"task": "train", "train": {"class": "Task12AXDataset", "num_seqs": 10}, "batch_size": 100,
        "network": NETWORK}


def config(tmp_path, text: str) -> Config:
    path = tmp_path / "c.config"
    path.write_text("#!rnn.py\n" + textwrap.dedent(text))
    return Config.from_sources([str(path)], [])


def verdicts(cfg: Config) -> dict[tuple[str, str], tuple[str, str]]:
    """(kind, name) -> (verdict, note) of every finding; layer and dataset names carry their owner."""
    findings, problems = collect(cfg)
    assert not problems, problems
    return {(f.kind, f.name if f.kind == "config" else f"{f.owners[0]}.{f.name}"): (f.verdict, f.note)
            for f in findings}


def test_top_level_verdicts(tmp_path):
    cfg = config(tmp_path, """
        import os
        from os.path import join
        task = "train"
        batch_size = 100
        bacth_size = 200
        multiprocessing = True
        truncation = -1
        chunking_variance = 0.5
        _private = 1
        class Helper: pass
        def get_network(epoch, **kwargs): return {}
        def helper(): return 1
    """)
    found = verdicts(cfg)
    assert found[("config", "batch_size")][0] == IMPLEMENTED
    assert found[("config", "get_network")][0] == IMPLEMENTED  # a function that is a key is the key
    assert found[("config", "bacth_size")] == (UNKNOWN, "(did you mean 'batch_size'?)")
    assert found[("config", "multiprocessing")][0] == NO_EFFECT
    assert found[("config", "truncation")][0] == NO_EFFECT and "= -1" in found[("config", "truncation")][1]
    assert found[("config", "chunking_variance")][0] == NOT_IMPLEMENTED
    for name in ("os", "join", "_private", "Helper", "helper"):
        assert found[("config", name)][0] == EXEMPT, name


def test_all_unimplemented_keys_in_one_error_and_a_typo_is_a_warning(tmp_path, capsys):
    cfg = config(tmp_path, """
        task = "train"
        batch_size = 100
        bacth_size = 200
        chunking_variance = 0.5
        gradient_clip_avg_norm = 2
        truncation = 50
        window = 1
        custom_dev_init_code = lambda: None
    """)
    with pytest.raises(ConfigError) as info:
        check_at_start(cfg)
    text = str(info.value)
    for name in ("'chunking_variance'", "'gradient_clip_avg_norm'", "'custom_dev_init_code'",
                 "'truncation'"):
        assert name in text, text
    assert "no effect here only -1; it is 50" in text  # harmless only at its no-op value
    assert ("ignore_keys = ['chunking_variance', 'custom_dev_init_code', 'gradient_clip_avg_norm', "
            "'truncation']") in text
    err = capsys.readouterr().err
    assert "config key 'bacth_size' (did you mean 'batch_size'?)" in err and "window" not in text


def test_ignore_keys_runs_without_the_listed_names_with_one_warning(tmp_path, capsys):
    cfg = config(tmp_path, """
        task = "train"
        chunking_variance = 0.5
        gradient_clip_avg_norm = 2
        ignore_keys = ["chunking_variance", "gradient_clip_avg_norm"]
    """)
    check_at_start(cfg)
    err = capsys.readouterr().err
    assert err.count("Ignored as ignore_keys asks") == 1
    assert "config key 'chunking_variance'; config key 'gradient_clip_avg_norm'" in err
    cfg.set("ignore_keys", ["chunking_variance", "batch_size"])
    with pytest.raises(ConfigError, match="lists 'batch_size', which this engine implements"):
        check_at_start(cfg)


def test_no_effect_keys_give_one_info_line_each(tmp_path, capsys):
    cfg = config(tmp_path, """
        use_tensorflow = True
        update_on_device = True
        window = 1
        tf_log_memory_usage = True
    """)
    check_at_start(cfg)
    check_at_start(cfg)  # checked again (as networks and datasets are when built): logged once
    out = capsys.readouterr().out
    for name in ("use_tensorflow", "update_on_device", "window", "tf_log_memory_usage"):
        assert out.count(f"config key '{name}'") == 1, out


def test_the_no_effect_tables_name_only_returnn_names_this_engine_does_not_read():
    assert set(no_effect.CONFIG_KEYS) <= returnn_keys.CONFIG_KEYS
    assert not set(no_effect.CONFIG_KEYS) & set(keys.KEYS)
    layer_options = returnn_keys.LAYER_COMMON_OPTIONS | returnn_keys.LAYER_OPTIONS["rec"] | \
        returnn_keys.LAYER_OPTIONS["conv"] | returnn_keys.LAYER_OPTIONS["pool"]
    assert set(no_effect.LAYER_OPTIONS) <= layer_options
    assert set(no_effect.DATASET_OPTIONS) <= returnn_keys.DATASET_COMMON_OPTIONS | \
        returnn_keys.DATASET_OPTIONS["HDFDataset"]


def test_layer_options(tmp_path):
    network = {"lstm": {"class": "rec", "unit": "lstm", "n_out": 4, "unroll": True, "max_seq_len": 100},
               "lstm2": {"class": "rec", "unit": "lstm", "n_out": 4, "max_seq_len": 100, "from": "lstm"},
               "output": {"class": "softmax", "loss": "ce", "from": "lstm2", "n_ot": 2, "batch_norm": True}}
    found = verdicts(Config(dict(BASE, network=network)))
    assert found[("layer", "lstm.unroll")][0] == NO_EFFECT
    assert found[("layer", "lstm.max_seq_len")][0] == NO_EFFECT  # with unroll: the static loop length
    assert found[("layer", "lstm2.max_seq_len")][0] == NOT_IMPLEMENTED  # without: not harmless
    assert found[("layer", "output.n_ot")] == (UNKNOWN, "(did you mean 'n_out'?)")
    assert found[("layer", "output.batch_norm")][0] == NOT_IMPLEMENTED
    with pytest.raises(ConfigError) as info:
        check_at_start(Config(dict(BASE, network=network)))
    text = str(info.value)
    assert "layer 'output' (softmax) option 'batch_norm'" in text and "'n_ot' (did you mean 'n_out'?)" in text
    assert "ignore_keys = ['layer:batch_norm', 'layer:max_seq_len']" in text


def test_channels_first_has_no_effect_on_conv_and_pool_only():
    network = {"conv": {"class": "conv", "from": "data", "filter_size": (3,), "padding": "same", "n_out": 4,
                        "auto_use_channel_first": True},
               "pool": {"class": "pool", "mode": "max", "pool_size": (2,), "padding": "same", "from": "conv",
                        "use_channel_first": True},
               "output": {"class": "softmax", "loss": "ce", "from": "pool", "auto_use_channel_first": True}}
    found = verdicts(Config(dict(BASE, network=network)))
    assert found[("layer", "conv.auto_use_channel_first")][0] == NO_EFFECT
    assert found[("layer", "pool.use_channel_first")][0] == NO_EFFECT
    assert found[("layer", "output.auto_use_channel_first")][0] == NOT_IMPLEMENTED


def test_an_ignored_layer_option_lets_the_network_build(capsys):
    from engine.model import build_model

    network = {"output": {"class": "softmax", "loss": "ce", "batch_norm": True}}
    with pytest.raises(ConfigError, match="batch_norm"):
        build_model(Config({"network": network}), input_dim=3, input_sparse=False, target_dims={"classes": 2})
    model = build_model(Config({"network": network, "ignore_keys": ["layer:batch_norm"]}), input_dim=3,
                        input_sparse=False, target_dims={"classes": 2})
    assert "output" in model.layers
    assert "layer 'output' (softmax) option 'batch_norm'" in capsys.readouterr().err


def test_dataset_options(tmp_path, capsys):
    from engine.datasets import create_dataset

    spec = {"class": "Task12AXDataset", "num_seqs": 5, "use_cache_manager": True, "estimated_num_seqs": 5,
            "window": 1}
    assert create_dataset(spec, key="train").num_seqs_total == 5
    out = capsys.readouterr().out
    assert out.count("dataset 'train' (Task12AXDataset) option") == 3, out
    with pytest.raises(DataError, match="ignore_keys = \\['dataset:seq_list_filter_file'\\]"):
        create_dataset(dict(spec, seq_list_filter_file="x"), key="train")
    ds = create_dataset(dict(spec, seq_list_filter_file="x"), ignored={"dataset:seq_list_filter_file"})
    assert ds.num_seqs_total == 5
    with pytest.raises(DataError, match="'num_seq' \\(did you mean 'num_seqs'\\?\\)"):
        create_dataset({"class": "Task12AXDataset", "num_seq": 5})


# ----- rnn.py --check -----

def test_check_prints_every_verdict_and_exits_0_when_training_would_start(tmp_path, capsys):
    path = tmp_path / "c.config"
    path.write_text(textwrap.dedent("""\
        #!rnn.py
        task = "train"
        train = {"class": "Task12AXDataset", "num_seqs": 10, "use_cache_manager": True}
        batch_size = 100
        bacth_size = 100
        multiprocessing = True
        network = {"lstm": {"class": "rec", "unit": "lstm", "n_out": 4, "unroll": True},
                   "output": {"class": "softmax", "loss": "ce", "from": "lstm"}}
        log = ["%s"]
        """ % (tmp_path / "logs" / "train.log")))
    assert main([str(path), "--check"]) == 0
    out = capsys.readouterr().out
    lines = {}  # "key" or "class option" -> its line
    for line in out.splitlines():
        if line.startswith("  "):
            first, second = line.split()[:2]
            lines[f"{first[:-1]} {second}" if first.endswith(":") else first] = line
    assert "implemented" in lines["batch_size"] and "did you mean 'batch_size'" in lines["bacth_size"]
    assert "no effect" in lines["multiprocessing"] and "Theano era" in lines["multiprocessing"]
    assert "no effect" in lines["rec unroll"] and "[layer 'lstm']" in lines["rec unroll"]
    assert "no effect" in lines["Task12AXDataset use_cache_manager"]
    assert out.rstrip().endswith("Training would start (see the warnings above).")
    assert not (tmp_path / "logs").exists()  # a check writes no log files


def test_check_exits_non_zero_with_the_errors(tmp_path, capsys):
    path = tmp_path / "c.config"
    path.write_text("#!rnn.py\nchunking_variance = 0.5\nnetwork = {'output': {'class': 'forced_align'}}\n"
                    "train = {'class': 'NumpyDumpDataset'}\n")
    assert main([str(path), "--check"]) == ConfigError.exit_code
    out = capsys.readouterr().out
    assert "chunking_variance  NOT IMPLEMENTED" in out
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("Training would not start.") and "'chunking_variance'" in last
    assert "'forced_align' is a RETURNN layer class this engine does not implement" in last
    assert "'NumpyDumpDataset'" in last


def test_check_imports_neither_tensorflow_nor_mpi(tmp_path):
    path = tmp_path / "c.config"
    path.write_text("#!rnn.py\ntask = 'train'\nnetwork = %r\ntrain = %r\nuse_horovod = True\n"
                    % (NETWORK, BASE["train"]))
    code = ("import sys; from engine.main import main; status = main([%r, '--check']); "
            "heavy = [m for m in ('tensorflow', 'mpi4py', 'horovod') if m in sys.modules]; "
            "print('HEAVY', heavy); sys.exit(status)" % str(path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(),
                       cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "HEAVY []" in r.stdout


def test_help_comes_from_the_registry_and_names_check():
    r = run_rnn(["--help"])
    assert r.returncode == 0 and "[--check]" in r.stdout
    for key in keys.KEYS:
        assert f"  {key} " in r.stdout, key


# ----- RETURNN's names, generated from its source -----

def test_generated_names_hold_what_recipes_use():
    for name in ("batch_size", "chunking", "multiprocessing", "update_on_device", "truncation",
                 "newbob_multi_num_epochs", "use_tensorflow", "tf_session_opts", "horovod_reduce_type"):
        assert name in returnn_keys.CONFIG_KEYS, name
    assert not [name for name in returnn_keys.CONFIG_KEYS if name.startswith("_")]
    assert {"unit", "direction", "unroll", "max_seq_len"} <= returnn_keys.LAYER_OPTIONS["rec"]
    assert {"L2", "loss_opts", "dropout", "from", "class"} <= returnn_keys.LAYER_COMMON_OPTIONS | \
        returnn_keys.LAYER_OPTIONS["rec"]
    assert {"time_chunking", "neural_transducer", "softmax"} <= set(returnn_keys.LAYER_OPTIONS)
    assert {"files", "use_cache_manager"} <= returnn_keys.DATASET_OPTIONS["HDFDataset"]
    assert {"partition_epoch", "seq_ordering", "estimated_num_seqs"} <= returnn_keys.DATASET_COMMON_OPTIONS


FAKE_RETURNN = {
    "returnn/config.py": "def f(config):\n    parser.add_option('-w', '--window', dest='window')\n",
    "returnn/engine.py": textwrap.dedent("""\
        KEYS = ["from_module_list"]
        def run(config, train):
            config.int("literal_key", 1)
            self.config.typed_value(f"batch_size_{'train' if train else 'dev'}")
            for key in ["loop_a", "loop_b"]:
                config.value(key, None)
            for key in KEYS:
                config.bool(key, False)
            helper(config, "via_helper")
        def helper(config, name):
            return config.float(name, 0.0)
        """),
    "returnn/old.py": "def f(config):\n  print 'py2'\n  config.value('py2_literal', 1)\n",
    "returnn/layers.py": textwrap.dedent("""\
        class LayerBase:
            def __init__(self, name, network, output, n_out=None, L2=None, _internal=None):
                pass
            @classmethod
            def transform_config_dict(cls, d, network, get_layer):
                d.pop("from", None)
                if "loss_opts" in d:
                    pass
        class RecLayer(LayerBase):
            layer_class = "rec"
            def __init__(self, unit="lstm", direction=1, **kwargs):
                pass
        """),
    "returnn/datasets.py": textwrap.dedent("""\
        class Dataset:
            def __init__(self, name=None, partition_epoch=1):
                pass
        class HDFDataset(Dataset):
            def __init__(self, files, use_cache_manager=False, **kwargs):
                pass
        """),
    "docs/configuration_reference/training.rst": "Training\n========\n\ndocumented_key\n    Text.\n",
    "tests/test_x.py": "config.value('from_a_test', 1)\n",
}


def test_gen_returnn_keys_reads_a_git_repository_and_writes_the_tables(tmp_path):
    repo = tmp_path / "returnn"
    for path, text in FAKE_RETURNN.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "fake"], check=True)
    out = tmp_path / "names.py"
    assert gen_returnn_keys.main(["--git", str(repo / ".git"), "--commit", "HEAD", "--out", str(out)]) == 0
    names: dict = {}
    exec(out.read_text(), names)
    assert names["CONFIG_KEYS"] == {"window", "literal_key", "batch_size_train", "batch_size_dev", "loop_a",
                                    "loop_b", "from_module_list", "via_helper", "py2_literal",
                                    "documented_key"}
    assert names["LAYER_COMMON_OPTIONS"] == {"class", "from", "n_out", "L2", "loss_opts"}
    assert names["LAYER_OPTIONS"] == {"rec": {"unit", "direction"}}
    assert names["DATASET_COMMON_OPTIONS"] == {"name", "partition_epoch"}
    assert names["DATASET_OPTIONS"] == {"HDFDataset": {"files", "use_cache_manager"}}
    dir_out = tmp_path / "from_dir.py"
    assert gen_returnn_keys.main(["--dir", str(repo / "returnn"), "--out", str(dir_out)]) == 0
    from_dir: dict = {}
    exec(dir_out.read_text(), from_dir)
    assert from_dir["CONFIG_KEYS"] == names["CONFIG_KEYS"] - {"documented_key"}  # docs/ is outside returnn/


def test_the_check_refuses_a_data_stream_the_declared_streams_lack():
    """'data:<stream>' sources are checked against the declared streams, as the build checks them."""
    network = {"input": {"class": "linear", "n_out": 4, "from": "data:delayed"},
               "output": {"class": "softmax", "loss": "ce", "target": "data", "from": "input"}}
    declared = {"data": {"dim": 7, "sparse": True}, "delayed": {"dim": 7, "sparse": True}}
    assert collect(Config({"network": network, "extern_data": declared}))[1] == []
    _, problems = collect(Config({"network": network, "extern_data": {"data": declared["data"]}}))
    assert any("'input': 'from' names 'data:delayed', but the data has no sparse stream 'delayed'" in p
               for p in problems)
    dense = {**declared, "delayed": {"dim": 7}}
    assert collect(Config({"network": network, "extern_data": dense}))[1] != []


def test_the_check_refuses_a_loss_target_the_declared_streams_lack():
    """2019-e2e-speech-to-text-comparison/iwslt/direct-ctc: a ctc loss on 'source_text', which its
    num_outputs does not declare; the build refused it, the check accepted it."""
    extern = {"data": {"dim": 4}, "classes": {"dim": 5, "sparse": True}}
    network = {"ctc": {"class": "softmax", "loss": "ctc", "target": "source_text", "from": "data"},
               "output": {"class": "softmax", "loss": "ce", "from": "data"}}
    _, problems = collect(Config({"network": network, "extern_data": extern}))
    assert any("Network layer 'ctc': its loss reads target 'source_text', which the config's extern_data / "
               "num_outputs does not declare (declared streams: classes)" in p for p in problems), problems
    extern["source_text"] = {"dim": 3, "sparse": True}
    assert collect(Config({"network": network, "extern_data": extern}))[1] == []
    unit = {"output": {"class": "choice", "target": "bpe", "beam_size": 2, "from": "prob"},
            "prob": {"class": "softmax", "from": "prev:output", "n_out": 5}}
    _, problems = collect(Config({"network": {"output": {"class": "rec", "from": [], "unit": unit}},
                                  "extern_data": extern}))
    assert any("'output', unit layer 'output': its choice reads target 'bpe'" in p for p in problems)


@pytest.mark.parametrize("entry, words", [
    ({"dim": None, "shape": (None,), "dtype": "int32", "sparse": True},
     "'alignment': 'dim' must be a positive int and 'sparse' True or False, got dim None"),
    ({"shape": (1,), "dtype": "float32"}, "'alignment': 'dim' must be a positive int"),
    ({"dim": 5, "shape": (1, 5)}, "'alignment': shape (1, 5) is not supported: a stream here is (None, 5)"),
    ({"dim": 5, "sparse": True, "dtype": "float32"}, "dtype 'float32' is not supported for a sparse stream"),
    ({"dim": 5, "same_dim_tags_as": {"t": "tag"}},
     "'alignment': same_dim_tags_as gives the time axis 'tag', which is not a DimensionTag"),
    ({"dim": 5, "dim_tags": ("B", "T", "F")}, "'alignment' has ['dim_tags'], which this engine does not"),
])
def test_extern_data_entries_it_cannot_honour_are_named(entry, words):
    """RETURNN's RNN-T and latent-attention setups declare streams this engine has no layout for; each is
    named in one paragraph (a dim None was a TypeError traceback)."""
    extern = {"data": {"dim": 4, "shape": (None, 4), "available_for_inference": True},
              "classes": {"dim": 5, "sparse": True, "dtype": "int32", "shape": (None,)}}
    network = {"output": {"class": "softmax", "loss": "ce", "from": "data"}}
    assert collect(Config({"network": network, "extern_data": extern}))[1] == []
    _, problems = collect(Config({"network": network, "extern_data": {**extern, "alignment": entry}}))
    assert any(words in p for p in problems), problems


def test_num_outputs_reads_as_returnn_reads_it():
    """num_outputs' own 'data' entry comes before num_inputs (absent in RETURNN's LM configs), and a plain
    num_outputs is the dim of the config's target (RETURNN's _num_inputs_outputs_from_config)."""
    from engine.datasets.streams import data_dims

    dims = data_dims(Config({"num_outputs": {"data": {"dim": 7, "sparse": True}, "delayed": [7, 1]}}), None)
    assert (dims.input_dim, dims.input_sparse, dims.target_dims) == (7, True, {"delayed": 7})
    dims = data_dims(Config({"num_inputs": 3, "num_outputs": 5, "target": "bpe"}), None)
    assert (dims.input_dim, dims.input_sparse, dims.target_dims) == (3, False, {"bpe": 5})


def test_published_configs_debug_and_constant_names_have_no_effect(tmp_path, capsys):
    """Hundreds of RETURNN's published configs set these: a print of the layers' templates, a profile, and
    'dropout' as their own constant (RETURNN's key of that name acts only without a 'network')."""
    cfg = config(tmp_path, """
        debug_print_layer_output_template = True
        store_metadata_mod_step = 100
        debug_grad_summaries = True
        patch_atfork = True
        start_batch = "auto"
        context_window = 1
        dropout = 0.1
        network = {"output": {"class": "softmax", "loss": "ce", "dropout": dropout}}
    """)
    check_at_start(cfg)
    out = capsys.readouterr().out
    for name in ("debug_print_layer_output_template", "store_metadata_mod_step", "debug_grad_summaries",
                 "patch_atfork", "start_batch", "context_window", "dropout"):
        assert out.count(f"config key '{name}'") == 1, out
    cfg.set("start_batch", 100)  # RETURNN refuses any other value too
    cfg.set("context_window", 3)
    refused = (r"config key 'start_batch' \(no effect here only \"auto\"; it is 100\); "
               r"config key 'context_window' \(no effect here only 1; it is 3\)")
    with pytest.raises(ConfigError, match=refused):
        check_at_start(cfg)
    cfg.set("start_batch", "auto")
    cfg.set("context_window", 1)
    cfg.set("network", None)
    cfg.set("get_model", lambda: None)
    with pytest.raises(ConfigError, match="config key 'dropout'"):
        check_at_start(cfg)
