"""GPU tests: exactness on CUDA at sizes that fill a GPU somewhat, with the float64 oracle
computed on the GPU by differences, in chunks (``oracle.assert_exact_chunked``).

Run on a GPU machine with ``pytest -m gpu tests/engine/test_gpu.py`` (about 3 minutes on an H100).
Everything here is skipped without CUDA; CI collects the file but runs none of it.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import knng
from knng.api import last_report
from oracle import METRICS, assert_exact_chunked, assert_output_kind, assert_radius_exact, smooth_image_patches

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

#: Oracle working memory: float64 differences per chunk (2²⁷ → 1 GiB) and query rows per
#: chunk (a few (rows × n) float64 matrices): stays well under 10 GB for n ≤ 2M.
CHUNK_ELEMS = 2**27


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator(device="cuda")
    g.manual_seed(seed % 2**63)
    return g


def _randn(shape, seed, *, offset=0.0, dtype=torch.float32):
    x = torch.randn(shape, generator=_gen(seed), device="cuda", dtype=torch.float64)
    return (x + offset).to(dtype)


def _check(q, c, results, metric="euclidean", *, exclude_self=False, rows=None, row_chunk=128, seed=None):
    assert_exact_chunked(q, c, results, metric, exclude_self=exclude_self, rows=rows, device="cuda",
                         row_chunk=row_chunk, chunk_elems=CHUNK_ELEMS, context=f"seed={seed} {metric}")


@pytest.fixture(autouse=True)
def _free_gpu_memory():
    yield
    torch.cuda.empty_cache()


# ------------------------------------------------------------------------------ large search
def test_search_200k_corpus_every_k(seed):
    corpus = _randn((200_000, 128), seed)
    queries = _randn((2_000, 128), seed + 1)
    results = []
    for k in (1, 10, 100, 1024):
        res = knng.search(queries, corpus, k)
        assert_output_kind(res, queries, k=k)
        assert res.indices.device == queries.device
        results.append(res)
    _check(queries, corpus, results, seed=seed)


def test_search_1m_corpus_sampled(seed):
    # The peers' shape (1M × 128 corpus, 10k queries): corpus tiles up to 2²⁰ columns.
    corpus = _randn((1_000_000, 128), seed)
    queries = _randn((10_000, 128), seed + 1)
    results = [knng.search(queries, corpus, k) for k in (10, 1024)]
    rows = np.random.default_rng(seed).choice(10_000, size=256, replace=False)
    _check(queries, corpus, results, rows=rows, row_chunk=32, seed=seed)


def test_graph_200k_sampled(seed):
    x = _randn((200_000, 128), seed, offset=3.0)
    g = knng.graph(x, 10)
    rows = np.random.default_rng(seed).choice(200_000, size=256, replace=False)
    _check(x, x, [g], exclude_self=True, rows=rows, row_chunk=64, seed=seed)


@pytest.mark.parametrize("metric", METRICS)
def test_search_every_metric_both_screens(metric, seed, screen):
    corpus = _randn((50_000, 64), seed, offset=2.0)
    queries = _randn((1_000, 64), seed + 1, offset=2.0)
    results = [knng.search(queries, corpus, k, metric=metric) for k in (1, 32, 500)]
    _check(queries, corpus, results, metric, seed=seed)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.uint8, torch.int8])
@pytest.mark.parametrize("metric", METRICS)
def test_search_input_dtypes(dtype, metric, seed):
    if dtype in (torch.uint8, torch.int8):
        lo, hi = (0, 256) if dtype == torch.uint8 else (-128, 128)
        corpus = torch.randint(lo, hi, (20_000, 48), generator=_gen(seed), device="cuda").to(dtype)
        queries = torch.randint(lo, hi, (500, 48), generator=_gen(seed + 1), device="cuda").to(dtype)
    else:
        corpus = _randn((20_000, 48), seed, dtype=dtype)
        queries = _randn((500, 48), seed + 1, dtype=dtype)
    res = knng.search(queries, corpus, 16, metric=metric)
    assert_output_kind(res, queries, k=16)
    _check(queries, corpus, [res], metric, seed=seed)


# ------------------------------------------------------------------------------ large graphs
def test_graph_30k(seed):
    x = _randn((30_000, 64), seed)
    g = knng.graph(x, 10)
    assert_output_kind(g, x, k=10)
    _check(x, x, [g], exclude_self=True, seed=seed)


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_graph_4096x512_k1024(metric, seed):
    x = _randn((4096, 512), seed, offset=0.5)
    g = knng.graph(x, 1024, metric=metric)
    _check(x, x, [g], metric, exclude_self=True, seed=seed)
    gs = knng.graph(x, 1024, metric=metric, include_self=True)
    _check(x, x, [gs], metric, seed=seed)


@pytest.mark.parametrize("metric", METRICS)
def test_graph_every_metric_both_screens(metric, seed, screen):
    x = _randn((10_000, 32), seed, offset=1.0)
    g = knng.graph(x, 16, metric=metric)
    _check(x, x, [g], metric, exclude_self=True, seed=seed)


def test_graph_blocked_path(seed):
    # Parts smaller than the data: blocks S(I, J), row and column selections, merges. (A budget
    # no longer forces them: 64 MB holds this graph's one part, since parts are sized by what
    # the plan holds rather than by a score block it never writes.)
    x = _randn((20_000, 32), seed)
    small = {name: 4096 for name in ("gpu_max_part", "gpu_kernel_max_part", "gpu_triangle_max_part",
                                     "gpu_triangle_max_part_small_k")}
    with knng.options(**small):
        g = knng.graph(x, 10)
    report = last_report()
    assert report.parts > 1, report
    _check(x, x, [g], exclude_self=True, seed=seed)


def test_graph_duplicates(seed):
    x = _randn((20_000, 24), seed)
    x[19_000:] = x[:1000].repeat(1, 1)
    x[18_000:18_600] = x[5].expand(600, -1)  # 601 copies of row 5
    g = knng.graph(x, 40)
    _check(x, x, [g], exclude_self=True, seed=seed)
    idx = g.indices.cpu()
    copies = torch.tensor([5] + list(range(18_000, 18_600)))
    assert (idx[5] == copies[1:41]).all()
    assert (idx[18_000] == torch.cat([copies[:1], copies[2:41]])).all()
    assert (g.distances[5] == 0).all()


# ------------------------------------------------------------------------- far from origin
@pytest.mark.parametrize("metric", METRICS)
def test_far_from_origin_gauss(metric, seed, screen):
    corpus = _randn((100_000, 128), seed, offset=1000.0)
    queries = _randn((1_000, 128), seed + 1, offset=1000.0)
    res = knng.search(queries, corpus, 10, metric=metric)
    _check(queries, corpus, [res], metric, seed=seed)
    x = corpus[:8_000]
    g = knng.graph(x, 10, metric=metric)
    _check(x, x, [g], metric, exclude_self=True, seed=seed)


@pytest.mark.parametrize("metric", METRICS)
def test_far_from_origin_uint8_patches(metric, seed):
    rng = np.random.default_rng(seed)
    patches = smooth_image_patches(rng, 101_000)
    corpus = torch.from_numpy(patches[:100_000]).cuda()
    queries = torch.from_numpy(patches[100_000:]).cuda()
    results = [knng.search(queries, corpus, k, metric=metric) for k in (10, 100)]
    _check(queries, corpus, results, metric, seed=seed)
    x = corpus[:10_000]
    g = knng.graph(x, 10, metric=metric)
    _check(x, x, [g], metric, exclude_self=True, seed=seed)


def test_float64_data_at_1e6(seed):
    corpus = _randn((100_000, 32), seed, offset=1e6, dtype=torch.float64)
    queries = _randn((500, 32), seed + 1, offset=1e6, dtype=torch.float64)
    for metric in METRICS:
        res = knng.search(queries, corpus, 10, metric=metric)
        _check(queries, corpus, [res], metric, seed=seed)


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean", "cosine", "inner_product"])
def test_adversarial_far_clusters_fall_back(metric, seed, screen):
    n, d = 100_000, 16
    sign = torch.where(torch.rand((n, 1), generator=_gen(seed), device="cuda") < 0.5, -1.0, 1.0).double()
    corpus = 1e4 * sign + 1e-3 * _randn((n, d), seed + 1, dtype=torch.float64)
    queries = corpus[:300] + 1e-3 * _randn((300, d), seed + 2, dtype=torch.float64)
    # The inner product ranks by −xᵀy, dominated by the cluster: a float64 screen may
    # settle every row at once; the Euclidean family and cosine must tighten their stores.
    must_tighten = metric != "inner_product" or screen == "float32"
    res = knng.search(queries, corpus, 10, metric=metric)
    assert last_report().store.tightenings > 0 or not must_tighten, last_report()
    _check(queries, corpus, [res], metric, seed=seed)
    x = corpus[:5_000]
    g = knng.graph(x, 10, metric=metric)
    assert last_report().store.tightenings > 0 or not must_tighten, last_report()
    _check(x, x, [g], metric, exclude_self=True, seed=seed)


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean", "inner_product"])
def test_far_away_queries_fall_back(metric, seed, set_options):

    set_options(screen_precision="float32")
    corpus = _randn((100_000, 32), seed, dtype=torch.float64)
    corpus -= corpus.mean(dim=1, keepdim=True)  # rows sum to zero …
    queries = corpus[:200] + 1e4  # … so the offset is orthogonal to all corpus variation
    res = knng.search(queries, corpus, 10, metric=metric)
    assert last_report().store.tightenings > 0
    _check(queries, corpus, [res], metric, seed=seed)


@pytest.mark.parametrize("metric", ["cosine", "pearson"])
def test_zero_and_constant_vectors(metric, seed):
    corpus = _randn((30_000, 16), seed)
    queries = _randn((100, 16), seed + 1)
    fill = 0.0 if metric == "cosine" else 3.0
    corpus[::1000] = fill
    queries[:3] = fill
    res = knng.search(queries, corpus, 50, metric=metric)
    _check(queries, corpus, [res], metric, seed=seed)
    assert (res.distances[:3] == 1.0).all()
    assert (res.indices[0].cpu() == torch.arange(50)).all()


# ------------------------------------------------------------------ streaming and host data
def test_streamed_memmap_corpus_larger_than_budget(tmp_path, seed):
    rng = np.random.default_rng(seed)
    n, d = 2_000_000, 64  # 512 MB of float32
    corpus = np.lib.format.open_memmap(tmp_path / "corpus.npy", mode="w+", dtype=np.float32, shape=(n, d))
    for s in range(0, n, 250_000):
        corpus[s:s + 250_000] = rng.standard_normal((min(250_000, n - s), d), dtype=np.float32)
    corpus.flush()
    del corpus
    corpus = np.load(tmp_path / "corpus.npy", mmap_mode="r")
    queries = rng.standard_normal((512, d)).astype(np.float32)
    res = knng.search(queries, corpus, 10, device="cuda", memory_budget="256MB")
    report = last_report()
    assert report.plan.corpus_resident is False, report
    assert_output_kind(res, queries, k=10)
    sample = rng.choice(512, size=64, replace=False)
    _check(queries, corpus, [res], rows=sample, row_chunk=32, seed=seed)


def test_numpy_in_numpy_out_on_cuda(seed):
    rng = np.random.default_rng(seed)
    corpus = rng.standard_normal((50_000, 32)).astype(np.float32)
    queries = rng.standard_normal((300, 32)).astype(np.float32)
    res = knng.search(queries, corpus, 20, device="cuda")
    assert_output_kind(res, queries, k=20)
    g = knng.graph(corpus[:5_000], 8, device="cuda")
    assert_output_kind(g, corpus, k=8)
    _check(queries, corpus, [res], seed=seed)
    _check(corpus[:5_000], corpus[:5_000], [g], exclude_self=True, seed=seed)
    # CPU tensor computed on the GPU comes back as a CPU tensor.
    t = torch.from_numpy(queries)
    res_t = knng.search(t, corpus, 20, device="cuda")
    assert_output_kind(res_t, t, k=20)
    assert (res_t.indices.numpy() == res.indices).all()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_gpu_keeps_device(seed, monkeypatch):
    # The engine makes the data's GPU the current one: Triton launches its kernels on the
    # current device's stream, and kernels run from cuda:0 on cuda:1's tensors once returned a
    # wrong answer here (unordered with the stream that wrote their inputs).
    import contextlib

    import knng.engine.graph.symmetric as engine_graph
    import knng.engine.search.knn as engine_search

    current = []

    def spy(real):  # the current device inside the engine's device context
        @contextlib.contextmanager
        def entered(device):
            with real(device):
                current.append(torch.cuda.current_device())
                yield
        return entered

    for module in (engine_search, engine_graph):
        monkeypatch.setattr(module, "on_device", spy(module.on_device))
    torch.cuda.set_device(0)
    corpus = _randn((20_000, 32), seed).to("cuda:1")
    queries = _randn((200, 32), seed + 1).to("cuda:1")
    res = knng.search(queries, corpus, 10)
    assert res.indices.device == torch.device("cuda:1")
    assert current and set(current) == {1} and torch.cuda.current_device() == 0
    current.clear()
    g = knng.graph(corpus[:3000], 5)
    assert g.indices.device == torch.device("cuda:1") and current and set(current) == {1}
    _check(queries.to("cuda:0"), corpus.to("cuda:0"), [(res.indices.to("cuda:0"), res.distances.to("cuda:0"))],
           seed=seed)


# ------------------------------------------------------------- settings, selection, memory
_TF32_CHILD = r"""
import sys, warnings
import numpy as np, torch
import knng

