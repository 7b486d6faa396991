"""The argument checks the public functions share (:mod:`numba_softmax.checks`): each
refuses a bad argument with the right error, naming it, and gives a good one back in
the form the call goes on with; and the package keeps its private names private — no
module imports another module's underscore name."""

import ast
import math
import pathlib
import sys

import numpy as np
import pytest
from numba import cuda

from numba_softmax import block_tables, checks

F16, F32, F64, I32 = (np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int32))
PACKAGE = pathlib.Path(checks.__file__).resolve().parent


def zeros(shape, dtype=F32):
    return np.zeros(shape, dtype)


# --- options ---------------------------------------------------------------------------
@pytest.mark.parametrize("value", [True, False, np.bool_(True), np.bool_(False)])
def test_flag_takes_booleans(value):
    got = checks.flag(value, "causal")
    assert got is bool(value)


@pytest.mark.parametrize("value", [1, 0, None, "yes", 1.0])
def test_flag_refuses_anything_else_by_name(value):
    with pytest.raises(TypeError, match="^return_lse must be True or False"):
        checks.flag(value, "return_lse")


def test_scale_defaults_to_one_over_sqrt_d_and_takes_reals():
    assert checks.scale(None, 64) == 0.125
    assert checks.scale(None, 0) == 1.0
    assert checks.scale(2, 64) == 2.0 and type(checks.scale(np.float32(0.5), 8)) is float
    assert checks.scale(0, 8) == 0.0


@pytest.mark.parametrize("value", [True, "1", math.inf, math.nan, 1j, [1.0]])
def test_scale_refuses_non_finite_or_non_real_by_name(value):
    with pytest.raises(TypeError, match="^scale must be a finite real number or None"):
        checks.scale(value, 64)


def test_window_reads_none_and_negative_sides_as_unbounded():
    assert checks.window(None) == (-1, -1)
    assert checks.window((3, 0)) == (3, 0)
    assert checks.window((-7, np.int64(2))) == (-1, 2)


@pytest.mark.parametrize("value", [3, (1,), (1, 2, 3), (1.0, 2), (True, 1), "ab"])
def test_window_refuses_anything_but_a_pair_of_ints_by_name(value):
    with pytest.raises(TypeError, match="^window must be None or a pair of ints"):
        checks.window(value)


def test_num_splits():
    assert checks.num_splits(None) is None and checks.num_splits(np.int32(3)) == 3
    with pytest.raises(TypeError, match="^num_splits must be an integer or None"):
        checks.num_splits(2.0)
    with pytest.raises(TypeError, match="^num_splits"):
        checks.num_splits(True)
    with pytest.raises(ValueError, match="^num_splits must be >= 1, got 0"):
        checks.num_splits(0)


def test_integer_real_temperature_top_p():
    assert checks.integer(np.int64(5), "seed") == 5
    with pytest.raises(TypeError, match="^seed must be an integer, got a bool"):
        checks.integer(True, "seed")
    with pytest.raises(TypeError, match="^seed must be an integer, got float"):
        checks.integer(1.0, "seed")
    assert checks.real(1, "top_p") == 1.0
    with pytest.raises(TypeError, match="^top_p must be a real number, got str"):
        checks.real("1", "top_p")
    assert checks.temperature(0.5) == 0.5
    for bad in (0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="^temperature must be finite and > 0"):
            checks.temperature(bad)
    with pytest.raises(TypeError, match="^temperature"):
        checks.temperature(None)
    assert checks.top_p(1) == 1.0
    for bad in (0, 1.5, -0.1):
        with pytest.raises(ValueError, match=r"^top_p must be in \(0, 1\]"):
            checks.top_p(bad)


def test_top_k_bounds_by_the_axis_and_the_kernels_limit():
    assert checks.top_k(3, 10) == 3
    with pytest.raises(ValueError, match="^top_k must be in 1 … 10"):
        checks.top_k(11, 10, "top_k")
    with pytest.raises(ValueError, match="^k must be in 1 … 10"):
        checks.top_k(0, 10)
    with pytest.raises(ValueError, match=f"^k must be at most {checks.MAX_K}"):
        checks.top_k(checks.MAX_K + 1, 10 * checks.MAX_K)
    with pytest.raises(TypeError, match="^k must be an integer"):
        checks.top_k(2.0, 10)


