"""Ablations of the decode kernel's in-kernel merge (issue 12), kernel time back to back:
which step of "partial → fence → ticket → last block folds" costs the small call its
~6 µs.  Some variants give wrong answers on purpose (timing only).  Prints only.

    python scripts/gpu/decode_ablate.py
"""

import torch
from numba import cuda, int32

from numba_softmax.kernels.decode import decode, decode_launch, decode_merge
from numba_softmax.kernels.hw import jit

from _timing import kernel_ms


def merge_variant(fence, fold, ticket=True, batch=None):
    def factory(dtype, dv, rows, warps):
        fold_z = decode_merge.fold_splits(dtype, dv, rows, warps, batch)

        @jit.device
        def merge(counters, t, o_ws, lse_ws, o, lse, splits, b, hk, group, pr0, n_rows):
            if fence == "all":
                cuda.threadfence()
            cuda.syncthreads()
            last = cuda.shared.array(1, int32)
            if cuda.threadIdx.x == 0:
                if fence == "one":
                    cuda.threadfence()
                if ticket:
                    last[0] = cuda.atomic.add(counters, t, 1) == splits - 1
                else:
                    last[0] = cuda.blockIdx.x % splits == 0
                if last[0]:
                    counters[t] = 0
                    if fence != "none":
                        cuda.threadfence()
            cuda.syncthreads()
            if last[0] and fold:
                fold_z(o_ws, lse_ws, o, lse, splits, b, hk, group, pr0, n_rows)

        return merge

    return factory


def main():
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}")
    h, d = 8, 64
    q = torch.randn(1, h, 1, d, device="cuda")
    o = torch.empty(1, h, 1, d, device="cuda")
    lse = torch.empty(1, h, 1, device="cuda")
    kv = torch.randn(1, h, 1024, d, device="cuda")
    q4, o4, lse4, kv4 = (cuda.as_cuda_array(t) for t in (q, o, lse, kv))
    ref = torch.nn.functional.scaled_dot_product_attention(q, kv, kv)
    original = decode.merge_when_last
    variants = [("as built", original),
                ("fence by thread 0 only", merge_variant("one", True)),
                ("fold 1 partial at a time", merge_variant("all", True, batch=1)),
                ("fold 8 partials at a time", merge_variant("all", True, batch=8)),
                ("no fence (wrong)", merge_variant("none", True)),
                ("ticket, no fold (wrong)", merge_variant("all", False)),
                ("no ticket, no fold (wrong)", merge_variant("none", False, ticket=False))]
    for name, factory in variants:
        decode.merge_when_last = factory
        decode.kernel.cache_clear()
        line = [f"{name:28s}"]
        for z in (4, 8, 16):
            run = lambda i, z=z: decode_launch.run(q4, kv4, kv4, o4, lse4, paged=False,  # noqa: E731
                                                num_splits=z)
            run(0)
            torch.cuda.synchronize()
            err = float((o - ref).abs().max())
            line.append(f"z{z} {kernel_ms(run, 1, calls=50) * 1e3:6.2f} µs (|Δ| {err:.1e})")
        print("  ".join(line), flush=True)
    decode.merge_when_last = original
    decode.kernel.cache_clear()


if __name__ == "__main__":
    main()
