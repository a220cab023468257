"""``task = "search"``: an attention model's beam search over an HDF corpus with BPE labels, on 1 and on
2 ranks (the same file, byte for byte), RETURNN's output formats, the scores it prints (recomputed here
from the file), and a rank that fails (a sequence with a NaN frame) ending the job without a file."""
import ast
import copy
import gzip
import re
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from engine.config.loader import Config
from engine.datasets import DataKeyInfo, HDFWriter
from engine.model.rec.decide import Decide
from engine.model.rec.subnet import RecSubnet
from engine.runtime.errors import ConfigError, DataError
from engine.tasks.search import returnn_scores, summary
from engine.tasks.search_layers import SearchLayers, search_layers
from engine.tasks.search_output import (BeamScore, HypothesisText, SeqResult, check_format, edit_distance,
                                        returnn_repr, score_sequence, vocabulary_from_labels,
                                        write_hypotheses)
from helpers import ROOT, run_mpi, run_rnn

LABELS = ["</s>", "HE@@", "LLO", "WOR@@", "LD", "A", "B@@", "C", "THE", "CAT", "DOG", "SAT"]
ATTENTION = {  # the attention decoder of RETURNN's LibriSpeech setups, tiny
    "source": {"class": "eval", "eval": "tf.clip_by_value(source(0), -3.0, 3.0)"},
    "lstm0_fw": {"class": "rec", "unit": "nativelstm2", "n_out": 8, "direction": 1, "from": ["source"]},
    "lstm0_bw": {"class": "rec", "unit": "nativelstm2", "n_out": 8, "direction": -1, "from": ["source"]},
    "lstm0_pool": {"class": "pool", "mode": "max", "padding": "same", "pool_size": (2,),
                   "from": ["lstm0_fw", "lstm0_bw"], "trainable": False},
    "encoder": {"class": "copy", "from": ["lstm0_pool"]},
    "enc_ctx": {"class": "linear", "activation": None, "with_bias": True, "from": ["encoder"], "n_out": 10},
    "inv_fertility": {"class": "linear", "activation": "sigmoid", "with_bias": False, "from": ["encoder"],
                      "n_out": 1},
    "enc_value": {"class": "split_dims", "axis": "F", "dims": (1, 16), "from": ["encoder"]},
    "output": {"class": "rec", "from": [], "target": "classes",
               "max_seq_len": "max_len_from('base:encoder')", "unit": {
                   "output": {"class": "choice", "target": "classes", "beam_size": 4, "from": ["output_prob"],
                              "initial_output": 0},
                   "end": {"class": "compare", "from": ["output"], "value": 0},
                   "target_embed": {"class": "linear", "activation": None, "with_bias": False,
                                    "from": ["output"], "n_out": 6, "initial_output": 0},
                   "weight_feedback": {"class": "linear", "activation": None, "with_bias": False,
                                       "from": ["prev:accum_att_weights"], "n_out": 10},
                   "s_transformed": {"class": "linear", "activation": None, "with_bias": False,
                                     "from": ["s"], "n_out": 10},
                   "energy_in": {"class": "combine", "kind": "add",
                                 "from": ["base:enc_ctx", "weight_feedback", "s_transformed"], "n_out": 10},
                   "energy_tanh": {"class": "activation", "activation": "tanh", "from": ["energy_in"]},
                   "energy": {"class": "linear", "activation": None, "with_bias": False,
                              "from": ["energy_tanh"], "n_out": 1},
                   "att_weights": {"class": "softmax_over_spatial", "from": ["energy"]},
                   "accum_att_weights": {
                       "class": "eval", "eval": "source(0) + source(1) * source(2) * 0.5",
                       "from": ["prev:accum_att_weights", "att_weights", "base:inv_fertility"],
                       "out_type": {"dim": 1, "shape": (None, 1)}},
                   "att0": {"class": "generic_attention", "weights": "att_weights", "base": "base:enc_value"},
                   "att": {"class": "merge_dims", "axes": "except_batch", "from": ["att0"]},
                   "s": {"class": "rnn_cell", "unit": "LSTMBlock", "from": ["prev:target_embed", "prev:att"],
                         "n_out": 8},
                   "readout_in": {"class": "linear", "from": ["s", "prev:target_embed", "att"],
                                  "activation": None, "n_out": 8},
                   "readout": {"class": "reduce_out", "mode": "max", "num_pieces": 2, "from": ["readout_in"]},
                   "output_prob": {"class": "softmax", "from": ["readout"], "dropout": 0.3,
                                   "target": "classes", "loss": "ce",
                                   "loss_opts": {"label_smoothing": 0.1}}}},
    "decision": {"class": "decide", "from": ["output"], "loss": "edit_distance", "target": "classes"},
    "ctc": {"class": "softmax", "from": ["encoder"], "loss": "ctc", "target": "classes",
            "loss_opts": {"beam_width": 1, "ctc_opts": {"ignore_longer_outputs_than_inputs": True}}},
}