knng.options(screen_precision="float32").__enter__()  # the screen TF32 could break; for the whole child

def state():
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for read in (torch.get_float32_matmul_precision, lambda: torch.backends.cuda.matmul.allow_tf32,
                     lambda: getattr(torch.backends.cuda.matmul, "fp32_precision", None)):
            try:
                out.append(read())
            except Exception as exc:
                out.append(type(exc).__name__)
    return out

SETTING
before = state()
g = torch.Generator(device="cuda")
g.manual_seed(SEED)
corpus = (1000.0 + torch.randn((100_000, 128), generator=g, device="cuda", dtype=torch.float64)).float()
queries = (1000.0 + torch.randn((500, 128), generator=g, device="cuda", dtype=torch.float64)).float()
res = knng.search(queries, corpus, 10)
gr = knng.graph(corpus[:8_000], 10)
after = state()
np.savez(OUT, corpus=corpus.cpu().numpy(), queries=queries.cpu().numpy(), si=res.indices.cpu().numpy(),
         sd=res.distances.cpu().numpy(), gi=gr.indices.cpu().numpy(), gd=gr.distances.cpu().numpy())
print("STATE", before, after)
assert before == after, "knng did not restore the matmul precision setting"
"""


@pytest.mark.parametrize("setting", [
    "torch.backends.cuda.matmul.allow_tf32 = True",
    "torch.set_float32_matmul_precision('high')",
    "torch.set_float32_matmul_precision('medium')",
    "torch.backends.cuda.matmul.allow_tf32 = True; torch.set_float32_matmul_precision('high')",
    "torch.backends.cuda.matmul.fp32_precision = 'tf32'",
    "torch.backends.fp32_precision = 'tf32'",
])
def test_global_tf32_setting_cannot_void_exactness(setting, seed, tmp_path):
    """Users often enable TF32 globally; the float32 screen's bound assumes IEEE float32 products.

    Each setting runs in a fresh interpreter: these are process-wide switches, and mixing the
    legacy and new APIs leaves torch in a state that later calls cannot undo.
    """
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "res.npz"
    code = _TF32_CHILD.replace("SETTING", setting).replace("SEED", str(seed % 2**62)).replace("OUT", repr(str(out)))
    env = dict(os.environ)
    src = str(Path(knng.__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    r = np.load(out)
    corpus, queries = torch.from_numpy(r["corpus"]).cuda(), torch.from_numpy(r["queries"]).cuda()
    _check(queries, corpus, [(r["si"], r["sd"])], seed=seed)
    x = corpus[:8_000]
    _check(x, x, [(r["gi"], r["gd"])], exclude_self=True, seed=seed)


@pytest.mark.parametrize("k", [1, 16, 128, 2048])
def test_select_algorithms_agree(k, seed):
    from knng.select import available

    corpus = _randn((100_000, 32), seed)
    queries = _randn((1_000, 32), seed + 1)
    base = knng.search(queries, corpus, k, select="topk")
    for name in available():
        res = knng.search(queries, corpus, k, select=name)
        assert torch.equal(res.indices, base.indices), name
        assert torch.equal(res.distances, base.distances), name
    _check(queries, corpus, [base], seed=seed)


@pytest.mark.parametrize("thresholds", ["sample", "tiles first"])
def test_oom_retry_on_gpu(thresholds, monkeypatch, seed, set_options):
    import knng.engine.search.knn as search  # the seeds of τ, or the tiles' minima where they go first

    set_options(tiles_first=thresholds == "tiles first")  # where the wgmma kernel runs
    name = "_seed_from_sample" if thresholds == "sample" else "_screen_tiles_first"
    real = getattr(search, name)
    calls = {"n": 0}

    def failing_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(search, name, failing_once)
    corpus = _randn((100_000, 64), seed)
    queries = _randn((4_000, 64), seed + 1)
    res = knng.search(queries, corpus, 10)
    if calls["n"] == 0:  # no wgmma kernel here: no tiles first
        pytest.skip("the search did not take its tiles first on this GPU")
    assert last_report().oom_retries == 1
    _check(queries, corpus, [res], seed=seed)


def test_real_out_of_memory_shrinks_tiles(seed, set_options):
    """An over-generous budget: the first blocks do not fit; knng must shrink and finish."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        # Its hog is sized from the free memory, which other workers on the GPU change (under
        # four workers it once found room and no out-of-memory error to recover from).
        pytest.skip("needs the GPU to itself: run it without pytest-xdist workers (-n 0)")
    # The seeds from the materialised sample block (the kernel's strip minima write none, and
    # then nothing of this search outgrows 1 GB; nor do the tiles' minima where they go first).

    set_options(kernels={"strip_minima": False})
    set_options(tiles_first=False)
    free, _ = torch.cuda.mem_get_info()
    corpus = _randn((300_000, 64), seed)
    queries = _randn((20_000, 64), seed + 1)
    hog = None
    try:
        # Leave ~1 GB free but tell knng it may use 50 GB (the float16 screen's first sample
        # product, 20k × 16,384 float32 scores, then no longer fits).
        spare = free - 2**30 - corpus.numel() * 4
        if spare > 0:
            hog = torch.empty(int(spare), dtype=torch.uint8, device="cuda")
        res = knng.search(queries, corpus, 10, memory_budget="50GB")
    finally:
        del hog
        torch.cuda.empty_cache()
    report = last_report()
    _check(queries, corpus, [res], rows=np.arange(0, 20_000, 50), seed=seed)
    assert report.oom_retries >= 1, report


