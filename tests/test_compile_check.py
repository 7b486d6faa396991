"""``scripts/compile_check.py`` without compiling (the simulator has no NVVM): every entry
of its table names a factory this tree has, every module that builds a kernel has an
entry, and its PTX and ptxas helpers do what they say.  (The compile itself: run the
script, ``python scripts/compile_check.py``; it needs NVVM and ptxas, not a GPU.)"""

import re

from _helpers import ROOT, load_script


def _script():
    return load_script("scripts/compile_check.py")


def test_every_entry_names_a_factory_of_this_tree():
    cc = _script()
    assert len({e.key for e in cc.TABLE}) == len(cc.TABLE)
    for e in cc.TABLE:
        assert callable(cc._resolve(e.target)), e.key
        for a in e.args:
            if isinstance(a, cc.Ref):
                assert callable(cc._resolve(a.target)), e.key


def test_every_module_that_builds_a_kernel_has_an_entry():
    """A new kernel module needs a row in compile_check's table (its launch's types)."""
    cc = _script()
    covered = {t.split(":")[0] for e in cc.TABLE for t in e.target.split("|")}
    package = ROOT / "numba_softmax"
    builders = set()
    for path in package.rglob("*.py"):
        if path.name != "jit.py" and re.search(r"@jit\.kernel|jit\.kernel\(", path.read_text()):
            builders.add(".".join(path.relative_to(package).with_suffix("").parts))
    assert builders and builders <= covered, sorted(builders - covered)


def test_canonical_declares_shared_arrays_in_the_order_they_were_made():
    cc = _script()
    decl = ".visible .shared .align 4 .b8 _cudapy_smem_{}[{}];\n"
    head = ".version 9.0\n.target sm_90\n"
    body = ".visible .entry k()\n{\n\tst.shared.u32 [_cudapy_smem_10], 1;\n\tst.shared.u32 [_cudapy_smem_2], 1;\n}\n"
    linked = head + decl.format(10, 16) + decl.format(11, 4) + decl.format(1, 8) + decl.format(2, 4) + body
    want = head + decl.format(1, 8) + decl.format(2, 4) + decl.format(10, 16) + decl.format(11, 4) + body
    assert cc.canonical(linked) == want
    assert cc.canonical(want) == want
    assert cc.canonical(head + body) == head + body


def test_ptxas_report_parsed_for_the_entry_function():
    cc = _script()
    report = """ptxas info    : 0 bytes gmem
ptxas info    : Function properties for cudaCGGetIntrinsicHandle
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z4kern' for 'sm_90'
ptxas info    : Function properties for _Z4kern
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 16672 bytes smem, 400 bytes cmem[0]
"""
    assert cc._parse(report) == dict(regs=64, spill_st=8, spill_ld=12, stack=16, smem=16672)
    assert cc._max_threads(64, None) == 1024
    assert cc._max_threads(75, None) == 800  # 2560 registers a warp: 25 warps
    assert cc._max_threads(128, (256, 2)) == 256


def test_strided_16_bit_variants_take_width_1_and_strided_rows():
    """``--strided-16``: each 16-bit entry whose factory takes a width, at width 1 with its
    2-D arrays of the storage dtype strided — where a float16 constant once broke every
    strided float16 top-k kernel, which no entry of the table had."""
    cc = _script()
    variants = {e.key: e for e in cc.STRIDED_16}
    assert len(variants) > 40
    key = "topk rows f16 B256 block rows [strided W1]"
    base, v = cc.ENTRIES["topk rows f16 B256 block rows"], variants[key]
    width = cc._params(base.target).index("width")
    assert base.args[width] == 8 and v.args[width] == 1
    assert base.sig[0] == cc.C(cc.float16, 2) and len(v.sig) == len(base.sig)
    for mine, theirs in zip(v.sig, base.sig):  # the float16 rows strided (x, values), no other
        half = getattr(theirs, "ndim", 0) == 2 and theirs.dtype == cc.float16
        assert mine == (cc.A(cc.float16, 2) if half else theirs)
    for e in cc.STRIDED_16:
        assert e.config.split()[0] in cc.HALF and e.args[cc._params(e.target).index("width")] == 1
