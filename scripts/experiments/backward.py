"""GPU check of the backward passes (issue 15): correctness first, then timing.

    python scripts/experiments/backward.py          # on a CUDA machine with PyTorch; ≈ 2 min with JIT
    python scripts/experiments/backward.py --check  # correctness only; --time: timing only

Correctness (every failure is printed; the exit status is 1 if any):
  * torch.autograd.gradcheck in float64 through numba_softmax.torch: softmax and
    log_softmax (every launch form: warp, block, two-pass, split), and the attention
    backward kernel in float64 (inside an autograd.Function whose forward is PyTorch's
    float64 math: the package's forward takes float16/float32); the attention op itself in
    float32 (``nondet_tol`` for dQ's atomic adds);
  * torch.library.opcheck of every op;
  * the flash-attn rule in float16 (through the ops) and bfloat16 (kernel level, uint16
    bits): |ours − fp32 reference| <= 2·|PyTorch same precision − reference| + 1e-5;
  * the row backward at every timing shape and the attention backward at the timing
    shapes against float64, outputs poisoned with NaN first.
Timing (CUDA events, a GPU sleep queued first so Python's launch cost is hidden, median of
20, two input sets alternated; every tensor set is larger than the 50 MB L2):
  * softmax / log_softmax backward GB/s (3 tensors: y, dy read, dx written) vs
    torch._softmax_backward_data, and % of the device-to-device copy bandwidth;
  * attention backward TFLOP/s (10·Sq·Sk·D·B·H) vs SDPA's backward, fp32 and fp16,
    (B, H) = (4, 8), S = 1024 / 4096, D = 64 / 128 (O and LSE from PyTorch's float32 math),
    plus two other tile shapes at S = 4096.
Each table stops (and says so) when the run passes its time budget, so the whole run
stays under 2 minutes.  Writes nothing but stdout.
"""

import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from numba import cuda  # noqa: E402

import numba_softmax.torch as nst  # noqa: E402
from numba_softmax import backward as B  # noqa: E402
from numba_softmax.kernels.backward import attention_backward as KA  # noqa: E402
from numba_softmax.kernels.backward import attention_backward_tiles as KT  # noqa: E402
from numba_softmax.runtime import launcher  # noqa: E402
from numba_softmax.kernels.backward import softmax_backward_launch as KS  # noqa: E402
from numba_softmax.kernels.rows.epilogue import LOG_SOFTMAX, SOFTMAX  # noqa: E402

F = torch.nn.functional
FAILED = []
T0 = time.time()


def check(name, ok, detail=""):
    print(f"  {'ok  ' if ok else 'FAIL'} {name} {detail}", flush=True)
    if not ok:
        FAILED.append(f"{name} {detail}")


def guarded(name, fn):
    try:
        fn()
    except Exception as e:  # a crash is a failure with its message, and the run goes on
        check(name, False, f"raised {type(e).__name__}: {str(e)[:300]}")


