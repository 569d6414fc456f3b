"""Slurm jobs from GPU PIDs through procfs fixture trees, and the per-GPU job mapping directory.

The cgroup texts are those slurmstepd's tasks have: cgroup v2 ``0::/system.slice/slurmstepd.scope/job_<id>/step_<s>/
user/task_<n>`` (SchedMD doc/html/cgroup_v2.shtml, its ``systemctl status slurmstepd.scope`` tree), the 26.05 SLUID
directories (cgroup.conf(5) CgroupJobIdPaths: ".../slurmstepd.scope/sEKNKTV3WPV500/"; cgroups.shtml
".../slurmstepd.scope/s5K1KKYAYG5D00/step_0/"), and cgroup v1's per-controller ``/slurm/uid_<uid>/job_<id>/
step_<s>/task_<n>`` (cgroups.shtml "/sys/fs/cgroup/memory/slurm/uid_1000/job_31/step_0/").
"""

import threading
import time
from collections import Counter

from mfu_exporter.node.slurm import (
    JobNames,
    MappingDir,
    ProcessJobs,
    host_pid_namespace,
    jobs_of_processes,
    nvml_compute_pids,
    parse_cgroup,
)
from mfu_exporter.sim.procfs import HOST, OWN, V1, V2, V2_MULTI, V2_SLUID, add_process, host_procfs


def test_parse_cgroup_layouts():
    step = parse_cgroup(V2)
    assert (step.job_id, step.sluid, step.step, step.version) == ("3385", None, "0", 2)
    assert step.job_dir == "/system.slice/slurmstepd.scope/job_3385"
    step = parse_cgroup(V2_SLUID)
    assert (step.job_id, step.sluid, step.job_dir) == (
        None,
        "s5K1KKYAYG5D00",
        "/system.slice/slurmstepd.scope/s5K1KKYAYG5D00",
    )
    assert parse_cgroup(V2_MULTI).job_id == "77" and parse_cgroup(V2_MULTI).step == "batch"
    step = parse_cgroup(V1)
    assert (step.job_id, step.uid, step.step, step.version) == ("31", 1000, "0", 1)
    # A private cgroup namespace shows paths relative to ours ("/../../"): the match is unanchored.
    assert parse_cgroup("0::/../../system.slice/slurmstepd.scope/job_9/step_extern/user/task_0").job_id == "9"
    for text in (OWN, HOST, "0::/system.slice/slurmstepd.scope/system\n", "", "garbage"):
        assert parse_cgroup(text) is None


def test_host_pid_namespace(tmp_path):
    ok, why = host_pid_namespace(str(host_procfs(tmp_path)))
    assert ok
    container = tmp_path / "container-proc"
    add_process(container, 1, OWN, comm="tini")
    add_process(container, 7, OWN, comm="mfu-exporter")
    ok, why = host_pid_namespace(str(container))
    assert not ok and "hostPID" in why and "kthreadd" in why


def test_processes_to_jobs_v1_v2_sluid_own_and_vanished(tmp_path):
    procfs = host_procfs(tmp_path)
    cgroot = tmp_path / "cgroup"
    add_process(procfs, 113635, V2)  # GPU 0: job 3385 from its path
    add_process(procfs, 2001, V1)  # GPU 1: job 31, cgroup v1
    # GPU 2: SLURM_JOB_ID is in its environment, which the exporter never reads (credentials live there).
    add_process(procfs, 3001, V2_SLUID, environ={"API_TOKEN": "secret", "SLURM_JOB_ID": "4242"})
    sluid2 = "0::/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_1/user/task_0\n"
    add_process(procfs, 4001, sluid2)  # GPU 3: found via slurmstepd
    stepd = cgroot / "system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_1/slurm"
    stepd.mkdir(parents=True)
    (stepd / "cgroup.procs").write_text("4000\n5000\n")  # 4000 is no slurmstepd: the title decides
    add_process(
        procfs,
        5000,
        "0::/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_1/slurm\n",
        cmdline=b"slurmstepd: [5151.1]\0",
        comm="slurmstepd",
    )
    sluid3 = "0::/system.slice/slurmstepd.scope/s0000000000ZZZ/step_0/user/task_0\n"
    add_process(procfs, 6001, sluid3)  # GPU 4: nothing local: named by SLUID
    add_process(procfs, 7001, OWN)  # GPU 5: our own container
    add_process(procfs, 7002, HOST)  # GPU 5: an ssh'd process, not Slurm
    resolver = ProcessJobs(str(procfs), str(cgroot))
    found = jobs_of_processes(
        {0: [113635], 1: [2001], 2: [3001], 3: [4001], 4: [6001], 5: [7001, 7002], 6: [99999]}, resolver
    )
    assert found.gpus == {0: {"3385"}, 1: {"31"}, 2: {"s5K1KKYAYG5D00"}, 3: {"5151"}, 4: {"s0000000000ZZZ"}}
    assert found.jobs["31"]["uid"] == 1000
    assert found.jobs["s5K1KKYAYG5D00"]["by"] == "sluid" and found.jobs["5151"]["by"] == "slurmstepd"
    assert found.jobs["s0000000000ZZZ"]["by"] == "sluid"
    assert found.skipped == Counter({"own_container": 1, "not_slurm": 1, "pid_gone": 1})


