"""Scheduler host lists -> Open MPI hostfile (engine/runtime/cluster.py, engine/tools/make_hostfile.py)."""
from __future__ import annotations

import os

import pytest

from engine.runtime.cluster import (HostSlots, check_enough_slots, expand_hostlist, format_host_map,
                                    format_openmpi_hostfile, format_rank_ranges, parse_pe_hostfile,
                                    parse_tasks_per_node, slurm_hosts)
from engine.runtime.errors import DistributedError
from engine.tools import make_hostfile

pytestmark = pytest.mark.tf_latest


def test_pe_hostfile_adds_slots_of_a_host_in_several_queues_and_keeps_the_master_first():
    text = ("node07.example.org 4 all.q@node07.example.org UNDEFINED\n"
            "node02.example.org 2 all.q@node02.example.org UNDEFINED\n"
            "\n"
            "node07.example.org 1 long.q@node07.example.org 0,1\n")
    assert parse_pe_hostfile(text) == [HostSlots("node07.example.org", 5), HostSlots("node02.example.org", 2)]


@pytest.mark.parametrize("text, message", [
    ("node01 four all.q@node01 UNDEFINED\n", "line 1: 'node01 four all.q@node01 UNDEFINED' is not"),
    ("node01 2 q UNDEFINED\nnode02\n", "line 2: 'node02' is not a PE_HOSTFILE line"),
    ("node01 0 q UNDEFINED\n", "SLOTS >= 1"),
    ("\n", "lists no hosts"),
])
def test_pe_hostfile_errors_name_the_file_and_line(text, message):
    with pytest.raises(DistributedError, match="PE_HOSTFILE /spool/pe") as info:
        parse_pe_hostfile(text, source="PE_HOSTFILE /spool/pe")
    assert message in str(info.value)


@pytest.mark.parametrize("expr, hosts", [
    ("node01", ["node01"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("gpu[8-10],login1", ["gpu8", "gpu9", "gpu10", "login1"]),
    ("cn[098-101]-ib", ["cn098-ib", "cn099-ib", "cn100-ib", "cn101-ib"]),
    ("rack[1-2]n[1,3]", ["rack1n1", "rack1n3", "rack2n1", "rack2n3"]),
    (" a[1-2] , b ", ["a1", "a2", "b"]),
])
def test_slurm_host_lists_expand(expr, hosts):
    assert expand_hostlist(expr) == hosts


@pytest.mark.parametrize("expr", ["", "node[01-03", "node]1[", "node[]", "node[3-1]", "node[a-c]", "a,,b"])
def test_bad_slurm_host_lists_are_named(expr):
    with pytest.raises(DistributedError, match=r"\$SLURM_JOB_NODELIST"):
        expand_hostlist(expr)


def test_slurm_tasks_per_node():
    assert parse_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert parse_tasks_per_node("4") == [4]
    with pytest.raises(DistributedError, match=r"\$SLURM_TASKS_PER_NODE = '2\(3\)'"):
        parse_tasks_per_node("2(3)")
    assert slurm_hosts("n[1-3]", "2(x2),1") == [HostSlots("n1", 2), HostSlots("n2", 2), HostSlots("n3", 1)]
    assert slurm_hosts("n[1-2]") == [HostSlots("n1", 1), HostSlots("n2", 1)]
    with pytest.raises(DistributedError, match="counts for 1 nodes, but .* names 3"):
        slurm_hosts("n[1-3]", "2")


def test_openmpi_hostfile_and_slot_check():
    hosts = [HostSlots("n1", 2), HostSlots("n2", 1)]
    assert format_openmpi_hostfile(hosts) == "n1 slots=2\nn2 slots=1\n"
    check_enough_slots(hosts, 3, "the test")
    with pytest.raises(DistributedError, match=r"4 ranks were asked for, but the test grants only 3 slots on "
                                               r"2 host\(s\) \(n1:2, n2:1\)"):
        check_enough_slots(hosts, 4, "the test")


def test_host_rank_map_line():
    assert format_rank_ranges([7, 0, 1, 2, 5, 8]) == "0-2,5,7-8"
    assert format_host_map(["a", "a", "b", "b"]) == "4 ranks on 2 hosts: a ranks 0-1; b ranks 2-3"
    assert format_host_map(["a", "b", "a", "b", "c"]) == \
        "5 ranks on 3 hosts: a ranks 0,2; b ranks 1,3; c rank 4"
    assert format_host_map(["solo"]) == "1 rank on 1 host: solo rank 0"


def test_make_hostfile_cli_from_the_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("PE_HOSTFILE", raising=False)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[01-02]")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "3(x2)")
    out = tmp_path / "hostfile"
    assert make_hostfile.main(["-o", str(out), "--ranks", "6"]) == 0
    assert out.read_text() == "node01 slots=3\nnode02 slots=3\n"
    assert "2 host(s), 6 slot(s) from SLURM node list 'node[01-02]'" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["hostfile"]  # written under a temp name, then renamed

    pe = tmp_path / "pe"
    pe.write_text("node09 4 all.q@node09 UNDEFINED\n")
    monkeypatch.setenv("PE_HOSTFILE", str(pe))  # SGE's file wins over SLURM's variables
    assert make_hostfile.main(["--slots-per-host", "2"]) == 0
    assert capsys.readouterr().out == "node09 slots=2\n"


@pytest.mark.parametrize("argv, message", [
    (["--sge", "/nonexistent/pe_hostfile"], "Cannot read the SGE PE_HOSTFILE /nonexistent/pe_hostfile"),
    (["--slurm", "n[1-2]", "--ranks", "3"],
     "3 ranks were asked for, but SLURM node list 'n[1-2]' grants only 2"),
    ([], "neither $PE_HOSTFILE (SGE) nor $SLURM_JOB_NODELIST (SLURM) is set"),
])
def test_make_hostfile_cli_errors(tmp_path, monkeypatch, capsys, argv, message):
    for name in ("PE_HOSTFILE", "SLURM_JOB_NODELIST", "SLURM_TASKS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "hostfile"
    assert make_hostfile.main([*argv, "-o", str(out)]) == 1
    assert message in capsys.readouterr().err
    assert not out.exists()