def write_corpus(path, num_seqs, seed, nan_seq=None):
    rng = np.random.RandomState(seed)
    keys = {"data": DataKeyInfo(dim=5), "classes": DataKeyInfo(dim=len(LABELS), sparse=True)}
    with HDFWriter(str(path), keys, labels={"classes": LABELS}) as writer:
        for i in range(num_seqs):
            frames = rng.randn(rng.randint(6, 16), 5).astype(np.float32)
            if i == nan_seq:
                frames[2, 1] = np.nan
            labels = np.concatenate([rng.randint(1, len(LABELS), size=rng.randint(1, 5)), [0]])
            labels = labels.astype(np.int32)
            writer.insert(f"corpus/seq-{i}", {"data": frames, "classes": labels})
    return str(path)


def references(path):
    """seq tag -> its label ids, from the HDF file itself."""
    with h5py.File(path) as f:
        tags = [t.decode() if isinstance(t, bytes) else t for t in f["seqTags"][:]]
        lengths, ids = f["seqLengths"][:, 1], f["targets/data/classes"][:]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return {tag: ids[s:s + n].tolist() for tag, s, n in zip(tags, starts, lengths)}


def levenshtein(a, b):
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return d[len(a)][len(b)]


def words(label_ids):
    if label_ids and label_ids[-1] == 0:  # the end label ('end' compares the choice with 0): no word
        label_ids = label_ids[:-1]
    return " ".join(LABELS[i] for i in label_ids).replace("@@ ", "").split()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("search")
    corpus = {name: write_corpus(folder / f"{name}.hdf", n, seed, nan) for name, n, seed, nan in
              [("train", 12, 1, None), ("dev", 11, 2, None), ("bad", 11, 2, 9)]}
    config = folder / "att.py"
    config.write_text(f"network = {ATTENTION!r}\n"
                      f"train = {{'class': 'HDFDataset', 'files': [{corpus['train']!r}]}}\n"
                      f"eval = {{'class': 'HDFDataset', 'files': [{corpus['dev']!r}]}}\n"
                      "batch_size = 60\n"
                      f"model = {str(folder / 'out' / 'model')!r}\nsearch_output_layer = 'decision'\n")
    from engine.model import build_model
    from engine.training.checkpoints.file_format import checkpoint_path, save_checkpoint

    # untrained: the search does not care, and training would take longer than all searches here
    model = build_model(ATTENTION, input_dim=5, input_sparse=False, target_dims={"classes": len(LABELS)},
                        random_seed=3)
    save_checkpoint(checkpoint_path(str(folder / "out" / "model"), 1), model.named_variables(), [], epoch=1,
                    global_step=0)
    return folder, str(config), corpus


