"""Which MPI launcher a command is, and the options that let it end a job whose host stopped answering.

    launcher = ask("mpirun")                       # runs `mpirun --version`
    plan = keepalive_plan(launcher, "mpirun", args, os.environ)
    plan.options                                   # to put right after the command name
    plan.notes                                     # one line each: what was added, kept or not possible

Used by ``mpirun-guard`` (engine/tools/mpirun_guard.py), which the job scripts and the documented
multi-host launch lines go through, so that these settings live in one place.

Why: Open MPI's ``mpirun`` waits for its daemon on every host before it exits, also after ``MPI_Abort``;
behind a cut link that was for ever (docs/multi-node.md, section 13). It does notice when the ``ssh``
that started a daemon exits, and ssh exits (255) when its own keepalive goes unanswered: hence ssh's
``ServerAliveInterval`` through Open MPI's ssh-arguments setting (``plm_ssh_args`` in Open MPI 5's PRRTE,
``plm_rsh_args`` in Open MPI 4's ORTE), plus a shorter keepalive on the daemons' own TCP connections
(``oob_tcp_keepalive_*``; both runtimes default to 300 s idle, then 9 probes 20 s apart). Where a
scheduler starts the daemons (SLURM: srun; Grid Engine: qrsh, which would take ssh's ``-o`` for an output
file) there is no ssh to configure. MPICH's Hydra has no setting for its ssh's arguments, and srun is
SLURM's own launcher: for those nothing is added, and a cut link ends the job through the engine's stall
watchdog and the launcher's own failure handling.

A value the site or the user already chose (in the command's arguments, the environment, or an MCA
parameter file) is kept, never replaced, and named in a note.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

SSH_ALIVE = "-o ServerAliveInterval=10 -o ServerAliveCountMax=3"  # ssh exits 30-40 s after a cut
DAEMON_KEEPALIVE = (("oob_tcp_keepalive_time", "30"), ("oob_tcp_keepalive_intvl", "10"),
                    ("oob_tcp_keepalive_probes", "3"))
SSH_ARGS_NAMES = ("plm_ssh_args", "plm_rsh_args")  # PRRTE's name, ORTE's name (either is the user's choice)
NO_QRSH_NAMES = ("plm_ssh_disable_qrsh", "plm_rsh_disable_qrsh")
VERSION_TIMEOUT = 60.0


class LauncherError(RuntimeError):
    """The launcher command cannot be run at all."""


@dataclass(frozen=True)
class Launcher:
    kind: str  # "prrte" (Open MPI >= 5), "orte" (Open MPI <= 4), "hydra" (MPICH and kin), "srun", "unknown"
    version: str  # as the command printed it, "" when unknown
    first_line: str = ""  # of its --version text, for the note on an unknown launcher

    @property
    def title(self) -> str:
        if "(PRRTE)" in self.first_line:  # PRRTE's own prterun, without Open MPI's name
            return f"PRRTE {self.version}"
        return {"prrte": f"Open MPI {self.version} (PRRTE)", "orte": f"Open MPI {self.version} (ORTE)",
                "hydra": f"MPICH Hydra {self.version}", "srun": f"SLURM srun {self.version}"
                }.get(self.kind, "an unknown launcher")


OPEN_MPI = re.compile(r"\(Open MPI\) (\d+)\.(\S+)")
PRRTE = re.compile(r"\(PRRTE\) (\S+)")
HYDRA = re.compile(r"HYDRA build details:.*?Version:\s*(\S+)", re.S)
INTEL = re.compile(r"Intel\(R\) MPI Library.*?Version (\S+?),?\s", re.S)  # Hydra inside
SLURM = re.compile(r"^slurm(?:-wlm)? (\S+)", re.M)


def identify(version_text: str) -> Launcher:
    """The launcher that printed ``version_text`` for ``--version``."""
    first = next((line.strip() for line in version_text.splitlines() if line.strip()), "")
    match = OPEN_MPI.search(version_text)
    if match:
        major = int(match.group(1))
        return Launcher("prrte" if major >= 5 else "orte", f"{major}.{match.group(2)}", first)
    for kind, pattern in (("prrte", PRRTE), ("hydra", HYDRA), ("hydra", INTEL), ("srun", SLURM)):
        match = pattern.search(version_text)
        if match:
            return Launcher(kind, match.group(1), first)
    return Launcher("unknown", "", first)


def ask(command: str) -> Launcher:
    """Run ``command --version`` and identify the launcher; LauncherError when it cannot be run."""
    try:
        done = subprocess.run([command, "--version"], capture_output=True, text=True, errors="replace",
                              timeout=VERSION_TIMEOUT, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise LauncherError(f"cannot run '{command} --version': {error}") from error
    return identify(done.stdout + done.stderr)


@dataclass
class Plan:
    options: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _param_files(launcher: Launcher, command: str, environ: Mapping[str, str]) -> list[Path]:
    """The MCA parameter files this Open MPI reads: the user's, the installation's, and any named by
    ``mca_base_param_files``."""
    which = shutil.which(command, path=environ.get("PATH"))
    prefix = environ.get("OPAL_PREFIX") or (str(Path(os.path.realpath(which)).parent.parent) if which else "")
    home = Path(environ.get("HOME", "~")).expanduser()
    user, installation = ((".prte", "prte-mca-params.conf") if launcher.kind == "prrte"
                          else (".openmpi", "openmpi-mca-params.conf"))
    files = [home / user / "mca-params.conf"] + ([Path(prefix) / "etc" / installation] if prefix else [])
    for variable in ("PRTE_MCA_mca_base_param_files", "OMPI_MCA_mca_base_param_files"):
        files += [Path(p) for p in environ.get(variable, "").split(":") if p and p != "none"]
    return files


def _read_params(path: Path) -> dict[str, str]:
    """``name = value`` lines of an MCA parameter file ('#' starts a comment); {} when it cannot be read."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    params = {}
    for line in text.splitlines():
        name, sep, value = line.split("#", 1)[0].partition("=")
        if sep and name.strip():
            params[name.strip()] = value.strip()
    return params


