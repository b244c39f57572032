"""Converters for the ATen ops of backward graphs that TVM 0.27's ExportedProgram importer lacks
and core ATen does not decompose (the training route, frontends/torch_train.py).

Each is `fn(node, importer) -> relax value`, passed to the importer as a custom converter
(`GRAD_CONVERTERS`). What a converter does not cover raises NotImplementedError with the reason, and
the graph runs in eager PyTorch with it logged.

- `convolution_backward` (2-D, not transposed): the gradients of `convolution` as convolutions, the
  way autograd derives them:
    grad_input  = conv2d_transpose(grad_out, weight) with the forward's stride, padding, dilation and
                  groups, and the output padding that gives back the input's size;
    grad_weight = conv2d(input^T, grad_out^T) over the batch (channels and batch swapped), with the
                  forward's dilation as stride and its stride as dilation, cut to the kernel's size
                  (groups == 1);
    grad_bias   = grad_out summed over batch and space.
  Outputs `output_mask` does not ask for are zeros no one reads (dead code after import).
- `index_put` with index tensors for leading dims only (the embedding's backward) as scatter_nd.
- `prims.fma` (a * b + c: core ATen's decomposition of an optimizer's `addcmul_`, AdamW's second
  moment) as a multiply and an add, a Python scalar operand in the tensor's dtype.
"""
from __future__ import annotations


def _pair(v):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return [int(x) for x in (v * 2 if len(v) == 1 else v)]


def _convolution_backward(node, importer):
    from tvm import relax

    args = importer.retrieve_args(node)
    grad_out, x, weight = args[0], args[1], args[2]
    stride, padding, dilation = _pair(args[4]), _pair(args[5]), _pair(args[6])
    transposed, groups, mask = bool(args[7]), int(args[9]), list(args[10])
    shape_x = [int(d) for d in importer.shape_of(x)]
    shape_w = [int(d) for d in importer.shape_of(weight)]
    shape_g = [int(d) for d in importer.shape_of(grad_out)]
    if len(shape_x) != 4 or transposed:
        raise NotImplementedError(f"convolution_backward of a {len(shape_x) - 2}-d{' transposed' if transposed else ''} "
                                  "convolution (2-d, not transposed, is converted)")
    bb = importer.block_builder
    kernel = shape_w[2:]
    dtype = x.ty.dtype
    outs = []
    if mask[0]:
        out_pad = [shape_x[2 + i] - ((shape_g[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (kernel[i] - 1) + 1)
                   for i in range(2)]
        outs.append(bb.emit(relax.op.nn.conv2d_transpose(grad_out, weight, strides=stride, padding=padding,
                                                         output_padding=out_pad, dilation=dilation, groups=groups,
                                                         kernel_layout="IOHW")))
    else:
        outs.append(bb.emit(relax.op.zeros(relax.ShapeExpr(shape_x), dtype)))
    if mask[1]:
        if groups != 1:
            raise NotImplementedError(f"the weight gradient of a grouped convolution (groups={groups})")
        xt = bb.emit(relax.op.permute_dims(x, [1, 0, 2, 3]))
        gt = bb.emit(relax.op.permute_dims(grad_out, [1, 0, 2, 3]))
        gw = bb.emit(relax.op.nn.conv2d(xt, gt, strides=dilation, padding=padding, dilation=stride))
        gw = bb.emit(relax.op.permute_dims(gw, [1, 0, 2, 3]))
        if [int(d) for d in list(importer.shape_of(gw))[2:]] != kernel:
            gw = bb.emit(relax.op.strided_slice(gw, axes=[2, 3], begin=[0, 0], end=kernel))
        outs.append(gw)
    else:
        outs.append(bb.emit(relax.op.zeros(relax.ShapeExpr(shape_w), dtype)))
    if mask[2]:
        outs.append(bb.emit(relax.op.sum(grad_out, axis=[0, 2, 3])))
    else:
        outs.append(bb.emit(relax.op.zeros(relax.ShapeExpr([shape_w[0]]), dtype)))
    return bb.emit(relax.Tuple(outs))


def _index_put(node, importer):
    """index_put with index tensors for the leading dims only (the embedding's backward: the rows
    of a [vocab, hidden] gradient indexed by the token ids, accumulated) as scatter_nd over the
    flattened indices, which TVM's converter rejects (it wants one index tensor per dim); every
    other index_put goes to TVM's converter."""
    from tvm import relax

    args = importer.retrieve_args(node)
    data, indices, values = args[0], list(args[1]), args[2]
    accumulate = bool(args[3]) if len(args) > 3 else bool(node.kwargs.get("accumulate", False))
    shape = [int(d) for d in importer.shape_of(data)]
    if (len(indices) >= len(shape) or any(i is None for i in indices)
            or len({tuple(int(d) for d in importer.shape_of(i)) for i in indices}) != 1):
        return importer._index_put(node)
    bb = importer.block_builder
    index_shape = [int(d) for d in importer.shape_of(indices[0])]
    n = 1
    for d in index_shape:
        n *= d
    cols = [bb.emit(relax.op.reshape(relax.op.astype(i, "int64"), [n, 1])) for i in indices]
    flat = cols[0] if len(cols) == 1 else bb.emit(relax.op.concat(cols, axis=1))
    rest = shape[len(indices):]
    values = bb.emit(relax.op.broadcast_to(values, relax.ShapeExpr(index_shape + rest)))
    values = bb.emit(relax.op.reshape(values, [n] + rest))
    return bb.emit(relax.op.scatter_nd(data, flat, values, "add" if accumulate else "update"))


def _fma(node, importer):
    """prims.fma(a, b, c) = a * b + c (not fused into one rounding: TVM has no fma op; the update
    graphs' tolerance against eager is 1e-5)."""
    from tvm import relax

    a, b, c = importer.retrieve_args(node)[:3]
    like = next(x for x in (a, b, c) if isinstance(x, relax.Expr))
    emit = importer.block_builder.emit

    def tensor(x):
        return x if isinstance(x, relax.Expr) else relax.const(x, like.ty.dtype)

    return emit(relax.op.add(emit(relax.op.multiply(tensor(a), tensor(b))), tensor(c)))


GRAD_CONVERTERS = {"fma.default": _fma, "convolution_backward.default": _convolution_backward, "index_put.default": _index_put,
                   "index_put_.default": _index_put}