def test_max_seqlen():
    assert checks.max_seqlen(None, 7, "max_seqlen_q") is None
    checks.max_seqlen(7, 7, "max_seqlen_q")
    with pytest.raises(ValueError, match="^max_seqlen_k = 6 but a sequence has 7"):
        checks.max_seqlen(6, 7, "max_seqlen_k")
    with pytest.raises(TypeError, match="^max_seqlen_q must be an integer or None"):
        checks.max_seqlen(7.0, 7, "max_seqlen_q")


# --- arrays ----------------------------------------------------------------------------
def test_described_names_what_is_not_an_array():
    d = checks.described(zeros((2, 3)), "q")
    assert (d.kind, d.dtype, d.shape) == ("numpy", F32, (2, 3))
    with pytest.raises(TypeError, match="^block_table: expected a NumPy array"):
        checks.described([[1, 2]], "block_table")


def test_described_all_checks_dtypes_and_one_kind_by_name():
    ds = checks.described_all({"a": zeros(3), "b": zeros(4, F16)}, (F16, F32))
    assert [d.shape for d in ds.values()] == [(3,), (4,)]
    with pytest.raises(TypeError, match="^b has dtype float64"):
        checks.described_all({"a": zeros(3), "b": zeros(3, F64)}, (F32,))
    with pytest.raises(TypeError, match="^a and b must be the same kind of array, got numpy and numba"):
        checks.described_all({"a": zeros(3), "b": cuda.to_device(zeros(3))}, (F32,))
    with pytest.raises(TypeError, match="^lse has dtype int32"):
        checks.described_all({"o": zeros(3), "lse": zeros(3, I32)}, {"o": (F32,), "lse": (F32,)})


def test_qkv_shapes():
    q, k = zeros((2, 4, 5, 8)), zeros((2, 2, 7, 8))
    dq, dk, dv = checks.qkv(q, k, zeros((2, 2, 7, 3)))
    assert (dq.shape, dk.shape, dv.shape) == ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 3))
    cases = [((q, k, zeros((2, 2, 7, 3), F16)), TypeError, "^q, k and v must have one dtype"),
             ((q, k, zeros((2, 2, 6, 3))), ValueError, r"^k .* and v .* same number of keys"),
             ((q, zeros((2, 3, 7, 8)), zeros((2, 3, 7, 8))), ValueError, "^q .* and k .* leading"),
             ((q, zeros((2, 2, 7, 4)), zeros((2, 2, 7, 3))), ValueError, "^q .* head dimension"),
             ((zeros(3), zeros(3), zeros(3)), ValueError, "^q, k and v need the same rank"),
             ((q, k, [0.0]), TypeError, "^v: expected")]
    for args, error, message in cases:
        with pytest.raises(error, match=message):
            checks.qkv(*args)


def test_packed_qkv_shapes():
    dq, _, _ = checks.packed_qkv(zeros((9, 4, 8)), zeros((6, 2, 8)), zeros((6, 2, 5)))
    assert dq.shape == (9, 4, 8)
    with pytest.raises(ValueError, match=r"^q, k, v are packed \(total, H, D\)"):
        checks.packed_qkv(zeros((1, 9, 4, 8)), zeros((6, 2, 8)), zeros((6, 2, 5)))
    with pytest.raises(ValueError, match="Hkv dividing q's heads"):
        checks.packed_qkv(zeros((9, 4, 8)), zeros((6, 3, 8)), zeros((6, 3, 5)))


def test_out_checks_kind_dtype_shape_and_self_overlap():
    like = checks.described(zeros((2, 3)), "q")
    d = checks.out(zeros((2, 3)), like, F32, (2, 3))
    assert d.shape == (2, 3)
    with pytest.raises(TypeError, match="^out has dtype float16; the result has dtype float32"):
        checks.out(zeros((2, 3), F16), like, F32, (2, 3))
    with pytest.raises(ValueError, match=r"^out has shape \(3, 2\); the result has shape \(2, 3\)"):
        checks.out(zeros((3, 2)), like, F32, (2, 3))
    with pytest.raises(TypeError, match=r"^out must be the same kind of array as the inputs \(numpy\)"):
        checks.out(cuda.to_device(zeros((2, 3))), like, F32, (2, 3))
    with pytest.raises(TypeError, match="^out: expected"):
        checks.out("o", like, F32, (2, 3))
    like_dev = checks.described(cuda.to_device(zeros((2, 3))), "q")
    with pytest.raises(ValueError, match="^out has elements that share memory"):
        checks.out(_rows_sharing_memory(), like_dev, F32, (2, 3))


