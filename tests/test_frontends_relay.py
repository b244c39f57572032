"""Relay text importer: the shipped graphs in tests/relay/ against numpy references and against
their unfused build; launches tvmfuse <= tvm; syntax errors with line:col; unsupported ops named."""
import math
import os

import numpy as np
import pytest

import tvmfuse
from tvmfuse.errors import FrontendError
from tvmfuse.loader import load_model
from tvmfuse.frontends.relay_ops import OPS

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "relay")
VARIANTS = ("none", "tvm", "tvmfuse")
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _conv3x3_pad1(x, w):
    n, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd), np.float64)
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    return out


def ref_mlp(x, w1, b1, w2, b2):
    return _softmax(np.maximum(x @ w1.T + b1, 0) @ w2.T + b2)


def ref_conv_bn_relu(x, w, b, gamma, beta, mean, var):
    y = _conv3x3_pad1(x, w) + b[:, None, None]
    y = (y - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5) * gamma[:, None, None] + beta[:, None, None]
    y = np.maximum(y, 0) + x
    y = y.reshape(1, 8, 6, 2, 6, 2).max(axis=(3, 5))
    return y.mean(axis=(2, 3))


def ref_attention(hidden, g, b, w_qkv, w_out):
    mu, var = hidden.mean(-1, keepdims=True), hidden.var(-1, keepdims=True)
    h = ((hidden - mu) / np.sqrt(var + 1e-5) * g + b).reshape(16, 32) @ w_qkv
    h = h.reshape(2, 8, 3, 32)
    q, k, v = h[:, :, 0], h[:, :, 1], h[:, :, 2]
    p = _softmax(q @ k.transpose(0, 2, 1) * 0.176777)
    y = ((p @ v).reshape(16, 32) @ w_out.T).reshape(2, 8, 32)
    return y * (_erf(y * 0.707107) + 1) * 0.5 + hidden


def ref_elementwise_let(x, y, c0):
    a = x + c0
    b = a - y
    e = np.abs(y) + 1
    g = 1 / np.sqrt(e)
    h = np.tanh(x)
    p = np.where((x > y) | (g <= 0.5), np.exp(b) * np.sqrt(e) / e, 1 / (1 + np.exp(-b)))
    q = np.maximum(p, _erf(h))
    u = np.concatenate([q[:, None], g[:, None]], axis=1)
    return u, q.sum(1) + q.mean(-1) - b.max(1), b.min(0, keepdims=True), q.astype("float16")


def ref_dense_meta(x):  # the constants tests/relay/dense_meta.txt carries in its #[metadata] section
    w = (np.arange(8 * 16).reshape(8, 16) % 7 - 3) / 8
    b = (np.arange(8) - 4) / 4
    g = np.linspace(0.5, 1.5, 8, dtype="float32")
    return (np.maximum(x @ w.T + b, 0) * g).astype("float16").astype("float32")


REFS = {"dense_meta.txt": ref_dense_meta, "mlp.txt": ref_mlp, "conv_bn_relu.txt": ref_conv_bn_relu, "attention.txt": ref_attention,
        "elementwise_let.txt": ref_elementwise_let}
C0 = np.linspace(-1, 1, 16).astype("float32")
_BUILT = {}


def _load(fname):
    if fname not in _BUILT:
        path = os.path.join(HERE, fname)
        if fname == "elementwise_let.txt":  # meta[relay.Constant][0]: given explicitly
            w = load_model(path)
            w.mod = tvmfuse.from_relay_text(path, constants=[C0])
        else:
            w = load_model(path)
        _BUILT[fname] = (w, {v: tvmfuse.build(w.mod, "llvm", v) for v in VARIANTS})
    return _BUILT[fname]


def _tuple(o):
    return o if isinstance(o, tuple) else (o,)