def nb(t):
    """A Numba device array over a tensor (bfloat16 as its uint16 bits)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return cuda.as_cuda_array(t.view(torch.int16)).view(np.uint16)
    return cuda.as_cuda_array(t)


def stream():
    return cuda.external_stream(torch.cuda.current_stream().cuda_stream)


# --- correctness -------------------------------------------------------------------------------
def gradcheck_rows():
    for fn in ("softmax", "log_softmax"):
        # float64 forms: warp (n <= 512), block (3 x 1500), two-pass (100 x 9000), split (2 rows)
        shapes = [((3, 37), -1, False), ((4, 5, 6), 1, False)]
        shapes += [((3, 1500), -1, True), ((100, 9000), -1, True)] if fn == "softmax" else \
            [((2, 30000), -1, True)]
        for shape, dim, fast in shapes:
            x = (3 * torch.randn(*shape, dtype=torch.float64, device="cuda")).requires_grad_()
            ok = torch.autograd.gradcheck(lambda t: getattr(nst, fn)(t, dim), (x,), fast_mode=fast,
                                          raise_exception=False)
            check(f"gradcheck float64 {fn} {shape} dim={dim}", ok)


class _MathForward(torch.autograd.Function):
    """Forward: PyTorch float64 math (bottom-right causal, GQA); backward: the package's
    attention_backward (float64 kernel) — so gradcheck tests the backward kernel."""

    @staticmethod
    def forward(ctx, q, k, v, causal):
        g = q.shape[-3] // k.shape[-3]
        kr, vr = k.repeat_interleave(g, -3), v.repeat_interleave(g, -3)
        s = q @ kr.transpose(-1, -2) / math.sqrt(q.shape[-1])
        sq, sk = s.shape[-2:]
        if causal:
            keep = torch.arange(sk, device=q.device)[None] <= torch.arange(sq, device=q.device)[:, None] + sk - sq
            s = s.masked_fill(~keep, float("-inf"))
        lse = torch.logsumexp(s, -1)
        o = torch.exp(s - lse[..., None]) @ vr
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        return (*B.attention_backward(do.contiguous(), q, k, v, o, lse, causal=ctx.causal), None)


def gradcheck_attention():
    for causal, (hq, hkv, sq, sk) in [(False, (2, 2, 13, 17)), (True, (4, 2, 11, 19))]:
        args = [torch.randn(1, h, s, 64, dtype=torch.float64, device="cuda", requires_grad=True)
                for h, s in ((hq, sq), (hkv, sk), (hkv, sk))]
        ok = torch.autograd.gradcheck(lambda q, k, v: _MathForward.apply(q, k, v, causal), args,
                                      fast_mode=True, nondet_tol=1e-10, raise_exception=False)
        check(f"gradcheck float64 attention backward kernel causal={causal} Hq/Hkv={hq}/{hkv}", ok)
    args = [torch.randn(1, 2, 9, 64, device="cuda", requires_grad=True) for _ in range(3)]
    ok = torch.autograd.gradcheck(lambda q, k, v: nst.attention(q, k, v, causal=True), args, eps=1e-3,
                                  atol=5e-3, rtol=5e-3, nondet_tol=1e-5, fast_mode=True,
                                  raise_exception=False)
    check("gradcheck float32 nst.attention causal (eps 1e-3, tol 5e-3)", ok)


def opchecks():
    x = torch.randn(4, 33, device="cuda", requires_grad=True)
    y = torch.softmax(x.detach(), -1)
    q, k, v = (torch.randn(1, 2, 17, 64, device="cuda", requires_grad=True) for _ in range(3))
    o, lse = nst.attention_op(q.detach(), k.detach(), v.detach(), True, None)
    cases = [(nst.softmax_op, (x, -1)), (nst.log_softmax_op, (x, -1)),
             (nst.softmax_backward_op, (torch.randn_like(y), y, -1)),
             (nst.log_softmax_backward_op, (torch.randn_like(y), y.log(), -1)),
             (nst.attention_op, (q, k, v, True, None)),
             (nst.attention_backward_op, (torch.randn_like(o), q.detach(), k.detach(), v.detach(),
                                          o, lse, True, None))]
    for op, args in cases:
        guarded(f"opcheck {op}", lambda: (torch.library.opcheck(op, args, atol=1e-5, rtol=1e-5),
                                          check(f"opcheck {op}", True)))


def flash_rule(tag, ours, theirs, ref):
    for name, a, b, r in zip(("dq", "dk", "dv"), ours, theirs, ref):
        e_ours = (a.float() - r).abs().max().item()
        e_torch = (b.float() - r).abs().max().item()
        check(f"flash-attn rule {tag} {name}", e_ours <= 2 * e_torch + 1e-5,
              f"ours {e_ours:.2e} vs 2·torch {2 * e_torch:.2e} + 1e-5")


def sdpa_grads(q, k, v, do, causal, dtype):
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*leaves, is_causal=causal).backward(do.to(dtype))
    return [t.grad.float() for t in leaves]


def flash_rules():
    torch.manual_seed(0)
    for causal, (b, h, s, d) in [(False, (2, 4, 257, 64)), (True, (2, 4, 257, 64)), (True, (1, 4, 131, 128))]:
        q, k, v, do = (torch.randn(b, h, s, d, device="cuda") for _ in range(4))
        ref = sdpa_grads(q, k, v, do, causal, torch.float32)
        theirs = sdpa_grads(q, k, v, do, causal, torch.float16)
        leaves = [t.half().requires_grad_() for t in (q, k, v)]
        nst.attention(*leaves, causal=causal).backward(do.half())
        flash_rule(f"fp16 {(b, h, s, d)} causal={causal}", [t.grad for t in leaves], theirs, ref)
        if d == 128:
            continue
        # bfloat16 at kernel level: inputs rounded to bf16, O and LSE in fp32 from them
        qb, kb, vb, dob = (t.bfloat16() for t in (q, k, v, do))
        ref = sdpa_grads(qb.float(), kb.float(), vb.float(), dob.float(), causal, torch.float32)
        theirs = sdpa_grads(qb, kb, vb, dob, causal, torch.bfloat16)
        sc = qb.float() @ kb.float().transpose(-1, -2) / math.sqrt(d)
        if causal:
            sc = sc.masked_fill(torch.ones(s, s, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
        lse = torch.logsumexp(sc, -1)
        o = (torch.softmax(sc, -1) @ vb.float()).bfloat16()
        outs = [torch.full_like(t, float("nan")) for t in (qb, kb, vb)]
        KA.launch(*(nb(t) for t in (dob, qb, kb, vb, o, lse)), *(nb(t) for t in outs), causal=causal,
                  stream=stream())
        flash_rule(f"bf16 {(b, h, s, d)} causal={causal}", outs, theirs, ref)


ROW_SHAPES = [(16384, 1024), (8192, 4096), (4096, 8192), (2048, 16384), (1024, 65536),
              (256, 262144), (128, 1048576)]


def row_reference(mode, dy, y):
    dy, y = dy.double(), y.double()
    if mode == SOFTMAX:
        return y * (dy - (y * dy).sum(-1, keepdim=True))
    return dy - y.exp() * dy.sum(-1, keepdim=True)


def rows_inputs(rows, n, dtype, mode, sets=2):
    out = []
    for _ in range(sets):
        x = 3 * torch.randn(rows, n, device="cuda")
        y = torch.softmax(x, -1) if mode == SOFTMAX else torch.log_softmax(x, -1)
        out.append((torch.randn(rows, n, device="cuda").to(dtype), y.to(dtype)))
    return out


def check_rows(mode, dy, y, plan=None, tag=""):
    dx = torch.full_like(y, float("nan"))
    KS.launch(mode, nb(dy), nb(y), nb(dx), stream=stream(), plan_=plan)
    ref = row_reference(mode, dy, y)
    err = ((dx.double() - ref).abs() / (ref.abs() + ref.abs().max() * 1e-3)).max().item()
    limit = 1e-3 if dy.dtype == torch.float32 else 2e-2
    name = "softmax" if mode == SOFTMAX else "log_softmax"
    check(f"row backward {name} {tuple(y.shape)} {y.dtype} {tag}", err < limit and not dx.isnan().any(),
          f"max rel err {err:.1e}")


def half_rows_rule():
    for dtype, mode in ((torch.float16, SOFTMAX), (torch.bfloat16, LOG_SOFTMAX)):
        (dy, y), = rows_inputs(64, 3000, dtype, mode, sets=1)
        dx = torch.full_like(y, float("nan"))
        KS.launch(mode, nb(dy), nb(y), nb(dx), stream=stream())
        ref = row_reference(mode, dy, y).float()
        fn = torch._softmax_backward_data if mode == SOFTMAX else torch._log_softmax_backward_data
        theirs = fn(dy, y, -1, dtype).float()
        e_ours, e_torch = (dx.float() - ref).abs().max().item(), (theirs - ref).abs().max().item()
        check(f"row rule {dtype} mode={mode}", e_ours <= 2 * e_torch + 1e-5,
              f"ours {e_ours:.2e} vs 2·torch {2 * e_torch:.2e}")


# --- timing --------------------------------------------------------------------------------------
def median_ms(fn, reps=20):
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    times = []
    with cuda.defer_cleanup():  # no cuMemFree (it synchronises) inside a timed interval
        for i in range(reps):
            torch.cuda._sleep(1_000_000)  # ≈ 0.6 ms: the launches below queue behind it
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(i)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
    return statistics.median(times)


def over_budget(seconds):
    if time.time() - T0 > seconds:
        print(f"  (past {seconds:.0f} s: the rest of this table is skipped)")
        return True
    return False


ROW_HEADER = (f"{'shape':>14} {'dtype':>8} {'mode':>11} {'form':>9} {'ours GB/s':>10} {'% copy':>7} "
              f"{'torch GB/s':>10} {'x torch':>8}")


def time_rows(cases, copy_gbs, budget):
    for case in cases:
        if over_budget(budget):
            return
        (rows, n), dtype, mode = case[:3]
        plan = case[3] if len(case) > 3 else None
        sets = rows_inputs(rows, n, dtype, mode)
        check_rows(mode, *sets[0], plan=plan)
        dxs = [torch.empty_like(y) for _, y in sets]
        views = [(nb(dy), nb(y), nb(dx)) for (dy, y), dx in zip(sets, dxs)]
        st = stream()
        ms = median_ms(lambda i: KS.launch(mode, *views[i % 2], stream=st, plan_=plan))
        fn = torch._softmax_backward_data if mode == SOFTMAX else torch._log_softmax_backward_data
        ms_t = median_ms(lambda i: fn(*sets[i % 2], -1, dtype))
        size = sets[0][0].element_size()
        limits = launcher.device_limits()
        form = (plan or KS.plan(rows, n, np.float32 if size == 4 else np.float16, 16 // size,
                                limits.max_threads, limits.sms)).form
        ours, theirs = 3 * rows * n * size / ms / 1e6, 3 * rows * n * size / ms_t / 1e6
        print(f"{rows:>6}x{n:<7} {str(dtype)[6:]:>8} {['softmax', 'log_softmax'][mode]:>11} "
              f"{form:>9} {ours:>10.0f} {100 * ours / copy_gbs:>6.1f}% {theirs:>10.0f} "
              f"{ours / theirs:>8.2f}", flush=True)


ATT_HEADER = (f"{'dtype':>8} {'S':>5} {'D':>4} {'tiles':>11} {'ours ms':>8} {'TFLOP/s':>8} "
              f"{'SDPA ms':>8} {'TFLOP/s':>8} {'x SDPA':>7}")


def forward_state(q, k, v):
    """O (in q's dtype) and LSE (float32) by PyTorch's float32 math: the backward's inputs."""
    sc = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(sc, -1)
    return (torch.softmax(sc, -1) @ v.float()).to(q.dtype), lse


def time_attention(cases, budget):
    b, h = 4, 8
    for dtype, s, d, tiles in cases:
        if over_budget(budget):
            return
        q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(4))
        o, lse = forward_state(q, k, v)
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        args = [nb(t) for t in (do, q, k, v, o, lse, *grads)]
        st = stream()
        run = lambda i: KA.launch(*args, stream=st, tiles=tiles)  # noqa: E731
        if s == 1024:  # correctness at the timing shape, against SDPA in float64
            run(0)
            ref = sdpa_grads(q.double(), k.double(), v.double(), do.double(), False, torch.float64)
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            errs = [((g.double() - r).abs().max() / r.abs().max()).item() for g, r in zip(grads, ref)]
            check(f"attention backward {dtype} S={s} D={d} vs float64", max(errs) < tol,
                  f"max err / max |ref| {max(errs):.1e}")
        ms = median_ms(run)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*leaves)
        ms_t = median_ms(lambda i: torch.autograd.grad(out, leaves, do, retain_graph=True))
        flops = 10 * s * s * d * b * h
        print(f"{str(dtype)[6:]:>8} {s:>5} {d:>4} {str(tiles or KT.fit_tiles(d, d)):>11} "
              f"{ms:>8.2f} {flops / ms / 1e9:>8.1f} {ms_t:>8.2f} {flops / ms_t / 1e9:>8.1f} "
              f"{ms_t / ms:>7.2f}", flush=True)