def _rows_sharing_memory():
    """A (2, 3) device array whose two rows are one row (stride 0)."""
    from numba_softmax.arrays import kinds

    row = kinds.describe(cuda.to_device(zeros(3)))
    return kinds.view_of(row, (2, 3), (0, 1))


def test_merge_pair_and_attention_grads_shapes():
    o, lse = zeros((2, 5, 4)), zeros((2, 5))
    ds = checks.merge_pair(o, lse, o, lse)
    assert ds["lse_b"].shape == (2, 5)
    with pytest.raises(ValueError, match=r"^lse_b has shape \(2, 4\)"):
        checks.merge_pair(o, lse, o, zeros((2, 4)))
    with pytest.raises(TypeError, match="^o_a and o_b must have one dtype"):
        checks.merge_pair(o, lse, zeros((2, 5, 4), F16), lse)
    q, k, v = zeros((1, 2, 5, 8)), zeros((1, 1, 7, 8)), zeros((1, 1, 7, 3))
    o, lse = zeros((1, 2, 5, 3)), zeros((1, 2, 5))
    assert checks.attention_grads(o, q, k, v, o, lse)["lse"].shape == (1, 2, 5)
    with pytest.raises(ValueError, match=r"^do has shape \(1, 2, 5, 4\)"):
        checks.attention_grads(zeros((1, 2, 5, 4)), q, k, v, o, lse)
    with pytest.raises(TypeError, match="^do, q, k, v and o must have one dtype; q has float32, v float64"):
        checks.attention_grads(o, q, k, zeros((1, 1, 7, 3), F64), o, lse)


# --- block tables ----------------------------------------------------------------------
def test_offsets():
    d, cu = checks.offsets(np.array([0, 2, 5], np.int32), 5, "cu_seqlens_q")
    assert d.dtype == I32 and cu.dtype == np.int64 and cu.tolist() == [0, 2, 5]
    with pytest.raises(TypeError, match="^cu_seqlens_k has dtype int64"):
        checks.offsets(np.array([0, 2]), 5, "cu_seqlens_k")
    for bad in ([1, 2], [0, 3, 2], [0, 6], [0]):
        with pytest.raises(ValueError, match="^cu_seqlens_q must be non-decreasing offsets"):
            checks.offsets(np.array(bad, np.int32), 5, "cu_seqlens_q")


def test_tables_name_the_bad_entry_host_and_device_alike():
    table = np.array([[0, 1, -1], [2, 9, -1]], np.int32)  # 9: no block of a 5-block pool
    lengths = np.array([5, 6], np.int32)
    for t, n in ((table, lengths), (cuda.to_device(table), cuda.to_device(lengths))):
        with pytest.raises(ValueError, match=r"^block_table\[1, 1\] = 9 is not a block"):
            block_tables.tables(t, n, 5, 4)
        block_tables.tables(t, n, 5, 4, entries=False)  # dtypes and shapes only
    with pytest.raises(ValueError, match="^cache_seqlens\\[0\\] = -1 is negative"):
        block_tables.tables(table, np.array([-1, 0], np.int32), 5, 4)
    with pytest.raises(ValueError, match="^sequence 0 needs 13 positions"):
        block_tables.tables(table, np.array([13, 0], np.int32), 5, 4)
    with pytest.raises(TypeError, match="^cache_seqlens must be int32, got int64"):
        block_tables.tables(table, lengths.astype(np.int64), 5, 4)
    with pytest.raises(ValueError, match=r"^block_table must be \(batch, max_blocks_per_seq\)"):
        block_tables.tables(table[0], lengths, 5, 4)
    with pytest.raises(ValueError, match="^cache_seqlens must be"):
        block_tables.tables(table, lengths[:1], 5, 4)


def test_table_findings_are_the_first_bad_sequence_and_entry():
    table = np.array([[0, 7], [0, 0], [-1, 0]], np.int32)
    lengths = np.array([8, 9, 1], np.int32)  # sequence 1 needs 3 blocks of 4 in a row of 2
    assert block_tables.table_findings(table, lengths, 5, 4) == (1, 9, 1, 7)
    good = np.zeros((2, 2), np.int32)
    assert block_tables.table_findings(good, np.array([8, 0], np.int32), 5, 4) == (2, 0, 4, 0)


