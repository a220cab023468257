"""Real ssh between simulated hosts (tests/cluster/simulated_hosts.py): an OpenSSH server on every host,
and the ssh client configured to log in to them with a key made for the test.

    with SimulatedHosts.create() as hosts:
        SshLogins.unavailable()                  # why it cannot (no sshd / ssh / ssh-keygen), or None
        logins = SshLogins.start(hosts, tmp_path)
        hosts.run_on(0, ["ssh", "198.18.0.2", "hostname"])   # -> simhost1

So ``mpirun`` on host 0 starts its daemon on host 1 with the real ``ssh`` client and whatever options it
is given (the job scripts' keepalive among them), against a real ``sshd`` whose session runs inside host
1's namespaces. Nothing of the machine's own ssh setup is touched: each sshd reads its own config file from
the test's directory, listens only on its host's test address, and accepts only the test's key; the
client's configuration reaches only the simulated hosts, as ``/etc/ssh`` inside their namespaces
(``ip netns exec`` mounts ``/etc/netns/<namespace>/ssh`` over ``/etc/ssh``). The servers end with the
namespaces (``SimulatedHosts.remove`` kills every process in them).
"""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from cluster.simulated_hosts import SimulatedHosts

SSHD = "/usr/sbin/sshd"


class SshLogins:
    def __init__(self, hosts: SimulatedHosts, folder: Path) -> None:
        self.hosts = hosts
        self.folder = folder
        self.servers: list[subprocess.Popen] = []

    @staticmethod
    def unavailable() -> str | None:
        """Why real ssh cannot be used here, or None when it can."""
        missing = [name for name in ("ssh", "ssh-keygen") if shutil.which(name) is None]
        if not Path(SSHD).exists():
            missing.append(SSHD)
        if missing:
            return (f"{', '.join(missing)} missing (install them with: apt-get install -y openssh-client "
                    "openssh-server)")
        return None

    @classmethod
    def start(cls, hosts: SimulatedHosts, folder: Path) -> SshLogins:
        self = cls(hosts, folder)
        folder.mkdir(parents=True, exist_ok=True)
        for key in ("client_key", "host_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / key)],
                           check=True, capture_output=True, timeout=60)
        (folder / "authorized_keys").write_text((folder / "client_key.pub").read_text())
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation directory
        client_config = (
            "Host *\n"
            f"  IdentityFile {folder / 'client_key'}\n  IdentitiesOnly yes\n  BatchMode yes\n"
            "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
        for index, host in enumerate(hosts.hosts):
            etc_ssh = Path("/etc/netns") / host.netns / "ssh"
            etc_ssh.mkdir(parents=True, exist_ok=True)
            (etc_ssh / "ssh_config").write_text(client_config)
            config = folder / f"sshd_config.{index}"
            config.write_text(
                f"ListenAddress {host.address}\nHostKey {folder / 'host_key'}\n"
                f"PidFile {folder / f'sshd.{index}.pid'}\nAuthorizedKeysFile {folder / 'authorized_keys'}\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPrintMotd no\n")
            log = open(folder / f"sshd.{index}.log", "w")
            self.servers.append(subprocess.Popen(
                hosts.command_on(index, [SSHD, "-D", "-e", "-f", str(config)]), stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        self._wait_until_listening()
        return self

    def _wait_until_listening(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        for index, host in enumerate(self.hosts.hosts):
            while True:
                probe = subprocess.run(self.hosts.command_on(index, ["ssh", host.address, "true"]),
                                       capture_output=True, text=True, timeout=30)
                if probe.returncode == 0:
                    break
                if self.servers[index].poll() is not None or time.monotonic() > deadline:
                    log = (self.folder / f"sshd.{index}.log").read_text()
                    raise RuntimeError(f"ssh to {host.hostname} ({host.address}) failed: "
                                       f"{probe.stderr.strip()}; sshd's log: {log}")
                time.sleep(0.2)
