"""numba_softmax.torch: the custom ops, their fake implementations and autograd.

On the CPU (any PyTorch): the ops are registered with the right schemas, fake tensors flow
forward and backward through them with the shapes, dtypes and layouts the real kernels
give, and a traced graph contains them — what ``torch.compile`` relies on.  On a GPU:
``torch.autograd.gradcheck`` in float64, ``torch.library.opcheck``, gradients against
PyTorch's own, the flash-attn rule in float16, ``torch.compile`` around the ops.
"""

import ast
from pathlib import Path

import pytest

from _helpers import SIMULATOR

torch = pytest.importorskip("torch")
nst = pytest.importorskip("numba_softmax.torch")

GPU = not SIMULATOR and torch.cuda.is_available()
gpu_only = pytest.mark.skipif(not GPU, reason="GPU only: CUDA tensors")


def test_no_module_but_torch_py_imports_torch_at_import_time():
    """Importing numba_softmax must not import PyTorch: no module of the package imports
    torch (or numba_softmax.torch) at its top level — only numba_softmax/torch.py does."""
    package = Path(nst.__file__).parent
    for path in package.rglob("*.py"):
        if path in (package / "torch.py", package / "torch_varlen.py",
                    package / "bench" / "triton_peers.py"):
            continue  # the PyTorch integration itself; the bench's Triton peers (imported lazily)
        for node in ast.parse(path.read_text(encoding="utf-8")).body:  # top-level statements
            names = [a.name for a in getattr(node, "names", [])]
            module = getattr(node, "module", None) or ""
            if isinstance(node, ast.Import):
                assert not any(n.split(".")[0] == "torch" for n in names), path
            if isinstance(node, ast.ImportFrom):
                assert module.split(".")[0] != "torch" and "torch" not in names \
                    and not module.endswith(".torch") and module != "torch", path


def test_ops_are_registered_with_their_schemas():
    ops = torch.ops.numba_softmax
    assert "Tensor x, SymInt dim" in str(ops.softmax.default._schema) or \
        "Tensor x, int dim" in str(ops.softmax.default._schema)
    assert "(Tensor dy, Tensor y," in str(ops.log_softmax_backward.default._schema)
    assert "bool causal, float? scale) -> (Tensor, Tensor)" in str(ops.attention.default._schema)
    assert "-> (Tensor, Tensor, Tensor)" in str(ops.attention_backward.default._schema)
    with pytest.raises(NotImplementedError, match="CPU"):  # CUDA tensors only
        nst.softmax(torch.randn(2, 3), -1)


@pytest.mark.parametrize("dim", [1, -1])
def test_fake_tensors_flow_forward_and_backward(dim):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(3, 5, 7, requires_grad=True)
        for fn in (nst.softmax, nst.log_softmax):
            y = fn(x, dim)
            # the package returns C order with dim moved last, then moved back
            assert y.shape == x.shape and y.stride() == torch.empty(3, 7, 5).movedim(-1, 1).stride() \
                if dim == 1 else y.is_contiguous()
            (grad,) = torch.autograd.grad((y * y).sum(), x)
            assert grad.shape == x.shape and grad.dtype == x.dtype
        q = torch.empty(2, 3, 9, 16, dtype=torch.float16, requires_grad=True)
        k = torch.empty(2, 3, 11, 16, dtype=torch.float16, requires_grad=True)
        v = torch.empty(2, 3, 11, 8, dtype=torch.float16, requires_grad=True)
        o, lse = torch.ops.numba_softmax.attention(q, k, v, True, None)
        assert o.shape == (2, 3, 9, 8) and o.dtype == torch.float16 and lse.dtype == torch.float32
        assert not lse.requires_grad  # gradients flow through O only
        grads = torch.autograd.grad(o.float().square().sum(), (q, k, v))
        assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


def test_a_traced_graph_holds_the_ops_forward_and_backward():
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(q, k, v):
        o = nst.attention(q, k, v, causal=True)
        loss = -nst.log_softmax(o, -1).sum()
        return torch.autograd.grad(loss, (q, k, v))

    args = [torch.randn(1, 2, 5, 8, requires_grad=True) for _ in range(3)]
    code = make_fx(step, tracing_mode="fake")(*args).code
    for op in ("numba_softmax.attention.", "numba_softmax.log_softmax.",
               "numba_softmax.log_softmax_backward.", "numba_softmax.attention_backward."):
        assert op in code, op


