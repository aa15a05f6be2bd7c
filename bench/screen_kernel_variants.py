"""Variants of the fused screen kernel, timed alone on one GPU (an experiment kept for its figures).

The current one-tile-per-program kernel (``knng.engine._triton_kernels.screen_kernel``) against
a persistent kernel (pointer loads or TMA descriptors; the tile loop flattened or not) and a
row-stationary kernel (a row tile's A loaded once, a loop over column tiles), all ending in
knng's own threshold test and append. 10,000 × 2²⁰ inputs at d = 128 and 960, TF32 and
bfloat16, thresholds that keep nothing, ~15 and ~200 pairs per row; each variant's kept pairs
are compared with the current kernel's. Figures: ``docs/BENCHMARKS.md``, "Search thresholds
that learn from the first tile". Usage (GPU machine)::

    PYTHONPATH=src python bench/screen_kernel_variants.py 128 960

Under ``TRITON_INTERPRET=1`` it runs a tiny case on the CPU (a check of the kernels' logic).
"""
import os
import sys
import time

import torch
import triton
import triton.language as tl

from knng.engine import _triton_kernels as K_

# The jitted helpers a kernel calls are found among its module's globals.
_test_and_append = K_._test_and_append
INTERP = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _tile_ids(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    per_group = GROUP_M * tiles_n
    group = tile // per_group
    first_m = group * GROUP_M
    size_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % size_m
    pid_n = (tile % per_group) // size_m
    return pid_m, pid_n


@triton.jit
def _epilogue(acc, row0, col0, m, n, col_terms, row_thr, owner, other, keys, counters, capacity,
              HAS_COL_TERMS: tl.constexpr, FEW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rm = row0 + tl.arange(0, BLOCK_M)
    rn = col0 + tl.arange(0, BLOCK_N)
    row_ok = rm < m
    col_ok = rn < n
    if HAS_COL_TERMS:
        acc += tl.load(col_terms + rn, mask=col_ok, other=0.0)[None, :]
    valid = row_ok[:, None] & col_ok[None, :]
    _test_and_append(acc, valid, row0, col0, rm, rn, row_ok, col_ok, row_thr, row_thr,
                     owner, other, keys, owner, other, keys, counters, capacity,
                     False, FEW, BLOCK_M, BLOCK_N)


@triton.jit
def persist_kernel(A, B, col_terms, row_thr, owner, other, keys, counters, m, n, K, stride_a, stride_b, capacity,
                   HAS_COL_TERMS: tl.constexpr, PRECISION: tl.constexpr, FEW: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   NUM_PROGS: tl.constexpr, FLATTEN: tl.constexpr):
    start = tl.program_id(0)
    tiles_m = tl.cdiv(m, BLOCK_M)
    tiles_n = tl.cdiv(n, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    rk = tl.arange(0, BLOCK_K)
    for tile in tl.range(start, tiles_m * tiles_n, NUM_PROGS, flatten=FLATTEN):
        pid_m, pid_n = _tile_ids(tile, tiles_m, tiles_n, GROUP_M)
        row0 = pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        rm = row0 + tl.arange(0, BLOCK_M)
        rn = col0 + tl.arange(0, BLOCK_N)
        rm = tl.where(rm < m, rm, 0)
        rn = tl.where(rn < n, rn, 0)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            kk = ki * BLOCK_K + rk
            a = tl.load(A + rm[:, None].to(tl.int64) * stride_a + kk[None, :], mask=kk[None, :] < K, other=0.0)
            b = tl.load(B + rn[None, :].to(tl.int64) * stride_b + kk[:, None], mask=kk[:, None] < K, other=0.0)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        _epilogue(acc, row0, col0, m, n, col_terms, row_thr, owner, other, keys, counters, capacity,
                  HAS_COL_TERMS, FEW, BLOCK_M, BLOCK_N)


@triton.jit
def persist_tma_kernel(a_desc, b_desc, col_terms, row_thr, owner, other, keys, counters, m, n, K, capacity,
                       HAS_COL_TERMS: tl.constexpr, PRECISION: tl.constexpr, FEW: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                       NUM_PROGS: tl.constexpr, FLATTEN: tl.constexpr):
    start = tl.program_id(0)
    tiles_m = tl.cdiv(m, BLOCK_M)
    tiles_n = tl.cdiv(n, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(start, tiles_m * tiles_n, NUM_PROGS, flatten=FLATTEN):
        pid_m, pid_n = _tile_ids(tile, tiles_m, tiles_n, GROUP_M)
        row0 = pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([row0, ki * BLOCK_K])
            b = b_desc.load([col0, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc, input_precision=PRECISION)
        _epilogue(acc, row0, col0, m, n, col_terms, row_thr, owner, other, keys, counters, capacity,
                  HAS_COL_TERMS, FEW, BLOCK_M, BLOCK_N)


@triton.jit
def rowstat_kernel(A, B, col_terms, row_thr, owner, other, keys, counters, m, n, K, stride_a, stride_b, capacity,
                   cols_per_prog,
                   HAS_COL_TERMS: tl.constexpr, PRECISION: tl.constexpr, FEW: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KP: tl.constexpr, STAGES: tl.constexpr):
    # One row tile against a range of columns; A is loaded once (K ≤ KP).
    row0 = tl.program_id(0) * BLOCK_M
    c_start = tl.program_id(1) * cols_per_prog
    c_end = tl.minimum(n, c_start + cols_per_prog)
    rm = row0 + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, KP)
    a = tl.load(A + rm[:, None].to(tl.int64) * stride_a + rk[None, :], mask=(rm[:, None] < m) & (rk[None, :] < K),
                other=0.0)
    for col0 in tl.range(c_start, c_end, BLOCK_N, num_stages=STAGES):
        rn = col0 + tl.arange(0, BLOCK_N)
        rn_safe = tl.where(rn < n, rn, 0)
        b = tl.load(B + rn_safe[None, :].to(tl.int64) * stride_b + rk[:, None], mask=rk[:, None] < K, other=0.0)
        acc = tl.dot(a, b, input_precision=PRECISION)
        _epilogue(acc, row0, col0, m, n, col_terms, row_thr, owner, other, keys, counters, capacity,
                  HAS_COL_TERMS, FEW, BLOCK_M, BLOCK_N)


def lists(capacity, dev):
    return (torch.empty(capacity, dtype=torch.int32, device=dev), torch.empty(capacity, dtype=torch.int32, device=dev),
            torch.empty(capacity, dtype=torch.float32, device=dev), torch.zeros(2, dtype=torch.int32, device=dev))


def run(variant, a, b, d, terms, thr, prec, capacity, opts):
    dev = a.device
    m, n = a.shape[0], b.shape[0]
    owner, other, keys, counters = lists(capacity, dev)
    bf = a.dtype == torch.bfloat16
    BK = 64 if bf else 32
    tp = "ieee" if bf else prec
    cfg = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16) if INTERP else dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=BK)
    ex = {} if INTERP else dict(num_warps=opts.get("warps", 8), num_stages=opts.get("stages", 3))
    if INTERP:
        cfg["BLOCK_K"] = 16
    common = dict(HAS_COL_TERMS=terms is not None, PRECISION=tp, FEW=4)
    t = terms if terms is not None else thr
    if variant == "base":
        grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
        K_.screen_kernel[grid](a, b, thr, thr, thr, t, thr, thr, owner, other, keys, owner, other, keys, counters,
                               m, n, d, a.stride(0), b.stride(0), capacity, 0,
                               HAS_ROW_TERMS=False, HAS_COL_TERMS=terms is not None, SYMMETRIC=False,
                               EXCLUDE_DIAG=False, SCALED=False, PRECISION=tp, FEW=4, GROUP_M=8, **cfg, **ex)
    elif variant == "persist":
        progs = opts["progs"]
        persist_kernel[(progs,)](a, b, t, thr, owner, other, keys, counters, m, n, d, a.stride(0), b.stride(0),
                                 capacity, GROUP_M=8, NUM_PROGS=progs, FLATTEN=opts["flatten"], **common, **cfg, **ex)
    elif variant == "tma":
        from triton.tools.tensor_descriptor import TensorDescriptor
        progs = opts["progs"]
        ad = TensorDescriptor(a, [m, d], [a.stride(0), 1], [cfg["BLOCK_M"], cfg["BLOCK_K"]])
        bd = TensorDescriptor(b, [n, d], [b.stride(0), 1], [cfg["BLOCK_N"], cfg["BLOCK_K"]])
        persist_tma_kernel[(progs,)](ad, bd, t, thr, owner, other, keys, counters, m, n, d, capacity, GROUP_M=8,
                                     NUM_PROGS=progs, FLATTEN=opts["flatten"], **common, **cfg, **ex)
    elif variant == "rowstat":
        kp = triton.next_power_of_2(d)
        splits = opts["splits"]
        bn = cfg["BLOCK_N"]
        per = triton.cdiv(triton.cdiv(n, bn), splits) * bn
        grid = (triton.cdiv(m, cfg["BLOCK_M"]), triton.cdiv(n, per))
        ex2 = {} if INTERP else dict(num_warps=opts.get("warps", 8))
        rowstat_kernel[grid](a, b, t, thr, owner, other, keys, counters, m, n, d, a.stride(0), b.stride(0), capacity,
                             per, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=bn, KP=kp, STAGES=opts.get("stages", 3),
                             **common, **ex2)
    return counters, owner, other, keys


def bench(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e3


def variants(d, nsm):
    out = [("base", {})]
    for progs in (nsm, 2 * nsm):
        for flatten in (True, False):
            out.append(("persist", dict(progs=progs, flatten=flatten)))
            out.append(("tma", dict(progs=progs, flatten=flatten)))
    if d <= 128:
        for splits in (8, 32):
            for stages in (2, 3):
                out.append(("rowstat", dict(splits=splits, stages=stages)))
    return out


def main():
    interp = INTERP
    dev = torch.device("cpu" if interp else "cuda")
    m, n = (70, 300) if interp else (10000, 1 << 20)
    ds = [int(v) for v in sys.argv[1:]] or [128, 960]
    nsm = 4 if interp else torch.cuda.get_device_properties(dev).multi_processor_count
    for d in ds:
        width = -(-(d + 2) // 16) * 16
        for dt in ((torch.float32,) if interp else (torch.float32, torch.bfloat16)):
            g = torch.Generator(device=dev).manual_seed(0)
            a = torch.zeros((m, width), device=dev, dtype=dt)
            a[:, :d] = torch.randn(m, d, device=dev, generator=g).to(dt)
            b = torch.zeros((n, width), device=dev, dtype=dt)
            b[:, :d] = torch.randn(n, d, device=dev, generator=g).to(dt)
            terms = (b[:, :d].float() ** 2).sum(1) * 0.5
            s = a[:, :d].float() @ b[: min(n, 65536), :d].float().T + terms[: min(n, 65536)]
            thrs = {"none": torch.full((m,), float("-inf"), device=dev)}
            for kth in ((1, 3) if interp else (1, 13)):
                thrs[f"k{kth}"] = torch.kthvalue(s, kth, dim=1).values.contiguous()
            del s
            prec = "tf32" if dt == torch.float32 else "ieee"
            for name, thr in thrs.items():
                ref = None
                line = []
                for variant, opts in variants(d, nsm):
                    label = variant + "".join(f"/{k}={v}" for k, v in opts.items())
                    try:
                        t = 0.0 if interp else bench(lambda: run(variant, a, b, d, terms, thr, prec, 1 << 26, opts))
                        c, r, cc, kk = run(variant, a, b, d, terms, thr, prec, 1 << 26, opts)
                        f = int(c[0].item())
                        got = (torch.sort(r[:f].long() * n + cc[:f].long()).values if f < 50_000_000 else None)
                        if variant == "base":
                            ref = got
                        if got is not None and ref is not None and torch.equal(got, ref):
                            same = "ok"
                        elif got is not None and ref is not None:
                            both = torch.isin(got, ref).sum().item()
                            same = f"DIFF(+{got.numel() - both}/-{ref.numel() - both})"
                        else:
                            same = "?"
                        line.append(f"{label} {t:.1f}ms {same}")
                    except Exception as e:  # noqa: BLE001
                        line.append(f"{label} FAILED {type(e).__name__}: {str(e)[:300]}")
                print(f"d={d} {dt} thr={name} kept {f / m:.1f}/row: " + "; ".join(line), flush=True)


if __name__ == "__main__":
    main()
