"""The threads a CPU runtime gets where none is set (adalayers.infer.cores): one per physical core this process
may use, read from a sysfs tree written here."""
from pathlib import Path

import pytest

from adalayers.infer.cores import cpu_quota, default_threads, physical_cores, usable_cpus


def machine(root: Path, cores: dict[int, tuple[int, int]], cpu_max: str | None = None,
            cfs: tuple[str, str] | None = None) -> Path:
    """A sysfs tree: cpu N -> (package, core id); cgroup v2's cpu.max or v1's (quota, period)."""
    for cpu, (package, core) in cores.items():
        topology = root / f"devices/system/cpu/cpu{cpu}/topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{package}\n")
        (topology / "core_id").write_text(f"{core}\n")
    if cpu_max is not None:
        (root / "fs/cgroup").mkdir(parents=True, exist_ok=True)
        (root / "fs/cgroup/cpu.max").write_text(cpu_max + "\n")
    if cfs is not None:
        (root / "fs/cgroup/cpu").mkdir(parents=True, exist_ok=True)
        (root / "fs/cgroup/cpu/cpu.cfs_quota_us").write_text(cfs[0] + "\n")
        (root / "fs/cgroup/cpu/cpu.cfs_period_us").write_text(cfs[1] + "\n")
    return root


# 8 CPUs: 4 cores with two hyperthreads each (cpu N and N + 4 are siblings), as Linux numbers them
SMT = {cpu: (0, cpu % 4) for cpu in range(8)}


def test_hyperthread_siblings_count_once(tmp_path):
    root = machine(tmp_path, SMT)
    assert physical_cores(root, set(range(8))) == 4
    assert usable_cpus(root, set(range(8))) == 8


def test_only_the_cpus_of_the_affinity_count(tmp_path):
    root = machine(tmp_path, SMT)
    assert physical_cores(root, {0, 4}) == 1      # one core's two siblings
    assert physical_cores(root, {0, 1, 2}) == 3
    assert usable_cpus(root, {0, 1, 2}) == 3


def test_two_packages_with_the_same_core_ids_are_two_cores(tmp_path):
    root = machine(tmp_path, {0: (0, 0), 1: (1, 0)})
    assert physical_cores(root, {0, 1}) == 2


@pytest.mark.parametrize("cpu_max, cfs, expected", [
    ("200000 100000", None, 2),
    ("150000 100000", None, 1),     # rounded down: a throttled second thread would stall the first
    ("50000 100000", None, 1),      # at least one
    ("max 100000", None, None),
    (None, ("300000", "100000"), 3),
    (None, ("-1", "100000"), None),  # cgroup v1's "no quota"
    (None, None, None),
])
def test_the_cgroup_quota_in_whole_cpus(tmp_path, cpu_max, cfs, expected):
    root = machine(tmp_path, SMT, cpu_max, cfs)
    assert cpu_quota(root) == expected


def test_a_quota_caps_the_threads(tmp_path):
    root = machine(tmp_path, SMT, "200000 100000")
    assert usable_cpus(root, set(range(8))) == 2
    assert physical_cores(root, set(range(8))) == 2


def test_without_a_topology_each_cpu_is_a_core(tmp_path):
    assert physical_cores(tmp_path, {0, 1, 5}) == 3
    assert physical_cores(tmp_path, set()) == 1


@pytest.mark.parametrize("omp, expected", [(None, 4), ("2", 2), ("", 4), ("0", 4), ("two", 4)])
def test_omp_num_threads_where_it_is_set_else_the_physical_cores(tmp_path, monkeypatch, omp, expected):
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    assert default_threads(machine(tmp_path, SMT), set(range(8))) == expected
