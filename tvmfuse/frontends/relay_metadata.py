"""Decode the `#[metadata]` section TVM appended to Relay text (`mod.astext(show_meta_data=True)`).

The section is TVM's SaveJSON graph: `root` is a Map node whose `keys` name the meta tables
("relay.Constant") and whose `data` point at Array nodes; each `relay.Constant` node's `attrs.data`
indexes `b64ndarrays`, base64 of TVM's NDArray binary format:

  u64 magic 0xDD5E40F096B4A13F | u64 reserved | i32 device_type, i32 device_id | i32 ndim |
  u8 dtype code, u8 bits, u16 lanes | i64 shape[ndim] | i64 nbytes | data (little endian)

`relay_constants(json_text)` returns the arrays in meta[relay.Constant] order. Anything that does
not follow this layout is a FrontendError (the caller can still pass constants= by hand).
"""
from __future__ import annotations

import base64
import json
import struct

import numpy as np

from ..errors import FrontendError

_MAGIC = 0xDD5E40F096B4A13F
_CODES = {0: "int", 1: "uint", 2: "float"}


def decode_ndarray(b64: str) -> np.ndarray:
    raw = base64.b64decode(b64)
    magic, _reserved, _dev_type, _dev_id, ndim, code, bits, lanes = struct.unpack_from("<QQiiiBBH", raw, 0)
    if magic != _MAGIC:
        raise FrontendError(f"#[metadata]: an array does not start with TVM's NDArray magic ({magic:#x})")
    if code not in _CODES or lanes != 1:
        raise FrontendError(f"#[metadata]: unsupported array dtype (code {code}, bits {bits}, lanes {lanes})")
    off = struct.calcsize("<QQiiiBBH")
    shape = struct.unpack_from(f"<{ndim}q", raw, off)
    off += 8 * ndim
    (nbytes,) = struct.unpack_from("<q", raw, off)
    off += 8
    dtype = np.dtype(f"{_CODES[code]}{bits}").newbyteorder("<")
    data = np.frombuffer(raw, dtype=dtype, count=nbytes // dtype.itemsize, offset=off)
    return data.reshape(shape).astype(dtype.newbyteorder("="))


def relay_constants(json_text: str) -> list[np.ndarray]:
    try:
        meta = json.loads(json_text)
        nodes, arrays = meta["nodes"], meta.get("b64ndarrays", [])
        root = nodes[meta["root"]]
        tables = dict(zip(root.get("keys", []), root.get("data", [])))
        if "relay.Constant" not in tables:
            return []
        consts = []
        for idx in nodes[int(tables["relay.Constant"])]["data"]:
            node = nodes[int(idx)]
            if node.get("type_key") != "relay.Constant":
                raise KeyError(f"node {idx} is a {node.get('type_key')}, not a relay.Constant")
            consts.append(decode_ndarray(arrays[int(node["attrs"]["data"])]))
        return consts
    except FrontendError:
        raise
    except (ValueError, KeyError, IndexError, TypeError, struct.error) as err:
        raise FrontendError(f"#[metadata] section could not be decoded ({type(err).__name__}: {err}); pass "
                            "constants=[...] or random_constants=True instead") from err