@pytest.mark.parametrize("pairs", [False, True])
def test_held_survivors_tighten_without_reading_back(pairs, seed):
    # A holding store's tightening marks the held pairs it keeps and compacts them at their next
    # use: it reads nothing back from the GPU, so the next block's launch, which needs only the
    # new τ, queues behind it (store._settle_held). The answer stays exact.
    from knng.engine.store import HoldingStore, Holding, PairErrors, PairNorms
    from knng.metrics import PRECISIONS, get_metric

    x = _randn((50, 8), seed, dtype=torch.float64)
    y = _randn((3000, 8), seed + 1, dtype=torch.float64)
    norms = (x.norm(dim=1), y.norm(dim=1))
    errors = PairErrors(metric=get_metric("sqeuclidean"), d=8, precision=PRECISIONS["float16"],
                        row_norms=None if pairs else norms[0], row_terms=None,
                        row_offsets=torch.zeros(50, dtype=torch.float64, device="cuda"),
                        col_norms=None if pairs else norms[1], col_terms=None, centre_norm=0.0)
    exact = ((x[:, None] - y[None]) ** 2).sum(-1)
    keys = (exact - (norms[0] ** 2)[:, None]).to(torch.float32)
    holding = Holding(pairs=True) if pairs else Holding(maxima=(float(norms[1].max()), 0.0))
    store = HoldingStore(50, 5, 8, errors, lambda r, c: ((x[r] if c.dim() == 1 else x[r][:, None]) - y[c]).pow(2).sum(-1),
                         torch.device("cuda"), pending=10**9, holding=holding)
    rows = torch.arange(50, device="cuda").repeat_interleave(3000)
    cols = torch.arange(3000, device="cuda").repeat(50)
    for p0 in range(0, rows.numel(), 40_000):
        r, c = rows[p0:p0 + 40_000], cols[p0:p0 + 40_000]
        store.add(r, c, keys[r, c], PairNorms(norms[0][r], norms[1][c], None, None) if pairs else None)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        store.tighten_held()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    store._settle_held()
    assert store._held_size < rows.numel() // 10  # the tightening dropped most of them
    idx, dist = store.finish()
    want = torch.sort(exact, dim=1, stable=True)
    assert torch.equal(idx, want.indices[:, :5]) and torch.equal(dist, want.values[:, :5])


