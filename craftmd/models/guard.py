"""The guard of a local model server: ``python guard.py PARENT_PID COMMAND...`` (run as a script, never imported).

:class:`craftmd.models.local_server.LocalServer` starts every server through it, in a session (and process group) of its
own: the guard starts the command as its child, in that group, and waits. When the command exits, the guard exits with
its status. When the process that started it is gone (its parent changes: it ended, or was killed with SIGKILL, which
no handler sees), the guard stops the whole group (SIGTERM, then SIGKILL after :data:`GRACE` seconds), so a run that is
killed leaves no server behind. A SIGTERM or SIGHUP to the group (``LocalServer.stop``) reaches the command too; the
guard then waits for it to exit and exits with it. Standard library only: it starts in a few milliseconds.
"""

import os
import signal
import subprocess
import sys
import time

#: Seconds between looks at the parent, and the seconds the server gets after SIGTERM before SIGKILL.
POLL = 0.25
GRACE = 10.0


def main(argv: list[str]) -> int:
    parent, command = int(argv[0]), argv[1:]
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: None)  # the group's signal is the command's to act on; the guard waits for it
    child = subprocess.Popen(command)  # in the guard's group: the one LocalServer stops
    while child.poll() is None:
        if os.getppid() != parent:  # the run is gone: its server goes too
            os.killpg(0, signal.SIGTERM)
            deadline = time.monotonic() + GRACE
            while child.poll() is None and time.monotonic() < deadline:
                time.sleep(POLL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.killpg(0, signal.SIGKILL)  # whatever is left of the group, the guard with it
        time.sleep(POLL)
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
