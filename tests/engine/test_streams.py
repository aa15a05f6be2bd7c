"""knng on the caller's CUDA stream (issue 55, item 5): its GPU work runs on the current stream of
the calling thread, in order with what the caller queued there before and after, and waits on
the host only for that stream, never for the whole device.

Both paths are run: the direct path of small calls and the block pipeline (whose file reads copy
on streams of their own, which the current stream waits for).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import knng
from oracle import assert_exact, oracle_graph, oracle_search

pytestmark = [pytest.mark.gpu, pytest.mark.direct]

PATHS = {"direct": {}, "pipeline": {"direct_max_scores": 0, "direct_max_scores_gpu": 0}}
#: GPU clock cycles of the sleeping kernel on another stream: about a second on a data-centre GPU.
SLEEP_CYCLES = 2_000_000_000


@pytest.fixture(autouse=True)
def _needs_a_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")


@pytest.mark.parametrize("path", PATHS)
def test_inputs_made_on_a_side_stream_are_read_after_they_are_written(rng, path):
    """Data written on a non-default stream just before the call (behind a long kernel there)
    and results read on that stream just after it: had knng run on another stream, it would have
    read the data before they were written, or the caller would read results not yet written."""
    x = rng.standard_normal((3000, 16)).astype(np.float32)
    q = rng.standard_normal((50, 16)).astype(np.float32)
    host_x, host_q = torch.from_numpy(x).pin_memory(), torch.from_numpy(q).pin_memory()
    side = torch.cuda.Stream()
    with knng.options(**PATHS[path]), torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES // 10)  # the copies below wait for it on this stream
        gx = torch.empty((3000, 16), device="cuda").copy_(host_x, non_blocking=True)
        gq = torch.empty((50, 16), device="cuda").copy_(host_q, non_blocking=True)
        g = knng.graph(gx, 7)
        s = knng.search(gq, gx, 5)
        # Read on the side stream, as a caller's next operation would.
        g_idx, g_dist = g.indices.clone(), g.distances.clone()
        s_idx, s_dist = s.indices.clone(), s.distances.clone()
    side.synchronize()
    assert g.report.plan.direct == (path == "direct") and s.report.plan.direct == (path == "direct")
    assert_exact((g_idx.cpu().numpy(), g_dist.cpu().numpy()), oracle_graph(x, 7))
    assert_exact((s_idx.cpu().numpy(), s_dist.cpu().numpy()), oracle_search(q, x, 5))


@pytest.mark.parametrize("path", PATHS)
def test_a_call_does_not_wait_for_other_streams(rng, path):
    """A kernel sleeping about a second on another stream: a call on the current stream returns
    long before it ends (no device-wide synchronisation, no work on the legacy default stream,
    which would wait for it)."""
    x = torch.from_numpy(rng.standard_normal((3000, 16)).astype(np.float32)).cuda()
    mine, other = torch.cuda.Stream(), torch.cuda.Stream()
    with knng.options(**PATHS[path]):
        with torch.cuda.stream(mine):
            knng.graph(x, 7)  # kernels compiled and loaded before the clock starts
            mine.synchronize()
        with torch.cuda.stream(other):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(SLEEP_CYCLES)
            end.record()
        t0 = time.perf_counter()
        with torch.cuda.stream(mine):
            g = knng.graph(x, 7)
            g.indices.cpu()
        waited = time.perf_counter() - t0
    other.synchronize()
    slept = start.elapsed_time(end) / 1000
    assert slept > 0.3, f"the sleeping kernel took only {slept:.3f} s: too short to tell"
    assert waited < slept / 2, f"the call took {waited:.3f} s beside a kernel of {slept:.3f} s on another stream"
    assert_exact((g.indices.cpu().numpy(), g.distances.cpu().numpy()), oracle_graph(x.cpu().numpy(), 7))