# ------------------------------------------------------- first calls without compiled kernels

@pytest.mark.parametrize("metric", METRICS)
def test_without_compiled_kernels_answers_are_exact(metric, seed, set_options):
    """``compiled_kernels=False``: what a first call of a kind runs while its kernels compile
    (torch's operations only, on the GPU); Gaussian data and uint8 patches with their ties."""
    set_options(compiled_kernels=False)
    rng = np.random.default_rng(seed)
    patches = torch.from_numpy(smooth_image_patches(rng, 40_500)).cuda()
    for corpus, queries in ((_randn((200_000, 128), seed), _randn((1_000, 128), seed + 1)),
                            (patches[:40_000], patches[40_000:])):
        results = [knng.search(queries, corpus, k, metric=metric) for k in (1, 10)]
        assert all(r.report.plan.uncompiled for r in results)
        assert not any("kernel" in name for r in results for name in r.report.stages), results[0].report.stages
        _check(queries, corpus, results, metric, seed=seed)
        x = corpus[:12_000]
        g = knng.graph(x, 10, metric=metric)
        assert g.report.plan.uncompiled
        _check(x, x, [g], metric, exclude_self=True, seed=seed)
    if metric in ("euclidean", "sqeuclidean", "cosine"):
        q, c = patches[40_000:40_050], patches[:20_000]
        radius = float(knng.search(q, c, 5, metric=metric).distances[:, -1].median())
        assert_radius_exact(knng.radius(q, c, radius, metric=metric), q, c, radius, metric, context=f"seed={seed}")


