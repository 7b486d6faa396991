"""Every example runs in its small form (``--sim``: the CUDA simulator) and prints its table.

Each script runs in a subprocess of its own — ``--sim`` must switch the simulator on
before numba is imported, which a process that already imported numba cannot do — and
the test reads the table it printed.  The GPU sizes are for running by hand.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def run_example(name, *args, timeout=300):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), "--sim", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{name} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def table_rows(out, title):
    """The data lines of the table whose title line starts with ``title``."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[start + 3:]:  # title, header, rule
        if not line.strip():
            break
        rows.append(line)
    return rows


def cells(line):
    """The cells of a table line (columns are separated by at least two spaces)."""
    return re.split(r"\s{2,}", line.strip())


def floats(line):
    return [float(x) for x in re.findall(r"-?\d+\.\d+e[-+]\d+", line)]


def test_all_examples_are_tested():
    scripts = sorted(p.name for p in EXAMPLES.glob("[0-9][0-9]_*.py"))
    tested = sorted(n for n in globals() if re.match(r"test_\d\d_", n))
    assert len(scripts) == len(tested), (scripts, tested)


def test_01_overflow():
    out = run_example("01_overflow.py")
    rows = table_rows(out, "naive vs safe softmax")
    assert len(rows) == 14
    for row in rows:
        nan_rows = re.search(r"(\d+)/(\d+)", row).group(1)
        if row.startswith("x·1000") and "naive" in row:
            assert nan_rows != "0", row  # the naive formula overflows
        else:
            assert nan_rows == "0", row  # nothing else does
    assert "Every safe kernel stayed finite:          yes" in out


def test_02_block_sweep():
    out = run_example("02_block_sweep.py")
    rows = table_rows(out, "Online (streaming) softmax on the device")
    assert [int(r.split()[0]) for r in rows] == [1, 2, 8, 32, 128, 512, 1024]
    for row in rows:
        err, sum_err, l_err = floats(row)
        assert err < 1e-5 and sum_err < 1e-5 and l_err < 1e-5, row
        assert " yes " in row  # the max is exact at every block size
    kernel_rows = table_rows(out, "The online kernel (v3)")
    assert len(kernel_rows) == 4
    assert all(floats(r)[0] < 1e-5 for r in kernel_rows)


def test_03_memory_traffic():
    out = run_example("03_memory_traffic.py")
    small = table_rows(out, "softmax of 2 × 64 float32")
    names = [cells(r)[0] for r in small]
    assert names == ["naive (5 kernels)", "v1 three_pass", "v3 online", "v4 split", "v2 fused",
                     "copy"]
    assert [int(cells(r)[2]) for r in small] == [32, 16, 12, 12, 8, 8]  # bytes per element
    assert all(floats(r)[-1] < 1e-6 for r in small)  # every kernel checked before timing
    long_row = table_rows(out, "softmax of 1 × 2100 float32")
    assert any(r.startswith("v2 fused") and "—" in r for r in long_row)  # does not fit on chip
    assert "does not fit on chip" in out


def test_04_chunk_merge():
    out = run_example("04_chunk_merge.py")
    rows = table_rows(out, "Merged chunks vs the whole-row softmax")
    assert len(rows) == 9
    assert any("ring: pairwise update_out_and_lse" in r for r in rows)
    for row in rows:
        err, sum_err, lse_err = floats(row)
        limit = 1e-12 if "host fp64" in row else 1e-5
        assert err < limit and sum_err < limit and lse_err < 10 * limit, row


def test_05_flash_attention():
    out = run_example("05_flash_attention.py")
    rows = table_rows(out, "Attention,")
    assert sum("materialised" in r for r in rows) == 2
    assert sum("single pass (flash)" in r for r in rows) == 2
    assert all(floats(r)[0] < 1e-5 for r in rows)


def test_06_split_kv_decode():
    out = run_example("06_split_kv_decode.py")
    rows = table_rows(out, "Decode attention (Sq = 1)")
    assert sum("one block per query row" in r for r in rows) == 2
    assert sum("split-KV, Z = " in r for r in rows) == 2
    assert all(floats(r)[0] < 1e-5 for r in rows)
    merged = table_rows(out, "merge_attention:")
    assert len(merged) == 2 and all(max(floats(r)) < 1e-5 for r in merged)


