"""The command line of ``rnn.py``: ``CONFIG [CONFIG ...] [++key value ...]``, ``--help``, ``--version``."""
from __future__ import annotations

from dataclasses import dataclass, field

import engine
from engine.errors import ConfigError

USAGE = """usage: rnn.py CONFIG [CONFIG ...] [++key value ...]
       mpirun -np N python rnn.py CONFIG ++use_horovod 1
       rnn.py --help | --version

Config files load in order (Python when the file ends in .py or starts with #!, JSON when it starts
with '{'); `++key value` overrides any key, before and after the files load. A value for a key that
holds a number, bool, list or dict is parsed as a literal of that type; `++key +-0.1` passes -0.1."""

# (key, default, meaning): what --help lists. The full contract is in docs/.
DOCUMENTED_KEYS: list[tuple[str, str, str]] = [
    ("task", '"train"', "train | eval | forward"),
    ("train, dev, eval", "", 'dataset dict, "file1.hdf,file2.hdf", or "Class:kw=v,..."'),
    ("extern_data", "from train data", "stream dims and sparsity (legacy: num_inputs, num_outputs)"),
    ("batch_size", "required", "max padded frames per batch (max_len * num_seqs), per rank"),
    ("max_seqs", "-1", "max sequences per batch (-1: no limit)"),
    ("max_seq_length", "0", "skip longer sequences (0: no limit; int or per-key dict)"),
    ("batching", "", "default seq_ordering of the train dataset"),
    ("cache_size", "", 'HDF cache bytes ("0": read from file; suffixes K/M/G)'),
    ("num_epochs", "5", "epochs to train"),
    ("model", "", "checkpoint prefix; epoch N is saved as <model>.<NNN>"),
    ("save_interval", "1", "save every N epochs (and at the end)"),
    ("start_epoch", '"auto"', "auto: resume after the newest checkpoint"),
    ("load", "", "checkpoint to load for eval/forward"),
    ("load_epoch", "", "eval/forward: load <model>.<load_epoch> (default: the newest)"),
    ("learning_rate", "1.0", "initial learning rate"),
    ("learning_rates", "", "per-epoch learning rates (list)"),
    ("learning_rate_control", '"constant"', "constant | newbob | newbob_rel | newbob_abs"),
    ("learning_rate_file", "", "per-epoch history of learning rates and scores"),
    ("optimizer", '{"class": "adam"}', "adam | sgd | momentum | rmsprop | nadam"),
    ("gradient_clip_global_norm", "", "clip gradients to this global norm"),
    ("network", "", "layer dict (linear, rec, softmax, dropout, copy) or get_model function"),
    ("output_file", "", "forward task: HDF file to write"),
    ("log", "", "log file(s); per rank <name>.horovod-<rank>-<size><ext> under MPI"),
    ("log_verbosity", "3", "0..5; 5 prints every step and tracebacks"),
    ("log_all_ranks", "False", "print progress of every rank on stdout, prefixed with the rank"),
    ("device", "GPU when present", "cpu | gpu"),
    ("random_seed", "42", "seed for the initial parameters (data order: the datasets' own seeds)"),
    ("use_horovod", "False", "data-parallel training over the ranks of the MPI job"),
    ("horovod_reduce_type", '"grad"', "grad: allreduce gradients each step; param: average parameters"),
    ("horovod_param_sync_step", "1", "param mode: average every N steps"),
    ("horovod_param_sync_time_diff", "None", "param mode: average every T seconds instead"),
    ("horovod_dataset_distribution", '"shard"', "shard | random_seed_offset"),
    ("horovod_scale_lr", "False", "multiply the learning rate by the number of ranks"),
    ("horovod_avg_grad", "False", "grad mode: average instead of sum"),
    ("distributed_backend", '"auto"', "auto | horovod | mpi (auto: Horovod when importable)"),
    ("distributed_stall_timeout", "None", "abort the job when a collective waits longer (seconds)"),
    ("debug", "False", "show tracebacks for errors"),
]


@dataclass
class CommandLine:
    config_files: list[str] = field(default_factory=list)
    overrides: list[tuple[str, str]] = field(default_factory=list)
    show_help: bool = False
    show_version: bool = False


def help_text() -> str:
    width = max(len(key) for key, _, _ in DOCUMENTED_KEYS)
    lines = [USAGE, "", "keys [default]:"]
    for key, default, meaning in DOCUMENTED_KEYS:
        lines.append(f"  {key:<{width}}  {meaning}" + (f" [{default}]" if default else ""))
    lines.append("\nSpecs: docs/config-and-cli.md, docs/distributed-protocol.md, docs/hdf-format.md.")
    return "\n".join(lines)


def version_text() -> str:
    return f"rnn.py (engine {engine.__version__})"


def parse_command_line(argv: list[str]) -> CommandLine:
    """Split ``argv`` (without the program name) into config files and ``++`` overrides."""
    cmd = CommandLine()
    i = 0
    while i < len(argv) and not argv[i].startswith(("-", "+")):
        cmd.config_files.append(argv[i])
        i += 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            cmd.show_help = True
        elif arg == "--version":
            cmd.show_version = True
        elif arg.startswith("++") and len(arg) > 2:
            key = arg[2:]
            if i + 1 >= len(argv) or argv[i + 1].startswith("++"):
                raise ConfigError(f"Command line: '++{key}' has no value; write '++{key} VALUE'.")
            cmd.overrides.append((key, argv[i + 1]))
            i += 1
        elif arg.startswith(("-", "+")):
            raise ConfigError(f"Command line: unknown option '{arg}'. Overrides are written '++key value'; "
                              "see --help.")
        else:
            raise ConfigError(f"Command line: unexpected argument '{arg}'. Config files come first, then "
                              "'++key value' pairs; see --help.")
        i += 1
    if not (cmd.config_files or cmd.overrides or cmd.show_help or cmd.show_version):
        raise ConfigError("Command line: no config file given.\n" + USAGE)
    return cmd
