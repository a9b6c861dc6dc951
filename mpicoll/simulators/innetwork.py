"""In-network reduction: NVLink SHARP (NVLS) all-reduce inside one node (issue 45, item 2).

The NVSwitch reduces: every GPU sends each of its n bytes up to the switch once (``multimem``
``ld_reduce``: GPU j pulls its n/p shard, reduced across the p GPUs, from the switch), then
stores its reduced shard once, n/p bytes up, which the switch multicasts to all p GPUs (n/p
down to each, from every shard: n down). Each GPU's port carries n + n/p each way, against the
ring's 2n(p-1)/p, at NCCL's NVLS efficiency (``nvlsEfficiency``, 0.85 on Hopper,
src/graph/tuning.cc lines 140-145) of the port, after NCCL's NVLS latency (NVLink, Simple:
25 us, ``hwLatencies`` line 160; base 0, line 152):

    T = 25 us + n (1 + 1/p) / (0.85 B)

On 8 H100 (B = 370.8 GB/s) that is busbw = algbw x 2(p-1)/p = 490 GB/s for large n, where
nccl-tests #212 reports ~480 (algbw ~275). Across nodes (NVLSTree, CollNet / IB SHARP) is not
modelled: a fabric with ``nvls`` and more than one node is refused.
"""

from __future__ import annotations

import numpy as np

from .fabric import PATH_NAMES
from .result import Timing, call_count

__all__ = ["nvls", "NVLS_EFFICIENCY", "NVLS_LATENCY"]

NVLS_EFFICIENCY = {"hopper": 0.85}     # tuning.cc:140-145 (Blackwell 0.74, not modelled)
NVLS_LATENCY = 25e-6                   # tuning.cc:160 (NVLink NVLS Simple), base 0 (:152)


def nvls(fabric, nbytes: int, *, itemsize: int = 4, delay=None):
    """One NVLS all-reduce of ``nbytes`` on ``fabric`` (one node, ``fabric.nvls``): a
    ``timed.Timing`` (the protocol is Simple, NVLS's only one)."""
    if not fabric.nvls or fabric.nodes != 1:
        raise ValueError(f"nvls needs one node of a fabric with NVLink SHARP (dgx-h100, "
                         f"dgx-h200), got {fabric.name} with {fabric.nodes} node(s)"
                         + ("" if fabric.nvls else " and no nvls"))
    p = fabric.per_node
    n = call_count("allreduce", nbytes, p, itemsize) * itemsize
    rate = fabric.intra.bandwidth * NVLS_EFFICIENCY[fabric.gpu]
    moved = n + n / p                                  # each way, per port
    d = np.zeros(p) if delay is None else np.asarray(delay, dtype=np.float64)
    start = float(d.max())                             # the switch waits for every GPU
    transfer = moved / rate if p > 1 else 0.0
    latency = NVLS_LATENCY if p > 1 else 0.0
    t = start + latency + transfer
    path = {name: 0.0 for name in PATH_NAMES}
    path[PATH_NAMES[0]] = p * moved
    messages = {name: 0 for name in PATH_NAMES}
    messages[PATH_NAMES[0]] = 2 * p if p > 1 else 0
    return Timing(fabric.name, p, n, np.full(p, t), t, path, messages,
                  {"intra": 2 * p * moved, "nic": 0.0, "spine": 0.0}, moved,
                  "intra-node port up, rank 0" if p > 1 else "(none)", 0, 0, rate,
                  {"delay": start, "latency": latency, "transfer": transfer, "reduction": 0.0,
                   "messages": 2.0 if p > 1 else 0.0}, 2, "allreduce", transfer, "Simple", 1)
