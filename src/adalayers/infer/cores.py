"""How many threads a CPU runtime gets where none is set: one per physical core this process may run on.

llama.cpp's context defaults to 4 threads (GGML_DEFAULT_N_THREADS) whatever the machine, while llama-server
defaults `--threads` to the machine's physical cores (common_cpu_get_num_math: hyperthread siblings counted
once). On 2 cores, 4 threads contend for them (gemma3-270m served at 0.57x llama-server's tokens/s at one
client with 4, 1.02x with 2: docs/llm.md); on a 32-core machine 4 threads leave most of it idle. adalayers
takes llama-server's rule, within what this process may use:

    usable_cpus()     the CPUs of its affinity (taskset, a container's cpuset), at most its cgroup's CPU quota
                      (`docker --cpus`: cpu.max, or cgroup v1's cfs_quota_us / cfs_period_us, rounded down, at least 1)
    physical_cores()  those CPUs with hyperthread siblings counted once (sysfs topology: package and core id),
                      at most usable_cpus()
    default_threads() OMP_NUM_THREADS where it is set (as torch reads it; Ray sets it to an actor's num_cpus),
                      else physical_cores()

`sys_root` and `affinity` are parameters for the tests; the defaults read this machine.
"""
from __future__ import annotations

import os
from pathlib import Path

SYS = Path("/sys")


def _affinity() -> set[int]:
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def cpu_quota(sys_root: Path = SYS) -> int | None:
    """The cgroup's CPU quota in whole CPUs (rounded down, at least 1), or None where there is none."""
    v2 = _read(sys_root / "fs/cgroup/cpu.max")
    fields = v2.split() if v2 else [_read(sys_root / "fs/cgroup/cpu/cpu.cfs_quota_us"),
                                    _read(sys_root / "fs/cgroup/cpu/cpu.cfs_period_us")]
    try:
        quota, period = int(fields[0]), int(fields[1])
    except (TypeError, ValueError, IndexError):  # "max", a missing file: no quota
        return None
    return max(1, quota // period) if quota > 0 and period > 0 else None


def usable_cpus(sys_root: Path = SYS, affinity: set[int] | None = None) -> int:
    cpus = len(affinity if affinity is not None else _affinity()) or 1
    quota = cpu_quota(sys_root)
    return min(cpus, quota) if quota else cpus


def physical_cores(sys_root: Path = SYS, affinity: set[int] | None = None) -> int:
    cpus = affinity if affinity is not None else _affinity()
    cores = set()
    for cpu in cpus:
        topology = sys_root / f"devices/system/cpu/cpu{cpu}/topology"
        package, core = _read(topology / "physical_package_id"), _read(topology / "core_id")
        cores.add((package, core) if core is not None else ("cpu", cpu))  # no topology: each CPU a core
    return max(1, min(len(cores), usable_cpus(sys_root, cpus)))


def default_threads(sys_root: Path = SYS, affinity: set[int] | None = None) -> int:
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return physical_cores(sys_root, affinity)
