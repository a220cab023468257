"""What every name of a config means here, before anything runs (``engine/config/key_check.py`` has the
rules).

``check_at_start(config)`` runs before every task: it logs the notes and raises one ConfigError for
everything that would stop the run or change it silently. ``run_check(config)`` is ``rnn.py CONFIG
--check``: it prints every verdict and says whether training would start, without importing TensorFlow
or starting MPI. A network from ``get_network`` is checked when it is built.
"""
from __future__ import annotations

from engine.config.key_check import (EXEMPT, IGNORED, IMPLEMENTED, NO_EFFECT, NOT_IMPLEMENTED, UNKNOWN,
                                     UNKNOWN_KEY_NOTE, Finding, config_findings, error_text, ignored_names,
                                     log_notes, merged)
from engine.config.loader import Config
from engine.datasets.factory import dataset_findings
from engine.datasets.streams import data_dims
from engine.model.pretrain import pretrain_from_config
from engine.model.rec.unit_subnetwork import flatten_subnetworks
from engine.model.spec import build_order, layer_findings, parse_network, sparse_stream_dims, stream_sources
from engine.model.spec_streams import registered_streams
from engine.runtime.errors import ConfigError, EngineError
from engine.training.checkpoints.preload_options import preload_entries
from engine.training.update.lr_control import LearningRateControl

DATASET_KEYS = ("train", "dev", "eval")
_ORDER = (NOT_IMPLEMENTED, UNKNOWN, IGNORED, NO_EFFECT, IMPLEMENTED, EXEMPT)
_SECTIONS = (("config", "config keys"), ("layer", "network layer options"), ("dataset", "dataset options"))


def collect(config: Config) -> tuple[list[Finding], list[str]]:
    """Every verdict (config keys, the options of each layer of a ``network`` dict and of each dataset),
    and the problems that are not about one name (a layer dict that does not parse, an unknown dataset
    class, a bad ``preload_from_files`` entry), as messages."""
    findings = config_findings(config)
    ignored = ignored_names(config)
    problems = []
    try:  # pretraining: the network of each of its epochs (WrapEpochValue resolved, '#config' read)
        schedule = pretrain_from_config(config)
    except EngineError as exc:
        schedule = None
        problems.append(str(exc))
    network = config.value("network") if schedule is None and not config.value("pretrain") else None
    networks = [network] if isinstance(network, dict) else []
    if schedule is not None:
        networks = [schedule.layers(epoch) for epoch in range(1, schedule.num_epochs + 1)]
    try:
        sparse = _declared_sparse_streams(config)
    except EngineError as exc:  # an extern_data / num_outputs entry this engine cannot honour
        sparse = None
        problems.append(str(exc))
    for network in networks:
        try:
            specs = parse_network(network)
            findings += layer_findings(specs, ignored)
            if sparse is not None:
                stream_sources(specs, specs, sparse)
                declared = {s[len("data:"):] if s != "data" else s for s in sparse}
                _check_loss_targets(specs, declared | set(registered_streams(specs)),
                                    config.str("target") or "classes")
            _check_error_measure(config, specs)
        except EngineError as exc:
            problems.append(str(exc))
            break
    try:
        preload_entries(config)
    except EngineError as exc:
        problems.append(str(exc))
    for key in DATASET_KEYS + ("search_data",):
        spec = config.typed(key)
        if key == "search_data" and (not config.has(key) or spec in DATASET_KEYS):
            continue  # the name of one of the datasets above (search.py)
        if spec and not callable(spec):
            try:
                findings += dataset_findings(spec, key, ignored)
            except EngineError as exc:
                problems.append(f"Dataset {key!r}: {exc}")
    return findings, problems


def _declared_sparse_streams(config: Config) -> dict[str, int] | None:
    """The sparse streams a ``data:<stream>`` source may name, where the config declares its streams (else
    they come from the dataset, which the check does not open: the build checks them)."""
    if not (config.has("extern_data") or config.has("num_inputs") or config.has("num_outputs")):
        return None
    dims = data_dims(config, None)
    return sparse_stream_dims(dims.input_dim, dims.input_sparse, dims.target_dims)