def test_07_block_tree():
    out = run_example("07_block_tree.py")
    for level in range(1, 11):
        assert f"Level {level} —" in out
    assert "all 32" in table_rows(out, "Level 5 —")[0]
    final = table_rows(out, "The row's state")
    assert [r.split()[:2] for r in final] == [["device", "tree"], ["device", "fused"],
                                              ["reference", "(fp64)"]]
    assert all(floats(r)[0] < 1e-5 for r in final)  # |lse − lse_fp64|
    assert "The tree saw every value once (200 of 200)" in out
    assert "Every level printed was written by the device" in out  # the traced twin ran
    worst = re.search(r"matches it to (\S+) \(relative\)", out)
    assert worst and float(worst.group(1)) <= 1e-5  # every traced level equals the host tree


def test_10_ring_attention():
    out = run_example("10_ring_attention.py")
    rows = table_rows(out, "Ring of 2 virtual ranks vs one device")
    assert [cells(r)[2] for r in rows] == ["no", "yes"]
    for row in rows:
        err_ring, err_one = floats(row)[:2]
        assert err_ring < 1e-5 and err_one < 1e-5 and " yes " in row, row
    steps = table_rows(out, "Steps of the last configuration (causal, zigzag")
    assert [cells(r)[3] for r in steps] == ["diagonal", "diagonal", "last queries", "first keys"]
    flops = [int(cells(r)[1]) for r in table_rows(out, "Work per rank")]
    assert len(flops) == 2 and flops[0] == flops[1] > 0  # zigzag: balanced

def test_08_train_tiny_attention():
    out = run_example("08_train_tiny_attention.py")
    assert "needs a CUDA GPU" in out  # training runs on PyTorch CUDA tensors only


def test_09_decoder_step():
    out = run_example("09_decoder_step.py")
    top = table_rows(out, "Top-k of softmax(logits / T)")
    assert len(top) == 8  # 2 sequences × 4 ranks
    for seq in (top[:4], top[4:]):
        probs = [float(cells(r)[3]) for r in seq]
        assert probs == sorted(probs, reverse=True) and 0 < probs[-1] and probs[0] < 1
        assert all(floats(r)[0] < 1e-6 for r in seq)  # |p − p_fp64|
    drawn = table_rows(out, "sample(): one token per sequence")
    assert [cells(r)[0] for r in drawn] == ["top-k, top-p", "whole vocabulary"]
    assert all(cells(r)[2] == "2/2" for r in drawn)  # the NumPy twin draws the same tokens
    assert "equal the float64 reference: yes" in out


@pytest.mark.parametrize("bad", [["--no-such-option"]])
def test_examples_reject_unknown_options(bad):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, str(EXAMPLES / "04_chunk_merge.py"), "--sim", *bad],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "usage:" in proc.stderr


def test_11_paged_decoder():
    out = run_example("11_paged_decoder.py")
    steps = table_rows(out, "Decode steps: paged attention")
    assert len(steps) == 4 and all(max(floats(r)[-2:]) < 1e-5 for r in steps)
    assert "equal the NumPy twin's: yes" in out


def test_examples_use_only_helpers_that_exist():
    """The GPU-only branches of the examples (timing) do not run here: at least every
    ``_common.name`` they call must exist (examples 09 and 10 once called removed ones)."""
    import ast

    sys.path.insert(0, str(EXAMPLES))
    try:
        import _common
    finally:
        sys.path.remove(str(EXAMPLES))
    for path in sorted(EXAMPLES.glob("[0-9]*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "_common"):
                assert hasattr(_common, node.attr), f"{path.name}: _common.{node.attr} does not exist"


def test_12_which_kernel():
    out = run_example("12_which_kernel.py")
    picks = table_rows(out, "1. what auto picks")
    assert len(picks) == 6
    for row in picks:
        c = cells(row)
        assert c[4] in ("fused", "onchip", "cluster", "group"), row
        errors = [float(e) for e in c[5:] if e != "—"]
        assert errors and max(errors) < (1e-3 if c[0] == "float16" else 1e-6), row
        assert c[5 + ("fused", "onchip", "cluster", "group").index(c[4])] != "—"  # auto ran
    assert [cells(r)[4] for r in picks][-2:] == ["group", "group"]  # past fused and cluster
    speeds = table_rows(out, "2. % of a device copy")
    assert len(speeds) == 6 and all(cells(r)[2:6] == ["—"] * 4 for r in speeds)  # no times



def test_13_serve():
    """The serving loop's greedy tokens equal ``model.generate``'s (it needs torch and
    transformers: CI has neither, and skips it)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = run_example("13_serve.py", timeout=600)
    rows = table_rows(out, "Served sequences")
    assert len(rows) == 3 and all(r.rstrip().endswith("yes") for r in rows), rows
    assert "Greedy tokens match model.generate (sdpa): yes" in out
