"""Child processes that do not outlive the process that started them, even when it is
SIGKILLed and has no chance to stop them (Linux's parent-death signal)."""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent thread dies. Call it in the
    child: first thing in a fresh process, or as a ``Popen`` ``preexec_fn`` (it survives exec).
    The parent is the *thread* that forked, so start such children from a thread that lives as
    long as they should."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, int(sig))
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)
