"""The communication layer on its own: a rank stuck inside a collective call is freed.

NCCL can block the host inside the call that issues a collective (a lazy connection to a peer
that never answers), where no polling wait runs. The background watchdog must then name the
failed peer and stop the rank, within the heartbeat timeout plus a bounded grace.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from test_distributed import free_port

SCRIPT = textwrap.dedent("""
    import os, sys, time, torch
    import torch.distributed as dist
    rank = int(sys.argv[1])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo")
    from knng.distributed.comm import Comm
    with Comm(timeout=60, heartbeat_timeout=2) as comm:
        comm.status("working on something")
        if rank == 1:
            time.sleep(1.0)
            os._exit(17)  # dies without a word
        time.sleep(1.5)
        # A collective call that never returns, as NCCL's can when its peer is gone.
        comm._issue("a collective that blocks its caller", 0, lambda: time.sleep(3600))
    print("not reached")
""")


@pytest.mark.slow
def test_a_rank_stuck_inside_a_collective_call_is_stopped_naming_the_dead_peer(tmp_path):
    port = str(free_port())
    script = tmp_path / "stuck.py"
    script.write_text(SCRIPT)
    env = dict(os.environ)
    procs = [subprocess.Popen([sys.executable, str(script), str(r), port], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    t0 = time.monotonic()
    out0, err0 = procs[0].communicate(timeout=120)
    took = time.monotonic() - t0
    procs[1].communicate(timeout=30)
    assert procs[1].returncode == 17
    assert procs[0].returncode == 1, (out0, err0)
    assert "knng[rank 0]: error: rank 1 stopped responding" in err0, err0
    assert "while working on something" in err0 and "a collective that blocks its caller" in err0, err0
    assert "not reached" not in out0
    assert took < 40, took  # 2 s of silence, then at most 10 s for the call to be freed, then exit


RELAY_SCRIPT = textwrap.dedent("""
    import os, sys, time, torch
    import torch.distributed as dist
    rank = int(sys.argv[1])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK=str(rank), WORLD_SIZE="3")
    dist.init_process_group("gloo")
    from knng.distributed.comm import Comm, DistributedError
    if rank == 0:  # no watchdog of its own: it reads the store only once both others have acted
        comm = Comm(timeout=60, heartbeat_timeout=60)
        time.sleep(5.0)
        try:
            comm._check_failures("checking")
        except DistributedError as exc:
            print(f"rank 0 read: {exc} [culprit {exc.rank}]", flush=True)
        time.sleep(2.0)  # rank 0 holds the store
        sys.exit(0)
    with Comm(timeout=60, heartbeat_timeout=60) as comm:
        comm.status("screening")
        if rank == 1:  # rank 1 blames rank 2, as when rank 2 hangs
            comm.post_error(DistributedError("rank 2 made no progress for 3 s", 2))
            time.sleep(6.0)
            sys.exit(0)
        time.sleep(3.0)  # rank 2's watchdog reads rank 1's report meanwhile
        comm.status("still screening")  # raises what the watchdog read
""")


@pytest.mark.slow
def test_a_rank_stopped_by_a_report_naming_it_does_not_repost_it_as_its_own_failure(tmp_path):
    # A relayed error naming rank 2, posted again by rank 2, read to the others as rank 2's own
    # failure ("rank 2 failed while …: DistributedError: rank 2 made no progress"): a flake of
    # the CLI's hang test, where the hung rank's watchdog read the report before rank 0 did.
    port = str(free_port())
    script = tmp_path / "relay.py"
    script.write_text(RELAY_SCRIPT)
    procs = [subprocess.Popen([sys.executable, str(script), str(r), port], env=dict(os.environ),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1, 2)]
    outs = [p.communicate(timeout=120) for p in procs]
    out0 = outs[0][0]
    assert "rank 0 read: rank 2 made no progress for 3 s (as rank 1 reported) [culprit 2]" in out0, outs
    assert procs[2].returncode == 1 and "rank 2 made no progress" in outs[2][1], outs
