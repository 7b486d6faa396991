"""``ns.attention`` on decoding shapes with the default ``num_splits`` (None: the decode
kernel, splits chosen) against ``num_splits=1`` (one forward pass) and SDPA: kernel time
behind a sleeping kernel.  Prints only.

    python scripts/gpu/decode_default.py
"""

import torch

import numba_softmax as ns

from _timing import kernel_ms

sdpa = torch.nn.functional.scaled_dot_product_attention
print(f"device: {torch.cuda.get_device_name()}")
for dtype, hq, hkv, sk, d in ((torch.float32, 8, 8, 1024, 64), (torch.float32, 8, 8, 32768, 64),
                              (torch.float16, 32, 8, 4096, 128)):
    q = torch.randn(1, hq, 1, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(1, hkv, sk, d, device="cuda", dtype=dtype) for _ in range(2))
    ke, ve = (x.repeat_interleave(hq // hkv, 1) for x in (k, v))
    ref = sdpa(q.float(), ke.float(), ve.float())
    line = [f"{str(dtype)[6:]:8s} Hq {hq} Hkv {hkv} Sk {sk:6d} D {d}:"]
    for name, fn in (("default", lambda: ns.attention(q, k, v)),
                     ("num_splits=1", lambda: ns.attention(q, k, v, num_splits=1)),
                     ("SDPA (expanded)", lambda: sdpa(q, ke, ve))):
        err = float((fn().float() - ref).abs().max())
        line.append(f"{name} {kernel_ms(lambda i: fn(), 1) * 1e3:8.1f} µs (err {err:.1e})")
    print("  ".join(line), flush=True)
