"""The CUDA C float16 screen (``knng.engine.cuda_screen``): correctness on adversarial blocks,
then its speed against the Triton kernel, on a GPU.

(a) Correctness. Random float16 blocks whose sizes are not tile multiples (m = 1, 7, 129, 1000;
    n = 1, 127, 129, 5000), K = 16 … 960, symmetric and not, the diagonal excluded at 0 and
    elsewhere, row / column terms present and absent, factors of both signs and not powers of
    two, NaN in the row storage past K (the kernel must never read it), and thresholds on exact
    reference keys (ties), at ±inf, NaN and mixed. The reference is the float64 product of the
    stored values (exact products): every pair whose reference key is under its threshold by
    more than tol must be kept, none over it by more than tol, no pair twice, every kept key
    within tol of the reference and under its threshold (float32), and the counters equal the
    kept counts; a list too small for its survivors must still count them all, and the entries
    it holds must be kept pairs. tol = 1e-5 × the block's scale (max |factor·Σ|a||b|·scale| + terms).
    Non-symmetric blocks also run the kernel without its pre-test, which must keep the same
    pairs with the same keys bit for bit, including on thresholds equal to the kernel's own keys
    and on infinite, NaN and huge terms and overflowing factors.
(b) Speed. CUDA-event medians (after warm-up, two input sets alternating) of the kernel alone
    for each tile configuration, 10,000 × 2^20 at K = 64, 128, 256, 960 with thresholds keeping
    ~0 / ~15 / ~200 pairs per row, and a symmetric 16,384² block at K = 128 (both thresholds,
    both terms, the diagonal excluded); the Triton kernel (bfloat16, ``fused.screen_block``) on
    the same keys for comparison.

Usage (GPU machine, repository root)::

    PYTHONPATH=src python bench/cuda_screen_kernel.py [--quick] [--configs r128x128,s128x128]

Prints JSON lines as it goes and a table last; writes $OUT/cuda_screen.json when OUT is set.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import os
import statistics
import sys
import time
import traceback

import torch

from knng.engine import cuda_screen, fused

DEV = torch.device("cuda")
#: The configurations ``cuda_screen.choose_config`` picks: every variant is checked on them.
SHIPPED = ("r128x128", "r256x128", "s128x128", "wg128x128", "wg128x128s1", "wg128x128b2")


# ------------------------------------------------------------------------------ inputs
def _rows(count: int, k: int, gen: torch.Generator, extra: int, dtype=torch.float16) -> torch.Tensor:
    """count × k random values in rows of k + extra (a multiple of 8) columns; NaN past k."""
    ld = -(-(k + extra) // 8) * 8
    x = torch.full((count, ld), float("nan"), device=DEV, dtype=torch.float32)
    x[:, :k] = torch.randn((count, k), generator=gen, device=DEV)
    # a few rows much larger / smaller, and duplicate rows (exact ties)
    if count > 4:
        x[: count // 4, :k] *= 8.0
        x[count // 2: count // 2 + 2, :k] = x[:2, :k]
    return x.to(dtype)


def _factors(count: int, gen: torch.Generator, signed: bool) -> torch.Tensor:
    """Powers of two, some of them times 0.3 (not exact), negative ones when ``signed``."""
    e = torch.randint(-3, 4, (count,), generator=gen, device=DEV).float()
    f = torch.exp2(e)
    f = torch.where(torch.rand((count,), generator=gen, device=DEV) < 0.3, f * 0.3, f)
    if signed:
        f = torch.where(torch.rand((count,), generator=gen, device=DEV) < 0.5, -f, f)
    return f.float().contiguous()


def _reference(a, b, k, rf, cs, rt, ct):
    exact = a[:, :k].double() @ b[:, :k].double().T
    ref = exact * rf.double()[:, None] * cs.double()[None, :]
    if ct is not None:
        ref = ref + ct.double()[None, :]
    if rt is not None:
        ref = ref + rt.double()[:, None]
    scale = float(((a[:, :k].double().abs() @ b[:, :k].double().abs().T) * rf.double().abs()[:, None]
                   * cs.double().abs()[None, :]).max()) if ref.numel() else 1.0
    scale += float(ct.abs().max()) if ct is not None else 0.0
    scale += float(rt.abs().max()) if rt is not None else 0.0
    return ref, max(scale, 1e-30)


def _thresholds(ref: torch.Tensor, valid: torch.Tensor, mode: str, gen: torch.Generator, dim: int) -> torch.Tensor:
    """Thresholds per row (dim 1) or column (dim 0) of the reference keys."""
    masked = torch.where(valid, ref, torch.inf)
    count = ref.shape[0] if dim == 1 else ref.shape[1]
    other = ref.shape[1] if dim == 1 else ref.shape[0]
    kth = masked.kthvalue(min(other, 3), dim=dim).values.float()  # an exact reference key: ties
    kth = torch.where(torch.isfinite(kth), kth, torch.zeros_like(kth))
    if mode == "kth":
        return kth.contiguous()
    if mode == "inf":
        return torch.full((count,), torch.inf, device=DEV)
    if mode == "-inf":
        return torch.full((count,), -torch.inf, device=DEV)
    pick = torch.randint(0, 4, (count,), generator=gen, device=DEV)  # mixed: kth, +inf, -inf, NaN
    out = torch.stack([kth, torch.full_like(kth, torch.inf), torch.full_like(kth, -torch.inf),
                       torch.full_like(kth, torch.nan)], 1)
    return out.gather(1, pick[:, None])[:, 0].contiguous()


def _run(a, b, k, rf, cs, rt, ct, row_thr, col_thr, diag, capacity, config):
    sides = 2 if col_thr is not None else 1
    lists = [(torch.full((capacity,), -7, dtype=torch.int32, device=DEV),
              torch.full((capacity,), -7, dtype=torch.int32, device=DEV),
              torch.full((capacity,), torch.nan, dtype=torch.float32, device=DEV)) for _ in range(sides)]
    counters = torch.zeros(2, dtype=torch.int32, device=DEV)
    cuda_screen.launch_screen(a, b, k, rf, cs, rt, ct, row_thr, col_thr, diag, lists, counters, capacity,
                              config=config)
    if DEV.type == "cuda":
        torch.cuda.synchronize()
    return lists, counters.tolist()


def _check_side(lists, count, capacity, thr, ref, valid, tol, name):
    """One side's list against the reference (``ref``/``valid`` already oriented owner × other)."""
    owner, other, keys = lists
    rows, cols = ref.shape
    assert count >= 0, f"{name}: negative count {count}"
    stored = min(count, capacity)
    o, t, kk = owner[:stored].long(), other[:stored].long(), keys[:stored]
    assert bool(((o >= 0) & (o < rows) & (t >= 0) & (t < cols)).all()), f"{name}: entry out of range"
    lin = o * cols + t
    assert lin.unique().numel() == stored, f"{name}: a pair listed twice"
    assert bool(valid[o, t].all()), f"{name}: an excluded pair was kept"
    r = ref[o, t]
    assert bool(((kk.double() - r).abs() <= tol).all()), \
        f"{name}: key off the reference by {float((kk.double() - r).abs().max()):.3g} > tol {tol:.3g}"
    assert bool((kk <= thr[o]).all()), f"{name}: a kept key over its threshold"
    possible = valid & (ref <= thr.double()[:, None] + tol)
    assert bool(possible[o, t].all()), f"{name}: a pair certainly over its threshold was kept"
    certain = valid & (ref < thr.double()[:, None] - tol)
    if count <= capacity:
        kept = torch.zeros((rows, cols), dtype=torch.bool, device=DEV)
        kept[o, t] = True
        missing = int((certain & ~kept).sum())
        assert missing == 0, f"{name}: {missing} pairs certainly under their threshold dropped"
        assert count == int(kept.sum()), f"{name}: counter {count} != kept {int(kept.sum())}"
    return int(certain.sum()), int(possible.sum())