_FRESH_PROCESS = r"""
import json, sys, time
import torch
import knng

torch.manual_seed(0)
x = torch.randn(200_000, 128, device="cuda")
q = torch.randn(2_000, 128, device="cuda")
torch.cuda.synchronize()
out = {}

def timed(name, call):
    t = time.perf_counter()
    result = call()
    torch.cuda.synchronize()
    out[name] = time.perf_counter() - t
    return result

first = timed("search_first", lambda: knng.search(q, x, 10))
graph_first = timed("graph_first", lambda: knng.graph(x[:30_000], 10))
radius_first = timed("radius_first", lambda: knng.radius(q[:100], x, 14.0))
out["waited"] = knng.wait_for_kernels(timeout=600)
second = timed("search_second", lambda: knng.search(q, x, 10))
graph_second = timed("graph_second", lambda: knng.graph(x[:30_000], 10))
radius_second = timed("radius_second", lambda: knng.radius(q[:100], x, 14.0))
out["uncompiled"] = [r.report.plan.uncompiled for r in (first, graph_first, second, graph_second)]
out["same"] = [bool(torch.equal(a.indices, b.indices) and torch.equal(a.distances, b.distances))
               for a, b in ((first, second), (graph_first, graph_second), (radius_first, radius_second))]
from knng.engine.kernels import compile_failures
out["failures"] = [str(v) for v in compile_failures().values()]
print(json.dumps(out))
"""


