#!/usr/bin/env python
"""Cases for a profiler, and the decode layout experiment (issues 17 and 18).

    python scripts/gpu/profile_cases.py time
    ncu --clock-control none --section … python scripts/gpu/profile_cases.py launch CASE …

``time``: the tensor-core decode kernel (fp16, Hq 32, Hkv 8, D 128, one query token)
on the same keys in four layouts — dense (B, Hkv, Sk, D); dense with the heads
interleaved ((B, Sk, Hkv, D) storage, the pool's order of rows); paged in pages of 16
and 256 with a shuffled table and with the identity table — with kernel time (CUDA
events behind a sleeping kernel, median of 5 sets of 20 calls, inputs rotated past the
L2) and SDPA's GQA decode beside it.  Every result is checked against float32 SDPA.

``launch CASE …``: each named case once (after one call that compiles it), for
``ncu -k regex:…`` to profile; cases: ``decode-dense``, ``decode-inter``,
``decode-paged16``, ``decode-paged256`` (B 16 × 32K; ``decode1-…``: B 1 × 4K), ``topk-lists``, ``topk-filter64``,
``topk-filter1024``, ``topk-radix1``, ``topk:B:V:k[:bf16]`` (the plan ``choose`` gives).  ``LINEINFO=1``: kernels compiled with line
information (ncu's source page then names the Python lines).  Prints tables; nothing is
kept.
"""

import os
import sys

import numpy as np
import torch
from numba import cuda

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

if os.environ.get("LINEINFO"):  # source lines in the profile: every cuda.jit with lineinfo
    _jit = cuda.jit
    cuda.jit = lambda *a, **kw: _jit(*a, lineinfo=True, **kw)

from numba_softmax.kernels.decode import decode_launch as DL  # noqa: E402
from numba_softmax.runtime import launcher  # noqa: E402
from numba_softmax.kernels.decode import paged as KP  # noqa: E402
from numba_softmax.kernels.topk import topk as K  # noqa: E402

from _timing import kernel_ms  # noqa: E402  (scripts/gpu/, the script's own folder)

HQ, HKV, D = 32, 8, 128


def nb(t):
    return cuda.as_cuda_array(t.detach())


def layouts(batch, ctx, gen, sets=1):
    """Per set: q, and {layout: (launch function)} on the same keys, plus o, lse."""
    out = []
    for _ in range(sets):
        q = torch.randn(batch, HQ, 1, D, device="cuda", dtype=torch.float16, generator=gen)
        ki = torch.randn(batch, ctx, HKV, D, device="cuda", dtype=torch.float16, generator=gen)
        vi = torch.randn(batch, ctx, HKV, D, device="cuda", dtype=torch.float16, generator=gen)
        k, v = ki.permute(0, 2, 1, 3).contiguous(), vi.permute(0, 2, 1, 3).contiguous()
        o = torch.empty(batch, HQ, 1, D, device="cuda", dtype=torch.float16)
        lse = torch.empty(batch, HQ, 1, device="cuda")
        qd, od, ld = nb(q), nb(o), nb(lse)
        fns = {"dense": (lambda a=(nb(k), nb(v)), qd=qd, od=od, ld=ld:
                         DL.run(qd, *a, od, ld, paged=False)),
               "inter": (lambda a=(nb(ki.permute(0, 2, 1, 3)), nb(vi.permute(0, 2, 1, 3))),
                         qd=qd, od=od, ld=ld: DL.run(qd, *a, od, ld, paged=False))}
        for bs in (16, 256):
            per = ctx // bs
            pool_k, pool_v = ki.reshape(batch * per, bs, HKV, D), vi.reshape(batch * per, bs, HKV, D)
            lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
            ident = torch.arange(batch * per, device="cuda", dtype=torch.int32).view(batch, per)
            perm = torch.randperm(batch * per, device="cuda", generator=gen).to(torch.int32)
            shuffled_k, shuffled_v = torch.empty_like(pool_k), torch.empty_like(pool_v)
            shuffled_k[perm.long()], shuffled_v[perm.long()] = pool_k, pool_v
            for name, (pk, pv, table) in ((f"paged{bs}", (shuffled_k, shuffled_v, perm.view(batch, per))),
                                          (f"paged{bs}-ident", (pool_k, pool_v, ident))):
                fns[name] = (lambda a=(nb(pk), nb(pv), nb(table), nb(lens)), qd=qd, od=od, ld=ld:
                             KP.launch(qd, a[0], a[1], a[2], a[3], od, ld, max_seqlen_k=ctx))
        out.append((q, k, v, o, fns))
    return out


