"""Several hosts: a rank finds its job from ``srun``'s variables (knng.distributed.rendezvous),
or from ``torchrun``'s on each of several nodes.

The end-to-end test emulates ``srun --ntasks 2 knng graph ...`` on one host: two processes with
only the variables Slurm would set (no RANK, WORLD_SIZE, MASTER_ADDR or MASTER_PORT), on CPUs
through Gloo, and compares the result with the one-process graph bit for bit; another runs two
``torchrun`` agents as two nodes would (a static rendezvous, two ranks each).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import knng
from knng.distributed.rendezvous import (
    SLURM_PORT_BASE, SLURM_PORT_SPAN, first_host, is_launched, job_rank, local_rank, slurm_port, torch_environment,
)

TORCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                   "TORCHELASTIC_USE_AGENT_STORE", "KNNG_LAUNCH_DEVICE", "KNNG_LAUNCHER_PID")


def _srun_task(rank: int, tasks: int, **extra: str) -> dict[str, str]:
    """The variables ``srun --ntasks TASKS`` gives task ``rank`` on one node (Slurm 23)."""
    return {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank),
            "SLURM_NTASKS": str(tasks), "SLURM_STEP_NUM_TASKS": str(tasks), "SLURM_NODEID": "0",
            "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_JOB_NODELIST": "gpu[07-08]",
            "SLURM_STEP_TASKS_PER_NODE": f"{tasks}", **extra}


@pytest.mark.parametrize(("nodelist", "host"), [
    ("node7", "node7"),
    ("gpu[03-06,09]", "gpu03"),
    ("gpu[03-06,09],cpu1", "gpu03"),
    ("cpu1,gpu[03-06]", "cpu1"),
    ("rack[1-2]-n[001-004]", "rack1-n001"),
    ("a[7,2-3]", "a7"),
    (" host-1.cluster ", "host-1.cluster"),
])
def test_first_host_of_a_hostlist(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


@pytest.mark.parametrize("nodelist", ["", "gpu[03-06", ",node1"])
def test_bad_hostlist_is_named(nodelist: str) -> None:
    with pytest.raises(ValueError, match="SLURM nodelist"):
        first_host(nodelist)


def test_port_is_shared_by_a_step_and_differs_between_jobs_and_steps() -> None:
    ports = {slurm_port(job, step) for job in range(1000, 1100) for step in range(4)}
    assert len(ports) == 400  # consecutive jobs and their first four steps never collide
    assert all(SLURM_PORT_BASE <= p < SLURM_PORT_BASE + SLURM_PORT_SPAN for p in ports)
    assert max(ports) < 32768  # below Linux's ephemeral range
    assert slurm_port(123456789, 2) == slurm_port(123456789, 2)


def test_torch_environment_from_slurm() -> None:
    env = torch_environment(_srun_task(1, 2))
    assert env == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                   "MASTER_ADDR": "gpu07", "MASTER_PORT": str(slurm_port(4242, 0))}
    assert is_launched(_srun_task(1, 2)) and job_rank(_srun_task(1, 2)) == 1 and local_rank(_srun_task(1, 2)) == 1


def test_variables_already_set_win_over_slurms() -> None:
    env = torch_environment(_srun_task(0, 4, MASTER_ADDR="10.0.0.5", MASTER_PORT="29400"))
    assert env["MASTER_ADDR"] == "10.0.0.5" and env["MASTER_PORT"] == "29400" and env["WORLD_SIZE"] == "4"
    # torchrun inside an allocation: its own RANK/WORLD_SIZE, Slurm's ignored.
    env = torch_environment(_srun_task(0, 4, RANK="3", WORLD_SIZE="8", MASTER_ADDR="h", MASTER_PORT="1"))
    assert (env["RANK"], env["WORLD_SIZE"]) == ("3", "8") and "LOCAL_RANK" not in env


def test_a_batch_script_or_a_step_of_one_task_is_not_a_job() -> None:
    batch = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_NODELIST": "n[1-2]"}
    assert torch_environment(batch) == {} and not is_launched(batch) and job_rank(batch) is None
    assert not is_launched(_srun_task(0, 1))  # srun --pty bash
    assert not is_launched({})


def test_malformed_slurm_variables_are_named() -> None:
    with pytest.raises(ValueError, match="SLURM_JOB_ID"):
        torch_environment(_srun_task(0, 2, SLURM_JOB_ID="4242x"))
    with pytest.raises(ValueError, match="SLURM_STEP_NUM_TASKS"):
        torch_environment(_srun_task(0, 2, SLURM_STEP_NUM_TASKS="two"))


def _free_slurm_port() -> tuple[int, int]:
    """A (job id, port) whose Slurm port is free on this host now."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if SLURM_PORT_BASE <= port < SLURM_PORT_BASE + SLURM_PORT_SPAN and (port - SLURM_PORT_BASE) % 4 == 0:
            return (port - SLURM_PORT_BASE) // 4, port
    job = int.from_bytes(os.urandom(2), "little") + 1000  # the kernel's ports lie elsewhere: any job will do
    return job, slurm_port(job, 0)


