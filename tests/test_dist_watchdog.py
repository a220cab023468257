"""The stall watchdog's decisions, with a fake clock and a fake wait channel (no threads, no MPI): what is
reported, who is named, when the warning and the end come, and that each comes once. test_dist_failure.py
runs it for real."""
from __future__ import annotations

import pytest

from engine.distributed.watchdog import StallLimits, Watchdog
from engine.runtime import log

pytestmark = pytest.mark.tf_latest


class Channel:
    def __init__(self) -> None:
        self.inbox: list[tuple[int, int, float, str]] = []
        self.sent: list[tuple[int, float, str]] = []

    def report_wait(self, count: int, waited: float, what: str, saving: bool) -> None:
        self.sent.append((count, waited, what) + (("saving",) if saving else ()))

    def collect_waits(self) -> list[tuple[int, int, float, str, bool]]:
        """The inbox's (rank, count, waited, what[, saving]) reports; without ``saving``: not saving."""
        received, self.inbox = self.inbox, []
        return [(*report, False) if len(report) == 4 else report for report in received]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Ended(Exception):
    pass


def watchdog(rank: int = 0, size: int = 3, warning: float | None = 60, timeout: float | None = 300,
             bytes_moved=None):
    clock, channel, ended = Clock(), Channel(), []

    def abort(message: str, code: int) -> None:
        ended.append((message, code))
        raise Ended

    dog = Watchdog(StallLimits(warning, timeout), abort, rank=rank, size=size, channel=channel, clock=clock,
                   start=False, bytes_moved=bytes_moved)
    return dog, clock, channel, ended


def test_a_rank_reports_only_waits_longer_than_one_look_with_the_collectives_number_and_name():
    dog, clock, channel, ended = watchdog(rank=2)
    assert dog.poll == 1.0
    for _ in range(3):
        with dog.guard("step signal"), dog.collective("allreduce"):
            clock.now += 0.5
            dog.check()  # a quick collective: nothing sent
    clock.now += 10
    dog.check()  # computing, not waiting: nothing sent
    with dog.collective("broadcast_object"):
        clock.now += 1.5
        dog.check()
        clock.now += 1
        dog.check()
    outer = dog.enter("allreduce in a tf.function")  # how Horovod's in-graph reduction is announced
    clock.now += 2
    dog.check()
    dog.leave(outer)
    dog.check()
    assert channel.sent == [(4, 1.5, "broadcast_object"), (4, 2.5, "broadcast_object"),
                            (5, 2.0, "allreduce in a tf.function")]


def test_rank_0_warns_once_then_ends_the_job_naming_the_missing_ranks(capsys):
    log.init()  # warnings on stderr, whatever earlier tests configured
    dog, clock, channel, ended = watchdog()
    with dog.guard("step signal"), dog.collective("allreduce"):  # collective #1: rank 0 waits
        for second in range(1, 62):
            clock.now += 1
            channel.inbox = [(1, 1, second - 0.5, "step signal (allreduce)")]  # rank 1 too; rank 2 is missing
            dog.check()
            if second == 59:
                assert capsys.readouterr().err == ""
        warned = capsys.readouterr().err
        assert warned.count("stall: rank 2 has not reached collective #1 'step signal (allreduce)' after "
                            "60 s; ranks 0, 1 wait there (distributed_stall_warning). The job ends after "
                            "distributed_stall_timeout = 300 s.") == 1, warned
        clock.now += 240
        channel.inbox = [(1, 1, 300.0, "step signal (allreduce)")]
        with pytest.raises(Ended):
            dog.check()
    assert ended == [("error: rank 2 did not reach collective #1 'step signal (allreduce)' within 300 s "
                      "(distributed_stall_timeout), where ranks 0, 1 wait: it stopped answering or is far "
                      "behind. Ending the MPI job.", 1)]


def test_rank_0_names_itself_when_the_others_wait_for_it():
    dog, clock, channel, ended = watchdog(size=2, warning=None, timeout=10)
    with dog.collective("barrier"):
        pass
    channel.inbox = [(1, 2, 9.0, "step signal (allreduce)")]  # rank 0 is still computing
    clock.now += 1
    dog.check()
    clock.now += 1
    with pytest.raises(Ended):
        dog.check()  # the report was 9 s old one second ago
    assert ended[0][0].startswith("error: rank 0 did not reach collective #2 'step signal (allreduce)' "
                                  "within 10 s (distributed_stall_timeout), where rank 1 waits")


def test_reports_that_stopped_coming_are_forgotten():
    dog, clock, channel, ended = watchdog(size=2, warning=None, timeout=10)
    channel.inbox = [(1, 1, 8.0, "allreduce")]
    dog.check()
    clock.now += 3.5  # three looks without a report: rank 1 is no longer waiting
    dog.check()
    assert ended == []