def test_a_fresh_process_runs_its_first_calls_while_their_kernels_compile(tmp_path):
    """A fresh process with empty kernel caches: the first search, graph and radius query of a
    kind run without compiled kernels, the kernels compile in the background (into the caches
    the environment names), and the calls after them run with the kernels, to the same answers."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"), CUPY_CACHE_DIR=str(tmp_path / "cupy"))
    done = subprocess.run([sys.executable, "-c", _FRESH_PROCESS], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["waited"] and not out["failures"], out
    assert out["uncompiled"] == [True, True, False, False], out
    assert out["same"] == [True, True, True], out
    assert any((tmp_path / "triton").rglob("*.cubin")), "no Triton kernel was compiled into the cache"


def test_calls_complete_with_most_of_the_card_held_by_the_caller(seed):
    """The caller's own tensors hold all of the card but 24 GB: the default budget follows the
    free memory, and a search, a graph of integer patches at k = 100 and a radius query complete,
    exact, with no out-of-memory error reaching the caller (issue 55)."""
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    hold = torch.empty(max(0, free - 24 * 10**9), dtype=torch.uint8, device="cuda")
    try:
        corpus, queries = _randn((1_000_000, 128), seed), _randn((2_000, 128), seed + 1)
        found = knng.search(queries, corpus, 10)
        _check(queries, corpus, [found], seed=seed, rows=torch.arange(0, 2_000, 7))
        rng = np.random.default_rng(seed)
        patches = torch.from_numpy(smooth_image_patches(rng, 60_000)).cuda()
        g = knng.graph(patches, 100)
        _check(patches, patches, [g], exclude_self=True, seed=seed, rows=torch.arange(0, 60_000, 97))
        few, part = queries[:20], corpus[:20_000]
        radius = float(knng.search(few, part, 5).distances[:, -1].max())
        assert_radius_exact(knng.radius(few, part, radius), few, part, radius, context=f"seed={seed}")
    finally:
        del hold


def test_the_report_states_the_device_peak(seed):
    """The report's ``device_peak``: exactly the call's peak above its start where the call set
    the process's peak, a bound where the process had held more before; never a reset of the
    caller's own peak statistics."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        pytest.skip("the allocator's peak is per process but the GPU's memory is shared: run with -n 0")
    x = _randn((100_000, 64), seed)
    torch.cuda.synchronize()
    # The process held 4 GiB before the call: the call's peak stays below it, so it is a bound.
    hog = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    del hog
    peak_before = torch.cuda.max_memory_allocated()
    g = knng.graph(x, 10, memory_budget="1GB")
    knng.wait_for_kernels()  # a first call's kernels compile in the background, allocating too
    assert torch.cuda.max_memory_allocated() == peak_before  # not reset by knng
    assert g.report.device_peak_is_bound
    assert (4 << 30) - (1 << 20) <= g.report.device_peak <= peak_before - x.numel() * 4
    # A fresh peak (the caller resets it): the call's own, exactly, and within its budget.
    del g
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    g = knng.graph(x, 10, memory_budget="1GB")
    report = g.report
    assert not report.device_peak_is_bound
    # Read before the answer takes the caller's form, which may allocate its copy after.
    assert 0 <= torch.cuda.max_memory_allocated() - start - report.device_peak <= x.shape[0] * 10 * 12
    assert report.device_peak > x.numel() // 8  # at least the graph's own lists
    found = knng.search(x[:1000], x, 10)
    assert found.report.device_peak is not None and found.report.device_peak > 0