@pytest.mark.mpi
@pytest.mark.slow
def test_one_and_two_ranks_write_the_same_file_and_print_its_scores(trained):
    folder, config, corpus = trained
    one, two = folder / "one.py", folder / "two.py"
    # RETURNN's py output of the decision and the rec layer's whole beam, a dict per sequence
    layers = ["++search_output_layer", "['decision', 'output']"]
    r1 = run_rnn([config, "++task", "search", "++search_output_file", str(one),
                  "++search_output_file_format", "py", *layers], timeout=300)
    assert r1.returncode == 0, r1.stdout + r1.stderr
    r2 = run_mpi(2, [str(ROOT / "rnn.py"), config, "++use_horovod", "1", "++task", "search",
                     "++search_output_file", str(two), "++search_output_file_format", "py", *layers],
                 timeout=300)
    assert r2.returncode == 0, r2.stdout + r2.stderr
    assert one.read_bytes() == two.read_bytes()
    text = one.read_text()
    refs = references(corpus["dev"])
    tags = re.findall(r"(?m)^'([^']*)': [{]$", text)
    assert sorted(tags) == sorted(refs) and len(tags) == len(set(tags))
    assert text.startswith("{\n") and text.endswith("],\n},\n}\n")
    entries = ast.literal_eval(text)
    for entry in entries.values():  # the beam (4), best first; the decide layer took its best
        scores = [score for score, _ in entry["output"]]
        assert len(scores) == 4 and scores == sorted(scores, reverse=True)
        assert entry["decision"] == entry["output"][0][1]
    hyps = {tag: entry["decision"] for tag, entry in entries.items()}
    ids = {tag: [LABELS.index(label) for label in hyp.split()] for tag, hyp in hyps.items()}
    word_errors = sum(levenshtein(words(ids[tag]), words(refs[tag])) for tag in refs)
    ref_words = sum(len(words(refs[tag])) for tag in refs)
    label_errors = sum(levenshtein(ids[tag], refs[tag]) for tag in refs)
    ref_labels = sum(len(refs[tag]) for tag in refs)
    # the ctc layer on the encoder is scored as the eval task scores it (the same numbers, printed there
    # with 6 decimals), the decide layer by the label errors of the hypotheses
    scored = run_rnn([config, "++task", "eval"], timeout=300)
    assert scored.returncode == 0, scored.stdout + scored.stderr
    ctc = re.search(r"eval: score_ctc (\S+) error_ctc (\S+)", scored.stdout)
    assert ctc, scored.stdout
    for r in (r1, r2):
        line = re.search(r"Search done\. Num steps \d+, Final: score (\S+) error ctc (\S+) decision (\S+)\n",
                         r.stdout)
        assert line, r.stdout
        assert float(line[1]) == pytest.approx(float(ctc[1]), abs=2e-6)
        assert float(line[2]) == pytest.approx(float(ctc[2]), abs=2e-6)
        assert line[3] == str(label_errors / ref_labels)
        assert (f"search: WER {word_errors / ref_words:.6f} ({word_errors} word errors / {ref_words} "
                f"reference words, {len(refs)} sequences)") in r.stdout, r.stdout
    assert "on 2 rank(s)" in r2.stdout


