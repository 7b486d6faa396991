"""Static SASS instruction counts of the softmax kernels, without a GPU (issue 13).

The long-row kernels issue more instructions than their memory traffic needs
(docs/algorithms/group.md); this counts them per kernel from the compiled machine code, so
a change to the shared device functions can be weighed before a GPU is at hand.

    pip install "numba-cuda[cu13]" nvidia-cuda-nvdisasm   # NVVM, and nvdisasm
    python scripts/sass_count.py [PACKAGE_DIR]

PACKAGE_DIR: the folder holding another ``numba_softmax`` to count instead (e.g. one
``git archive``'d from an earlier tree), for a before/after.  The row arrays are typed
C-contiguous (``[:, ::1]``), as a launch on contiguous rows compiles them; until an earlier
version of this script they were typed as any layout (``[:, :]``), whose indexing adds a
multiply by the column stride a vector — the counts in ``docs/algorithms/group.md`` were
taken so.  Needs a ``ptxas`` on the
PATH (as scripts/ptxinfo.py does).  Prints registers, spill bytes, the kernel's static
instruction count and the counts of the opcodes the row loops are made of.
"""
import collections
import glob
import importlib
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import types as _t

os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
if len(sys.argv) > 1:
    sys.path.insert(0, os.path.abspath(sys.argv[1]))
import numpy as np  # noqa: E402
import numba.cuda.dispatcher as _disp  # noqa: E402
from numba import cuda  # noqa: E402
from numba.cuda.types import float16, float32, float64, int64, uint16  # noqa: E402

_disp.get_current_device = lambda: _t.SimpleNamespace(compute_capability=(9, 0))  # no GPU here
F32, F16, F64, U16 = (np.dtype(t) for t in (np.float32, np.float16, np.float64, np.uint16))
GROUP_ARGS = (int64, int64, int64, int64, float32[:, ::1], float32[:, ::1], int64[::1])
# name: (module, factory, factory arguments, signature); mode 0 = softmax
CASES = {
    "fused f32": ("fused", (F32, 16, 0, 4, 256), (float32[:, ::1], float32[:, ::1])),
    "online f32": ("online", (F32, 8, 0, 4), (float32[:, ::1], float32[:, ::1], int64)),
    "online f64": ("online", (F64, 4, 0, 2), (float64[:, ::1], float64[:, ::1], int64)),
    "onchip f32": ("onchip", (F32, 8, 0, 4, 512), (float32[:, ::1], float32[:, ::1], int64)),
    "group f32": ("group", (F32, 8, 0, 4, 256, False), (float32[:, ::1], float32[:, ::1]) + GROUP_ARGS),
    "group f16": ("group", (F16, 16, 0, 8, 256, False), (float16[:, ::1], float16[:, ::1]) + GROUP_ARGS),
    "cluster f32": ("cluster", (F32, 8, 0, 4, 256, 8), (float32[:, ::1], float32[:, ::1], int64, int64)),
    "cluster f16": ("cluster", (F16, 16, 0, 8, 256, 8), (float16[:, ::1], float16[:, ::1], int64, int64)),
    "cluster bf16": ("cluster", (U16, 16, 0, 8, 256, 8), (uint16[:, ::1], uint16[:, ::1], int64, int64)),
    "online bf16": ("online", (U16, 16, 0, 8), (uint16[:, ::1], uint16[:, ::1], int64)),
    "online f16": ("online", (F16, 16, 0, 8), (float16[:, ::1], float16[:, ::1], int64)),
}
OPS = ["FMNMX", "FSETP", "PLOP3", "FSEL", "MUFU", "FADD", "FMUL", "FFMA", "LDG", "STG", "LDS", "STS"]


def nvdisasm():
    found = glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "*", "bin", "nvdisasm"))
    return found[0] if found else "nvdisasm"


def sass(module, args, sig):
    """(registers, spill bytes, SASS text) of ``kernels.<module>.kernel(*args)`` compiled
    for sm_90 with the signature ``sig``, as the package compiles it (fastmath, launch
    bounds, and its ``max_registers`` given to ptxas)."""
    k = getattr(importlib.import_module(f"numba_softmax.kernels.{module}"), "kernel")(*args)
    ptx, _ = cuda.compile_ptx(k.py_func, sig, cc=(9, 0), fastmath=k.targetoptions.get("fastmath", False),
                             launch_bounds=k.targetoptions.get("launch_bounds"))
    return ptx_sass(ptx, k.targetoptions.get("max_registers"))


def ptx_sass(ptx, max_registers=None):
    """(registers, spill bytes, SASS text) of PTX assembled by ptxas for sm_90 — sm_90a
    for the kernels whose instructions only it has (wgmma, setmaxnreg, TMA)."""
    d = tempfile.mkdtemp()
    arch = "sm_90a" if re.search(r"wgmma\.|setmaxnreg|cp\.async\.bulk\.tensor", ptx) else "sm_90"
    with open(f"{d}/k.ptx", "w") as f:
        text = re.sub(r"^\.version 9\.\d+", ".version 9.0", ptx, flags=re.M)
        f.write(text if arch == "sm_90a" else text.replace("sm_90a", "sm_90"))
    relocatable = ["-c"] if "cudaCGGetIntrinsicHandle" in ptx else []  # cooperative: cudadevrt
    cap = [f"-maxrregcount={max_registers}"] if max_registers else []
    r = subprocess.run(["ptxas", f"-arch={arch}", "-v", *relocatable, *cap, f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                       capture_output=True, text=True, check=True)
    text = subprocess.run([nvdisasm(), "-c", f"{d}/k.cubin"], capture_output=True, text=True,
                          check=True).stdout
    regs = re.search(r"Used (\d+) registers", r.stdout + r.stderr).group(1)
    spill = re.search(r"(\d+) bytes spill stores", r.stdout + r.stderr)
    return regs, spill.group(1) if spill else "0", text


def count(module, args, sig):
    regs, spill, text = sass(module, args, sig)
    ops = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9]*)", text, re.M)
    return regs, spill, len(ops), collections.Counter(ops)


def main():
    import numba_softmax

    print(f"package: {os.path.dirname(numba_softmax.__file__)}")
    print(f"{'kernel':11s} {'regs':>4s} {'spill':>5s} {'total':>5s} " + " ".join(f"{o:>5s}" for o in OPS))
    for name, (module, args, sig) in CASES.items():
        regs, spill, total, c = count(module, args, sig)
        print(f"{name:11s} {regs:>4s} {spill:>5s} {total:5d} " + " ".join(f"{c[o]:5d}" for o in OPS),
              flush=True)


if __name__ == "__main__":
    main()
