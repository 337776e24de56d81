"""Ranks and servers never outlive their launcher, even one killed with SIGKILL.

On this machine (local and emulated backends) every rank is a child of the launcher started with
`preexec_fn=exit_with_launcher(...)`: the kernel's parent-death signal (prctl PR_SET_PDEATHSIG,
kept across exec, so also through `nsenter`) sends SIGKILL to the rank when the launcher's thread
that started it ends, and a rank whose launcher died between fork and prctl kills itself at once.

On remote hosts (SSH backend) the rank's login shell starts a watcher beside it (`SSH_WATCHER`): it
reads the SSH channel's stdin, which stays open as long as the launcher's SSH connection does; at EOF
(the launcher exited, was killed, or its host or link went away and sshd dropped the session) the
watcher kills the rank's whole process group.
"""

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1

# Run in the remote shell before `exec`; $$ is the session and process-group leader that becomes the
# rank. The channel's stdin goes to the watcher on fd 3 (a background list's own stdin is /dev/null);
# the rank gets /dev/null as stdin (SSH_RANK_REDIRECTS, after its argv).
SSH_WATCHER = "exec 3<&0; (cat <&3 >/dev/null 2>&1; kill -KILL -- -$$) >/dev/null 2>&1 &"
SSH_RANK_REDIRECTS = "</dev/null 3<&-"


def exit_with_launcher(launcher_pid: int | None = None):
    """A Popen preexec_fn: the child gets SIGKILL when the launcher (this process) dies."""
    launcher_pid = os.getpid() if launcher_pid is None else launcher_pid
    libc = ctypes.CDLL(None, use_errno=True)

    def arm() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != launcher_pid:   # it died before the prctl: nobody would signal us
            os.kill(os.getpid(), signal.SIGKILL)

    return arm