# --- GPU ------------------------------------------------------------------------------------
def _cuda(*shape, dtype=torch.float64, scale=1.0):
    return (scale * torch.randn(*shape, dtype=dtype, device="cuda")).requires_grad_()


@gpu_only
@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape, dim", [((3, 37), -1), ((4, 5, 6), 1), ((2, 1100), -1)])
def test_gradcheck_rows_float64(fn, shape, dim):
    x = _cuda(*shape, scale=3.0)
    assert torch.autograd.gradcheck(lambda t: getattr(nst, fn)(t, dim), (x,))


@gpu_only
@pytest.mark.parametrize("causal", [False, True])
def test_attention_gradients_against_pytorch_float64(causal):
    """Our float32 gradients against SDPA's in float64 (the package's forward takes float16
    and float32); odd lengths, Sq == Sk so that both causal conventions agree."""
    q, k, v, do = (torch.randn(2, 3, 37, 24, device="cuda", dtype=torch.float64) for _ in range(4))
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.nn.functional.scaled_dot_product_attention(*ref, is_causal=causal).backward(do)
    ours = [t.float().requires_grad_() for t in (q, k, v)]
    nst.attention(*ours, causal=causal).backward(do.float())
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.grad.double(), b.grad, rtol=1e-4, atol=2e-5)


@gpu_only
def test_attention_gradcheck_float32():
    """gradcheck in float32 (the forward's widest type): larger steps, looser tolerances,
    and ``nondet_tol`` for dQ's atomic adds."""
    args = [_cuda(1, 2, 9, 8, dtype=torch.float32) for _ in range(3)]
    assert torch.autograd.gradcheck(lambda q, k, v: nst.attention(q, k, v, causal=True), args,
                                    eps=1e-3, atol=5e-3, rtol=5e-3, nondet_tol=1e-5)


@gpu_only
def test_opcheck():
    x = _cuda(4, 33, dtype=torch.float32)
    for op in (nst.softmax_op, nst.log_softmax_op):
        torch.library.opcheck(op, (x, -1))
    y = torch.softmax(x.detach(), -1)
    torch.library.opcheck(nst.softmax_backward_op, (torch.randn_like(y), y, -1))
    q, k, v = (_cuda(1, 2, 17, 16, dtype=torch.float32) for _ in range(3))
    torch.library.opcheck(nst.attention_op, (q, k, v, True, None))
    o, lse = nst.attention_op(q.detach(), k.detach(), v.detach(), True, None)
    torch.library.opcheck(nst.attention_backward_op,
                          (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o, lse, True, None),
                          test_utils=("test_schema", "test_faketensor"))  # atomics: not bitwise


@gpu_only
@pytest.mark.parametrize("causal", [False, True])
def test_float16_meets_the_flash_attn_rule(causal):
    """|ours(fp16) − ref(fp32)| <= 2·|torch(fp16) − ref(fp32)| + 1e-5, per gradient."""
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(2, 4, 129, 64, device="cuda") for _ in range(4))
    grads = {}
    for name, dtype, fn in [("ref", torch.float32, "sdpa"), ("torch", torch.float16, "sdpa"),
                            ("ours", torch.float16, "ours")]:
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]  # own leaves each
        if fn == "sdpa":
            o = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
        else:
            o = nst.attention(*leaves, causal=causal)
        o.backward(do.to(dtype))
        grads[name] = [t.grad.float() for t in leaves]
    for i, name in enumerate(("dq", "dk", "dv")):
        ours = (grads["ours"][i] - grads["ref"][i]).abs().max().item()
        theirs = (grads["torch"][i] - grads["ref"][i]).abs().max().item()
        assert ours <= 2 * theirs + 1e-5, (name, ours, theirs)


