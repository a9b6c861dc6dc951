"""In-network reduction (issue 45, item 2): the switches reduce, as NCCL's NVLS, NVLSTree and
CollNetDirect algorithms have them do.

Each is a pipeline of slices through two stages, the NVLink ports of a node and its NICs, so it
takes its latency plus the bytes of the busier stage at that stage's rate. With p GPUs per node,
each with its own NIC (a head: NCCL's ``NVLS Head`` lines, one channel each), n bytes:

* **NVLS** (NVLink SHARP, one node): every GPU's n bytes go up to the NVSwitch once
  (``multimem.ld_reduce``: head j pulls its n/p shard reduced across the p GPUs), each head
  stores its reduced shard once, n/p up, which the switch multicasts to all p GPUs (n down):
  each port carries n (1 + 1/p) each way, at NCCL's NVLS efficiency of the port
  (``nvlsEfficiency``, 0.85 on Hopper, ``src/graph/tuning.cc`` lines 138-143), after NCCL's NVLS
  latency (NVLink, Simple: 25 us, line 161; base 0, line 152)::

      T = 25 us + n (1 + 1/p) / (0.85 B)

  On 8 H100 (B = 370.8 GB/s) busbw = algbw x 2(p-1)/p = 490 GB/s for large n, where
  nccl-tests #212 reports ~480 (algbw ~275). On several nodes NVLS needs CollNet (IB SHARP,
  ``enqueue.cc`` line 2008): each head also sends its n/p shard to the network's SHARP tree and
  gets it back reduced, n/p each way on its NIC, after 25 + 18 us (network NVLS, line 173).
* **NVLSTree** (several nodes): NVLS inside each node (the same port bytes), and between the
  nodes each head's n/p shard reduced up and broadcast down two binary trees of the nodes (each
  carrying half: NCCL's ``ncclGetDtree``), so a NIC carries n/p each way on two nodes (a pair:
  one child, one root) and 2n/p on more (a node is interior in one tree, two children, and a
  leaf in the other). NCCL's kernels stay below a per-channel busbw (``perChMaxNVLSTreeBws``,
  Hopper 57.7 GB/s on two nodes, 45.5 on more, lines 205-211), which bounds the rate too.
  Latency 25 us + 2 floor(lg nodes) x 20.9 us (network NVLSTree, line 173; lines 427-428).
* **CollNetDirect** (IB SHARP, ``collnet`` fabrics): inside the node a direct reduce-scatter to
  the p heads and a direct all-gather from them over NVLink (2n(p-1)/p each way per port, at
  NCCL's Hopper factor 0.85, line 348), between the nodes each head's n/p shard up the SHARP
  tree and back (n/p each way per NIC). Latency 2(3.7 + 0.4 (p - 1)) + 31 us (lines 160, 172,
  418-421).

A call starts when its last rank arrives (``delay``): the switch waits for every input.
"""

from __future__ import annotations

import math

import numpy as np

from . import nccl_tuning
from .fabric import PATH_NAMES
from .result import Timing, call_count

__all__ = ["nvls", "nvls_tree", "collnet", "ALGORITHMS", "NVLS_EFFICIENCY", "NVLS_LATENCY"]

NVLS_EFFICIENCY = nccl_tuning.NVLS_EFFICIENCY        # tuning.cc:138-143 (Blackwell not modelled)
NVLS_LATENCY = 25e-6                                 # tuning.cc:161 (NVLink NVLS Simple), base 0
_US = 1e-6


def _hw(kind: str, algo: str) -> float:
    """NCCL's per-hop latency of ``algo`` (Simple) on ``kind`` ("nvlink", "net"), seconds."""
    return nccl_tuning.HW[kind][algo][2] * _US


def _call(fabric, nbytes, itemsize, delay, *, intra_bytes, intra_rate, nic_bytes, latency,
          cap=np.inf, pairs=0) -> Timing:
    """A two-stage pipeline: each port carries ``intra_bytes`` each way at ``intra_rate``, each
    NIC ``nic_bytes`` each way; its transfer is the busier stage's, at least n / ``cap``.
    ``pairs``: the rank pairs whose messages cross nodes (none when a switch reduces)."""
    p, N = fabric.per_node, fabric.size
    n = call_count("allreduce", nbytes, N, itemsize) * itemsize
    d = np.zeros(N) if delay is None else np.asarray(delay, dtype=np.float64)
    if d.shape != (N,) or not (d >= 0).all():
        raise ValueError(f"delay must be {N} non-negative seconds (one per rank), got "
                         f"{d.shape[0] if d.ndim == 1 else d.shape} values")
    start = float(d.max())                             # the switch waits for every GPU
    intra_t = intra_bytes(n) / intra_rate if p > 1 else 0.0
    nic_t = nic_bytes(n) / fabric.nic.bandwidth if fabric.nodes > 1 else 0.0
    capped = n / cap if N > 1 else 0.0
    transfer = max(intra_t, nic_t, capped)
    lat = latency if N > 1 else 0.0
    t = start + lat + transfer
    bottleneck = ("(none)" if N == 1 else "NCCL's per-channel cap" if capped > max(intra_t, nic_t)
                  else "intra-node port up, rank 0" if intra_t >= nic_t else "NIC up, rank 0")
    path = dict.fromkeys(PATH_NAMES, 0.0)
    messages = dict.fromkeys(PATH_NAMES, 0)
    if p > 1:
        path[PATH_NAMES[0]] = N * intra_bytes(n)
        messages[PATH_NAMES[0]] = 2 * N
    if fabric.nodes > 1:                               # head c's traffic stays on rail c
        path[PATH_NAMES[1]] = N * nic_bytes(n)
        messages[PATH_NAMES[1]] = 2 * N
    moved = nic_bytes(n) if bottleneck.startswith("NIC") else intra_bytes(n)
    rate = min(intra_rate if p > 1 else np.inf,
               fabric.nic.bandwidth if fabric.nodes > 1 else np.inf, cap)
    return Timing(fabric.name, N, n, np.full(N, t), t, path, messages,
                  {"intra": 2 * path[PATH_NAMES[0]], "nic": 2 * path[PATH_NAMES[1]],
                   "spine": 0.0},
                  moved if N > 1 else 0.0, bottleneck, pairs, 0,
                  rate, {"delay": start, "latency": lat, "transfer": transfer, "reduction": 0.0,
                         "messages": 2.0 if N > 1 else 0.0},
                  2, "allreduce", transfer, "Simple", p if fabric.nodes > 1 else 1)


