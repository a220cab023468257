"""engine/tools/mpi_launcher.py: which launcher a `--version` text comes from, and the keepalive options
each gets. The Open MPI 5 text is what this environment's mpirun prints (and the real one is asked too);
the others are written from the formats their projects document and print: Open MPI 4's
``mpirun (Open MPI) 4.1.x`` (its orterun), MPICH's Hydra ``HYDRA build details:`` block, Intel MPI's
one-line banner (Hydra inside) and SLURM's ``slurm 23.02.7``."""
from __future__ import annotations

import subprocess

import pytest

from engine.tools.mpi_launcher import SSH_ALIVE, Launcher, ask, identify, keepalive_plan
from helpers import BIN

OPEN_MPI_5 = "mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n"
OPEN_MPI_4 = "mpirun (Open MPI) 4.1.5\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
HYDRA = """HYDRA build details:
    Version:                                 4.1.2
    Release Date:                            Wed Jun  7 15:22:45 CDT 2023
    CC:                              gcc
    Configure options:                       '--prefix=/usr'
    Process Manager:                         pmi
    Launchers available:                     ssh rsh fork slurm ll lsf sge manual persist
"""
INTEL = ("Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: c2e19c2f3e)\n"
         "Copyright 2003-2023, Intel Corporation.\n")
SRUN = "slurm 23.02.7\n"
PRTERUN = "prterun (PRRTE) 3.0.11\n\nReport bugs to https://github.com/openpmix/prrte\n"


@pytest.mark.parametrize("text, kind, version, title", [
    (OPEN_MPI_5, "prrte", "5.0.11", "Open MPI 5.0.11 (PRRTE)"),
    (OPEN_MPI_4, "orte", "4.1.5", "Open MPI 4.1.5 (ORTE)"),
    (HYDRA, "hydra", "4.1.2", "MPICH Hydra 4.1.2"),
    (INTEL, "hydra", "2021.10", "MPICH Hydra 2021.10"),
    (SRUN, "srun", "23.02.7", "SLURM srun 23.02.7"),
    (PRTERUN, "prrte", "3.0.11", "PRRTE 3.0.11"),
    ("mpiexec: unrecognized option '--version'\n", "unknown", "", "an unknown launcher"),
])
def test_the_launcher_is_identified_by_its_version_text(text, kind, version, title):
    launcher = identify(text)
    assert (launcher.kind, launcher.version, launcher.title) == (kind, version, title)


def test_this_environment_s_mpirun_is_open_mpi_5():
    launcher = ask(str(BIN / "mpirun"))
    assert launcher.kind == "prrte" and launcher.version.startswith("5."), launcher
    assert identify(subprocess.run([str(BIN / "mpirun"), "--version"], capture_output=True,
                                   text=True).stdout) == launcher


def plan(kind: str, tmp_path, args=(), command="mpirun", **environ):
    env = {"HOME": str(tmp_path / "home"), "PATH": str(tmp_path / "bin"), **environ}
    return keepalive_plan(Launcher(kind, "9.9"), command, list(args), env)


KEEPALIVE_5 = ["--prtemca", "oob_tcp_keepalive_time", "30", "--prtemca", "oob_tcp_keepalive_intvl", "10",
               "--prtemca", "oob_tcp_keepalive_probes", "3"]


def test_open_mpi_5_over_ssh_gets_ssh_s_and_the_daemons_keepalive(tmp_path):
    got = plan("prrte", tmp_path)
    assert got.options == ["--prtemca", "plm_ssh_args", SSH_ALIVE, *KEEPALIVE_5]
    assert len(got.notes) == 1 and "adding plm_ssh_args" in got.notes[0]


def test_open_mpi_4_gets_its_own_option_names(tmp_path):
    got = plan("orte", tmp_path)
    assert got.options == ["--mca", "plm_rsh_args", SSH_ALIVE, "--mca", "oob_tcp_keepalive_time", "30",
                           "--mca", "oob_tcp_keepalive_intvl", "10", "--mca", "oob_tcp_keepalive_probes", "3"]
    assert "--prtemca" not in got.options


