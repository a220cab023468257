"""Stands in for ``python SCRIPT ARGS``: the warm-start server (server.py) forks the process that runs it.

    python tests/warm/client.py SOCKET SCRIPT ARGS...

Sends the command, the environment, the working directory, the umask, the CPU affinity (mpirun's binding)
and descriptors 0-2 to the server at SOCKET, forwards the signals it receives to the child the server
made, and ends as that child ended (its exit status, or killed by the same signal). While the server is
still importing TensorFlow (its pid in ``server.pid`` beside SOCKET is alive, the socket not there yet),
it waits for it, up to ``WAIT_S``: a cold start would import TensorFlow too, at the same CPU cost. Where
the server is gone, or answers "cold", it runs ``python SCRIPT ARGS`` itself, by exec: the same command
without the warm start.
Imports nothing heavy: it costs a Python start-up, not TensorFlow's.
"""
import array
import json
import os
import signal
import socket
import struct
import sys
import time

WAIT_S = 120  # for a server that imports TensorFlow on a loaded machine
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def run_cold(command: list[str]) -> None:
    note("cold")
    os.execv(sys.executable, [sys.executable, *command])


def note(start: str) -> None:
    """One line for the suite's count of warm and cold starts (tests/conftest.py), where it keeps one."""
    if os.environ.get("ENGINE_TESTS_WARM_LOG"):
        with open(os.environ["ENGINE_TESTS_WARM_LOG"], "a") as log:
            log.write(f"{start}\n")


def wait_for_server(path: str) -> None:
    """Returns once the socket exists, or the server that will make it has ended, or after WAIT_S. A signal
    meanwhile ends the client as it would end a process started at once, before its handlers."""
    try:
        with open(os.path.join(os.path.dirname(path), "server.pid")) as f:
            pid = int(f.read())
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(path) and time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in "ZX":  # ended, not yet reaped by its parent
                    return
        except OSError:
            return
        time.sleep(0.05)


def receive_int(sock: socket.socket) -> int | None:
    data = b""
    while len(data) < 4:
        try:
            part = sock.recv(4 - len(data))
        except InterruptedError:
            continue
        if not part:
            return None
        data += part
    return struct.unpack("i", data)[0]


def main() -> None:
    path, *command = sys.argv[1:]
    wait_for_server(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        run_cold(command)
    umask = os.umask(0)
    os.umask(umask)
    request = json.dumps({"argv": command, "env": dict(os.environ), "cwd": os.getcwd(), "umask": umask,
                          "cpus": sorted(os.sched_getaffinity(0))}).encode() + b"\n"
    sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])

    early: list[int] = []  # signals received before the server said the rank runs
    running = [False]

    def send(number: int) -> None:
        try:
            sock.sendall(struct.pack("i", number))
        except OSError:
            pass  # the rank has ended already: its status follows

    def forward(number: int, _frame) -> None:
        if running[0]:
            send(number)
        else:
            early.append(number)

    # handled from here on: the rank may run (and print) before its pid reaches us, and a signal sent on
    # what it printed would otherwise kill this client and leave the rank running; the numbers go to the
    # server once it has forked the rank (before, they would run into the request it is still reading)
    for signum in FORWARDED:
        signal.signal(signum, forward)
    pid = receive_int(sock)
    if pid is None or pid < 0:
        for signum in FORWARDED:
            signal.signal(signum, signal.SIG_DFL)
        for number in early:  # what they would have done to this client
            os.kill(os.getpid(), number)
        sock.close()
        run_cold(command)
    note("warm")
    running[0] = True
    for number in early:
        send(number)
    status = receive_int(sock)
    if status is None:
        print(f"warm start: the server that ran this rank (pid {pid}) went away", file=sys.stderr, flush=True)
        os._exit(1)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number in FORWARDED:  # SIGKILL and SIGSTOP cannot be caught, nor their action changed
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
