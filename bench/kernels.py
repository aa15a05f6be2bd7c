"""The engine's GPU kernels timed alone: the screen, the seeds' strip minima, the dense products.

GPU only (on a machine without CUDA it says so and exits with status 0). Each variant is one
of knng's maintained kernel choices, switched through ``knng.options`` (never a module
attribute); CUDA-event medians after warm-up calls (``harness.time_call``). Subcommands:

``screen``
    ``knng.engine.kernels.fused.screen_block`` on m × n × d blocks of N(0, 1) rows, with thresholds
    that keep nothing (the products, the compare and the reduction run; the compaction does
    not) or about 20 or 200 pairs per row: the scaled float16 screen on the CUDA C kernel (the
    wgmma kernel on a Hopper GPU; ``mma.sync`` with ``wgmma=False``; two accumulator sets with
    ``wgmma_one_set=False``; the pre-test without its marks with ``mark_candidates=False``),
    the Triton kernel on the same rows (``cuda_screen=False``), bfloat16, TF32 and the int8
    digit screen (int8x4); on a square block also a part's own block, screened by rows
    against screened as its upper triangle (``triangle``). TFLOP/s count 2·m·n·d (a triangle:
    the whole block's), against torch's bfloat16 product of the same shape and the
    datasheet peaks.
``minima``
    ``fused.strip_minima`` (a graph's and a search's seeds) on the mma.sync and on the wgmma
    kernel (``wgmma_minima``), alternating, and whether the two agree bit for bit.
``products``
    The dense products an exact 16,384 × 4,096 graph could be built on: ``x @ x.T`` in float64,
    float16, bfloat16, float32 and int8 (``torch._int_mm``), whole and one 2,048-row band: the
    floors any exact method pays there.

Usage (GPU machine, repository root)::

    PYTHONPATH=src:tests python bench/kernels.py screen --out screen.json
    PYTHONPATH=src:tests python bench/kernels.py screen --shapes 28672x28672x128 --variants "float16,float16 mma.sync,own rows,own triangle"
    PYTHONPATH=src:tests python bench/kernels.py minima
    PYTHONPATH=src:tests python bench/kernels.py products
    PYTHONPATH=src:tests python bench/kernels.py screen --quick       # one small shape
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from knng.engine import kernels
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

#: Dense peaks of an H100 / H200 SXM (TFLOP/s), the datasheet figures; int8x4 counts its four
#: int8 products (1,979 TOP/s) as one product of the d inputs.
PEAK = {"bfloat16": 989, "float16": 989, "tf32": 494, "tf32x3": 494 / 3, "float32": 67, "int8x4": 1979 / 4}

#: Screen variants: name -> (precision, knng.options changes, own block: None / "rows" / "triangle").
SCREENS: dict[str, tuple[str, dict[str, Any], str | None]] = {
    "float16": ("float16", {}, None),
    "float16 mma.sync": ("float16", {"wgmma": False}, None),
    "float16 two sets": ("float16", {"wgmma_one_set": False}, None),
    "float16 no marks": ("float16", {"mark_candidates": False}, None),
    "float16 triton": ("float16", {"cuda_screen": False}, None),
    "bfloat16": ("bfloat16", {}, None),
    "tf32": ("tf32", {}, None),
    "int8x4": ("int8x4", {}, None),
    "own rows": ("float16", {}, "rows"),
    "own triangle": ("float16", {}, "triangle"),
}
DEFAULT_SHAPES = "10000x1000000x128,16384x16384x128,16384x16384x4096,10000x1000000x960,28672x28672x128"


def cuda_ms(call: Any, repeats: int) -> float:
    """Median ms of CUDA-event timings of ``call`` after two warm-up calls."""
    return harness.time_call(call, device="cuda", warmup=2, repeats=repeats).median * 1e3


def screen(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``fused.screen_block`` per variant, survivors and shape."""
    from knng.engine.kernels import fused
    from knng.metrics import get_metric

    gen = torch.Generator(device="cuda").manual_seed(1)
    shapes = "4096x65536x128,8192x8192x128" if args.quick else (args.shapes or DEFAULT_SHAPES)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in SCREENS]
    if unknown:
        raise SystemExit(f"unknown screen variant(s) {unknown}; the variants are {', '.join(SCREENS)}")
    sq = get_metric("sqeuclidean")
    rows = []
    for shape in shapes.split(","):
        m, n, d = (int(v) for v in shape.split("x"))
        a32 = torch.randn((m, d), generator=gen, device="cuda")
        b32 = a32 if m == n else torch.randn((n, d), generator=gen, device="cuda")
        flops = 2.0 * m * n * d
        a16, b16 = a32.bfloat16(), b32.bfloat16()
        mm = cuda_ms(lambda a16=a16, b16=b16: a16 @ b16.T, args.repeats) if m * n * 2 < 40e9 else float("nan")
        terms = (b32.double() ** 2).sum(1).float()
        sample = b32[torch.randperm(n, device="cuda", generator=gen)[:min(n, 65536)]]
        sample_d2 = torch.cdist(a32, sample).pow(2)  # squared distances: the keys of every variant but own blocks'
        rows_by = {}
        row = {"m": m, "n": n, "d": d, "torch_bf16_mm_ms": mm, "variants": {}}
        for name in variants:
            precision, changes, own = SCREENS[name]
            if own and m != n:
                continue
            if name not in rows_by:
                if own:
                    p = sq.prepare(a32.double(), None, side="corpus", symmetric=True, dtype=torch.float16)
                    rows_by[name] = (p.vectors, p.vectors, p.terms.float().contiguous())
                elif precision in ("float16", "int8x4"):
                    dtype = torch.float16 if precision == "float16" else torch.int8
                    rows_by[name] = (sq.prepare(a32.double(), None, side="query", symmetric=False, dtype=dtype).vectors,
                                     sq.prepare(b32.double(), None, side="corpus", symmetric=False, dtype=dtype).vectors,
                                     terms)
                elif precision == "bfloat16":
                    rows_by[name] = (a16 * -2.0, b16, terms)
                else:
                    rows_by[name] = (a32 * -2.0, b32, terms)
            a, b, t = rows_by[name]
            for survivors in (0, 20, 200):
                if survivors == 0:
                    thr = torch.full((m,), -1e30, device="cuda")
                else:
                    kth = max(1, round(survivors * sample.shape[0] / n))
                    thr = sample_d2.kthvalue(kth, 1).values.float()
                    if not own:  # the keys leave out the rows' own terms
                        thr = thr - (a32.double() ** 2).sum(1).float()
                hint = m * (survivors * 2 + 64)
                with harness.option_context(changes):
                    if own == "triangle" and not kernels.triangle_runs(a.device, precision, d):
                        row["variants"][f"{name} survivors≈{survivors}"] = {"skipped": "no triangle kernel here"}
                        continue
                    if own:
                        def call() -> Any:
                            return fused.screen_block(a, b, d, thr, thr if own == "triangle" else None, t, t,
                                                      precision, exclude_diagonal=0, capacity_hint=hint,
                                                      triangle=own == "triangle")
                    else:
                        def call() -> Any:
                            return fused.screen_block(a, b, d, thr, None, None, t, precision, capacity_hint=hint)
                    ms = cuda_ms(call, args.repeats)
                    by_row, by_col = call()
                kept = by_row.owner.numel() + (0 if by_col is None else by_col.owner.numel())
                row["variants"][f"{name} survivors≈{survivors}"] = {
                    "ms": ms, "tflops": flops / ms / 1e9, "of_peak": flops / ms / 1e9 / PEAK[precision],
                    "kept_per_row": kept / m}
        print(json.dumps(row), flush=True)
        rows.append(row)
        del a32, b32, a16, b16, sample, sample_d2, rows_by
        harness.release("cuda")
    print("\n| m × n × d | torch bf16 mm (ms) | variant | ms | TFLOP/s | of peak | kept per row |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        for name, v in r["variants"].items():
            if "ms" in v:
                print(f"| {r['m']}×{r['n']}×{r['d']} | {r['torch_bf16_mm_ms']:.2f} | {name} | {v['ms']:.3f} | "
                      f"{v['tflops']:.0f} | {v['of_peak']:.0%} | {v['kept_per_row']:.1f} |")
    return rows


def minima(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Strip minima on the mma.sync and the wgmma kernel, alternating, compared bit for bit."""
    from knng.engine.kernels import fused
    from knng.metrics import get_metric

    gen = torch.Generator(device="cuda").manual_seed(0)
    metric = get_metric("sqeuclidean")
    shapes = ((4096, 8192),) if args.quick else ((50000, 65536), (32768, 8192), (10000, 65536))
    rows = []
    for m, n in shapes:
        x = torch.randn((m, 128), device="cuda", generator=gen, dtype=torch.float64)
        y = torch.randn((n, 128), device="cuda", generator=gen, dtype=torch.float64)
        pa = metric.prepare(x, None, side="corpus", symmetric=True, dtype=torch.float16)
        pb = metric.prepare(y, None, side="corpus", symmetric=True, dtype=torch.float16)
        rt, ct = pa.terms.float().contiguous(), pb.terms.float().contiguous()
        if not kernels.strip_minima_runs(x.device, "float16"):
            print("minima: the strip-minima kernel does not run here (the CUDA C screen is needed)")
            return rows

        def call() -> Any:
            return fused.strip_minima(pa.vectors, pb.vectors, 128, rt, ct, "float16")

        runs = harness.alternate({"mma.sync": {"wgmma_minima": False}, "wgmma": {"wgmma_minima": True}}, call,
                                 device="cuda", repeats=args.repeats, warmup=2)
        a, b = runs["mma.sync"].result, runs["wgmma"].result
        same = torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        flops = 2 * m * n * 128
        row = {"m": m, "n": n, "d": 128, "same": same,
               **{f"{k}_ms": statistics.median(v.times) * 1e3 for k, v in runs.items()}}
        rows.append(row)
        print(f"strip minima {m} × {n}: " + ", ".join(
            f"{k} {row[f'{k}_ms']:.3f} ms ({flops / row[f'{k}_ms'] / 1e9:.0f} TFLOP/s)" for k in runs)
              + f"; same {same}", flush=True)
    return rows


def products(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Dense products of a 16,384 × 4,096 block in each type, whole and one band."""
    n, d = (4096, 1024) if args.quick else (16384, 4096)
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn((n, d), device="cuda", generator=gen)
    x64, x16, xb = x.double(), x.half(), x.bfloat16()
    xi = torch.randint(-127, 128, (n, d), device="cuda", dtype=torch.int8, generator=gen)
    band = 2048
    rows = []
    for name, call, m in (("float64", lambda: x64 @ x64.T, n), ("float16", lambda: x16 @ x16.T, n),
                          ("bfloat16", lambda: xb @ xb.T, n), ("float32", lambda: x @ x.T, n),
                          ("int8", lambda: torch._int_mm(xi, xi.T), n),
                          ("float64 band", lambda: x64[:band] @ x64.T, band),
                          ("int8 band", lambda: torch._int_mm(xi[:band], xi.T), band)):
        best = harness.time_call(call, device="cuda", warmup=1, repeats=args.repeats).min * 1e3
        rows.append({"product": name, "rows": m, "n": n, "d": d, "ms": best, "tops": 2 * m * n * d / best / 1e9})
        print(f"{name} ({m} × {n} × {d}): {best:.3f} ms, {rows[-1]['tops']:.1f} T op/s", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["screen", "minima", "products"], help="the kernels to time")
    ap.add_argument("--shapes", default=None, help=f"screen: m×n×d shapes (default {DEFAULT_SHAPES})")
    ap.add_argument("--variants", default=",".join(SCREENS), help=f"screen: variants (default all: {', '.join(SCREENS)})")
    ap.add_argument("--repeats", type=int, default=10, help="timed launches (default 10)")
    ap.add_argument("--quick", action="store_true", help="small shapes: a smoke run")
    ap.add_argument("--out", default=None, help="write the figures to this JSON file")
    args = ap.parse_args(argv)
    harness.gpu_or_exit("bench/kernels.py")
    rows = {"screen": screen, "minima": minima, "products": products}[args.what](args)
    harness.write_json(args.out, {**harness.environment("cuda"), "what": args.what, "results": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