@pytest.mark.parametrize("fname", sorted(REFS))
def test_shipped_relay_graph_matches_numpy_and_unfused(fname):
    w, builds = _load(fname)
    inputs = w.inputs()
    extra = (C0,) if fname == "elementwise_let.txt" else ()
    ref = _tuple(REFS[fname](*[a.astype("float64") for a in inputs], *extra))
    unfused = _tuple(builds["none"](*inputs))
    for v in VARIANTS:
        out = _tuple(builds[v](*inputs))
        assert len(out) == len(ref)
        for o, r, u in zip(out, ref, unfused):
            tol = 2e-3 if o.dtype == np.float16 else 1e-4
            np.testing.assert_allclose(o.astype("float64"), r, rtol=tol, atol=tol)
            np.testing.assert_allclose(o, u, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fname", sorted(REFS))
def test_shipped_relay_graph_launches(fname):
    _, builds = _load(fname)
    assert builds["tvmfuse"].launches <= builds["tvm"].launches < builds["none"].launches


def test_shipped_files_cover_the_required_ops():
    text = "".join(open(os.path.join(HERE, f)).read() for f in REFS)
    required = ["nn.dense", "nn.matmul", "nn.batch_matmul", "nn.conv2d", "nn.bias_add", "nn.batch_norm", "nn.relu",
                "nn.softmax", "nn.layer_norm", "add", "subtract", "multiply", "divide", "greater", "less_equal",
                "exp", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "reshape", "transpose", "expand_dims", "squeeze",
                "concatenate", "strided_slice", "sum", "mean", "max", "min", "cast", "let ", "%2.0", "meta[relay.Constant]"]
    missing = [op for op in required if (op + "(" if not op.endswith((" ", "]")) and "%" not in op else op) not in text]
    assert not missing
    assert all(op in OPS for op in required if "(" not in op and " " not in op and "%" not in op and "[" not in op)


# ---------------------------------------------------------------- inline texts
HEAD = '#[version = "0.0.5"]\n'


def _run(text, *arrays, **kw):
    mod = tvmfuse.from_relay_text(HEAD + text, **kw)
    return tvmfuse.build(mod, "llvm", "tvmfuse")(*arrays)


def test_matmul_transpose_flags_and_named_tuple_projection():
    text = """def @main(%a: Tensor[(3, 4), float32], %b: Tensor[(5, 4), float32]) {
  %0 = nn.matmul(%a, %b, units=None, transpose_b=True) /* ty=Tensor[(3, 5), float32] */;
  let %pair = (%0, %a);
  let %first = %pair.0;
  %1 = %pair.1;
  (%first, sum(%1, axis=[1], exclude=True))
}"""
    a, b = np.random.default_rng(0).standard_normal((2, 20)).astype("float32").reshape(2, -1)[:, :12].reshape(2, 3, 4)
    b5 = np.random.default_rng(1).standard_normal((5, 4)).astype("float32")
    out = _run(text, a, b5)
    np.testing.assert_allclose(out[0], a @ b5.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[1], a.sum(0), rtol=1e-5, atol=1e-6)


def test_global_functions_are_inlined():
    text = """def @gelu_ish(%x: Tensor[(2, 3), float32]) {
  multiply(%x, sigmoid(multiply(%x, 1.702f)))
}
def @main(%x: Tensor[(2, 3), float32]) {
  %0 = @gelu_ish(%x);
  add(%0, 1f)
}"""
    x = np.arange(6, dtype="float32").reshape(2, 3) / 3
    np.testing.assert_allclose(_run(text, x), x / (1 + np.exp(-1.702 * x)) + 1, rtol=1e-5, atol=1e-6)


def test_metadata_section_as_tvm_printed_it():
    # meta[relay.Constant][0] of a Relay text printed by TVM 0.8.0 (show_meta_data=True): [[1, 2, 3], [4, 5, 6]]
    from tvmfuse.frontends.relay_metadata import decode_ndarray, relay_constants

    blob = ("P6G0lvBAXt0AAAAAAAAAAAEAAAAAAAAAAgAAAAIgAQACAAAAAAAAAAMAAAAAAAAAGAAAAAAAAAAAAIA/AAAAQAAAQEAAAIBA"
            "AACgQAAAwEA=")
    np.testing.assert_array_equal(decode_ndarray(blob), np.arange(1, 7, dtype="float32").reshape(2, 3))
    text = """#[version = "0.0.5"]
def @main(%x: Tensor[(2, 3), float32]) {
  add(%x, meta[relay.Constant][0] /* ty=Tensor[(2, 3), float32] */)
}

#[metadata]
{"root": 1, "nodes": [{"type_key": ""}, {"type_key": "Map", "keys": ["relay.Constant"], "data": [2]},
 {"type_key": "Array", "data": [3]},
 {"type_key": "relay.Constant", "attrs": {"_checked_type_": "0", "data": "0", "span": "0"}}],
 "b64ndarrays": ["BLOB"], "attrs": {"tvm_version": "0.8.0"}}
""".replace("BLOB", blob)
    mod = tvmfuse.from_relay_text(text)
    out = tvmfuse.build(mod, "llvm", "tvmfuse")(np.ones((2, 3), "float32"))
    np.testing.assert_array_equal(out, np.arange(2, 8, dtype="float32").reshape(2, 3))
    with pytest.raises(FrontendError, match=r"#\[metadata\] section could not be decoded"):
        relay_constants('{"root": 1, "nodes": []}')


def test_meta_constants_random_fill_and_errors():
    text = """def @main(%x: Tensor[(2, 4), float32]) {
  add(%x, meta[relay.Constant][0] /* ty=Tensor[(4), float32] */)
}"""
    x = np.zeros((2, 4), "float32")
    out = _run(text, x, random_constants=True)
    assert out.shape == (2, 4) and np.all(out[0] == out[1]) and np.any(out != 0)
    np.testing.assert_allclose(_run(text, x, constants={0: np.ones(4, "float32")}), np.ones((2, 4)))
    with pytest.raises(FrontendError, match=r"<relay>:3:11: meta\[relay.Constant\]\[0\] has no value.*constants="):
        tvmfuse.from_relay_text(HEAD + text)
    with pytest.raises(FrontendError, match=r"the value given is \[3\]:float32, the text says \[4\]:float32"):
        tvmfuse.from_relay_text(HEAD + text, constants=[np.ones(3, "float32")])


def test_syntax_error_reports_line_and_column():
    text = """def @main(%x: Tensor[(2, 4), float32]) {
  %0 = nn.relu(%x) /* ty=Tensor[(2, 4), float32] */;
  %1 = add(%0 %x);
  %1
}"""
    with pytest.raises(FrontendError) as e:
        tvmfuse.from_relay_text(HEAD + text)
    msg = str(e.value)
    assert msg.startswith("<relay>:4:15: Relay syntax error: unexpected LOCAL_VAR '%x'"), msg
    assert "%1 = add(%0 %x);" in msg and "^" in msg


def test_syntax_error_at_end_of_file(tmp_path):
    p = tmp_path / "cut.relay"
    p.write_text(HEAD + "def @main(%x: Tensor[(2), float32]) {\n  nn.relu(%x)\n")
    with pytest.raises(FrontendError, match=r"cut\.relay:4:1: Relay syntax error: unexpected end of input"):
        tvmfuse.from_relay_text(p)


def test_unsupported_op_is_named_with_position():
    text = """def @main(%x: Tensor[(1, 2, 4, 4, 4), float32], %w: Tensor[(2, 2, 1, 1, 1), float32]) {
  %0 = nn.relu(%x);
  nn.conv3d(%0, %w)
}"""
    with pytest.raises(FrontendError, match=r"<relay>:4:3: Relay op 'nn.conv3d' is not supported"):
        tvmfuse.from_relay_text(HEAD + text)


def test_undefined_variable_closure_and_dynamic_shape_errors():
    with pytest.raises(FrontendError, match=r"<relay>:3:29: undefined variable %y"):
        tvmfuse.from_relay_text(HEAD + "def @main(%x: float32) {\n  %0 = add(%x, %x); add(%0, %y)\n}")
    with pytest.raises(FrontendError, match=r"<relay>:3:3: closures"):
        tvmfuse.from_relay_text(HEAD + "def @main(%x: float32) {\n  fn (%y: float32) { %y }\n}")
    with pytest.raises(FrontendError, match=r"dynamic dimension \?"):
        tvmfuse.from_relay_text(HEAD + "def @main(%x: Tensor[(?, 4), float32]) {\n  %x\n}")


def test_conversion_is_checked_against_the_printed_types():
    text = """def @main(%x: Tensor[(4, 16), float32], %w: Tensor[(8, 16), float32]) {
  nn.dense(%x, %w, units=8) /* ty=Tensor[(4, 9), float32] */
}"""
    with pytest.raises(FrontendError, match=r"<relay>:3:3: converted to \[4, 8\]:float32, but the text's type "
                                            r"annotation says \[4, 9\]:float32"):
        tvmfuse.from_relay_text(HEAD + text)


def test_missing_file():
    with pytest.raises(FrontendError, match=r"no such file 'tests/relay/nope\.txt'"):
        tvmfuse.from_relay_text("tests/relay/nope.txt")
