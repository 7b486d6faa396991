"""GPU check of the tensor-core attention backward (issue 15): correctness, then timing.

    python scripts/experiments/backward_tc.py [--sweep] [--time]   # a CUDA machine with PyTorch

Correctness (every failure printed; exit status 1 if any): the flash-attn rule per
gradient, |ours − fp32 reference| <= 2·|SDPA same precision − reference| + 1e-5, in fp16
through ``numba_softmax.torch`` (autograd) and in bf16 and GQA at kernel level
(O and LSE from PyTorch's float32 math on the rounded inputs).
Timing (``backward.median_ms``: CUDA events behind a GPU sleep, median of 20; the
preprocess, main and convert kernels all counted): TFLOP/s = 10·Sq·Sk·D·B·H / time
(half with causal) against SDPA's backward, (B, H) = (4, 8), S = 4096; ``--sweep``: the
tile configurations (warps, block_q) at fp16, non-causal; ``--time``: the timing alone (an
A/B of trees run one after the other).  Writes nothing but stdout.
"""

import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import torch  # noqa: E402

import backward as bw  # noqa: E402  (scripts/experiments/backward.py: helpers)
import numba_softmax.torch as nst  # noqa: E402
from numba_softmax.kernels.backward import attention_backward as KA  # noqa: E402
from numba_softmax.kernels.backward import attention_backward_tc_launch as TC  # noqa: E402

F = torch.nn.functional


def sdpa_grads(q, k, v, do, causal, dtype):
    gqa = q.shape[1] != k.shape[1]
    leaves = [t.detach().to(dtype).clone().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=gqa).backward(do.to(dtype))
    return [t.grad.float() for t in leaves]


def forward_state(q, k, v, causal):
    """O (in q's dtype) and LSE (float32) by PyTorch's float32 math (bottom-right causal)."""
    group = q.shape[1] // k.shape[1]
    kr, vr = (t.float().repeat_interleave(group, 1) for t in (k, v))
    sc = q.float() @ kr.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        hide = torch.ones(sq, sk, device="cuda", dtype=torch.bool).triu(sk - sq + 1)
        sc = sc.masked_fill(hide, float("-inf"))
    return (torch.softmax(sc, -1) @ vr).to(q.dtype), torch.logsumexp(sc, -1)


def kernel_grads(q, k, v, do, causal, **tiles):
    o, lse = forward_state(q, k, v, causal)
    outs = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    TC.launch(*(bw.nb(t) for t in (do, q, k, v, o, lse)), *(bw.nb(t) for t in outs),
              causal=causal, stream=bw.stream(), **tiles)
    return outs


def rules():
    torch.manual_seed(0)
    for causal, (b, h, hkv, s, d) in [(False, (2, 4, 4, 257, 64)), (True, (2, 4, 4, 257, 64)),
                                      (True, (1, 4, 4, 131, 128)), (False, (1, 8, 2, 300, 128)),
                                      (True, (2, 8, 1, 190, 64))]:
        q, do = (torch.randn(b, h, s, d, device="cuda") for _ in range(2))
        k, v = (torch.randn(b, hkv, s, d, device="cuda") for _ in range(2))
        if h == hkv:  # fp16 through the autograd op
            ref = sdpa_grads(q, k, v, do, causal, torch.float32)
            theirs = sdpa_grads(q, k, v, do, causal, torch.float16)
            leaves = [t.half().requires_grad_() for t in (q, k, v)]
            nst.attention(*leaves, causal=causal).backward(do.half())
            bw.flash_rule(f"fp16 op {(b, h, s, d)} causal={causal}", [t.grad for t in leaves],
                          theirs, ref)
        for dtype in (torch.float16, torch.bfloat16):  # kernel level, GQA too
            lo = [t.to(dtype) for t in (q, k, v, do)]
            ref = sdpa_grads(*(t.float() for t in lo), causal, torch.float32)
            theirs = sdpa_grads(*lo, causal, dtype)
            for tiles in ({}, dict(warps=4, block_q=32)):
                bw.flash_rule(f"{str(dtype)[6:]} kernel {(b, h, hkv, s, d)} causal={causal} "
                              f"{tiles or 'default'}", kernel_grads(*lo, causal, **tiles),
                              theirs, ref)


HEADER = (f"{'dtype':>9} {'D':>4} {'causal':>6} {'tiles':>10} {'ours ms':>8} {'TFLOP/s':>8} "
          f"{'SDPA ms':>8} {'TFLOP/s':>8} {'x SDPA':>7}")


def time_case(dtype, d, causal, tiles, s=4096, b=4, h=8, peer=True, core=False):
    q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(4))
    o, lse = forward_state(q, k, v, causal)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    args = [bw.nb(t) for t in (do, q, k, v, o, lse, *grads)]
    st = bw.stream()
    if core:
        ms = bw.median_ms(lambda i: KA.launch(*args, causal=causal, stream=st))
    else:
        ms = bw.median_ms(lambda i: TC.launch(*args, causal=causal, stream=st, **tiles))
    flops = 10 * s * s * d * b * h * (0.5 if causal else 1.0)
    line = (f"{str(dtype)[6:]:>9} {d:>4} {str(causal):>6} "
            f"{'cuda-core' if core else str((tiles.get('warps', 8), tiles.get('block_q', 64))):>10} "
            f"{ms:>8.2f} {flops / ms / 1e9:>8.1f}")
    if peer:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        ms_t = bw.median_ms(lambda i: torch.autograd.grad(out, leaves, do, retain_graph=True))
        line += f" {ms_t:>8.2f} {flops / ms_t / 1e9:>8.1f} {ms_t / ms:>7.2f}"
    print(line, flush=True)


def main():
    sweep = "--sweep" in sys.argv
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    t0 = time.time()
    if "--time" not in sys.argv:
        bw.guarded("flash-attn rules", rules)
    print(f"  ({time.time() - t0:.0f} s)")
    print("\nattention backward, tensor cores; TFLOP/s = 10·Sq·Sk·D·B·H / time (half causal)")
    print(HEADER)
    for dtype in (torch.float16, torch.bfloat16):
        for d in (64, 128):
            for causal in (False, True):
                bw.guarded(f"time {dtype} {d} {causal}", lambda: time_case(dtype, d, causal, {}))
    bw.guarded("time cuda-core", lambda: time_case(torch.float16, 64, False, {}, core=True))
    if sweep:
        print("\ntiles (warps, block_q), fp16, non-causal")
        print(HEADER)
        for d in (64, 128):
            for w, br in ((8, 32), (4, 64), (4, 32)):
                bw.guarded(f"tiles {d} {w} {br}", lambda: time_case(
                    torch.float16, d, False, dict(warps=w, block_q=br), peer=False))
    print(f"\n{time.time() - t0:.0f} s in all; {len(bw.FAILED)} failure(s)")
    for f in bw.FAILED:
        print("FAILED:", f)
    return 1 if bw.FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
