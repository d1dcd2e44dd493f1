"""CPU pinning of every thread, NUMA memory binding, and reading both back from /proc.

``os.sched_setaffinity(pid, ...)`` changes ONE thread (the one whose tid equals pid), so a process
that already started thread pools (torch, OpenMP, Ray) stays partly unpinned. ``pin_all_threads``
sets every tid in /proc/self/task; threads created later inherit from their creator.

Memory policy (``set_mempolicy``) is also per thread and inherited at creation: call
``bind_memory`` early, before thread pools start. Binding is done through libnuma via ctypes, with
a raw-syscall fallback; the result says which way worked or why neither did.

The read-back (``affinity_tree``, ``violations``, ``mems_allowed``) is what a benchmark records as
proof of where it actually ran.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
from collections.abc import Iterable
from dataclasses import dataclass

from omni_ray.measure.sampler import tree_pids
from omni_ray.topology.sysfs import format_cpulist, parse_cpulist

_PROC = "/proc"

# set_mempolicy(2) modes, from <linux/mempolicy.h>.
MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND = 0, 1, 2

# Syscall numbers by machine: (set_mempolicy, get_mempolicy).
_MEMPOLICY_SYSCALLS = {
    "x86_64": (238, 239),
    "aarch64": (237, 236),
    "ppc64le": (261, 260),
    "s390x": (270, 269),
}


# -- CPU pinning ---------------------------------------------------------------------------

def pin_all_threads(cpus: Iterable[int]) -> list[int]:
    """Set the CPU affinity of every thread of this process to ``cpus``; returns the tids pinned.

    Threads that end while this runs are skipped. Raises OSError naming the tid and CPUs when the
    kernel refuses (e.g. CPUs outside this cgroup's cpuset)."""
    cpu_set = set(cpus)
    if not cpu_set:
        raise ValueError("pin_all_threads: empty CPU set")
    pinned: list[int] = []
    for name in sorted(os.listdir(f"{_PROC}/self/task"), key=int):
        tid = int(name)
        try:
            os.sched_setaffinity(tid, cpu_set)
        except ProcessLookupError:
            continue
        except OSError as e:
            raise OSError(e.errno, f"sched_setaffinity(tid {tid}, CPUs "
                                   f"{format_cpulist(sorted(cpu_set))}): {e.strerror}") from e
        pinned.append(tid)
    return pinned


def normal_priority(target: int = 0) -> dict:
    """Give every thread of this process the scheduling priority of a normal process.

    Ray starts its worker processes at niceness 15, and an engine launched from a stage actor
    inherits it: on a machine where anything else runs, the measured engine would lose the CPU
    to every neighbour at niceness 0, and read slower than it is. Raising a niceness back needs
    root (CAP_SYS_NICE); without it the niceness stays, and the returned record says so.
    Returns {"inherited": n, "niceness": n now}."""
    inherited = os.getpriority(os.PRIO_PROCESS, 0)
    if inherited != target:
        for name in os.listdir(f"{_PROC}/self/task"):  # niceness is per thread on Linux
            try:
                os.setpriority(os.PRIO_PROCESS, int(name), target)
            except ProcessLookupError:
                continue
            except PermissionError:
                break
    return {"inherited": inherited, "niceness": os.getpriority(os.PRIO_PROCESS, 0)}


def _status_field(path: str, field: str) -> str | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return line.split(":", 1)[1].strip()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def affinity_tree(root_pid: int) -> dict[int, dict[int, list[int]]]:
    """pid -> tid -> allowed CPUs (``Cpus_allowed_list``) for every thread of every process in
    the tree at ``root_pid``. Processes and threads that vanish meanwhile are left out."""
    tree: dict[int, dict[int, list[int]]] = {}
    for pid in tree_pids(root_pid):
        try:
            tids = sorted(int(t) for t in os.listdir(f"{_PROC}/{pid}/task"))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        threads: dict[int, list[int]] = {}
        for tid in tids:
            value = _status_field(f"{_PROC}/{pid}/task/{tid}/status", "Cpus_allowed_list")
            if value is not None:
                threads[tid] = list(parse_cpulist(value))
        if threads:
            tree[pid] = threads
    return tree


def violations(tree: dict[int, dict[int, list[int]]], allowed_cpus: Iterable[int]) -> list[str]:
    """One human line per thread that may run on a CPU outside ``allowed_cpus``; [] = clean."""
    allowed = set(allowed_cpus)
    lines: list[str] = []
    for pid, threads in sorted(tree.items()):
        for tid, cpus in sorted(threads.items()):
            outside = set(cpus) - allowed
            if outside:
                lines.append(f"pid {pid} tid {tid}: allowed on CPUs {format_cpulist(cpus)}, "
                             f"outside {format_cpulist(sorted(allowed)) or '(none)'}: "
                             f"{format_cpulist(sorted(outside))}")
    return lines


def mems_allowed(pid: int | str = "self") -> list[int]:
    """NUMA nodes the process may allocate on (``Mems_allowed_list``); [] if it is gone."""
    value = _status_field(f"{_PROC}/{pid}/status", "Mems_allowed_list")
    return list(parse_cpulist(value)) if value is not None else []


# -- memory binding ------------------------------------------------------------------------

@dataclass(frozen=True)
class BindResult:
    """Outcome of ``bind_memory``; truthy when the policy is in place.

    ``method`` is "libnuma", "syscall" or "" (failed); ``reason`` says why a way failed."""

    ok: bool
    node: int
    mode: str  # "bind" | "preferred"
    method: str
    reason: str = ""
    simulated: bool = False  # the node is a simulated socket (OMNI_RAY_SYSFS_ROOT)

    def __bool__(self) -> bool:
        return self.ok

    def to_dict(self) -> dict:
        return {"ok": self.ok, "node": self.node, "mode": self.mode, "method": self.method,
                "reason": self.reason, "simulated": self.simulated}


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def current_mempolicy() -> tuple[int, list[int]] | None:
    """(mode, nodes) of the calling thread via get_mempolicy(2); None if unavailable here."""
    numbers = _MEMPOLICY_SYSCALLS.get(platform.machine())
    if numbers is None:
        return None
    words = 16  # 1024 nodes
    mode = ctypes.c_int(0)
    mask = (ctypes.c_ulong * words)()
    rc = _libc().syscall(numbers[1], ctypes.byref(mode), mask, ctypes.c_ulong(words * 64),
                         None, ctypes.c_ulong(0))
    if rc != 0:
        return None
    bits = ctypes.sizeof(ctypes.c_ulong) * 8
    nodes = [w * bits + b for w in range(words) for b in range(bits) if mask[w] >> b & 1]
    return mode.value, nodes


def _policy_is(mode: int, node: int) -> bool:
    got = current_mempolicy()
    return got is not None and got[0] == mode and got[1] == [node]


def _bind_libnuma(node: int, mode: int) -> str:
    """Empty string on success, else the reason."""
    path = ctypes.util.find_library("numa") or "libnuma.so.1"
    try:
        lib = ctypes.CDLL(path, use_errno=True)
    except OSError as e:
        return f"libnuma not loadable ({e})"
    if lib.numa_available() < 0:
        return "numa_available() < 0 (no NUMA support in this kernel or container)"
    if mode == MPOL_BIND:
        lib.numa_parse_nodestring.restype = ctypes.c_void_p
        lib.numa_parse_nodestring.argtypes = [ctypes.c_char_p]
        lib.numa_set_membind.argtypes = [ctypes.c_void_p]
        lib.numa_bitmask_free.argtypes = [ctypes.c_void_p]
        mask = lib.numa_parse_nodestring(str(node).encode())
        if not mask:
            return f"numa_parse_nodestring({node!r}) failed: node not present"
        try:
            lib.numa_set_membind(mask)
        finally:
            lib.numa_bitmask_free(mask)
    else:
        lib.numa_set_preferred.argtypes = [ctypes.c_int]
        lib.numa_set_preferred(node)
    # libnuma's setters return void and only print on error: read the policy back.
    got = current_mempolicy()
    if got is None or _policy_is(mode, node):
        return ""
    return f"libnuma call did not take effect (policy now mode {got[0]} nodes {got[1]})"


def _bind_syscall(node: int, mode: int) -> str:
    numbers = _MEMPOLICY_SYSCALLS.get(platform.machine())
    if numbers is None:
        return f"no set_mempolicy syscall number known for {platform.machine()}"
    bits = ctypes.sizeof(ctypes.c_ulong) * 8
    words = node // bits + 1
    mask = (ctypes.c_ulong * words)()
    mask[node // bits] = 1 << (node % bits)
    # maxnode: the kernel reads maxnode-1 bits (libnuma passes size + 1).
    rc = _libc().syscall(numbers[0], ctypes.c_int(mode), mask, ctypes.c_ulong(words * bits + 1))
    if rc != 0:
        err = ctypes.get_errno()
        return f"set_mempolicy failed: {errno.errorcode.get(err, err)} ({os.strerror(err)})"
    return ""


def bind_memory(node: int, *, strict: bool = True) -> BindResult:
    """Make the calling thread (and threads it creates later) allocate on NUMA ``node``.

    strict: MPOL_BIND (allocation fails rather than spill) else MPOL_PREFERRED. Tries libnuma,
    then the raw syscall; returns a falsy ``BindResult`` with both reasons if neither works."""
    if node < 0:
        raise ValueError(f"bind_memory: node must be >= 0, got {node}")
    mode = MPOL_BIND if strict else MPOL_PREFERRED
    mode_name = "bind" if strict else "preferred"
    why_lib = _bind_libnuma(node, mode)
    if not why_lib:
        return BindResult(True, node, mode_name, "libnuma")
    why_sys = _bind_syscall(node, mode)
    if not why_sys:
        return BindResult(True, node, mode_name, "syscall", reason=f"libnuma: {why_lib}")
    return BindResult(False, node, mode_name, "", reason=f"libnuma: {why_lib}; syscall: {why_sys}")


def unbind_memory() -> bool:
    """Back to the default policy (allocate on the local node) for the calling thread."""
    numbers = _MEMPOLICY_SYSCALLS.get(platform.machine())
    if numbers is None:
        return False
    return _libc().syscall(numbers[0], ctypes.c_int(MPOL_DEFAULT), None, ctypes.c_ulong(0)) == 0


def bind_slot_memory(node: int, cpus: Iterable[int], *, simulated: bool,
                     kernel_cpus: frozenset[int] | None = None) -> BindResult:
    """``bind_memory(node)`` for a slot on ``cpus``; on a simulated topology only when the
    kernel has that node and it holds the slot's CPUs (``kernel_cpus``: the kernel's CPUs of
    ``node``, read from /sys when not given). Otherwise nothing is bound and the result says
    "not bound (node N is simulated)": recorded, never skipped silently, never an error."""
    if simulated:
        if kernel_cpus is None:
            from omni_ray.topology.detection import kernel_node_cpus

            kernel_cpus = kernel_node_cpus(node)
        if kernel_cpus is None or not set(cpus) <= kernel_cpus:
            return BindResult(False, node, "bind", "",
                              reason=f"not bound (node {node} is simulated)", simulated=True)
        result = bind_memory(node)
        return BindResult(result.ok, node, result.mode, result.method, result.reason, True)
    return bind_memory(node)
