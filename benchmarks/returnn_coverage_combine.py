"""``bench_returnn_search.py --score-combine``: the attention network's choice also scores the coverage of
its attention, as RETURNN's coverage-penalty setups do (2019-asr-e2e-trafo-vs-lstm/tedlium2's base2 ...
eos config has it commented out), through a ``custom_score_combine`` (this benchmark's own function) that
adds 1.5 times each hypothesis' coverage gain to the sum of the scores, reading the unit layers
``prev:coverage`` and ``coverage`` (the encoder frames' accumulated attention, each capped at 0.5, summed
over the frames) as its ``explicit_search_sources``. The network dict carries a mark where the function
goes; the config text defines the function and names it there, so both programs read the same function
from their configs."""
from __future__ import annotations

COVERAGE_MARK = "<coverage_score_combine>"
COVERAGE_COMBINE = """
def coverage_score_combine(layer, scores_in, scores_base, batch_dim, scores_beam_in, base_beam_in, t,
                           end_flags, **kwargs):
    import tensorflow as tf
    from returnn.tf.util.basic import where_bc
    before, now = [src.output.copy_as_batch_major().placeholder for src in layer.explicit_search_sources]
    gain = tf.reshape(now - before, [batch_dim, scores_beam_in])[:, :base_beam_in]  # (batch, beam)
    gain = where_bc(end_flags, 0.0, 1.5 * gain)
    return scores_base + scores_in + gain[:, :, tf.newaxis]

"""


def with_coverage_combine(network: dict) -> dict:
    """The attention network with its choice scoring the coverage (``--score-combine``)."""
    unit = dict(network["output"]["unit"])
    unit["coverage_in"] = {"class": "eval", "from": ["accum_att_weights"],
                           "eval": "tf.minimum(source(0), 0.5)"}
    unit["coverage"] = {"class": "reduce", "mode": "sum", "axes": "t", "from": ["coverage_in"]}
    unit["output"] = {**unit["output"], "custom_score_combine": COVERAGE_MARK,
                      "explicit_search_sources": ["prev:coverage", "coverage"]}
    return {**network, "output": {**network["output"], "unit": unit}}


def with_functions_defined(config_text: str) -> str:
    """The config's text with the function defined in front and named where the network marks it."""
    if COVERAGE_MARK not in config_text:
        return config_text
    return COVERAGE_COMBINE + config_text.replace(repr(COVERAGE_MARK), "coverage_score_combine")
