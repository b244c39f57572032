"""FoldExplicitPadding: an explicit zero `nn.pad` in front of a conv2d becomes the conv's own padding;
a pad of all zeros is dropped.

Contract. In every Relax function:
  - `p = nn.pad(x, widths)` with every width 0 is `x` (TF-ported models emit them: MobileNetV2's
    "same" padding of a stride-1 1x1 conv);
  - `y = nn.conv2d(p, W, padding=(t, l, b, r))` where `p = nn.pad(x, widths, "constant", 0.0)` pads
    only the conv's spatial axes (H and W of its data_layout), by non-negative widths, becomes
    `nn.conv2d(x, W, padding=(t + ph0, l + pw0, b + ph1, r + pw1))`.
A conv pads its input with zeros before its window slides, so both forms compute the same sums,
term for term. The pad stays when something else reads it (DeadCodeElimination drops it
otherwise).

Why: TF-style "same" padding arrives as a separate op (transformers' MobileNetV2 and EfficientNet
with tf_padding). Fusion then puts it into the epilogue of the conv before it, where the conv rule
cannot write it from its register tile: the whole output is stored, then padded in a second pass
(MobileNetV2's 16->96 1x1 conv at 112x112 with the next depthwise conv's padding: 0.87 ms at 44
GFLOP/s, flagged a roofline cliff on znver4). As the conv's own padding it is the padded input
stage the conv rule already has.

Must not fire: a pad with a non-zero value or a reflect/edge mode, a pad of the batch or channel
axis, a negative width (a crop), a conv whose layout has no H and W. Runs for every variant and
target alike (pipeline.constant_passes), so variants still compare fusion.
"""
from __future__ import annotations

import tvm
from tvm import relax

from ..relax_utils import rewrite_relax_functions


def _widths(call):
    return [int(v) for v in call.attrs.pad_width]


def _is_zero_pad(call):
    return isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.pad" \
        and all(w == 0 for w in _widths(call))


def _foldable(pad, conv):
    """The spatial (before, after) widths of `pad` in `conv`'s data layout, or None."""
    if not (isinstance(pad, relax.Call) and isinstance(pad.op, tvm.ir.Op) and pad.op.name == "relax.nn.pad"):
        return None
    if str(pad.attrs.pad_mode) != "constant" or float(pad.attrs.pad_value) != 0.0:
        return None
    widths = _widths(pad)
    layout = str(conv.attrs.data_layout)
    if len(widths) != 2 * len(layout) or "H" not in layout or "W" not in layout or min(widths) < 0:
        return None
    h, w = layout.index("H"), layout.index("W")
    if any(widths[2 * i] or widths[2 * i + 1] for i in range(len(layout)) if i not in (h, w)):
        return None
    return (widths[2 * h], widths[2 * h + 1]), (widths[2 * w], widths[2 * w + 1])


@relax.expr_functor.mutator
class _Fold(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.changed = 0

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if _is_zero_pad(call):
            self.changed += 1
            return call.args[0]
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d"):
            return call
        data = call.args[0]
        pad = self.lookup_binding(data) if isinstance(data, relax.Var) else None
        spatial = _foldable(pad, call) if pad is not None else None
        if spatial is None:
            return call
        (ph0, ph1), (pw0, pw1) = spatial
        t, left, b, r = (int(p) for p in call.attrs.padding)
        a = call.attrs
        self.changed += 1
        return relax.op.nn.conv2d(pad.args[0], call.args[1], strides=a.strides,
                                  padding=(t + ph0, left + pw0, b + ph1, r + pw1), dilation=a.dilation,
                                  groups=a.groups, data_layout=a.data_layout, kernel_layout=a.kernel_layout,
                                  out_layout=a.out_layout, out_dtype=a.out_dtype)


@tvm.transform.module_pass(opt_level=0, name="tvmfuse.FoldExplicitPadding")
def FoldExplicitPadding(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 (a pass, named like TVM's)
    fold = _Fold(mod)
    out = rewrite_relax_functions(mod, fold, lambda: fold.changed)
    return mod if out is None else relax.transform.CanonicalizeBindings()(relax.transform.Normalize()(out))
