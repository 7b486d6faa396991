"""scripts/experiments/topk_ablate.py's variants (no GPU needed): every edit still matches the
package's source once, the variants it calls exact give the package's values and
indices bit for bit, and the close ones its indices and values within float32 rounding
(two and four warps a block: the package shares a floor only in the second, the variants
add or remove it; lists of one and of two slots)."""

import sys

import numpy as np
from numba import cuda

from _helpers import load_script, sized


def test_every_variant_builds_and_the_exact_and_close_ones_match_the_package(tmp_path, four_warp_blocks):
    ablate = load_script("scripts/experiments/topk_ablate.py")
    modules = ablate.build(str(tmp_path), list(ablate.VARIANTS))  # (exits if an edit misses)
    for i in range(len(modules)):  # each copy launches through its own launcher
        four_warp_blocks(sys.modules[f"ns_{i}.runtime.launcher"])
    rng = np.random.default_rng(3)
    x = cuda.to_device(rng.standard_normal((2, 700)).astype(np.float32))
    # (k 40: two slots, the buffered path; the simulator runs it alone, for CI's time)
    for threads, k in sized(((64, 40),), ((64, 6), (128, 6), (64, 40))):
        out = {}
        for name, mod in modules.items():
            values = cuda.to_device(np.full((2, k), np.nan, np.float32))
            indices = cuda.to_device(np.full((2, k), -7, np.int64))
            mod.launch(x, k, values, indices, plan=mod.Plan(False, threads, 4))
            out[name] = values.copy_to_host(), indices.copy_to_host()
        for name, (kind, _) in ablate.VARIANTS.items():
            if kind != ablate.TIMED:
                np.testing.assert_array_equal(out[name][1], out["as is"][1], err_msg=name)
            if kind == ablate.EXACT:
                np.testing.assert_array_equal(out[name][0], out["as is"][0], err_msg=name)
            elif kind == ablate.CLOSE:
                np.testing.assert_allclose(out[name][0], out["as is"][0], rtol=1e-5, err_msg=name)
        assert not np.array_equal(out["no list"][1], out["as is"][1])  # (it does take the list out)
