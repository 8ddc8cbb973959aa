"""How much memory this process can still take: the machine's available memory, and the limits set on the process
(cgroup, `ulimit -v`, `ulimit -d`), which `/proc/meminfo` does not show. `hubvit.limits` checks sizes against it."""

from __future__ import annotations

import os
from pathlib import Path


def available_memory():
    """(bytes, what bounds it): the least of the memory available now (`MemAvailable`), what the process's cgroup
    may still use, and the address space and data left under `ulimit -v` / `ulimit -d` (RLIMIT_AS, RLIMIT_DATA: a
    reader that allocates past these gets MemoryError however much memory the machine has free)."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append((int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"))
    except (OSError, ValueError, IndexError):
        pass
    if not found:
        try:
            found.append((os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "physical memory"))
        except (ValueError, OSError, AttributeError):
            found.append((1 << 40, "assumed memory"))
    found += _process_limits()
    return min(found)


def _process_limits():
    """(bytes left, name) for each memory limit set on this process: cgroup v2/v1 limits, RLIMIT_AS, RLIMIT_DATA."""
    limits = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, group = line.split(":", 2)
        folder, files = None, None
        if controllers == "":
            folder, files = Path("/sys/fs/cgroup") / group.lstrip("/"), ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            folder, files = (
                Path("/sys/fs/cgroup/memory") / group.lstrip("/"),
                ("memory.limit_in_bytes", "memory.usage_in_bytes"),
            )
        try:
            limit, usage = (folder / files[0]).read_text().strip(), (folder / files[1]).read_text().strip()
            if limit != "max" and int(limit) < 1 << 60:
                limits.append((max(0, int(limit) - int(usage)), "left under the cgroup's memory limit"))
        except (OSError, ValueError, TypeError):
            continue
    try:
        import resource

        status = {
            line.split(":")[0]: int(line.split()[1]) * 1024
            for line in Path("/proc/self/status").read_text().splitlines()
            if line.startswith(("VmSize:", "VmData:"))
        }
        for limit, used, name in (
            (resource.RLIMIT_AS, "VmSize", "ulimit -v"),
            (resource.RLIMIT_DATA, "VmData", "ulimit -d"),
        ):
            soft = resource.getrlimit(limit)[0]
            if soft != resource.RLIM_INFINITY and used in status:
                limits.append((max(0, soft - status[used]), f"address space left under {name}"))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return limits