def test_a_wait_where_every_rank_arrived_ends_at_the_timeout_with_its_own_message():
    dog, clock, channel, ended = watchdog(size=2, timeout=10)
    with dog.collective("allreduce"):
        clock.now += 10.5
        channel.inbox = [(1, 1, 10.0, "allreduce")]  # both wait in #1, yet it does not complete
        with pytest.raises(Ended):
            dog.check()
    assert "'allreduce' did not complete within 10 s (distributed_stall_timeout) although every rank " \
           "entered it" in ended[0][0]


class Link:
    """A fake network byte count: ``rate`` bytes per second of the fake clock (None: not visible)."""

    def __init__(self, clock: Clock, rate: float | None) -> None:
        self.clock, self.rate, self.start = clock, rate, clock.now

    def __call__(self) -> int | None:
        return None if self.rate is None else int((self.clock.now - self.start) * self.rate)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_wait_on_a_link_that_moves_bytes_is_no_stall_and_one_that_moves_none_is(rank):
    dog, clock, channel, ended = watchdog(rank=rank, size=2, timeout=10)
    link = Link(clock, 625e3)  # 5 Mbit/s
    dog._bytes_moved = link
    with dog.collective("allreduce"):
        for _ in range(200):  # 200 s in a reduction that makes progress: never ended
            clock.now += 1
            channel.inbox = [(1, 1, 1.0, "allreduce")]
            dog.check()
        assert ended == []
        if rank == 1:  # what it reports to rank 0 is the time since bytes last moved, not since it entered
            assert channel.sent[-1][1] == 0.0
        link.rate = dog.progress_bytes  # the data stops: only the side channel's chatter is left
        with pytest.raises(Ended):
            for _ in range(30):
                clock.now += 1
                channel.inbox = [(1, 1, 1.0, "allreduce")]
                dog.check()
    stalled = clock.now - 200 - 100.0
    limit = 10 if rank == 0 else 10 + dog.limits.grace
    assert limit < stalled <= limit + 1
    if rank == 0:
        assert "and nothing moved over the network in that time: the link between the hosts is down" \
            in ended[0][0]


@pytest.mark.parametrize("rank", [0, 1])
def test_a_guard_whose_collective_moved_bytes_until_it_ended_is_no_stall(rank):
    """The initial broadcast over a slow link: the guard's Bcast moves bytes for far longer than the
    timeout, then the guard goes on a little (assigning the values). Its wait is the guard's again, which
    began as long ago as the Bcast: it counts from the last bytes moved, not from the guard's start."""
    dog, clock, channel, ended = watchdog(rank=rank, size=2, timeout=10)
    dog._bytes_moved = Link(clock, 625e3)
    with dog.guard("initial parameter broadcast"):
        with dog.collective("broadcast_variables"):
            for _ in range(30):
                clock.now += 1
                channel.inbox = [(1, 1, 1.0, "initial parameter broadcast (broadcast_variables)")]
                dog.check()
        for _ in range(3):
            clock.now += 1
            dog.check()
    assert ended == []


def test_without_a_byte_count_a_wait_counts_from_its_start():
    dog, clock, channel, ended = watchdog(size=2, timeout=10, bytes_moved=None)
    dog._bytes_moved = Link(clock, None)  # a transport the count does not see (InfiniBand)
    with dog.collective("allreduce"):
        clock.now += 5
        dog.check()
        clock.now += 5.5
        with pytest.raises(Ended):
            dog.check()


def test_other_ranks_end_the_job_only_after_rank_0_had_its_grace_period():
    dog, clock, channel, ended = watchdog(rank=1, size=2, timeout=100)
    assert dog.limits.grace == 20
    with dog.guard("step signal"), dog.collective("allreduce"):
        clock.now += 119
        dog.check()
        assert ended == []
        clock.now += 2
        with pytest.raises(Ended):
            dog.check()
    assert "did not complete within 120 s (distributed_stall_timeout + 20 s), and rank 0" in ended[0][0]


def test_no_limits_never_end_anything(capsys):
    dog, clock, channel, ended = watchdog(warning=None, timeout=None)
    with dog.collective("allreduce"):
        channel.inbox = [(1, 1, 10.0 ** 6, "allreduce")]
        clock.now += 10 ** 6
        dog.check()
    assert ended == [] and capsys.readouterr().err == ""


def checkpoint_watchdog(rank: int = 0, channel: bool = True):
    clock, inbox, ended = Clock(), Channel(), []

    def abort(message: str, code: int) -> None:
        ended.append((message, code))
        raise Ended

    dog = Watchdog(StallLimits(warning=5, timeout=10, checkpoint=60), abort, rank=rank, size=2,
                   channel=inbox if channel else None, clock=clock, start=False)
    return dog, clock, inbox, ended


