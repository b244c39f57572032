"""What AOTAutograd is handed for tvmfuse's training and update graphs (torch_train.py,
torch_update.py): the decompositions, and the partitioner that splits a joint graph into forward and
backward.

Contract: `decompositions()` is core ATen's table, plus torch's own decompositions of the
normalizations whose saved statistics TVM's converters drop (`_DECOMPOSED`), plus var_mean as the
var and mean TVM converts. `PARTITIONERS[name]()` is the partition function the backend option
`partitioner` names.
"""
from __future__ import annotations

import torch

# decomposed by torch before export: TVM 0.27's converters of the normalizations return the
# normalized output only (the mean and rstd native_layer_norm returns are lost;
# _native_batch_norm_legit_functional's saved statistics and new running variance are zeros), and
# the backward reads them
_DECOMPOSED = ("native_layer_norm", "_native_batch_norm_legit_functional", "_native_batch_norm_legit",
               "native_batch_norm", "native_group_norm")


def _min_cut():
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    return min_cut_rematerialization_partition


def _default():
    from torch._functorch.partitioners import default_partition

    return default_partition


# options={"partitioner": ...} of the backend. "min_cut" (Inductor's, the default): the forward saves
# fewer tensors (resnet-tiny's forward returns 42 instead of 47; an MLP saves a weight, not its
# transpose, so no view is replayed and detached per step), and cheap elementwise ops (a ReLU mask, a
# normalization's scaling) are recomputed in the backward, where they fuse. "default" (AOTAutograd's):
# the forward saves everything the backward reads; resnet-tiny's step then takes one launch fewer.
PARTITIONERS = {"min_cut": _min_cut, "default": _default}


def decompositions() -> dict:
    """Core ATen's decompositions, and torch's own for the normalizations whose statistics the
    backward reads (`_DECOMPOSED`)."""
    from torch._decomp import core_aten_decompositions, get_decompositions

    aten = torch.ops.aten
    table = dict(core_aten_decompositions())
    table.update(get_decompositions([getattr(aten, name) for name in _DECOMPOSED]))
    table[aten.var_mean.correction] = _var_mean
    return table


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    """var_mean (what the normalizations' decompositions compute with; TVM has no converter, and
    torch's decomposition of it leaves prims) as the var and mean TVM converts."""
    aten = torch.ops.aten
    dims = list(range(x.dim())) if dim is None else dim
    return aten.var.correction(x, dims, correction=correction, keepdim=keepdim), aten.mean.dim(x, dims, keepdim)