def test_pid_vanishing_between_nvml_and_proc_read_and_pid_reuse(tmp_path):
    procfs = host_procfs(tmp_path)
    add_process(procfs, 800, V2)
    resolver = ProcessJobs(str(procfs))
    assert resolver.job_of(800).job == "3385"
    # The process exits after NVML listed it: cgroup gone while stat was still there.
    (procfs / "800" / "cgroup").unlink()
    assert resolver.job_of(800).job == "3385"  # same PID and start time: the cached answer stands
    for name in ("stat", "cmdline", "comm"):
        (procfs / "800" / name).unlink()
    assert resolver.job_of(800).by == "pid_gone"
    # The PID is reused by another job's process: a new start time, a new answer, never the cached one.
    add_process(procfs, 800, V2.replace("3385", "3390"), start=99999)
    assert resolver.job_of(800).job == "3390"


class FakeNvmlProcesses:
    class Proc:
        def __init__(self, pid):
            self.pid = pid

    class NVMLError_GpuIsLost(Exception):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        if handle == 2:
            raise self.NVMLError_GpuIsLost()
        return [self.Proc(100 + handle), self.Proc(200 + handle)]


def test_nvml_compute_pids_one_lost_gpu():
    pids, errors = nvml_compute_pids(FakeNvmlProcesses(), [0, 1, 2])
    assert pids == {0: [100, 200], 1: [101, 201]}
    assert errors == Counter({"nvml_processes_NVMLError_GpuIsLost": 1})


def test_mapping_dir(tmp_path):
    d = tmp_path / "job-mapping"
    d.mkdir()
    (d / "0").write_text("5\n")
    (d / "1").write_text("5\n6\n\n")
    (d / "2").write_text("7")  # no trailing newline: a complete file still
    (d / "3.1").write_text("8\n")  # MIG instance
    (d / "4").write_text("5; rm -rf /\n9\n")
    (d / ".0.tmp").write_text("99\n")
    read = MappingDir(str(d)).read()
    assert read.gpus == {0: ("5",), 1: ("5", "6"), 2: ("7",), 4: ("9",)}
    assert "3.1" in read.unsupported
    assert read.errors == Counter({"mapping_line_invalid": 1})
    missing = MappingDir(str(tmp_path / "absent")).read()
    assert missing.gpus == {} and missing.errors["mapping_dir_missing"] == 1


def test_mapping_file_caught_between_truncate_and_write_keeps_its_job(tmp_path):
    d = tmp_path / "map"
    d.mkdir()
    (d / "0").write_text("5\n")
    now = [time.time()]
    reader = MappingDir(str(d), settle=2.0, clock=lambda: now[0])
    assert reader.read().gpus == {0: ("5",)}
    (d / "0").write_text("")  # the prolog's "> file" happened, its write not yet
    now[0] = time.time()
    assert reader.read().gpus == {0: ("5",)}
    now[0] += 5  # an epilog really emptied it: the job ends once the file has been empty for settle seconds
    assert reader.read().gpus == {}


def test_mapping_dir_rewritten_while_reading(tmp_path):
    d = tmp_path / "map"
    d.mkdir()
    for gpu in range(8):
        (d / str(gpu)).write_text(f"{1000 + gpu}\n")
    stop = threading.Event()

    def rewrite():
        n = 0
        while not stop.is_set():
            gpu = n % 8
            path = d / str(gpu)
            with open(path, "w") as file:  # truncate, then write in two pieces, like a shell prolog's echo
                file.write(f"{1000 + gpu}")
                file.flush()
                file.write("\n")
            if n % 16 == 0:
                path.unlink()
                path.write_text(f"{1000 + gpu}\n")
            n += 1

    writer = threading.Thread(target=rewrite, daemon=True)
    writer.start()
    reader = MappingDir(str(d), settle=2.0)
    try:
        for _ in range(300):
            read = reader.read()
            for gpu, jobs in read.gpus.items():
                assert jobs == (str(1000 + gpu),), (gpu, jobs)  # never a half-written ID, never another GPU's job
            assert not read.errors.get("mapping_line_invalid")
    finally:
        stop.set()
        writer.join(2)


def test_job_names_cached_and_optional(tmp_path):
    script = tmp_path / "squeue"
    count = tmp_path / "count"
    script.write_text(f'#!/bin/sh\necho x >> {count}\n[ "$5" = 31 ] && echo llama-70b && exit 0\nexit 1\n')
    script.chmod(0o755)
    names = JobNames([str(script), "-h", "-o", "%j", "-j", "{job}"], timeout=5)

    def settle(job):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if job not in names._inflight and job in names._names:
                return names.name(job)
            names.name(job)
            time.sleep(0.01)
        raise AssertionError("no answer")

    assert names.name("31") is None  # not known yet: the job ID names it meanwhile
    assert settle("31") == "llama-70b"
    assert settle("32") is None
    for _ in range(5):
        names.name("31")
    assert len(count.read_text().splitlines()) == 2  # once per job, cached
    absent = JobNames(["/nonexistent/squeue", "{job}"])
    absent.name("1")
    deadline = time.monotonic() + 5
    while not absent.failures and time.monotonic() < deadline:
        time.sleep(0.01)
    assert absent.failures["FileNotFoundError"] == 1
