"""The command line of ``rnn.py``: ``CONFIG [CONFIG ...] [++key value ...] [--check]``, ``--help``,
``--version``."""
from __future__ import annotations

from dataclasses import dataclass, field

import engine
from engine.config import keys
from engine.runtime.errors import ConfigError

USAGE = """usage: rnn.py CONFIG [CONFIG ...] [++key value ...] [--check]
       mpirun -np N python rnn.py CONFIG ++use_horovod 1
       rnn.py --help | --version

Config files load in order (JSON when the file starts with '{', Python otherwise); `++key value`
overrides any key, before and after the files load. A value for a key that holds a number, bool, list
or dict is parsed as a literal of that type; `++key +-0.1` passes -0.1. `--check` prints what each key,
layer option and dataset option means here (implemented, no effect, not implemented, unknown) and
whether training would start, without training."""


@dataclass
class CommandLine:
    config_files: list[str] = field(default_factory=list)
    overrides: list[tuple[str, str]] = field(default_factory=list)
    show_help: bool = False
    show_version: bool = False
    check: bool = False


def help_text() -> str:
    rows = keys.help_rows()
    width = max(len(name) for _, name, _, _ in rows)
    lines = [USAGE, "", "keys [default], by the part of the engine that reads them:"]
    for i, (owner, name, meaning, default) in enumerate(rows):
        if i == 0 or owner != rows[i - 1][0]:
            lines.append(f"{owner}:")
        lines.append(f"  {name:<{width}}  {meaning}" + (f" [{default}]" if default else ""))
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
        elif arg == "--check":
            cmd.check = True
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