def copy_bandwidth():
    src = torch.empty(64 << 20, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda i: dst.copy_(src))
    return 2 * src.numel() * 4 / ms / 1e6


def timing():
    """The timing tables, each cut short (and saying so) past its share of the time left:
    at least 45 s, and the whole run under about 2 minutes."""
    t1 = time.time()
    window = max(45.0, 115.0 - (t1 - T0))
    until = [t1 - T0 + f * window for f in (0.4, 0.8, 0.9, 1.0)]
    copy_gbs = copy_bandwidth()
    print(f"\ncopy bandwidth (device to device, read + write): {copy_gbs:.0f} GB/s")
    f32, f16 = torch.float32, torch.float16
    print("\nsoftmax / log_softmax backward, kernel time; GB/s = 3 tensors' bytes / time")
    print(ROW_HEADER)
    guarded("row timing fp32", lambda: time_rows(
        [(s, f32, m) for s in ROW_SHAPES for m in (SOFTMAX, LOG_SOFTMAX)], copy_gbs, until[0]))
    print("\nattention backward, kernel time; TFLOP/s = 10·Sq·Sk·D·B·H / time (non-causal)")
    print(ATT_HEADER)
    guarded("attention timing", lambda: time_attention(
        [(dt, s, d, None) for dt in (f32, f16) for s in (1024, 4096) for d in (64, 128)], until[1]))
    print("\nfurther rows: float16, and another launch form")
    print(ROW_HEADER)
    guarded("row timing fp16", lambda: time_rows(
        [(s, f16, SOFTMAX) for s in ROW_SHAPES]
        + [((2048, 16384), f32, SOFTMAX, KS.Plan("two_pass", 1024))], copy_gbs, until[2]))
    print("\nattention backward with other tiles")
    print(ATT_HEADER)
    guarded("attention tiles", lambda: time_attention(
        [(f32, 4096, 64, (64, 64, 8)), (f32, 4096, 128, (32, 32, 4))], until[3]))


def main():
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="correctness only")
    p.add_argument("--time", action="store_true", help="timing only")
    args = p.parse_args()
    both = not (args.check or args.time)
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    if args.check or both:
        print("correctness")
        for name, fn in [("gradcheck rows", gradcheck_rows), ("gradcheck attention", gradcheck_attention),
                         ("opcheck", opchecks), ("flash-attn rule", flash_rules),
                         ("row rule", half_rows_rule)]:
            guarded(name, fn)
        print(f"  ({time.time() - T0:.0f} s so far)")
    if args.time or both:
        timing()
    print(f"\n{time.time() - T0:.0f} s in all; {len(FAILED)} failure(s)")
    for f in FAILED:
        print("FAILED:", f)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