# --- private names stay private ----------------------------------------------------------
def _module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private_imports():
    """``file:line: name`` for each underscore name that a module of the package takes from
    another of its modules (``from .x import _y``, or ``x._y`` on an imported module).
    Underscore *modules* (``from . import _mma_sim``) are modules, not private names."""
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in files}
    found = []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        here = _module_name(path).split(".")
        package = here if path.name == "__init__.py" else here[:-1]
        imported = {}  # local name -> the package module it is
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if source.split(".")[0] != PACKAGE.name:
                    continue  # another library's names are its own business
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:
                        imported[alias.asname or alias.name] = f"{source}.{alias.name}"
                    elif alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: "
                                     f"{alias.name} from {source}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == PACKAGE.name and alias.asname:
                        imported[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in imported and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: "
                             f"{imported[node.value.id]}.{node.attr}")
    return found


def test_the_private_import_finder_finds_what_it_should(tmp_path, monkeypatch):
    fake = tmp_path / PACKAGE.name
    (fake / "sub").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "a.py").write_text("def _hidden():\n    pass\n\ndef shown():\n    pass\n")
    (fake / "_priv.py").write_text("def tool():\n    pass\n")
    (fake / "sub" / "__init__.py").write_text("")
    (fake / "sub" / "b.py").write_text(
        "from ..a import _hidden, shown\nfrom .. import a as mod, _priv\nfrom numpy import _globals\n"
        "mod._hidden()\n_priv.tool()\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    found = _private_imports()
    assert [f.split(": ", 1)[1] for f in found] == [
        f"_hidden from {PACKAGE.name}.a", f"{PACKAGE.name}.a._hidden"], found


def test_no_module_imports_another_modules_private_names():
    found = _private_imports()
    assert not found, "private names taken from another module:\n" + "\n".join(found)


# --- each array described once per call ----------------------------------------------------
@pytest.fixture
def descriptions(monkeypatch):
    """How often :func:`numba_softmax.arrays.kinds.describe` saw each object, by id."""
    from numba_softmax.arrays import kinds

    seen, describe = {}, kinds.describe

    def counting(x, *args, **kwargs):
        seen[id(x)] = seen.get(id(x), 0) + 1
        return describe(x, *args, **kwargs)

    monkeypatch.setattr(kinds, "describe", counting)
    return seen


def _times(seen, *arrays):
    return [seen.get(id(a), 0) for a in arrays]


@pytest.mark.parametrize("on_device", [False, True])
def test_a_call_describes_each_of_its_arrays_once(descriptions, on_device):
    import numba_softmax as ns

    rng = np.random.default_rng(0)

    def arr(shape, dtype=F32):
        host = rng.standard_normal(shape).astype(dtype)
        return cuda.to_device(host) if on_device else host

    q, k, v = arr((1, 2, 3, 8)), arr((1, 1, 4, 8)), arr((1, 1, 4, 8))
    out = arr((1, 2, 3, 8))
    ns.attention(q, k, v, causal=True, out=out)
    assert _times(descriptions, q, k, v, out) == [1, 1, 1, 1]

    k_cache, v_cache = arr((3, 4, 1, 8)), arr((3, 4, 1, 8))
    table = np.array([[2, 0]], np.int32)
    lengths = np.array([6], np.int32)
    if on_device:
        table, lengths = cuda.to_device(table), cuda.to_device(lengths)
    q1 = arr((1, 2, 1, 8))
    descriptions.clear()  # counted by id: a freed temporary's id may be a new array's
    ns.paged_attention(q1, k_cache, v_cache, table, lengths)
    assert _times(descriptions, q1, k_cache, v_cache, table, lengths) == [1] * 5

    o, lse = ns.attention(q, k, v, return_lse=True)
    do = arr((1, 2, 3, 8))
    descriptions.clear()
    ns.attention_backward(do, q, k, v, o, lse)
    assert _times(descriptions, do, q, k, v, o, lse) == [1] * 6

    x, y = arr((3, 5)), arr((3, 5))
    descriptions.clear()
    ns.softmax(x, out=y)
    assert _times(descriptions, x, y) == [1, 1]
