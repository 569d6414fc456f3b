"""procfs fixture trees for job discovery: processes with the cgroup files slurmstepd's tasks have.

The texts follow the layouts SchedMD documents: cgroup v2 ``0::/system.slice/slurmstepd.scope/job_<id>/step_<s>/
user/task_<n>`` (doc/html/cgroup_v2.shtml, the ``systemctl status slurmstepd.scope`` tree), Slurm 26.05's SLUID job
directories (cgroup.conf(5) CgroupJobIdPaths; cgroups.shtml ".../slurmstepd.scope/s5K1KKYAYG5D00/step_0/"), and
cgroup v1's one line per controller ``/slurm/uid_<uid>/job_<id>/step_<s>/task_<n>`` (cgroups.shtml
"/sys/fs/cgroup/memory/slurm/uid_1000/job_31/step_0/"). Used by the tests, the demo and bench/discovery.py.
"""

from __future__ import annotations

from pathlib import Path

V2 = "0::/system.slice/slurmstepd.scope/job_3385/step_0/user/task_0\n"
V2_SLUID = "0::/system.slice/slurmstepd.scope/s5K1KKYAYG5D00/step_0/user/task_0\n"
V2_MULTI = "0::/system.slice/node07_slurmstepd.scope/job_77/step_batch/user/task_special\n"
V1 = """12:pids:/slurm/uid_1000/job_31/step_0/task_0
11:memory:/slurm/uid_1000/job_31/step_0/task_0
10:devices:/slurm/uid_1000/job_31/step_0
9:freezer:/slurm/uid_1000/job_31/step_0/task_0
4:cpuset:/slurm/uid_1000/job_31/step_0
1:name=systemd:/system.slice/slurmd.service
"""
OWN = (
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod8712f785_1a3e_41ec_a00b_e2dcc77431cb.slice/"
    "cri-containerd-73051af2aa.scope\n"
)
HOST = "0::/user.slice/user-1000.slice/session-3.scope\n"


def v2_job(job_id: str | int, step: str = "0", task: int = 0) -> str:
    return f"0::/system.slice/slurmstepd.scope/job_{job_id}/step_{step}/user/task_{task}\n"


def stat_line(pid: int, comm: str = "python3", start: int = 12345) -> str:
    # /proc/<pid>/stat: comm in parentheses (may hold spaces), field 22 is the start time in clock ticks.
    rest = ["S", "1", str(pid), str(pid)] + ["0"] * 15 + [str(start)] + ["0"] * 10
    return f"{pid} ({comm}) " + " ".join(rest) + "\n"


def add_process(
    procfs: Path,
    pid: int,
    cgroup: str,
    environ: dict[str, str] | None = None,
    cmdline: bytes = b"python3\0train.py\0",
    start: int = 12345,
    comm: str = "python3",
) -> None:
    d = Path(procfs) / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(stat_line(pid, comm, start))
    (d / "cgroup").write_text(cgroup)
    (d / "cmdline").write_bytes(cmdline)
    (d / "comm").write_text(comm + "\n")
    if environ is not None:
        (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in environ.items()) + b"\0")


def host_procfs(root: Path, own: str = OWN) -> Path:
    """A host PID namespace's procfs (init at 1, kthreadd at 2) with the exporter itself at 4000 (``self``)."""
    procfs = Path(root) / "proc"
    add_process(procfs, 1, "0::/init.scope\n", comm="systemd")
    add_process(procfs, 2, "0::/\n", comm="kthreadd")
    (procfs / "self").symlink_to("4000")
    add_process(procfs, 4000, own, comm="mfu-exporter")
    return procfs