def test_while_rank_0_writes_a_checkpoint_the_waits_end_the_job_only_after_the_checkpoint_timeout(capsys):
    log.init()
    dog, clock, channel, ended = checkpoint_watchdog()
    with dog.collective("allreduce"):
        pass
    with dog.checkpoint_window():  # rank 0 writes: no wait of its own, rank 1 waits for it
        for second in range(1, 60):
            clock.now += 1
            channel.inbox = [(1, 2, second - 0.5, "step signal (allreduce)", True)]
            dog.check()
        assert ended == []
        warned = capsys.readouterr().err
        assert warned.count("stall: rank 0 has not reached collective #2 'step signal (allreduce)' after "
                            "6 s; rank 1 waits there (distributed_stall_warning). The job ends after "
                            "distributed_checkpoint_timeout = 60 s (a checkpoint is being saved).") == 1, \
            warned
        clock.now += 1
        channel.inbox = [(1, 2, 60.0, "step signal (allreduce)", True)]
        with pytest.raises(Ended):
            dog.check()
    assert ended == [("error: rank 0 did not reach collective #2 'step signal (allreduce)' within 60 s "
                      "(distributed_checkpoint_timeout), where rank 1 waits: a checkpoint is being saved, "
                      "and its write is stuck or slower than that (raise distributed_checkpoint_timeout for "
                      "large checkpoints on slow storage), or rank 0 stopped answering. Ending the MPI job.",
                      1)]


def test_a_report_that_arrives_after_rank_0_left_the_collective_ends_nothing():
    dog, clock, channel, ended = checkpoint_watchdog()
    with dog.checkpoint_window():
        clock.now += 15  # rank 0 wrote for 15 s, rank 1 waited for it in collective #1
        channel.inbox = [(1, 1, 15.0, "step signal (allreduce)", True)]
        dog.check()
        with dog.collective("allreduce"):  # rank 0 joins #1, which completes for both
            pass
    clock.now += 0.3  # rank 1's last report, sent before #1 completed, is still taken as current
    dog.check()
    assert ended == []


def test_a_rank_waiting_in_the_window_for_a_rank_0_that_is_not_writing_gets_no_extension():
    dog, clock, channel, ended = checkpoint_watchdog()
    clock.now += 11  # rank 0 still trains its step (no checkpoint window); rank 1 entered the save early
    channel.inbox = [(1, 2, 11.0, "checkpoint (gather_object)", True)]
    with pytest.raises(Ended):
        dog.check()
    assert "within 10 s (distributed_stall_timeout)" in ended[0][0]


def test_other_ranks_wait_in_the_window_until_the_checkpoint_timeout_and_its_grace():
    dog, clock, channel, ended = checkpoint_watchdog(rank=1)
    with dog.checkpoint_window(), dog.guard("step signal"), dog.collective("allreduce"):
        clock.now += 2
        dog.check()
        assert channel.sent == [(1, 2.0, "step signal (allreduce)", "saving")]
        clock.now += 73  # past distributed_stall_timeout + its grace (21 s), within 60 + 16 s
        dog.check()
        assert ended == []
        clock.now += 2
        with pytest.raises(Ended):
            dog.check()
    assert "did not complete within 76 s (distributed_checkpoint_timeout + 16 s), and rank 0" in ended[0][0]
    with dog.guard("step signal"), dog.collective("allreduce"):  # the window is over: the usual limit
        clock.now += 2
        dog.check()
    assert channel.sent[-1] == (2, 2.0, "step signal (allreduce)")


def test_without_a_channel_every_rank_warns_and_ends_the_job_itself_naming_its_collective(capsys):
    log.init()
    dog, clock, _, ended = checkpoint_watchdog(rank=1, channel=False)
    assert dog.local_only
    with dog.guard("step signal"), dog.collective("allreduce"):
        for _ in range(3):
            clock.now += 3
            dog.check()
        assert capsys.readouterr().err.count(
            "stall: rank 1 waits in collective #1 'step signal (allreduce)' for 6 s "
            "(distributed_stall_warning); the ranks not there yet cannot be named (MPI runs below "
            "THREAD_MULTIPLE, so the watchdog thread does not call MPI). The job ends after "
            "distributed_stall_timeout = 10 s.") == 1
        clock.now += 2  # 11 s: no grace, nobody else ends the job
        with pytest.raises(Ended):
            dog.check()
    assert ended[0][0] == (
        "error: collective #1 'step signal (allreduce)' did not complete within 10 s "
        "(distributed_stall_timeout); the ranks that did not arrive cannot be named (MPI runs below "
        "THREAD_MULTIPLE, so the watchdog thread does not call MPI). Ending the MPI job.")
