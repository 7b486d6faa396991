"""Compile a project kernel to PTX without a GPU and print ptxas's resource report
(registers, spills, shared memory): what decides a launch's block size, read for free.

Needs numba-cuda's NVVM/NVRTC (pip install "numba-cuda[cu13]") and a ptxas on the PATH.

    python scripts/ptxinfo.py MODULE:FACTORY 'ARGS' 'SIGNATURE'
e.g.
    python scripts/ptxinfo.py numba_softmax.kernels.softmax.fused:kernel "(np.float32, 256, 8, 0, 256, 4)" "(float32[:, :], float32[:, :])"
FACTORY(*ARGS) must return a cuda.jit kernel dispatcher (or a tuple whose first item is one).
A cooperative kernel (one calling cuda.cg.this_grid()) calls into cudadevrt, which is
linked only at load time: ptxas then compiles it relocatable (-c), and the registers
reported are the kernel's own.
"""
import importlib, os, subprocess, sys, tempfile
os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
import numpy as np  # noqa
import numba  # noqa
from numba import cuda
import types as _t
import numba.cuda.dispatcher as _disp
_disp.get_current_device = lambda: _t.SimpleNamespace(compute_capability=(9, 0))  # no GPU here
from numba.cuda.types import boolean, float16, float32, float64, int32, int64, uint16, uint32  # noqa

mod, fac = sys.argv[1].split(":")
k = getattr(importlib.import_module(mod), fac)(*eval(sys.argv[2]))
if isinstance(k, tuple):
    k = k[0]
sig = eval(sys.argv[3])
ptx, _ = cuda.compile_ptx(k.py_func, sig, cc=(9, 0), fastmath=k.targetoptions.get("fastmath", False),
                         launch_bounds=k.targetoptions.get("launch_bounds"))
ptx = ptx.replace(".version 9.5", ".version 9.0")
d = tempfile.mkdtemp()
open(f"{d}/k.ptx", "w").write(ptx)
relocatable = ["-c"] if "cudaCGGetIntrinsicHandle" in ptx else []
cap = [f"-maxrregcount={k.targetoptions['max_registers']}"] if k.targetoptions.get("max_registers") else []
r = subprocess.run(["ptxas", "-arch=sm_90", "-v", *relocatable, *cap, f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                   capture_output=True, text=True)
print(r.stdout + r.stderr)
print("ptx:", f"{d}/k.ptx")
