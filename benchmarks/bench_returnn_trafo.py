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
import sys

from bench_returnn_attention import add_batch_arguments, compare, read_checked_setup
from returnn_attention_side import returnn_side

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


def add_size_arguments(parser: argparse.ArgumentParser) -> None:
    """The reduced sizes ``trafo_network`` takes, shared with ``bench_returnn_search.py``."""
    parser.add_argument("--blocks", type=int, default=2, help="encoder and decoder blocks each")
    parser.add_argument("--dim", type=int, default=32, help="the model dim (keys, values)")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ff-dim", type=int, default=64)
    parser.add_argument("--lstm-dim", type=int, default=32)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkout", nargs="?", help="a checkout of rwth-i6/returnn-experiments")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="the setup's config, under the checkout")
    add_size_arguments(parser)
    add_batch_arguments(parser)
    args = parser.parse_args()
    if args.returnn_side:
        returnn_side(args.returnn_side)
        return 0
    checked = read_checked_setup(parser, args, "bench_returnn_trafo")
    if checked is None:
        return 2  # no RETURNN (said on stderr)
    namespace = checked[1].namespace
    if "TransformerNetwork" not in namespace:
        sys.exit(f"bench_returnn_trafo: {args.config} defines no TransformerNetwork")
    title = (f"{args.config}: {args.blocks} + {args.blocks} blocks, dim {args.dim}, {args.heads} heads, ff "
             f"{args.ff_dim}, LSTMs {args.lstm_dim}, {args.classes} classes")
    return compare(args, checked, trafo_network(namespace, args), title, __file__, LAYERS)


if __name__ == "__main__":
    sys.exit(main())
