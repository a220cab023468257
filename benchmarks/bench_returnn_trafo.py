#!/usr/bin/env python3
"""RETURNN's Transformer ASR setup (a ``rec`` decoder whose unit is Transformer blocks: causal
``self_attention``, encoder-decoder attention of ``dot`` / ``softmax_over_spatial`` / ``generic_attention``,
``layer_norm``, feed-forward ``linear`` layers, residual ``combine``) beside RETURNN: its loop plan, its
losses at initialisation and after one update, equal or not.

    RETURNN_PYTHON=/tmp/returnn-venv/bin/python \
        .venv/bin/python benchmarks/bench_returnn_trafo.py CHECKOUT
        [--config 2019-asr-e2e-trafo-vs-lstm/librispeech/trafo.12l.ffdim4.pretrain3.config]
        [--blocks 2] [--dim 32] [--heads 4] [--ff-dim 64] [--lstm-dim 32] [--classes 60] [--seqs 3]
        [--frames 36] [--no-update]

CHECKOUT is a checkout of ``rwth-i6/returnn-experiments`` (the project holds none of its files). The
network is the one the config's own ``TransformerNetwork(...).build()`` makes, with reduced sizes for a
small machine: ``--blocks`` encoder and ``--blocks`` decoder blocks (the config: 12 and 12), model dim
``--dim`` (512; keys and values of every attention), ``--heads`` heads (8), feed-forward ``--ff-dim``
(2048), the front end's LSTMs ``--lstm-dim`` (1024), ``--classes`` labels (10025 BPE units); dropout 0.1
and label smoothing 0.1 as the config's. Its ``pretrain`` is not run: the full network is compared.

Everything else is ``bench_returnn_attention.py``'s machinery (its docstring says what is compared and
how): the same random batch, RETURNN's builds and their lists ("train flag tensor" the reference), the
scores in eval at initialisation (1e-5) and one Adam update with every dropout 0 (1 %).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback

import numpy as np

from bench_returnn_attention import UPDATER_KEYS, engine_side, report
from returnn_attention_side import make_batch, returnn_side
from returnn_side import no_returnn, returnn_python, returnn_versions, run_returnn_side

DEFAULT_CONFIG = "2019-asr-e2e-trafo-vs-lstm/librispeech/trafo.12l.ffdim4.pretrain3.config"
# outputs compared (RETURNN hands out those of the decoder only where its plan moves them out of the loop)
LAYERS = ("encoder", "output/target_embed", "output/dec_01_self_att_att", "output/dec_01_att_att",
          "output/dec_01", "output/decoder", "output/output_prob")


def trafo_network(namespace: dict, args: argparse.Namespace) -> dict:
    """The config's network, built by its ``TransformerNetwork`` with the reduced sizes."""
    kwargs = dict(namespace["TrafoDefaultKwargs"])
    kwargs.update(encN=args.blocks, decN=args.blocks, lstm_dim=args.lstm_dim, FFDim=args.ff_dim,
                  EncKeyTotalDim=args.dim, EncValueTotalDim=args.dim, AttNumHeads=args.heads)
    return namespace["TransformerNetwork"](**kwargs).build()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkout", nargs="?", help="a checkout of rwth-i6/returnn-experiments")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="the setup's config, under the checkout")
    parser.add_argument("--blocks", type=int, default=2, help="encoder and decoder blocks each")
    parser.add_argument("--dim", type=int, default=32, help="the model dim (keys, values)")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ff-dim", type=int, default=64)
    parser.add_argument("--lstm-dim", type=int, default=32)
    parser.add_argument("--seqs", type=int, default=3)
    parser.add_argument("--frames", type=int, default=36, help="frames of each sequence (a multiple of 6)")
    parser.add_argument("--classes", type=int, default=60, help="the label vocabulary (EOS 0 included)")
    parser.add_argument("--no-update", action="store_true", help="compare at initialisation only")
    parser.add_argument("--returnn-side", metavar="JOBS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.returnn_side:
        returnn_side(args.returnn_side)
        return 0
    if not args.checkout:
        parser.error("CHECKOUT is required")
    if args.frames % 6 or args.frames < 12:
        parser.error("--frames must be a multiple of 6, at least 12")
    python = returnn_python()
    if python is None:
        return no_returnn("bench_returnn_trafo", "nothing is compared")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from engine.runtime import log

    log.init(verbosity=log.WARNING)
    from returnn_setups import read_setup

    setup = read_setup(args.checkout, args.config)
    if "TransformerNetwork" not in setup.namespace:
        sys.exit(f"bench_returnn_trafo: {args.config} defines no TransformerNetwork")
    dim = int(setup.namespace.get("num_inputs", 40))
    rates = setup.namespace.get("learning_rates")
    learning_rate = float(rates[0] if rates else setup.namespace.get("learning_rate", 0.001))
    with tempfile.TemporaryDirectory() as folder:
        batch = os.path.join(folder, "batch.npz")
        np.savez(batch, **make_batch(args.seqs, args.frames, dim, args.classes))
        job = {"network": repr(trafo_network(setup.namespace, args)), "batch": batch, "seed": 42,
               "layers": list(LAYERS),
               "extern_data": {"data": {"dim": dim, "sparse": False},
                               "classes": {"dim": args.classes, "sparse": True}},
               "checkpoint": os.path.join(folder, "returnn-init"), "results": os.path.join(folder, "r.json"),
               "outputs": os.path.join(folder, "outputs.npz"), "gradients": os.path.join(folder, "grads.npz"),
               "after": None if args.no_update else os.path.join(folder, "returnn-after"),
               "updater": {k: setup.namespace[k] for k in UPDATER_KEYS if k in setup.namespace},
               "learning_rate": learning_rate}
        with open(os.path.join(folder, "job.json"), "w") as f:
            json.dump(job, f)
        run_returnn_side(python, __file__, os.path.join(folder, "job.json"))
        with open(job["results"]) as f:
            theirs = json.load(f)
        print(f"{args.config}: {args.blocks} + {args.blocks} blocks, dim {args.dim}, {args.heads} heads, "
              f"ff {args.ff_dim}, LSTMs {args.lstm_dim}, {args.classes} classes: {args.seqs} sequences of "
              f"{args.frames} frames, labels {np.load(batch)['label_lengths'].tolist()}; "
              f"RETURNN {returnn_versions(python)}")
        ours = {"numbers": {}, "outputs": {}, "numbers after the update": {}, "failures": []}
        try:
            engine_side(job, folder, ours)
        except Exception:  # noqa: BLE001 - RETURNN's reference and what the engine gave are still printed
            ours["failures"].append(traceback.format_exc())
    verdicts = report(theirs, ours, job)
    for failure in dict.fromkeys(ours["failures"]):
        print(f"FAIL the engine side:\n{failure}")
    return 0 if all(verdicts) and not ours["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