@pytest.mark.slow
def test_the_rec_layer_alone_writes_its_beams_one_a_line_in_txt(trained):
    """search_output_layer "output" (the rec layer; 19 published configs name it): each line is the beam as
    Python prints the list, best first; the decision of the network's decide layer is still scored."""
    folder, config, corpus = trained
    out = folder / "beams.txt"
    r = run_rnn([config, "++task", "search", "++search_output_file", str(out), "++search_output_layer",
                 "output"], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == len(references(corpus["dev"]))
    for line in lines:
        beam = ast.literal_eval(line)
        assert len(beam) == 4
        assert all(isinstance(score, float) and isinstance(text, str) for score, text in beam)
        assert [score for score, _ in beam] == sorted((score for score, _ in beam), reverse=True)
    assert re.search(r"Final: score \S+ error ctc \S+ decision \S+\n", r.stdout), r.stdout


FAVOUR_A = """
def favour_a(layer, scores_in, scores_base, end_flags, **kwargs):
    import tensorflow as tf
    from TFUtil import where_bc
    bonus = tf.one_hot(5, layer.output.dim, on_value=50.0)  # label 'A'
    return scores_base + scores_in + where_bc(end_flags[:, :, None], 0.0, bonus[None, None])
"""


@pytest.mark.slow
def test_a_custom_score_combine_of_the_config_decides_the_search(trained):
    """The config's function (importing RETURNN's where_bc when called) in place of the scores' sum: a
    bonus for label 'A' on every step makes every decision 'A' up to max_seq_len."""
    folder, config, corpus = trained
    network = copy.deepcopy(ATTENTION)
    network["output"]["unit"]["output"]["custom_score_combine"] = "<favour_a>"
    combined = folder / "favour_a.py"
    combined.write_text(FAVOUR_A + open(config).read().replace(f"network = {ATTENTION!r}", f"network = "
                        f"{network!r}").replace("'<favour_a>'", "favour_a"))
    out = folder / "favour_a.txt"
    r = run_rnn([str(combined), "++task", "search", "++search_output_file", str(out)], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == len(references(corpus["dev"]))
    assert all(line and set(line.split()) == {"A"} for line in lines), lines


@pytest.mark.mpi
@pytest.mark.slow
def test_a_failing_rank_ends_the_job_with_its_message_and_leaves_no_file(trained):
    folder, config, corpus = trained
    out = folder / "bad.txt"
    r = run_mpi(2, [str(ROOT / "rnn.py"), config, "++use_horovod", "1", "++task", "search",
                    "++search_output_file", str(out), "++search_data",
                    f"{{'class': 'HDFDataset', 'files': [{corpus['bad']!r}]}}"], timeout=300)
    assert r.returncode != 0
    message = "search: the best hypothesis of sequence 'corpus/seq-9' has score NaN"
    assert r.stderr.count(message) == 1 and "Another rank failed" in r.stderr, r.stdout + r.stderr
    assert not [p.name for p in folder.iterdir() if p.name.startswith(("bad.txt", ".bad.txt"))]


def test_edit_distance_is_levenshtein():
    rng = np.random.RandomState(3)
    for _ in range(200):
        a, b = (rng.randint(0, 4, size=rng.randint(0, 9)).tolist() for _ in range(2))
        assert edit_distance(a, b) == levenshtein(a, b)
    assert edit_distance(["the", "cat"], ["a", "cat", "sat"]) == 2


def test_text_and_words_of_each_kind_of_vocabulary():
    bpe = HypothesisText(vocabulary_from_labels(LABELS), end_label=0)
    assert bpe.has_words and bpe.text(np.array([1, 2, 3, 4]), "t") == "HE@@ LLO WOR@@ LD"
    assert bpe.words(np.array([1, 2, 3, 4, 0]), "t") == ["HELLO", "WORLD"]
    assert bpe.words(np.array([8, 6]), "t") == ["THE", "B"]  # a piece left open at the end
    chars = HypothesisText(vocabulary_from_labels(list("abc ")), end_label=None)
    assert chars.text(np.array([0, 1, 3, 2]), "t") == "ab c"
    assert chars.words(np.array([0, 3, 2]), "t") == ["a", "c"]
    assert not HypothesisText(vocabulary_from_labels(list("abc")), None).has_words
    utf8 = HypothesisText(vocabulary_from_labels([chr(i) for i in range(256)]), None)
    assert utf8.text(np.array(list("é a".encode())), "t") == "é a"
    with pytest.raises(DataError, match="'t' is not UTF-8 text"):
        utf8.text(np.array([0xC3]), "t")
    with pytest.raises(DataError, match="outside the vocabulary's 12 labels"):
        bpe.text(np.array([12]), "t")
    assert HypothesisText.of(None, [], "classes", 0) is None  # no labels: no text (a file is refused)
    result = score_sequence("t", np.array([1, 2, 7]), np.array([1, 2, 3, 4, 0]), bpe)
    assert (result.output, result.label_errors, result.ref_labels, result.word_errors, result.ref_words) == \
        ("HE@@ LLO C", 3, 5, 1, 2)


@pytest.mark.parametrize("name", ["out.txt", "out.py", "out.py.gz"])
def test_the_file_formats_are_returnns(tmp_path, name):
    results = [SeqResult("a/1", "HE@@ LLO"), SeqResult("b'2", "")]
    tmp = tmp_path / "tmp"
    fmt = "txt" if ".txt" in name else "py"
    write_hypotheses(str(tmp), str(tmp_path / name), fmt, results)
    data = tmp.read_bytes()
    text = (gzip.decompress(data) if name.endswith(".gz") else data).decode()
    if fmt == "txt":
        assert text == "HE@@ LLO\n\n"
    else:
        assert text == "{\n'a/1': 'HE@@ LLO',\n\"b'2\": '',\n}\n"
        assert ast.literal_eval(text) == {"a/1": "HE@@ LLO", "b'2": ""}
    if name.endswith(".gz"):  # no time stamp: the same hypotheses give the same bytes
        write_hypotheses(str(tmp_path / "again"), str(tmp_path / name), fmt, results)
        assert (tmp_path / "again").read_bytes() == data


def test_beams_and_several_layers_are_written_as_returnn_writes_them(tmp_path):
    """RETURNN's better_repr layout (its file of the bench's search, seq-0, cut to 2 beam entries) and str
    of a beam in the txt format; scores print as numpy prints a float32."""
    beam = [(BeamScore(np.float32(-0.9266699)), "w6 w7 w9 w9"), (BeamScore(np.float32(-1.5)), "w6")]
    tmp = tmp_path / "tmp"
    write_hypotheses(str(tmp), str(tmp_path / "out.py"), "py",
                     [SeqResult("seq-0", {"output": beam, "decision": "w6 w7 w9 w9"})])
    assert tmp.read_text() == ("{\n'seq-0': {\n'decision': 'w6 w7 w9 w9',\n'output': [\n"
                               "(-0.9266699, 'w6 w7 w9 w9'),\n(-1.5, 'w6'),\n],\n},\n}\n")
    write_hypotheses(str(tmp), str(tmp_path / "out.py"), "py", [SeqResult("s", beam[1:])])
    assert tmp.read_text() == "{\n's': [\n(-1.5, 'w6'),\n],\n}\n"
    write_hypotheses(str(tmp), str(tmp_path / "out.txt"), "txt", [SeqResult("s", beam)])
    assert tmp.read_text() == "[(-0.9266699, 'w6 w7 w9 w9'), (-1.5, 'w6')]\n"
    assert returnn_repr({"b": 1, "a": (2,)}) == "{'a': (2,), 'b': 1}"  # short: on one line
    assert returnn_repr([float("nan"), 1e-05]) == "[\nfloat('nan'),\n1e-05,\n]"
    assert repr(BeamScore(np.float32(1e-5))) == "1e-05"


def test_refusals(tmp_path):
    with pytest.raises(ConfigError, match="'json' is not one of txt, py"):
        check_format("", "json")
    (tmp_path / "old.txt").write_text("x")
    with pytest.raises(ConfigError, match="exists already"):
        check_format(str(tmp_path / "old.txt"), "txt")

    rec, plain_rec = RecSubnet.__new__(RecSubnet), RecSubnet.__new__(RecSubnet)
    rec.choice, plain_rec.choice = True, False
    model = SimpleNamespace(
        layers={"output": rec, "ctc": object(), "lstm": plain_rec,
                "decision": Decide("decision", {}, 12, {"classes": 12}),
                "decision2": Decide("decision2", {}, 12, {"classes": 12})},
        specs={name: SimpleNamespace(sources=("output",)) for name in ("decision", "decision2")})
    config = Config()
    for value, message in [
            (["decision", "decision2"], "the decide layers \\['decision', 'decision2'\\] of one rec layer"),
            ("lstm", "is a rec layer without a searched subnetwork unit"),
            ("ctc", "is neither a decide layer nor a rec layer with a choice"),
            ([], "must name a layer or list layers"),
            ("nope", "is not a layer of the network; it must name a decide layer or a searched rec layer "
                     ".the network's: \\['output', 'decision', 'decision2'\\]")]:
        config.set("search_output_layer", value)
        with pytest.raises(ConfigError, match=message):
            search_layers(config, model)
    config.set("search_output_layer", "decision")
    assert search_layers(config, model) == SearchLayers(["decision"], False, "output", "decision")
    config.set("search_output_layer", ["output", "decision2"])
    assert search_layers(config, model) == SearchLayers(["output", "decision2"], True, "output", "decision2")
    config.set("search_output_layer", "output")  # the network's decide layer is scored (RETURNN reports it)
    layers = search_layers(config, model)
    assert (layers.decide, layers.decided, layers.beam_outputs()) == ("decision", "decision", ["output"])


@pytest.mark.parametrize("flag, error", [(False, "0.25"), (True, "None")])
def test_the_closing_line_reports_the_decide_error_unless_its_loss_is_dropped_in_search(flag, error):
    """RETURNN drops a layer's loss in a search where loss_only_on_non_search is set (published attention
    setups set it on their decide layer): its closing line then has no error."""
    decide = {"class": "decide", "from": "output", "loss": "edit_distance", "target": "classes",
              "loss_only_on_non_search": flag}
    setup = _summary_setup({"decision": decide}, scored={})
    results = [SeqResult("a", None, label_errors=1, ref_labels=4)]
    assert summary(setup, results, 3, np.zeros((0, 3)))[0] == \
        f"Search done. Num steps 3, Final: score None error {error}"


def test_the_closing_line_has_returnns_scores_of_the_loss_layers_outside_the_loop():
    """RETURNN's format: one value alone, several as "<layer> <value>" in order of the layers' names; a
    loss layer's score and error are its sums divided by its count; an edit_distance loss has an error only.
    """
    decide = {"class": "decide", "from": "output", "loss": "edit_distance", "target": "classes"}
    setup = _summary_setup({"decision": decide}, scored={"ctc": "ctc", "edit": "edit_distance"})
    results = [SeqResult("a", None, label_errors=1, ref_labels=4), SeqResult("b", None, 2, 4)]
    sums = np.array([[30.0, 3.0, 8.0], [0.0, 2.0, 8.0]])
    assert summary(setup, results, 2, sums)[0] == \
        "Search done. Num steps 2, Final: score 3.75 error ctc 0.375 decision 0.375 edit 0.25"
    assert returnn_scores({}) == "None" and returnn_scores({"b": 0.5}) == "0.5"
    assert returnn_scores({"b": 0.5, "a": 1e-7}) == "a 1e-07 b 0.5"


def _summary_setup(specs: dict, scored: dict):
    """A search's setup as ``summary`` reads it: the decide layer's spec, the scored layers' losses."""
    return SimpleNamespace(
        target="classes", layers=SearchLayers(["decision"], False, "output", "decision"), text=None,
        scored=list(scored),
        model=SimpleNamespace(specs={name: SimpleNamespace(opts=opts) for name, opts in specs.items()},
                              loss_objects={name: SimpleNamespace(loss=loss)
                                            for name, loss in scored.items()}))