def time_layouts():
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    print(f"device: {torch.cuda.get_device_name()}; Hq {HQ}, Hkv {HKV}, D {D}, fp16, one token")
    bad = []
    for batch, ctx in ((1, 32768), (16, 32768), (64, 4096), (1, 4096)):
        nbytes = 2 * batch * HKV * ctx * D * 2
        sets = max(1, min(4, (200 << 20) // nbytes + 1))
        data = layouts(batch, ctx, gen, sets)
        q, k, v, o, _ = data[0]
        ref = sdpa(q.float(), k.float(), v.float(), enable_gqa=True)
        tol = 2 * float((sdpa(q, k, v, enable_gqa=True).float() - ref).abs().max()) + 1e-3
        t0 = kernel_ms(lambda i: sdpa(*data[i][:3], enable_gqa=True), sets)
        print(f"B {batch} ctx {ctx}: SDPA {t0 * 1e3:.1f} µs {nbytes / t0 / 1e6:.0f} GB/s")
        for name in data[0][4]:
            data[0][4][name]()
            err = float((o.float() - ref).abs().max())
            if not err <= tol:
                bad.append(f"B {batch} ctx {ctx} {name}: error {err:.1e} > {tol:.1e}")
            t = kernel_ms(lambda i: data[i][4][name](), sets)
            print(f"    {name:<14} {t * 1e3:8.1f} µs {nbytes / t / 1e6:6.0f} GB/s "
                  f"{t0 / t:5.2f}× SDPA  err {err:.1e}")
        data = None  # (the case's arrays go before the next is made)
        torch.cuda.empty_cache()
    if bad:
        print("FAILED:\n  " + "\n  ".join(bad))
        sys.exit(1)


def topk_case(B, V, k, plan=None, bf16=False):
    x = torch.randn(B, V, device="cuda")
    values = torch.empty(B, k, device="cuda")
    if bf16:  # (as its uint16 bits, as the package takes bfloat16)
        x, values = x.bfloat16().view(torch.uint16), values.bfloat16().view(torch.uint16)
    indices = torch.empty(B, k, device="cuda", dtype=torch.int64)
    plan = plan or K.choose(B, V, k, nb(x).dtype, 8 if bf16 else 4, launcher.device_limits(), True)
    print(f"top-k B {B} V {V} k {k}{' bfloat16' if bf16 else ''}: {plan}")
    return lambda: K.launch(nb(x), k, nb(values), nb(indices), plan=plan)


def launch(names):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    fns = {}
    if any(n.startswith("decode-") for n in names):
        fns.update({f"decode-{n}": f for n, f in layouts(16, 32768, gen)[0][4].items()})
    if any(n.startswith("decode1-") for n in names):
        fns.update({f"decode1-{n}": f for n, f in layouts(1, 4096, gen)[0][4].items()})
    topk = {"topk-lists": lambda: topk_case(1024, 128256, 50),
            "topk-filter64": lambda: topk_case(64, 128256, 50),
            "topk-filter1024": lambda: topk_case(1024, 128256, 50, K.Plan(False, 256, 8, 1, filter=True)),
            "topk-radix1": lambda: topk_case(1, 128256, 50)}
    for name in names:
        if name.startswith("topk:"):  # topk:B:V:k[:bf16] — the plan choose gives
            B, V, k = (int(a) for a in name.split(":")[1:4])
            bf16 = name.endswith(":bf16")
            topk[name] = lambda B=B, V=V, k=k, bf16=bf16: topk_case(B, V, k, bf16=bf16)
        fn = fns[name] if name in fns else topk[name]()
        fn()  # compiles (and launches once)
        torch.cuda.synchronize()
        print(f"launch {name}", flush=True)
        fn()
        torch.cuda.synchronize()


if __name__ == "__main__":
    if sys.argv[1:2] == ["time"]:
        time_layouts()
    elif sys.argv[1:2] == ["launch"]:
        launch(sys.argv[2:])
    else:
        sys.exit(__doc__)
