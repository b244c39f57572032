"""`from_relay_text(text_or_path)`: TVM Relay's text format (TVM <= 0.19) -> an equivalent Relax module.

Contract:
- input: the text `mod.astext()` printed (`#[version = "0.0.5"]`, `def @main(%x: Tensor[(1, 16),
  float32]) { ... }`), graph-form `%0 = ...;` lines and `let %x = ...;` bindings, tuples and `%t.0`
  projections; a str holding the text, or a path to a .txt / .relay file (a str that starts with
  `#[version`, `def ` or contains a newline is text);
- parsed by the Lark LALR grammar `relay_grammar.lark`; a syntax error is a FrontendError with
  `file:line:col`, the offending line and what was expected;
- ops are converted one by one by `relay_ops.OPS` into Relax ops inside one dataflow block of main;
  an op not in that table is a FrontendError naming it (with line:col). Calls of other `def @f`
  in the text are inlined. Closures (`fn`) and `if` are refused with line:col;
- `meta[relay.Constant][i]`: values come from `constants` (a list indexed like the meta table, or a
  dict {i: array}) if given, else from the `#[metadata]` section TVM appended to the text
  (relay_metadata.py decodes its base64 NDArrays); with `random_constants=True` constants found in
  neither are filled with deterministic random values of the type printed beside them
  (`/* ty=Tensor[(64), float32] */`); otherwise a missing constant is a FrontendError;
- the result is `common.normalize`d (batch_norm decomposed for inference, ...).
"""
from __future__ import annotations

import os
import re
from functools import lru_cache

import numpy as np
import tvm
from tvm import relax

from ..errors import FrontendError
from ..relax_utils import GRAPH_LOCK
from .common import normalize as _normalize
from .common import read_path
from .relay_ops import OPS, UnsupportedAttr

_NUM = re.compile(r"^(-?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][-+]?[0-9]+)?)(f16|f32|f64|f|i8|i16|i32|i64|u8|u16|u32|u64|i|u)?$")
_SUFFIX_DTYPE = {"f": "float32", "f16": "float16", "f32": "float32", "f64": "float64", "i": "int32",
                 "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "u": "uint32", "u8": "uint8",
                 "u16": "uint16", "u32": "uint32", "u64": "uint64"}


@lru_cache(maxsize=None)
def _parser(start="start"):
    from lark import Lark

    path = os.path.join(os.path.dirname(__file__), "relay_grammar.lark")
    with open(path) as f:
        return Lark(f.read(), parser="lalr", propagate_positions=True, start=start)


def _looks_like_text(s: str) -> bool:
    s = s.lstrip()
    return "\n" in s or s.startswith(("#[version", "def ", "fn ", "%", "free_var"))


def parse(text: str, source: str = "<relay>"):
    """The Lark tree of the text before any `#[metadata]` section; syntax errors as FrontendError."""
    from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

    body = text.split("#[metadata]", 1)[0]
    try:
        return _parser().parse(body)
    except UnexpectedInput as err:
        line, col = getattr(err, "line", "?"), getattr(err, "column", "?")
        if isinstance(err, UnexpectedToken) and err.token.type == "$END":
            what, expected = "unexpected end of input", sorted(err.accepts or err.expected)
            line, col = body.count("\n") + 1, len(body.rsplit("\n", 1)[-1]) + 1
        elif isinstance(err, UnexpectedToken):
            what = f"unexpected {err.token.type} {str(err.token)!r}"
            expected = sorted(err.accepts or err.expected)
        elif isinstance(err, UnexpectedCharacters):
            what = f"unexpected character {body[err.pos_in_stream]!r}"
            expected = sorted(err.allowed or [])
        elif isinstance(err, UnexpectedEOF):
            what, expected = "unexpected end of input", sorted(err.expected)
            line = body.count("\n") + 1
            col = len(body.rsplit("\n", 1)[-1]) + 1
        else:  # pragma: no cover
            what, expected = str(err), []
        ctx = err.get_context(body).rstrip() if hasattr(err, "get_context") and line != "?" else ""
        exp = f"; expected one of {', '.join(expected[:12])}" if expected else ""
        raise FrontendError(f"{source}:{line}:{col}: Relay syntax error: {what}{exp}\n{ctx}") from None