def _need(fabric, name: str, ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"{name} needs {what}, got {fabric.name} with {fabric.nodes} node(s)"
                         + ("" if fabric.nvls else ", no NVLink SHARP")
                         + ("" if fabric.collnet else ", no IB SHARP (collnet)"))


def nvls(fabric, nbytes: int, *, itemsize: int = 4, delay=None) -> Timing:
    """One NVLS all-reduce of ``nbytes`` on ``fabric`` (NVLink SHARP: one node, or several with
    IB SHARP): a ``timed.Timing`` (the protocol is Simple, NVLS's only one)."""
    _need(fabric, "nvls", fabric.nvls and (fabric.nodes == 1 or fabric.collnet),
          "one node of a fabric with NVLink SHARP (dgx-h100, dgx-h200), or several with IB "
          "SHARP too (collnet: dgx-h100-sharp)")
    p = fabric.per_node
    lat = NVLS_LATENCY + (_hw("net", "nvls") if fabric.nodes > 1 else 0.0)
    return _call(fabric, nbytes, itemsize, delay,
                 intra_bytes=lambda n: n + n / p,
                 intra_rate=fabric.intra.bandwidth * NVLS_EFFICIENCY[fabric.gpu],
                 nic_bytes=lambda n: n / p, latency=lat)


def nvls_tree(fabric, nbytes: int, *, itemsize: int = 4, delay=None) -> Timing:
    """One NVLSTree all-reduce: NVLS inside each node, two binary trees of the nodes between."""
    _need(fabric, "nvls_tree", fabric.nvls and fabric.nodes > 1,
          "several nodes of a fabric with NVLink SHARP (dgx-h100, dgx-h200)")
    p, N = fabric.per_node, fabric.nodes
    per_channel = nccl_tuning.NVLS_TREE[fabric.gpu][min(N, 3) - 1] * 1e9
    P = fabric.size
    lat = NVLS_LATENCY + 2 * int(math.log2(N)) * _hw("net", "nvls_tree")
    return _call(fabric, nbytes, itemsize, delay,
                 intra_bytes=lambda n: n + n / p,
                 intra_rate=fabric.intra.bandwidth * NVLS_EFFICIENCY[fabric.gpu],
                 nic_bytes=lambda n: (1 if N == 2 else 2) * n / p, latency=lat,
                 cap=p * per_channel * P / (2 * (P - 1)),
                 pairs=4 * p * (N - 1))          # each head: 2 trees x (N - 1) edges, both ways


def collnet(fabric, nbytes: int, *, itemsize: int = 4, delay=None) -> Timing:
    """One CollNetDirect all-reduce: direct reduce-scatter and all-gather with the heads over
    NVLink, the heads' shards reduced by the network's switches (IB SHARP)."""
    _need(fabric, "collnet", fabric.collnet and fabric.nodes > 1,
          "several nodes of a fabric with IB SHARP (collnet: dgx-h100-sharp)")
    p = fabric.per_node
    lat = (2 * (min(1, p - 1) * _hw("nvlink", "collnet_direct")
                + (p - 1) * nccl_tuning.ARITY_LATENCY * _US) + _hw("net", "collnet_direct"))
    factor = nccl_tuning.COLLNET_HOPPER if fabric.gpu == "hopper" else 1.0
    return _call(fabric, nbytes, itemsize, delay,
                 intra_bytes=lambda n: 2 * n * (p - 1) / p,
                 intra_rate=fabric.intra.bandwidth * factor,
                 nic_bytes=lambda n: n / p, latency=lat)


# name -> (timing function, NCCL's name of it in nccl_tuning)
ALGORITHMS = {"nvls": (nvls, "nvls"), "nvls_tree": (nvls_tree, "nvls_tree"),
              "collnet": (collnet, "collnet_direct")}