class _Settings:
    """Where one of a set of MCA parameter names is already set: the arguments, the environment, a file."""

    def __init__(self, launcher: Launcher, command: str, args: list[str], environ: Mapping[str, str]) -> None:
        self.args = args
        self.environ = environ
        self.files = [(path, _read_params(path)) for path in _param_files(launcher, command, environ)]

    def find(self, names: tuple[str, ...]) -> str | None:
        """'NAME in the command's arguments' / 'in the environment (VAR=...)' / 'in FILE (...)', or None."""
        for i, arg in enumerate(self.args):
            for name in names:
                if arg == name or arg.startswith(name + "="):
                    given = arg == name and i + 1 < len(self.args)
                    value = self.args[i + 1] if given else arg.partition("=")[2]
                    return f"{name} is set in the command's arguments ('{value}')"
        for name in names:
            for prefix in ("PRTE_MCA_", "OMPI_MCA_"):
                value = self.environ.get(prefix + name)
                if value is not None:
                    return f"{name} is set in the environment ({prefix}{name}='{value}')"
        for path, params in self.files:
            for name in names:
                if name in params:
                    return f"{name} is set in {path} ('{params[name]}')"
        return None


def _daemons_by(settings: _Settings, environ: Mapping[str, str]) -> str:
    """What starts Open MPI's daemons on the other hosts: 'ssh', or the scheduler's own command."""
    if environ.get("SLURM_JOB_ID"):
        return "srun"
    if environ.get("SGE_ROOT") and environ.get("ARC") and settings.find(NO_QRSH_NAMES) is None:
        return "qrsh"
    return "ssh"


def keepalive_plan(launcher: Launcher, command: str, args: list[str], environ: Mapping[str, str]) -> Plan:
    """The keepalive options for ``launcher`` (started as ``command`` with ``args``), and notes."""
    plan = Plan()
    if launcher.kind in ("prrte", "orte"):
        flag = "--prtemca" if launcher.kind == "prrte" else "--mca"
        settings = _Settings(launcher, command, args, environ)
        added = []
        by = _daemons_by(settings, environ)
        ssh_name = "plm_ssh_args" if launcher.kind == "prrte" else "plm_rsh_args"
        site = settings.find(SSH_ARGS_NAMES)
        if site:
            plan.notes.append(f"{site}: kept, not replaced by ssh's keepalive ({SSH_ALIVE})")
        elif by == "ssh":
            plan.options += [flag, ssh_name, SSH_ALIVE]
            added.append(f"{ssh_name} '{SSH_ALIVE}' (ssh's keepalive)")
        else:
            added.append(f"no ssh options ({by} starts the daemons here)")
        for name, value in DAEMON_KEEPALIVE:
            site = settings.find((name,))
            if site:
                plan.notes.append(f"{site}: kept, not replaced by {value}")
            else:
                plan.options += [flag, name, value]
        if any(name in plan.options for name, _ in DAEMON_KEEPALIVE):
            added.append("the daemons' TCP keepalive (oob_tcp_keepalive_time 30, _intvl 10, _probes 3)")
        if added:
            plan.notes.insert(0, f"{launcher.title}: adding {' and '.join(added)}, so that mpirun ends "
                                 "when a host stops answering")
    elif launcher.kind == "hydra":
        plan.notes.append(f"{launcher.title}: no keepalive options (Hydra has no setting for its ssh's "
                          "arguments); after a cut link the job relies on the engine's stall watchdog "
                          "(ServerAliveInterval in ~/.ssh/config makes ssh end too)")
    elif launcher.kind == "srun":
        plan.notes.append(f"{launcher.title}: no keepalive options needed: SLURM ends the step when it "
                          "declares a node down (SlurmdTimeout), and the engine's stall watchdog ends the "
                          "ranks")
    else:
        plan.notes.append(f"cannot tell which launcher '{command}' is (--version said "
                          f"'{launcher.first_line[:80]}'): no keepalive options; after a cut link the job "
                          "relies on the engine's stall watchdog")
    return plan