@pytest.mark.parametrize("environ, args", [
    ({"SLURM_JOB_ID": "12"}, []),  # srun starts the daemons
    ({"SGE_ROOT": "/opt/sge", "ARC": "lx-amd64"}, []),  # qrsh does
])
def test_no_ssh_options_where_a_scheduler_starts_the_daemons(tmp_path, environ, args):
    got = plan("prrte", tmp_path, args, **environ)
    assert got.options == KEEPALIVE_5
    assert "no ssh options" in got.notes[0]


def test_sge_with_qrsh_disabled_uses_ssh(tmp_path):
    got = plan("prrte", tmp_path, ["--prtemca", "plm_ssh_disable_qrsh", "1"], SGE_ROOT="/opt/sge", ARC="x")
    assert "plm_ssh_args" in got.options


def site_prefix(tmp_path, conf_name: str, line: str) -> str:
    """An installation under tmp_path/site with bin/mpirun and etc/CONF_NAME holding ``line``."""
    (tmp_path / "site" / "bin").mkdir(parents=True)
    (tmp_path / "site" / "etc").mkdir()
    mpirun = tmp_path / "site" / "bin" / "mpirun"
    mpirun.write_text("#!/bin/sh\n")
    mpirun.chmod(0o755)
    (tmp_path / "site" / "etc" / conf_name).write_text(f"# the site's settings\n{line}\n")
    return str(mpirun)


@pytest.mark.parametrize("kind, conf_name, name", [
    ("prrte", "prte-mca-params.conf", "plm_ssh_args"), ("orte", "openmpi-mca-params.conf", "plm_rsh_args")])
def test_a_site_s_ssh_arguments_in_the_installation_s_parameter_file_are_kept_and_named(
        tmp_path, kind, conf_name, name):
    mpirun = site_prefix(tmp_path, conf_name, f"{name} = -i /etc/cluster_key -o ServerAliveInterval=5")
    got = plan(kind, tmp_path, command=mpirun)
    assert name not in got.options and "oob_tcp_keepalive_time" in got.options
    conf = tmp_path / "site" / "etc" / conf_name
    assert f"{name} is set in {conf} ('-i /etc/cluster_key -o ServerAliveInterval=5'): kept" in got.notes[1]


@pytest.mark.parametrize("where", ["environment", "arguments", "home"])
def test_a_user_s_own_setting_is_kept_and_named(tmp_path, where):
    environ, args = {}, []
    if where == "environment":
        environ = {"PRTE_MCA_plm_ssh_args": "-p 2222", "OMPI_MCA_oob_tcp_keepalive_time": "60"}
    elif where == "arguments":
        args = ["--prtemca", "plm_ssh_args", "-p 2222", "--mca", "oob_tcp_keepalive_time=60", "-np", "2"]
    else:
        (tmp_path / "home" / ".prte").mkdir(parents=True)
        (tmp_path / "home" / ".prte" / "mca-params.conf").write_text(
            "plm_ssh_args = -p 2222\noob_tcp_keepalive_time = 60  # slow network\n")
    got = plan("prrte", tmp_path, args, **environ)
    assert "plm_ssh_args" not in got.options and "oob_tcp_keepalive_time" not in got.options
    assert got.options == ["--prtemca", "oob_tcp_keepalive_intvl", "10",
                           "--prtemca", "oob_tcp_keepalive_probes", "3"]
    assert any("plm_ssh_args is set in" in n and "'-p 2222'): kept" in n for n in got.notes), got.notes
    assert any("oob_tcp_keepalive_time is set in" in n and "60" in n for n in got.notes), got.notes


@pytest.mark.parametrize("kind, words", [
    ("hydra", "Hydra has no setting for its ssh's arguments"),
    ("srun", "SLURM ends the step when it declares a node down"),
    ("unknown", "cannot tell which launcher"),
])
def test_other_launchers_get_no_options_and_one_line_saying_what_ends_the_job(tmp_path, kind, words):
    got = plan(kind, tmp_path)
    assert got.options == [] and len(got.notes) == 1 and words in got.notes[0]
    assert "stall watchdog" in got.notes[0]