def _entries(lists, count, n):
    """A list's entries in (owner, other) order, keys as bits."""
    owner, other, keys = (x[:count] for x in lists)
    order = torch.argsort(owner.long() * n + other.long())
    return owner[order], other[order], keys[order].view(torch.int32)


def check_case(case: dict, config, gen: torch.Generator) -> dict:
    m, n, k = case["m"], case["n"], case["k"]
    a = _rows(m, k, gen, case.get("extra", 16))
    b = _rows(n, k, gen, case.get("extra", 16) + 8)
    rf = _factors(m, gen, signed=True)
    cs = _factors(n, gen, signed=False)
    rt = torch.randn((m,), generator=gen, device=DEV) * 50 if case["rt"] else None
    ct = torch.randn((n,), generator=gen, device=DEV) * 50 if case["ct"] else None
    if case.get("wild"):  # non-finite and huge terms, factors whose products overflow
        wild = torch.tensor([float("inf"), -float("inf"), float("nan"), 3e38, -3e38, 1e30], device=DEV)
        for v in (rt, ct):
            if v is not None:
                v[:min(6, v.numel())] = wild[:min(6, v.numel())]
        rf[-min(3, m):] = 2.0**100
    ref, scale = _reference(a, b, k, rf, cs, rt, ct)
    tol = 1e-5 * scale
    valid = torch.ones((m, n), dtype=torch.bool, device=DEV)
    diag = case["diag"]
    if diag is not None:
        r = torch.arange(m, device=DEV)
        c = r - diag
        ok = (c >= 0) & (c < n)
        valid[r[ok], c[ok]] = False
    cfg = config if isinstance(config, cuda_screen.Config) else cuda_screen.CONFIGS[config]
    capacity = m * n + 5
    if case["thr"] == "own":
        # Thresholds on the kernel's own float32 keys (exact ties): the 3rd smallest of each row.
        inf = torch.full((m,), torch.inf, device=DEV)
        (o, t, kk), _ = _run(a, b, k, rf, cs, rt, ct, inf, None, diag, capacity, cfg._replace(pretest=False))[0][0], 0
        dense = torch.full((m, n), torch.inf, device=DEV)
        valid_n = int(valid.sum())
        dense[o[:valid_n].long(), t[:valid_n].long()] = kk[:valid_n]
        row_thr = dense.kthvalue(min(n, 3), dim=1).values.contiguous()
        col_thr = None
    else:
        row_thr = _thresholds(ref, valid, case["thr"], gen, 1)
        col_thr = _thresholds(ref, valid, case["thr"], gen, 0) if case["sym"] else None
    lists, counts = _run(a, b, k, rf, cs, rt, ct, row_thr, col_thr, diag, capacity, config)
    out = {}
    if cfg.pretest and col_thr is None:
        # The pre-test must keep exactly what the plain test keeps, with the same keys (bits).
        lists_t, counts_t = _run(a, b, k, rf, cs, rt, ct, row_thr, col_thr, diag, capacity,
                                 cfg._replace(pretest=False))
        assert counts_t == counts, f"pre-test counts {counts} != plain {counts_t}"
        got, want = _entries(lists[0], counts[0], n), _entries(lists_t[0], counts_t[0], n)
        assert all(torch.equal(x, y) for x, y in zip(got, want)), "pre-test and plain test differ"
        out["twin"] = True
    if case.get("wild"):
        assert min(counts) >= 0
        out["kept"] = counts
        return out
    _check_side(lists[0], counts[0], capacity, row_thr, ref, valid, tol, "rows")
    out["kept"] = [counts[0]]
    if col_thr is not None:
        _check_side(lists[1], counts[1], capacity, col_thr, ref.T, valid.T, tol, "columns")
        out["kept"].append(counts[1])
    elif counts[1] != 0:
        raise AssertionError("the column counter moved in a non-symmetric block")
    if case.get("overflow") and max(counts) > 1:
        small = max(1, min(c for c in counts[:2 if col_thr is not None else 1]) // 3)
        lists2, counts2 = _run(a, b, k, rf, cs, rt, ct, row_thr, col_thr, diag, small, config)
        assert counts2[:len(lists2)] == counts[:len(lists2)], f"overflow counts {counts2} != {counts}"
        _check_side(lists2[0], counts2[0], small, row_thr, ref, valid, tol, "rows (overflowed)")
        if col_thr is not None:
            _check_side(lists2[1], counts2[1], small, col_thr, ref.T, valid.T, tol, "columns (overflowed)")
        out["overflow_capacity"] = small
    return out


def correctness_cases(quick: bool) -> list[dict]:
    cases = []
    ks = [16, 64, 128, 960]
    terms = [(False, True), (True, True), (False, False), (True, False)]
    thr_modes = ["kth", "mixed", "inf", "kth", "-inf"]
    for idx, (m, n) in enumerate(itertools.product([1, 7, 129, 1000], [1, 127, 129, 5000])):
        rt, ct = terms[(idx // 3) % 4]
        cases.append(dict(m=m, n=n, k=ks[idx % 4], sym=idx % 2 == 1, diag=[None, 0, 5, -3][(idx // 2) % 4],
                          rt=rt, ct=ct, thr=thr_modes[idx % 5]))
    for k in ([128] if quick else [16, 64, 80, 128, 144, 256, 272, 960]):
        for sym, (rt, ct) in itertools.product([False, True], terms):
            cases.append(dict(m=1000, n=5000, k=k, sym=sym, diag=0 if sym else None, rt=rt, ct=ct, thr="kth"))
    cases.append(dict(m=1000, n=1000, k=128, sym=True, diag=0, rt=True, ct=True, thr="kth"))
    cases.append(dict(m=300, n=700, k=64, sym=True, diag=-40, rt=True, ct=True, thr="inf", overflow=True))
    cases.append(dict(m=1000, n=5000, k=128, sym=False, diag=None, rt=False, ct=True, thr="mixed", overflow=True))
    cases.append(dict(m=513, n=2000, k=960, sym=True, diag=7, rt=False, ct=True, thr="kth", overflow=True))
    for rt, ct in terms:
        for thr in ("mixed", "kth", "inf"):
            cases.append(dict(m=200, n=300, k=64, sym=False, diag=3, rt=rt, ct=ct, thr=thr, wild=True))
        for k in (64, 128, 960):
            cases.append(dict(m=1000, n=5000, k=k, sym=False, diag=None if k != 64 else 2, rt=rt, ct=ct, thr="own"))
    return cases


def correctness(configs: list[str], quick: bool, log) -> dict:
    gen = torch.Generator(device=DEV).manual_seed(7)
    results = {"passed": 0, "failed": 0, "failures": []}
    default_cases = correctness_cases(quick)
    for config in configs:
        resident = cuda_screen.CONFIGS[config].resident
        shipped = config in SHIPPED
        for case in default_cases:
            if not shipped and not (case["rt"] == case["ct"] == case["sym"] or (not case["rt"] and case["ct"]
                                                                                 and not case["sym"])):
                continue  # other configurations: two variants (the benchmark's and all on)
            if resident and cuda_screen.shared_bytes(case["k"], cuda_screen.CONFIGS[config], True, True, True) \
                    > 227 * 1024:
                continue
            try:
                check_case(case, config, gen)
                results["passed"] += 1
            except Exception as exc:  # noqa: BLE001 - report every failing case
                results["failed"] += 1
                results["failures"].append({"config": config, **case, "error": str(exc)[:300]})
                log(f"FAIL {config} {case}: {exc}")
        log(f"correctness {config}: {results['passed']} passed, {results['failed']} failed so far")
    return results


# ------------------------------------------------------------------------------ timing
def cuda_ms(fn, inputs, repeats: int) -> float:
    """Median CUDA-event time of fn(*inputs[i % 2]) after warm-up."""
    for i in range(3):
        fn(*inputs[i % len(inputs)])
    torch.cuda.synchronize()
    times = []
    for i in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(*inputs[i % len(inputs)])
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def timing(args, configs: list[str], log) -> list[dict]:
    gen = torch.Generator(device=DEV).manual_seed(1)
    rows = []
    shapes = [(args.m, args.n, k, False) for k in args.ks] + [(args.sym, args.sym, 128, True)]
    if args.quick:
        shapes = [(2048, 65536, 128, False), (4096, 4096, 128, True)]
    for m, n, k, sym in shapes:
        sets = []
        for _ in range(2):
            a = torch.randn((m, k), generator=gen, device=DEV).half()
            b = a if sym else torch.randn((n, k), generator=gen, device=DEV).half()
            sets.append((a, b))
        rf = torch.full((m,), -2.0, device=DEV)
        cs = torch.ones((n,), device=DEV)
        flops = 2.0 * m * n * k
        for survivors in args.survivors:
            inputs, tinputs = [], []
            for a, b in sets:
                ct = (b.float() ** 2).sum(1)
                rt = (a.float() ** 2).sum(1) if sym else None
                sample = b[torch.randperm(n, device=DEV, generator=gen)[:min(n, 65536)]].float()
                keys = -2.0 * (a.float() @ sample.T) + (sample ** 2).sum(1)[None, :]
                if rt is not None:
                    keys += rt[:, None]
                if survivors == 0:
                    thr = torch.full((m,), -1e30, device=DEV)
                else:
                    thr = keys.kthvalue(max(1, round(survivors * sample.shape[0] / n)), 1).values.contiguous()
                col_thr = thr[:n].clone() if sym else None
                cap = max(1 << 20, m * (survivors * 3 + 64))
                lists = [tuple(torch.empty(cap, dtype=dt, device=DEV) for dt in (torch.int32, torch.int32,
                                                                                  torch.float32))
                         for _ in range(2 if sym else 1)]
                counters = torch.zeros(2, dtype=torch.int32, device=DEV)
                inputs.append((a, b, rt, ct, thr, col_thr, lists, counters, cap))
                tinputs.append(((a.float() * -2).bfloat16(), b.bfloat16(), thr, col_thr, rt, ct))
                del keys, sample
            row = {"m": m, "n": n, "k": k, "symmetric": sym, "survivors_target": survivors, "tflop": flops / 1e12,
                   "cuda": {}}

            def run_cuda(a, b, rt, ct, thr, col_thr, lists, counters, cap, config=None, bf16=False):
                counters.zero_()
                cuda_screen.launch_screen(a, b, k, rf, cs, rt, ct, thr, col_thr, 0 if sym else None, lists,
                                          counters, cap, config=config, bf16=bf16)

            for config in configs:
                cfg = cuda_screen.CONFIGS[config]
                if cfg.resident and cuda_screen.shared_bytes(k, cfg, sym, True, sym) > 227 * 1024:
                    continue
                try:
                    ms = cuda_ms(lambda *x: run_cuda(*x, config=config), inputs, args.repeats)
                    kept = inputs[-1][7].tolist()
                    row["cuda"][config] = {"ms": ms, "tflops": flops / ms / 1e9, "kept_per_row": kept[0] / m,
                                           "kept_per_col": kept[1] / n if sym else None}
                except Exception as exc:  # noqa: BLE001
                    row["cuda"][config] = {"error": str(exc)[:300]}
            if args.bf16 and k == 128:
                try:
                    binputs = [(x[0].bfloat16(), x[1].bfloat16(), *x[2:]) for x in inputs]
                    ms = cuda_ms(lambda *x: run_cuda(*x, bf16=True), binputs, args.repeats)
                    row["cuda_bf16"] = {"ms": ms, "tflops": flops / ms / 1e9,
                                        "config": cuda_screen.choose_config(k, sym)}
                    del binputs
                except Exception as exc:  # noqa: BLE001
                    row["cuda_bf16"] = {"error": str(exc)[:300]}
            if not args.no_triton and fused.fused_available(DEV):
                def run_triton(a, b, thr, col_thr, rt, ct):
                    return fused.screen_block(a, b, k, thr, col_thr, rt, ct, "bfloat16",
                                              exclude_diagonal=0 if sym else None,
                                              capacity_hint=m * (survivors * 3 + 64))
                try:
                    ms = cuda_ms(run_triton, tinputs, args.repeats)
                    out = run_triton(*tinputs[-1])
                    row["triton_bf16"] = {"ms": ms, "tflops": flops / ms / 1e9,
                                          "kept_per_row": out[0].owner.numel() / m}
                except Exception as exc:  # noqa: BLE001
                    row["triton_bf16"] = {"error": str(exc)[:300]}
            log(json.dumps(row))
            rows.append(row)
            del inputs, tinputs
            torch.cuda.empty_cache()
        del sets
        torch.cuda.empty_cache()
    return rows


# ------------------------------------------------------------------------------ main
def precompile(configs: list[str], log) -> dict:
    """Compile every variant the run needs (threads: NVRTC runs outside the GIL), with the
    kernels' register counts."""
    index = torch.cuda.current_device()
    wanted = set()
    for config in configs:
        shipped = config in SHIPPED
        cfg = cuda_screen.CONFIGS[config]
        for rt, ct, sym in itertools.product([False, True], repeat=3):
            if shipped or rt == ct == sym or (ct and not rt and not sym):
                wanted.add((cfg, rt, ct, sym, False))
                if cfg.pretest and not sym:
                    wanted.add((cfg._replace(pretest=False), rt, ct, sym, False))
    wanted.add((cuda_screen.CONFIGS["r128x128"], False, True, False, True))
    t0 = time.time()

    def one(v):
        config, rt, ct, sym, bf16 = v
        fn = cuda_screen.kernel(index, config, rt, ct, sym, bf16)
        return v, int(fn.num_regs), int(getattr(fn, "local_size_bytes", -1))

    report = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        for v, regs, local in pool.map(one, sorted(wanted)):
            name = next((k for k, c in cuda_screen.CONFIGS.items() if c == v[0]), repr(tuple(v[0])))
            report["/".join([name] + [str(x) for x in v[1:]])] = {"regs": regs, "local_bytes": local}
    log(f"compiled {len(wanted)} variants in {time.time() - t0:.1f} s; registers (local bytes): "
        + ", ".join(f"{k} {v['regs']} ({v['local_bytes']})" for k, v in report.items()))
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default=",".join(cuda_screen.CONFIGS))
    p.add_argument("--m", type=int, default=10_000)
    p.add_argument("--n", type=int, default=2**20)
    p.add_argument("--ks", type=lambda s: [int(v) for v in s.split(",")], default=[128, 64, 256, 960])
    p.add_argument("--sym", type=int, default=16_384, help="rows = columns of the symmetric block")
    p.add_argument("--survivors", type=lambda s: [int(v) for v in s.split(",")], default=[0, 15, 200])
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--skip-check", action="store_true")
    p.add_argument("--skip-time", action="store_true")
    p.add_argument("--no-triton", action="store_true")
    p.add_argument("--bf16", action="store_true", help="also time the bfloat16 variant of the CUDA kernel")
    args = p.parse_args()
    configs = args.configs.split(",")

    def log(msg):
        print(msg, flush=True)

    result = {"device": torch.cuda.get_device_name(), "configs": {c: cuda_screen.CONFIGS[c]._asdict() for c in configs}}
    result["compile"] = precompile(configs, log)
    if not args.skip_check:
        result["correctness"] = correctness(configs, args.quick, log)
    if not args.skip_time:
        result["timing"] = timing(args, configs, log)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "cuda_screen.json"), "w") as f:
            json.dump(result, f, indent=1)
    if "correctness" in result:
        c = result["correctness"]
        print(f"\ncorrectness: {c['passed']} cases passed, {c['failed']} failed")
    if "timing" in result:
        print("\n| m × n × K | sym | kept/row | config | ms | TFLOP/s | Triton bf16 ms |")
        print("|---|---|---|---|---|---|---|")
        for r in result["timing"]:
            tri = r.get("triton_bf16", {})
            tri_ms = f"{tri['ms']:.2f} ({tri['kept_per_row']:.0f}/row)" if "ms" in tri else tri.get("error", "-")[:40]
            for name, v in r["cuda"].items():
                if "ms" in v:
                    print(f"| {r['m']}×{r['n']}×{r['k']} | {r['symmetric']} | {v['kept_per_row']:.1f} | {name} | "
                          f"{v['ms']:.2f} | {v['tflops']:.0f} | {tri_ms} |")
                else:
                    print(f"| {r['m']}×{r['n']}×{r['k']} | {r['symmetric']} | - | {name} | {v['error'][:60]} |")
            if "cuda_bf16" in r and "ms" in r["cuda_bf16"]:
                print(f"| {r['m']}×{r['n']}×{r['k']} | {r['symmetric']} | - | bf16 {r['cuda_bf16'].get('config', '')} | "
                      f"{r['cuda_bf16']['ms']:.2f} | {r['cuda_bf16']['tflops']:.0f} | |")
        # The short table: the configuration the launcher picks, against Triton.
        print("\n| m × n × K | symmetric | kept/row | default config | ms | TFLOP/s | Triton bf16 ms | speed-up |")
        print("|---|---|---|---|---|---|---|---|")
        for r in result["timing"]:
            name = cuda_screen.choose_config(r["k"], r["symmetric"])
            v, tri = r["cuda"].get(name, {}), r.get("triton_bf16", {})
            if "ms" not in v:
                continue
            t_ms = tri.get("ms")
            triton = f"{t_ms:.2f}" if t_ms else "-"
            speedup = f"{t_ms / v['ms']:.1f}×" if t_ms else "-"
            print(f"| {r['m']}×{r['n']}×{r['k']} | {r['symmetric']} | {v['kept_per_row']:.1f} | {name} | "
                  f"{v['ms']:.2f} | {v['tflops']:.0f} | {triton} | {speedup} |")


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
