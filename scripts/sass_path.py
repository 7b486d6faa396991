"""Instructions on one thread's path through the fused kernel, beside the Triton tutorial
kernel's, both compiled for sm_90 without a GPU (issue 13: what the tutorial still wins
by at short rows).

    python scripts/sass_path.py [PACKAGE_DIR]    # ptxas and nvdisasm as for sass_count.py

PACKAGE_DIR: another ``numba_softmax`` to count instead (a ``git archive`` of an earlier
tree, or a branch's worktree), for a before/after.  Triton is optional: where it imports,
the tutorial kernel of ``numba_softmax.bench.triton_peers`` is compiled for the same row
(its warps, 16-byte aligned pointers and a row length divisible by 16, as Triton
specialises them at a launch on the sweep's rows).

The path is that of a thread whose vectors all lie inside its row — every thread at the
sweep's shapes: a forward branch over a scalar global load or store (the row's ragged
end) is taken, any other branch falls through, and the code, which has no loops, is
counted once.  These are instructions on a path, not a measurement of executed ones;
``ncu`` found the softmax kernels' time to follow their executed instructions at one
issue rate (``docs/algorithms/online.md``, *What 16-bit rows cost*).  Classes: float
(arithmetic, conversion, exp), memory (global and shared), shuffles and barriers, and
the rest — integer, address and control.
"""
import os
import re
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

SHAPES = [1024, 8192, 16384]  # row lengths of the sweep's short rows (16384×1024, 4096×8192, 2048×16384)
DTYPES = [np.float32, np.float16]
FLOAT = {"FADD", "FMUL", "FFMA", "FMNMX", "FSETP", "FSEL", "MUFU", "HADD2", "HFMA2", "F2FP", "F2F"}
MEMORY = {"LDG", "STG", "LDS", "STS"}
EXCHANGE = {"SHFL", "BAR"}
SCALAR = re.compile(r"\b(LDG|STG)\.E(\.U16|\.S16|\.U8)?\s")


def path(text):
    """The opcodes on the whole-vector path of a SASS listing (see the module's text)."""
    ins, labels, pending = [], {}, []
    for line in text.splitlines():
        m = re.match(r"^(\.L_x_\d+):", line.strip())
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if m:
            for name in pending:
                labels[name] = len(ins)
            pending = []
            ins.append(m.group(1))
    taken, i = [], 0
    while i < len(ins):
        text_i = ins[i]
        op = re.sub(r"^@!?U?P\w\s+", "", text_i).split()[0]
        i += 1
        if op == "NOP":
            continue
        taken.append(op.split(".")[0])
        if op == "EXIT" and not text_i.startswith("@"):
            break
        m = re.search(r"BRA\s+`\((\.L_x_\d+)\)", text_i)
        if m:
            target = labels[m.group(1)]
            if not text_i.startswith("@"):
                i = target
            elif target > i and any(SCALAR.search(x + " ") for x in ins[i:target]):
                i = target  # over the row's ragged end
    return taken


def classes(ops):
    groups = {"float": FLOAT, "memory": MEMORY, "exchange": EXCHANGE}
    out = {name: sum(o in members for o in ops) for name, members in groups.items()}
    out["integer/control"] = len(ops) - sum(out.values())
    return out


def compiler():
    """:mod:`sass_count` (imported here, not above: it points Numba at a pretend sm_90
    device and puts PACKAGE_DIR first on the path — for this script's own run only)."""
    sys.path.insert(0, HERE)
    import sass_count

    return sass_count


def ours(n, dtype):
    from numba.cuda.types import float32, uint16

    S = compiler()
    from numba_softmax.kernels.softmax import fused
    from numba_softmax.kernels.rows import pairs
    from numba_softmax.kernels.hw import vector
    from numba_softmax.kernels.rows.epilogue import SOFTMAX

    width = vector.width_for(dtype)
    team, registers = fused.wide_team(n, dtype, SOFTMAX) or (fused.default_team(n, dtype), None)
    vpt = fused.fit_vpt(n, team, dtype)  # (the launch fused.configure gives a softmax)
    arg = uint16 if pairs.packed(dtype, width) else float32
    regs, _, text = S.sass("fused", (np.dtype(dtype), vpt, SOFTMAX, width, team, False, True, registers),
                           (arg[:, ::1], arg[:, ::1]))
    return team, vpt, regs, path(text)


def tutorial(n, dtype):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from numba_softmax.bench import triton_peers

    block = triton.next_power_of_2(n)
    t = {np.float32: "fp32", np.float16: "fp16"}[dtype]
    sig = {"output_ptr": "*" + t, "input_ptr": "*" + t, "input_row_stride": "i32",
           "output_row_stride": "i32", "n_cols": "i32", "BLOCK_SIZE": "constexpr"}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(5)}  # as a launch on the sweep's rows
    src = ASTSource(triton_peers._tutorial_kernel, sig, constexprs={"BLOCK_SIZE": block}, attrs=attrs)
    warps = triton_peers.tutorial_warps(block)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    regs, _, text = compiler().ptx_sass(k.asm["ptx"])
    return 32 * warps, block // (32 * warps), regs, path(text)


def main():
    compiler()  # (first: PACKAGE_DIR before the installed package)
    import numba_softmax

    print(f"package: {os.path.dirname(numba_softmax.__file__)}")
    try:
        import triton
        print(f"triton {triton.__version__}")
    except ImportError:
        triton = None
        print("triton: not importable, its kernel not compiled")
    print(f"{'row':>6s} {'dtype':8s} {'kernel':9s} {'layout':>9s} {'regs':>4s} {'path':>5s} "
          f"{'a value':>7s}  classes")
    for n in SHAPES:
        for dtype in DTYPES:
            rows = [("fused", ours)] + ([("tutorial", tutorial)] if triton else [])
            for name, fn in rows:
                try:
                    threads, vpt, regs, ops = fn(n, dtype)
                except Exception as e:  # (Triton's compile API moves between versions)
                    print(f"{n:6d} {np.dtype(dtype).name:8s} {name:9s} not compiled: {type(e).__name__}: {e}")
                    continue
                c = " ".join(f"{k} {v}" for k, v in classes(ops).items())
                print(f"{n:6d} {np.dtype(dtype).name:8s} {name:9s} {f'{threads}x{vpt}':>9s} {regs:>4s} "
                      f"{len(ops):5d} {len(ops) / vpt:7.1f}  {c}", flush=True)


if __name__ == "__main__":
    main()