@gpu_only
def test_torch_compile_traces_around_the_ops():
    def model(x, q, k, v):
        return nst.log_softmax(x, -1).sum() + nst.attention(q, k, v, causal=True).square().sum()

    args = [_cuda(2, 3, 20, 16, dtype=torch.float32) for _ in range(4)]
    eager = torch.autograd.grad(model(*args), args)
    compiled = torch.autograd.grad(torch.compile(model, fullgraph=True)(*args), args)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not (GPU or SIMULATOR), reason="needs a GPU or the CUDA simulator")
def test_attention_options_forward_and_backward_against_the_reference():
    """window, softcap and alibi_slopes through the options op pair, gradients included,
    against the float64 references (on the simulator the ops take CPU tensors)."""
    import numpy as np

    from numba_softmax import reference as R

    dev = "cuda" if GPU else "cpu"
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g).to(dev).requires_grad_()
               for n in (5, 7, 7))
    do = torch.randn(1, 2, 5, 8, generator=g).to(dev)
    slopes = torch.tensor([0.5, 0.25], device=dev)
    opts = dict(causal=True, window=(3, 0), softcap=2.5)
    o = nst.attention(q, k, v, alibi_slopes=slopes, **opts)
    o.backward(do)
    host = [t.detach().cpu().double().numpy() for t in (q, k, v, do)]
    want, lse = R.attention(*host[:3], return_lse=True, alibi_slopes=slopes.cpu().numpy(), **opts)
    grads = R.attention_backward(host[3], *host[:3], want, lse,
                                 alibi_slopes=slopes.cpu().numpy(), **opts)
    np.testing.assert_allclose(o.detach().cpu().numpy(), want, rtol=1e-4, atol=1e-5)
    for got, expected in zip((q.grad, k.grad, v.grad), grads):
        np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=1e-3, atol=1e-4)
    with pytest.raises(ValueError, match="softcap"):
        nst.attention(q, k, v, softcap=-1.0)


@pytest.mark.skipif(not (GPU or SIMULATOR), reason="needs a GPU or the CUDA simulator")
def test_attention_varlen_forward_and_backward_per_sequence():
    """A packed batch (one sequence with no queries, one longer than its keys): O and the
    gradients equal each sequence's own float64 references; rows of no sequence get 0."""
    import numpy as np

    from numba_softmax import reference as R

    dev = "cuda" if GPU else "cpu"
    lq, lk = [3, 0, 6], [4, 2, 5]
    cq, ck = np.cumsum([0] + lq), np.cumsum([0] + lk)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(int(cq[-1]) + 2, 2, 8, generator=g).to(dev).requires_grad_()  # 2 padding rows
    k, v = (torch.randn(int(ck[-1]), 1, 8, generator=g).to(dev).requires_grad_() for _ in "kv")
    do = torch.randn(q.shape, generator=g).to(dev)
    cu_q, cu_k = (torch.tensor(c, dtype=torch.int32, device=dev) for c in (cq, ck))
    o = nst.attention_varlen(q, k, v, cu_q, cu_k, causal=True, softcap=4.0)
    o.backward(do)
    host = lambda t: t.detach().cpu().double().numpy()  # noqa: E731
    for b in range(3):
        sq_, sk_ = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        if cq[b + 1] == cq[b]:
            continue
        qb, kb, vb, dob = (host(x[s]).swapaxes(0, 1)[None] for x, s in
                           ((q, sq_), (k, sk_), (v, sk_), (do, sq_)))
        want, lse = R.attention(qb, kb, vb, causal=True, softcap=4.0, return_lse=True)
        np.testing.assert_allclose(host(o[sq_]).swapaxes(0, 1)[None], want, rtol=1e-4, atol=1e-5)
        grads = R.attention_backward(dob, qb, kb, vb, want, lse, causal=True, softcap=4.0)
        for got, x, s in zip(grads, (q, k, v), (sq_, sk_, sk_)):
            np.testing.assert_allclose(host(x.grad[s]).swapaxes(0, 1)[None], got, rtol=1e-3,
                                       atol=1e-4)
    assert (host(q.grad[int(cq[-1]):]) == 0).all() and (host(o[int(cq[-1]):]) == 0).all()
    with pytest.raises(TypeError, match="cu_seqlens_q"):
        nst.attention_varlen(q, k, v, cu_q.long(), cu_k)
