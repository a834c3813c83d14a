"""Launch-configuration sweeps of the attention kernels, for tools/bench_kernels.py --sweep and
--split-sweep: each configuration checked against the default's output and timed, the best
printed."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

import torch

from tools.bench_kernels import Shapes, Timer, _decode_setup, _extend_flops, _extend_setup, decode_bytes


def _sweep(
    name: str,
    configs: list[dict],
    make: Callable[[dict], Callable[[], torch.Tensor]],
    timer: Timer,
    work: float,
    unit: str,
) -> dict:
    """Time make(config)() for each config, checking its output against the default config's."""
    reference = make({})().clone()
    rows = []
    for cfg in configs:
        try:
            fn = make(cfg)
            got = fn()
            err = float((got.float() - reference.float()).abs().max())
            ms = timer(fn)
        except Exception as exc:  # out of shared memory, bad layout: skip the config
            rows.append({**cfg, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"})
            continue
        ok = err < 2e-2 and not torch.isnan(got).any()
        rows.append(
            {**cfg, "ms": ms, unit: work / ms / 1e9 if unit == "TFLOP/s" else work / ms / 1e6, "max_err": err, "ok": ok}
        )
    good = [r for r in rows if r.get("ok")]
    best = max(good, key=lambda r: r[unit]) if good else None
    print(f"sweep {name}: best {best}", flush=True)
    return {"results": rows, "best": best}


def sweep(s: Shapes, dev, timer: Timer, seq: int, num_sms: int) -> dict:
    from services.worker.kernels.decode_attention import choose_num_splits, decode_attention, decode_scratch
    from services.worker.kernels.extend_attention import extend_attention

    ext = _extend_setup(s, seq, 0, dev)
    ext_cfgs = [
        {"BLOCK_M": m, "BLOCK_N": n, "num_warps": w, "num_stages": st}
        for m, n, w, st in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4))
        if m % n == 0
    ]
    ctx = s.decode_contexts[-1]
    dec = _decode_setup(s, ctx, True, False, dev)
    dec_cfgs = [
        {"BLOCK_N": n, "num_splits": sp, "num_warps": w, "num_stages": st}
        for n, sp, w, st in itertools.product((32, 64, 128), (1, 2, 4, 8), (4, 8), (2, 3))
    ]

    def make_decode(cfg: dict) -> Callable[[], torch.Tensor]:
        cfg = {"num_splits": choose_num_splits(s.decode_batch, s.hkv, ctx, num_sms)} | cfg
        mid_o, mid_lse = decode_scratch(s.decode_batch, s.hq, s.head_dim, cfg["num_splits"], dev)
        return lambda: decode_attention(**dec, mid_o=mid_o, mid_lse=mid_lse, **cfg)

    return {
        "extend": _sweep(
            f"extend seq {seq}",
            ext_cfgs,
            lambda c: lambda: extend_attention(**ext, **c),
            timer,
            _extend_flops(s, seq, 0),
            "TFLOP/s",
        ),
        "decode": _sweep(f"decode ctx {ctx}", dec_cfgs, make_decode, timer, decode_bytes(s, ctx, False), "GB/s"),
    }


def split_sweep(s: Shapes, dev, timer: Timer, copy_gbs: float, smoke: bool) -> dict:
    """Decode attention at each batch x context for grids of 1..32 splits, each request using
    min(grid, ceil(context / split_tokens)) of them: what the split rule is chosen from."""
    from services.worker.kernels.decode_attention import decode_attention, decode_scratch

    batches, contexts = ((2, 3), (40,)) if smoke else ((1, 16, 64, 256), (512, 1024, 2048, 4096))
    rows = []
    for b, ctx in itertools.product(batches, contexts):
        sb = replace(s, decode_batch=b)
        args = _decode_setup(sb, ctx, True, False, dev)
        args["out"] = torch.empty_like(args["q"])
        nbytes = decode_bytes(sb, ctx, False)
        for grid in (1, 2, 4, 8, 16, 32):
            seen = set()
            for tokens in (1, 256, 512, 1024):
                used = min(grid, -(-ctx // tokens))
                if used in seen:
                    continue
                seen.add(used)
                mid_o, mid_lse = decode_scratch(b, s.hq, s.head_dim, grid, dev)
                ms = timer(
                    lambda a=args, g=grid, t=tokens, mo=mid_o, ml=mid_lse: decode_attention(
                        num_splits=g, split_tokens=t, mid_o=mo, mid_lse=ml, **a
                    )
                )
                gbs = nbytes / ms / 1e6
                pct = 100 * gbs / copy_gbs
                rows.append(
                    {
                        "batch": b,
                        "context": ctx,
                        "grid_splits": grid,
                        "used_splits": used,
                        "split_tokens": tokens,
                        "ms": ms,
                        "GB/s": gbs,
                        "pct_of_copy": pct,
                    }
                )
        best = max((r for r in rows if r["batch"] == b and r["context"] == ctx), key=lambda r: r["GB/s"])
        print(
            f"split sweep batch {b} context {ctx}: best grid {best['grid_splits']} used {best['used_splits']} "
            f"{best['pct_of_copy']:.1f}% of copy",
            flush=True,
        )
    return {"results": rows}