def _check_loss_targets(specs: dict, streams: set[str], default: str) -> None:
    """Each loss (and each choice) names a target stream the config declares (its ``target``, else the
    config's ``target``, else "classes"), as the build requires; the dims the check knows are those of
    ``extern_data`` / ``num_outputs``."""
    for name, spec in specs.items():
        layers = {name: spec.opts}
        if spec.subnetwork:
            layers = {f"{name}', unit layer '{unit_name}": opts
                      for unit_name, opts in spec.opts["unit"].items() if isinstance(opts, dict)}
        for where, opts in layers.items():
            if not (opts.get("loss") or opts.get("class") == "choice"):
                continue
            target = opts.get("target", spec.opts.get("target", default) if spec.subnetwork else default)
            if isinstance(target, str) and target not in streams:
                what = "loss" if opts.get("loss") else "choice"
                raise ConfigError(f"Network layer '{where}': its {what} reads target {target!r}, which the "
                                  "config's extern_data / num_outputs does not declare (declared streams: "
                                  f"{', '.join(sorted(streams))}).")


def _check_error_measure(config: Config, specs: dict) -> None:
    """``learning_rate_control_error_measure`` naming a loss layer's score: the training's check
    (``LearningRateControl.resolve_layer_keys``) on the loss layers as the build orders them, where that
    order is known without building (a unit's several losses are ordered by the unit's build)."""
    if not config.has("learning_rate_control_error_measure"):
        return
    layers: list[str] = []
    for name in build_order(specs):
        spec = specs[name]
        if spec.cls in ("softmax", "copy", "decide") and spec.opts.get("loss"):
            layers.append(name)
        elif spec.subnetwork:
            units = [u for u, opts in flatten_subnetworks(name, spec.opts["unit"]).items()
                     if isinstance(opts, dict) and opts.get("loss")]
            if len(units) > 1 and not layers:
                return  # the main layer is one of these, in the order the unit builds them
            layers += [f"{name}/{unit}" for unit in units]
    if "output" in layers:  # the main loss layer, as NetworkModel.loss_layers puts it
        layers.remove("output")
        layers.insert(0, "output")
    LearningRateControl.from_config(config).resolve_layer_keys(layers)


def check_at_start(config: Config) -> None:
    findings, problems = collect(config)
    log_notes(findings)
    reason = stop_reason(findings, problems)
    if reason:
        raise ConfigError(reason)


def run_check(config: Config) -> int:
    """Print the verdicts; 0 when training would start, the ConfigError exit code otherwise."""
    findings, problems = collect(config)
    print(f"Check of {', '.join(config.files) or 'the command line'}:")
    for kind, title in _SECTIONS:
        rows = sorted((f for f in merged(findings) if f.kind == kind),
                      key=lambda f: (_ORDER.index(f.verdict), f.cls, f.name))
        if rows:
            print(f"{title}:")
            width = max(len(_label(f)) for f in rows)
            for f in rows:
                verdict = f.verdict.upper() if f.fatal else f.verdict
                note = UNKNOWN_KEY_NOTE if f.verdict == UNKNOWN and not f.fatal and not f.note else f.note
                where = f"[{f.owners_text}]" if f.owners else ""
                print("  " + "  ".join((f"{_label(f):<{width}}", f"{verdict:<15}", note, where)).rstrip())
    reason = stop_reason(findings, problems)
    if reason:
        print(f"Training would not start. {reason}")
        return ConfigError.exit_code
    warned = any(f.verdict in (UNKNOWN, IGNORED) for f in findings)
    print("Training would start" + (" (see the warnings above)." if warned else "."))
    return 0


def stop_reason(findings: list[Finding], problems: list[str]) -> str:
    fatal = [f for f in merged(findings) if f.fatal]
    return " ".join(([error_text(fatal)] if fatal else []) + problems)


def _label(finding: Finding) -> str:
    return finding.name if finding.kind == "config" else f"{finding.cls}: {finding.name}"
