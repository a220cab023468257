"""The options each top-level layer class takes (``spec.py`` classifies every option against these; the
layer classes check their values), by RETURNN's class name."""
from __future__ import annotations

CLASS_OPTIONS: dict[str, set[str]] = {
    "linear": {"n_out", "activation", "with_bias", "forward_weights_init", "bias_init",
               "use_transposed_weights"},
    "softmax": {"n_out", "loss", "target", "loss_scale", "loss_opts", "with_bias", "darc1", "only_on_eval",
                "forward_weights_init", "bias_init", "use_transposed_weights", "loss_only_on_non_search"},
    "rec": {"n_out", "unit", "direction", "forward_weights_init", "recurrent_weights_init", "bias_init",
            "unit_opts"},  # unit_opts: layers/lstm_norm_options.py checks them per unit
    "decide": {"loss", "target", "loss_opts", "only_on_eval", "length_normalization",
               "loss_only_on_non_search"},
    "copy": {"loss", "target", "loss_scale", "loss_opts", "only_on_eval"},
    "dropout": set(),
    "time_chunking": {"chunk_size", "chunk_step"},
    "time_unchunking": {"chunking_layer"},
    "conv": {"n_out", "filter_size", "padding", "strides", "dilation_rate", "activation", "with_bias",
             "groups", "input_add_feature_dim", "forward_weights_init", "bias_init"},
    "pool": {"mode", "pool_size", "padding", "strides", "dilation_rate", "input_add_feature_dim"},
    "split_dims": {"axis", "dims", "pad_to_multiples", "pad_value"},
    "transposed_conv": {"filter_size", "strides", "padding", "remove_padding", "output_padding", "n_out",
                        "activation", "with_bias", "forward_weights_init", "bias_init"},
    "reinterpret_data": {"size_base", "enforce_batch_major", "set_axes"},
    "merge_dims": {"axes", "keep_order", "n_out"},
    "reduce": {"mode", "axes", "axis", "keep_dims", "use_time_mask", "enforce_batch_dim_axis"},
    "layer_norm": {"epsilon"},
    "batch_norm": {"use_shift", "use_std", "use_sample", "force_sample", "momentum", "epsilon",
                   "update_sample_only_in_training", "delay_sample_update", "param_version", "gamma_init",
                   "beta_init", "masked_time"},
    "activation": {"activation"},
    "gating": {"activation", "gate_activation", "n_out"},
    "reduce_out": {"mode", "num_pieces", "n_out"},
    "slice": {"axis", "slice_start", "slice_end", "slice_step", "n_out"},
    "combine": {"kind", "activation", "with_bias", "n_out"},
    "positional_encoding": {"add_to_input", "n_out"},
    "self_attention": {"n_out", "num_heads", "total_key_dim", "attention_dropout", "attention_left_only",
                       "key_shift", "forward_weights_init"},
    "relative_positional_encoding": {"n_out", "clipping", "fixed", "forward_weights_init"},
    "window": {"window_size", "window_left", "window_right", "axis", "padding", "stride"},
    "pad": {"axes", "padding", "value", "mode", "handle_dynamic_dims"},
    "swap_axes": {"axis1", "axis2"},
    "dot": {"red1", "red2", "var1", "var2"},  # layers/dot.py checks their values
    "length": {"axis", "add_time_axis", "dtype", "sparse"},  # layers/per_sequence.py checks their values
    "compare": {"kind", "value"},
    "squeeze": {"axis", "enforce_batch_dim_axis", "allow_no_op"},  # layers/per_sequence.py
    "softmax_over_spatial": {"axis", "energy_factor", "use_time_mask"},  # layers/time_attention.py
    "generic_attention": {"weights", "base", "auto_squeeze"},
    "eval": {"eval", "eval_locals", "out_type", "n_out", "activation", "with_bias", "eval_for_output_loss",
             "allow_broadcast_all_sources"},  # layers/eval.py refuses some values by name
}
