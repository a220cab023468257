"""The side channel in a real 3-rank job with one rank that takes nothing in (tests/mpi_scripts/
side_channel_stuck_peer.py): the other two still exchange a stop notice and its answer at once, and the
stuck rank gets the notice, sent again, once it takes messages in again. Before, one send in flight to
the stuck rank dropped every later message to every rank."""
from __future__ import annotations

import re

import pytest

from helpers import ROOT, run_mpi

pytestmark = pytest.mark.mpi

SCRIPT = str(ROOT / "tests" / "mpi_scripts" / "side_channel_stuck_peer.py")


def test_one_stuck_rank_neither_delays_nor_drops_the_others_messages_and_its_notice_is_resent(tmp_path):
    result = run_mpi(3, [SCRIPT, str(tmp_path / "rank-0-may-receive")], timeout=90)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for rank in range(3):
        assert f"rank {rank}: ok" in result.stdout, output
    assert "rank 0: ok, got [(1, 10)]" in result.stdout, output


def test_at_exit_the_ranks_meet_and_take_in_what_was_sent_before_mpi_is_finalised():
    """A rank that finishes first does not finalise MPI while another still works and sends (Open MPI 5
    segfaulted in MPI_Finalize once so): it waits for the late rank, and takes in its last message."""
    result = run_mpi(2, [str(ROOT / "tests" / "mpi_scripts" / "side_channel_exit.py")], timeout=90)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    match = re.search(r"rank 0: left after ([\d.]+) s; a message left in: (\w+)", result.stdout)
    assert match, output
    assert float(match.group(1)) >= 1.5, output  # rank 1 lingered 2 s
    assert match.group(2) == "False", output