def _number(tok: str, where):
    m = _NUM.match(tok)
    if not m:
        raise FrontendError(f"{where}: bad number literal {tok!r}")
    text, suffix = m.groups()
    if suffix:
        dtype = _SUFFIX_DTYPE[suffix]
    else:
        dtype = "float32" if any(c in text for c in ".eE") else "int32"
    value = float(text) if dtype.startswith("float") else int(float(text))
    return value, dtype


class _Converter:
    def __init__(self, tree, source, constants, random_constants):
        self.source, self.constants, self.random_constants = source, constants, random_constants
        self.defs = {}
        for d in tree.children:
            if getattr(d, "data", None) == "definition":
                self.defs[str(d.children[0])[1:]] = d
        if "main" not in self.defs:
            raise FrontendError(f"{source}: no `def @main(...)` in the text; defined: {sorted(self.defs)}")
        self.bb = relax.BlockBuilder()
        self.inlining: list[str] = []

    # ------------------------------------------------------------------ helpers
    def where(self, tree) -> str:
        meta = getattr(tree, "meta", None)
        if meta is not None and not getattr(meta, "empty", True):
            return f"{self.source}:{meta.line}:{meta.column}"
        line = getattr(tree, "line", None)
        return f"{self.source}:{line}:{getattr(tree, 'column', '?')}" if line else self.source

    def error(self, tree, msg):
        return FrontendError(f"{self.where(tree)}: {msg}")

    def type_of(self, tree):
        """A Relax type from a type tree."""
        kind = tree.data
        if kind == "tensor_type":
            shape_tree, dtype = tree.children
            dims = []
            for d in shape_tree.children:
                if d is None:
                    continue
                tok = d.children[0] if d.children else None
                if tok is None or not str(tok).isdigit():
                    raise self.error(tree, f"dynamic dimension {tok or '?'} in {dims}: only static shapes are supported")
                dims.append(int(tok))
            return relax.TensorType(dims, str(dtype))
        if kind == "scalar_type":
            return relax.TensorType([], str(tree.children[0]))
        if kind == "tuple_type":
            return relax.TupleType([self.type_of(c) for c in tree.children if c is not None])
        raise self.error(tree, f"unknown type {kind}")

    def annotation_type(self, tok):
        text = str(tok)[2:-2].strip()[len("ty="):]
        text = re.split(r"\s+span=", text)[0].strip()
        try:
            return self.type_of(_parser("type").parse(text))
        except FrontendError:
            raise
        except Exception as err:
            raise FrontendError(f"{self.source}:{tok.line}:{tok.column}: unreadable type annotation {text!r} ({err})")

    def check_type(self, where, got, want):
        """The converted value must have the type Relay printed beside it (`/* ty=... */`)."""
        def desc(ty):
            if isinstance(ty, relax.TupleType):
                return "(" + ", ".join(desc(f) for f in ty.fields) + ")"
            shape = [int(v) for v in ty.shape.values] if getattr(ty, "shape", None) is not None else "?"
            return f"{shape}:{ty.dtype}"

        if desc(got) != desc(want):
            raise self.error(where, f"converted to {desc(got)}, but the text's type annotation says {desc(want)}")

    # ------------------------------------------------------------------ conversion
    def module(self, normalize: bool):
        main = self.defs["main"]
        _, params_tree, ret_tree, body = main.children
        params = self.params(params_tree)
        with GRAPH_LOCK, self.bb.function("main", [v for _, v in params]):
            with self.bb.dataflow():
                out = self.body(body, dict(params))
                out = self.bb.emit_output(out)
            self.bb.emit_func_output(out)
        mod = self.bb.get()
        return _normalize(mod) if normalize else mod

    def params(self, tree):
        out = []
        for p in (tree.children if tree is not None else []):
            name, ty = str(p.children[0])[1:], p.children[1]
            if ty is None:
                raise self.error(p, f"parameter %{name} has no type; Relax needs `%{name}: Tensor[(...), dtype]`")
            rty = self.type_of(ty)
            if not isinstance(rty, relax.TensorType):
                raise self.error(p, f"parameter %{name}: tuple-typed parameters are not supported")
            out.append((name, relax.Var(re.sub(r"\W", "_", name), rty)))
        return out

    def body(self, tree, env):
        *stmts, result = tree.children
        for s in stmts:
            if s.data == "graph_binding":
                name, value = s.children
            else:  # let_binding
                name, _ty, value = s.children
            env[str(name)[1:]] = self.leaf(self.expr(value, env))
        return self.expr(result, env)

    def leaf(self, e):
        if isinstance(e, (relax.Var, tvm.ir.expr.Constant)):
            return e
        return self.bb.emit(e)

    def expr(self, t, env):
        from lark import Token

        if isinstance(t, Token):  # an inlined `?rule` that is a bare token
            raise self.error(t, f"unexpected token {t!r}")
        kind = t.data
        if kind == "var":
            return self.lookup(t.children[0], env)
        if kind == "annotated":
            inner, ann = t.children
            if getattr(inner, "data", None) == "meta_ref":
                return self.meta_const(inner, self.annotation_type(ann))
            value = self.leaf(self.expr(inner, env))
            self.check_type(inner, value.ty, self.annotation_type(ann))
            return value
        if kind == "proj":
            tup = self.leaf(self.expr(t.children[0], env))
            return self.project(t, tup, int(t.children[1]))
        if kind == "tuple":
            return relax.Tuple([self.leaf(self.expr(c, env)) for c in t.children])
        if kind == "number":
            value, dtype = _number(str(t.children[0]), self.where(t))
            return relax.const(value, dtype)
        if kind in ("true", "false"):
            return relax.const(kind == "true", "bool")
        if kind == "meta_ref":
            return self.meta_const(t, None)
        if kind == "call":
            return self.call(t, env)
        if kind == "global_call":
            return self.global_call(t, env)
        if kind == "closure":
            raise self.error(t, "closures (`fn (...) { ... }`) are not supported; only def @main and "
                                "global functions it calls")
        if kind == "if_expr":
            raise self.error(t, "`if` (control flow) is not supported: fusion works on dataflow graphs")
        raise self.error(t, f"unsupported expression {kind}")

    def lookup(self, tok, env):
        name = str(tok)[1:]
        if name in env:
            return env[name]
        base, _, idx = name.rpartition(".")  # `%x.0` lexes as one name; it is a projection
        if base and idx.isdigit():
            return self.project(tok, self.leaf(self.lookup(tok.__class__(tok.type, "%" + base), env)), int(idx))
        raise FrontendError(f"{self.source}:{tok.line}:{tok.column}: undefined variable %{name}")

    def project(self, where, tup, i):
        ty = tup.ty if isinstance(tup, relax.Expr) else None
        if not isinstance(ty, relax.TupleType):
            raise self.error(where, f"`.{i}` projection of a non-tuple value")
        if i >= len(ty.fields):
            raise self.error(where, f"tuple index {i} out of range (tuple of {len(ty.fields)})")
        return relax.TupleGetItem(tup, i)

    def meta_const(self, t, ty):
        *kind, idx = [str(c) for c in t.children]
        kind, idx = ".".join(kind), int(idx)
        if kind != "relay.Constant":
            raise self.error(t, f"meta[{kind}] is not supported (only meta[relay.Constant][i])")
        value = None
        if isinstance(self.constants, dict):
            value = self.constants.get(idx)
        elif self.constants is not None and idx < len(self.constants):
            value = self.constants[idx]
        if value is None:
            if not self.random_constants:
                raise self.error(t, f"meta[relay.Constant][{idx}] has no value (no #[metadata] section holds it); "
                                    "pass constants=[...] (indexed like meta[relay.Constant]) or "
                                    "random_constants=True")
            if ty is None or not isinstance(ty, relax.TensorType):
                raise self.error(t, f"meta[relay.Constant][{idx}] has no `/* ty=Tensor[...] */` annotation to "
                                    "random-fill it from; pass constants=")
            shape, dtype = [int(v) for v in ty.shape.values], str(ty.dtype)
            rng = np.random.default_rng(1000 + idx)
            value = (rng.standard_normal(shape) if dtype.startswith("float")
                     else rng.integers(0, 4, size=shape)).astype(dtype)
        value = np.asarray(value)
        if ty is not None and isinstance(ty, relax.TensorType):
            want = tuple(int(v) for v in ty.shape.values)
            if tuple(value.shape) != want or str(value.dtype) != str(ty.dtype):
                raise self.error(t, f"meta[relay.Constant][{idx}]: the value given is {list(value.shape)}:"
                                    f"{value.dtype}, the text says {list(want)}:{ty.dtype}")
        return relax.const(value)

    def call_args(self, t, env):
        args, attrs = [], {}
        tree = t.children[-1]
        for a in (tree.children if tree is not None else []):
            if getattr(a, "data", None) == "attr":
                attrs[str(a.children[0])] = self.attr_value(a.children[1])
            else:
                if attrs:
                    raise self.error(a, "positional argument after keyword attributes")
                args.append(self.leaf(self.expr(a, env)))
        return args, attrs

    def attr_value(self, t):
        kind = t.data
        if kind == "number":
            return _number(str(t.children[0]), self.where(t))[0]
        if kind == "string":
            return str(t.children[0])[1:-1]
        if kind in ("true", "false"):
            return kind == "true"
        if kind == "none":
            return None
        if kind == "name":
            return str(t.children[0])
        if kind == "list":
            return [self.attr_value(c) for c in t.children if c is not None]
        raise self.error(t, f"unsupported attribute value ({kind})")

    def call(self, t, env):
        op = ".".join(str(c) for c in t.children[0].children)
        fn = OPS.get(op)
        if fn is None:
            raise self.error(t, f"Relay op '{op}' is not supported by tvmfuse's Relay importer; supported ops: "
                                f"{', '.join(sorted(OPS))}")
        args, attrs = self.call_args(t, env)
        try:
            return fn(self.bb, args, attrs)
        except UnsupportedAttr as err:
            raise self.error(t, f"{op}: {err}") from None
        except FrontendError:
            raise
        except Exception as err:
            raise self.error(t, f"{op}: could not convert ({type(err).__name__}: {err})") from err

    def global_call(self, t, env):
        name = str(t.children[0])[1:]
        if name not in self.defs:
            raise self.error(t, f"call of undefined global function @{name}")
        if name in self.inlining:
            raise self.error(t, f"recursive call of @{name} is not supported")
        args, attrs = self.call_args(t, env)
        _, params_tree, _, body = self.defs[name].children
        params = self.params(params_tree)
        if attrs or len(args) != len(params):
            raise self.error(t, f"@{name} takes {len(params)} arguments, got {len(args)}")
        self.inlining.append(name)
        try:
            return self.body(body, {p: a for (p, _), a in zip(params, args)})
        finally:
            self.inlining.pop()


def from_relay_text(text_or_path, *, constants=None, random_constants: bool = False,
                    normalize: bool = True) -> tvm.IRModule:
    """Import Relay text; see the module docstring for the contract."""
    if isinstance(text_or_path, os.PathLike) or (isinstance(text_or_path, str) and not _looks_like_text(text_or_path)):
        path = read_path(text_or_path, "from_relay_text", (".txt", ".relay"))
        with open(path) as f:
            text, source = f.read(), path
    elif isinstance(text_or_path, str):
        text, source = text_or_path, "<relay>"
    else:
        raise FrontendError(f"from_relay_text expects Relay text or a path, got {type(text_or_path).__name__}")
    tree = parse(text, source)
    if constants is None and "#[metadata]" in text:
        from .relay_metadata import relay_constants

        constants = relay_constants(text.split("#[metadata]", 1)[1])
    return _Converter(tree, source, constants, random_constants).module(normalize)
