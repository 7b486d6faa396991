"""Where the small float32 decode kernel's time goes (issue 12): kernel time, back to back
behind a sleeping kernel, of the decode kernel launched directly with 1 split (no
merge) and with 4 or 16 (the last block merges), at 64 and 1024 keys, beside an empty
kernel, ``torch.softmax`` and ``ns.softmax`` of one 1 × 1024 row.  Prints only.

    python scripts/gpu/decode_parts.py
"""

import torch
from numba import cuda

import numba_softmax as ns
from numba_softmax.kernels.decode import decode_launch
from numba_softmax.runtime import launcher

from _timing import kernel_ms


@cuda.jit
def _empty(x):
    if cuda.grid(1) == 1 << 30:
        x[0] = 0.0


def main():
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}")
    x = torch.randn(1, 1024, device="cuda")
    xs = cuda.as_cuda_array(x)
    rows = [("empty kernel, 32 blocks × 256", lambda i: launcher.launch(_empty, (32,), 256, 0, (xs,))),
            ("torch.softmax 1×1024", lambda i: torch.softmax(x, -1)),
            ("ns.softmax 1×1024", lambda i: ns.softmax(x))]
    h, d = 8, 64
    q = torch.randn(1, h, 1, d, device="cuda")
    o = torch.empty(1, h, 1, d, device="cuda")
    lse = torch.empty(1, h, 1, device="cuda")
    q4, o4, lse4 = (cuda.as_cuda_array(t) for t in (q, o, lse))
    for sk in (64, 1024):
        kv = torch.randn(1, h, sk, d, device="cuda")
        kv4 = cuda.as_cuda_array(kv)
        ref = torch.nn.functional.scaled_dot_product_attention(q, kv, kv)
        for z in (1, 4, 16):
            if z * 64 > sk and z > 1:
                continue
            run = lambda i, z=z, kv4=kv4: decode_launch.run(q4, kv4, kv4, o4, lse4, paged=False,  # noqa: E731
                                                         num_splits=z)
            run(0)
            torch.cuda.synchronize()
            err = float((o - ref).abs().max())
            rows.append((f"decode kernel Sk {sk} z {z} (|Δ| {err:.1e})", run))
    for name, fn in rows:
        print(f"{name:44s} {kernel_ms(fn, 1, calls=50) * 1e3:7.2f} µs", flush=True)


if __name__ == "__main__":
    main()
