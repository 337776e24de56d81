"""A real sshd on 127.0.0.1 whose every session runs one forced command: the stand-in for a switch
or host that `netconf apply` reaches over SSH (the SSH paths stay real; only the far side is a script)."""

import contextlib
import os
import subprocess
import time
from pathlib import Path
from ports import free_port


@contextlib.contextmanager
def forced_command_sshd(folder: Path, script_text: str):
    """Start sshd with ForceCommand = a script holding `script_text`; yield its port.

    `folder` gets the host and client keys (`client` is the key to log in with) and `known_hosts`
    for the server; sshd is stopped on exit, also on failure."""
    for name in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)], check=True)
    (folder / "authorized_keys").write_text((folder / "client.pub").read_text())
    script = folder / "forced.sh"
    script.write_text(script_text)
    script.chmod(0o755)
    port = free_port()
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    config = folder / "sshd.conf"
    config.write_text(f"Port {port}\nListenAddress 127.0.0.1\nHostKey {folder / 'host'}\n"
                      f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPubkeyAuthentication yes\n"
                      "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                      f"PidFile {folder / 'sshd.pid'}\nForceCommand {script}\n")
    log = folder / "sshd.log"
    daemon = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(config), "-E", str(log)])
    try:
        deadline = time.monotonic() + 10
        while not (log.exists() and "Server listening" in log.read_text()):
            assert time.monotonic() < deadline, "sshd did not start"
            time.sleep(0.05)
        key = " ".join((folder / "host.pub").read_text().split()[:2])
        (folder / "known_hosts").write_text(f"[127.0.0.1]:{port} {key}\n")
        yield port
    finally:
        daemon.terminate()
        daemon.wait(5)