def test_srun_two_tasks_on_one_host_equal_one_process(tmp_path: Path, rng: np.random.Generator) -> None:
    x = rng.normal(20.0, 1.0, (600, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    job, port = _free_slurm_port()
    base = {key: value for key, value in os.environ.items()
            if key not in TORCH_VARIABLES and not key.startswith("SLURM_")}
    procs = []
    for rank in range(2):
        env = {**base, **_srun_task(rank, 2, SLURM_JOB_ID=str(job), SLURM_STEP_NODELIST="localhost",
                                    SLURM_JOB_NODELIST="localhost"), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-m", "knng", "graph", str(tmp_path / "x.npy"), "-k", "6",
                                       "-o", str(tmp_path / "out"), "--no-progress", "--timeout", "60"],
                                      env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outputs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, f"port {port}: {outputs}"
    assert "2 ranks" in outputs[0][0], outputs[0][0]
    assert outputs[1][0] == ""  # rank 1 says nothing: rank 0 reports for the job
    ref = knng.graph(x, 6, device="cpu")
    np.testing.assert_array_equal(np.load(tmp_path / "out/indices.npy"), ref.indices)
    np.testing.assert_array_equal(np.load(tmp_path / "out/distances.npy"), ref.distances)
    assert json.loads((tmp_path / "out/knng.json").read_text())["world_size"] == 2


@pytest.mark.slow
def test_torchrun_two_nodes_on_one_host_equal_one_process(tmp_path: Path, rng: np.random.Generator) -> None:
    """Two ``torchrun`` agents, as two hosts would start them (``--nnodes 2 --node-rank 0|1``, a
    static rendezvous at node 0), each with two ranks: four ranks over two "nodes" on Gloo,
    whose graph (written by the ranks into one output folder) equals one process's bit for bit."""
    x = rng.normal(-30.0, 2.0, (700, 12)).astype(np.float32)
    x[::7] = x[0]  # identical rows: folded across the nodes' ranks
    np.save(tmp_path / "x.npy", x)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {key: value for key, value in os.environ.items()
            if key not in TORCH_VARIABLES and not key.startswith("SLURM_") and not key.startswith("TORCHELASTIC")}
    procs = []
    for node in range(2):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
                "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
                "-m", "knng", "graph", str(tmp_path / "x.npy"), "-k", "5", "-o", str(tmp_path / "out"),
                "--no-progress", "--timeout", "60"]
        procs.append(subprocess.Popen(argv, env={**base, "OMP_NUM_THREADS": "1"}, cwd=tmp_path,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, f"port {port}: {outputs}"
    assert "4 ranks" in outputs[0][0], outputs
    ref = knng.graph(x, 5, device="cpu")
    np.testing.assert_array_equal(np.load(tmp_path / "out/indices.npy"), ref.indices)
    np.testing.assert_array_equal(np.load(tmp_path / "out/distances.npy"), ref.distances)
    assert json.loads((tmp_path / "out/knng.json").read_text())["world_size"] == 4
