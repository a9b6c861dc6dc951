"""NCCL's tuning model for the all-reduce: the latency and bandwidth NCCL predicts for each
algorithm (ring, tree) and protocol (LL, LL128, Simple), the protocol it picks, and the
adjustments the timed executor takes from it.

Every constant is NCCL's, from ``src/graph/tuning.cc`` of NVIDIA/nccl (master, commit
5067397c), cited by line:

* base latency per call (us): tree 6.8 / 14.0 / 8.4, ring 6.6 / 14.0 / 8.4 (LL / LL128 /
  Simple) -- ``baseLatencies``, lines 149-154;
* per-hop latency (us): NVLink tree 0.6 / 1.25 / 4.0, ring 0.6 / 1.9 / 3.4; network tree
  5.0 / 8.5 / 14, ring 2.7 / 4.0 / 14.0 -- ``hwLatencies``, lines 158-159 and 170-171;
* LL bandwidth caps (GB/s, one node by GPU, several by CPU: Intel 39.0 / 39.0 / 20.4 for
  1 / 2 / more nodes; Ampere 87.7, Hopper 141.0 on one node) -- lines 177-182 (``llMaxBws``),
  index chosen at lines 267-272;
* per-channel caps (GB/s): ring LL128 Ampere 20.0, Hopper 36.7 (``perChMaxRingLL128Bws``,
  lines 184-189); tree LL128 Ampere 20.0, Hopper 36.7 / 36.7 / 29.0 (``perChMaxTreeLL128Bws``,
  191-196); tree Ampere 24.0 / 23.6 / 17.8, Hopper 38.7 / 41.4 / 36.0 (``perChMaxTreeBws``,
  198-203);
* busbw refinements: ring LL x0.5 capped by the LL cap (line 327), ring LL128 x0.92 capped per
  channel (329), tree x0.92 capped per channel (331), tree LL /3.8 capped by the LL cap (332),
  tree LL128 x120/128 (7/9 on one node) capped per channel (334-335); busbw -> algbw: ring
  x nRanks / nsteps, tree x0.5 (378-381);
* ring latency: base + (nsteps - nInterSteps) x max(NVLink hop, net overhead) + nInterSteps x
  network hop, nsteps = 2(nRanks - 1), nInterSteps = 2(nNodes - 1) (lines 403-412); the net
  overhead is 1 us on an x86 host (Intel or other: ``getNetOverhead``, lines 228-233), x3 for
  Simple (408); tree latency: base + 2((ppn - 1) NVLink hop + log2(nNodes) network hop)
  (416); a one-rank-per-node network hop is the tree's (387);
* in-network algorithms (Simple only, line 302): NVLS and NVLSTree per channel
  min(bwIntra x ``nvlsEfficiency`` (0.85 on Hopper, lines 138-143) x (nCh - 1) / nCh x 2,
  bwInter (x2 for NVLSTree on <= 2 nodes), NVLSTree's cap ``perChMaxNVLSTreeBws`` Hopper
  57.7 / 45.5 GB/s on 2 / more nodes, lines 205-211) (lines 307-322), algbw = busbw x nRanks /
  nsteps (378-381); CollNetDirect nCh x bwIntra / (GPU:NIC ratio), x0.85 on Hopper (339-349),
  algbw x0.5; latencies (base 0, lines 149-154; NVLink NVLS / NVLSTree 25 us, CollNetDirect
  3.7, line 160-161; network NVLS 18, NVLSTree 20.9, CollNetDirect 31, lines 172-173):
  NVLS intraLat (+ interLat on several nodes), NVLSTree intraLat + 2 log2(nNodes) interLat,
  CollNetDirect 2(min(1, ppn - 1) intraLat + 0.4 (ppn - 1)) + interLat (lines 418-428). NVLSTree
  needs several nodes, NVLS on several nodes and CollNet need CollNet (IB SHARP, off unless
  ``NCCL_COLLNET_ENABLE``) (lines 500-506; ``src/enqueue.cc`` 2000-2008);
* time = latency + bytes / (1000 x algbw) (``ncclTopoGetAlgoTime``, line 653), with the tree's
  bandwidth times a size-indexed correction (``treeCorrectionFactor``, lines 623-627, applied at
  640-641) and a multi-node Simple ring's latency x1.4 (x1.9 before Ampere) once a rank's share of
  a channel is >= 64 B (the "plateau effect", lines 647-650).

NCCL's graph (its channels and their bandwidth) is what its topology search finds; here it is
derived from the fabric (``graph_of``): two NCCL channels per NIC (16 on a DGX, as NCCL runs
it), each with half a NIC's bandwidth across nodes, 1/16 of the NVLink bandwidth on one node.
The NVLS graph (``src/graph/search.cc``) has one channel per head, i.e. per GPU with a NIC
(``per_node``, line 1127); its bwIntra is the fastest search speed (lines 1057-1059) at which
every GPU's NVSwitch port carries its (p + 1) pulls, one per head and two for its own
(``ncclTopoSearchTryNvls``, lines 410-440): 40 GB/s on 8 H100 (9 x 40 <= 370.8); its bwInter
is raised up to just under 2 x bwIntra (lines 1274-1278): to the NIC's 48 across nodes, 60 on
one node. So NVLS on 8 H100 is 8 x 40 x 0.85 x 7/8 x 2 = 476 GB/s busbw (nccl-tests #212:
~480), NVLSTree 8 x 57.7 = 462 on two nodes and 8 x 45.5 = 364 on more. The CollNetDirect
graph is taken as the same heads at the NIC's 48 GB/s (an assumption: its search is not
modelled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Graph", "graph_of", "latency", "bandwidth", "time", "choose", "efficiency",
           "call_graph", "as_nccl_runs", "algorithms", "PROTOCOLS", "ALGORITHMS",
           "NVLS_EFFICIENCY"]

PROTOCOLS = ("LL", "LL128", "Simple")
# NCCL's algorithms for the all-reduce (PAT is not one: tuning.cc:299), by the simulator's names
ALGORITHMS = ("tree", "ring", "collnet_direct", "nvls", "nvls_tree")
IN_NETWORK = ALGORITHMS[2:]                                               # Simple only (:302)
BASE = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4),               # tuning.cc:149-154
        "collnet_direct": (0, 0, 0), "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0)}
HW = {"nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4),       # :158-161
                 "collnet_direct": (0, 0, 3.7), "nvls": (0, 0, 25.0), "nvls_tree": (0, 0, 25.0)},
      "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0),         # :170-173
              "collnet_direct": (0, 0, 31.0), "nvls": (0, 0, 18.0), "nvls_tree": (0, 0, 20.9)}}
NVLS_EFFICIENCY = {"hopper": 0.85}                                        # :138-143 (0: Ampere)
NVLS_TREE = {"hopper": (0.0, 57.7, 45.5)}                                 # :205-211
COLLNET_HOPPER = 0.85                                                     # :348
ARITY_LATENCY = 0.4                                                       # us, :420
# search.cc:1057-1059, the Hopper search speeds (GB/s per channel) inside a node and across
SM90_INTRA = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)
SM90_INTER = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0)
LL_MAX = {"intel": (39.0, 39.0, 20.4), "ampere": (87.7,), "hopper": (141.0,)}   # :177-182
RING_LL128 = {"ampere": 20.0, "hopper": 36.7}                             # :184-189
TREE_LL128 = {"ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 29.0)}   # :191-196
TREE = {"ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0)}        # :198-203
TREE_CORRECTION = (                                                       # :623-627
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0,
     1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9,
     1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9,
     .9))
NET_OVERHEAD = 1.0                          # us, x86 host (tuning.cc:228-233)
PLATEAU = {"ampere": 1.4, "hopper": 1.4}    # multi-node Simple ring (tuning.cc:649)


@dataclass(frozen=True)
class Graph:
    """What NCCL's tuning sees: nodes, ranks per node, channels, GB/s per channel, GPU."""

    nodes: int
    ppn: int
    channels: int
    bw: float                     # GB/s per channel (NCCL's bwIntra on <= 2 nodes, else bwInter)
    gpu: str                      # "ampere" or "hopper"
    nvls: tuple = ()              # the NVLS graph with NVLink SHARP: (heads, bwIntra, bwInter)
    collnet: bool = False         # CollNet (IB SHARP) enabled

    @property
    def nranks(self) -> int:
        return self.nodes * self.ppn

    def _index(self) -> int:
        return min(self.nodes, 3) - 1            # N1 / N2 / N4 (tuning.cc:267)


def graph_of(fabric, channels: int | None = None) -> Graph:
    """NCCL's graph on ``fabric`` (a preset with ``gpu``): two NCCL channels per NIC, i.e. per
    channel of the timed executor (``channels``, default one per NIC), each with half a NIC's
    bandwidth across nodes, 1 / (2 per_node) of the NVLink bandwidth on one node."""
    nch = 2 * (channels or fabric.per_node)
    per = (fabric.intra.bandwidth / (2 * fabric.per_node) if fabric.nodes == 1
           else fabric.nic.bandwidth / 2)
    nvls = ()
    if fabric.nvls and fabric.per_node > 1:
        p, port = fabric.per_node, fabric.intra.bandwidth / 1e9
        speeds = SM90_INTRA if fabric.nodes == 1 else SM90_INTER
        intra = next((s for s in speeds if (p + 1) * s <= port), speeds[-1])
        inter = next(s for s in speeds if s < 2 * intra
                     and (fabric.nodes == 1 or s <= fabric.nic.bandwidth / 1e9))
        nvls = (p, intra, inter)
    return Graph(fabric.nodes, fabric.per_node, nch, per / 1e9, fabric.gpu, nvls,
                 fabric.collnet and fabric.nodes > 1)


def algorithms(g: Graph) -> tuple:
    """The all-reduce algorithms NCCL enables on ``g`` (tuning.cc:497-510, enqueue.cc:2000-2008):
    ring and tree; NVLS with NVLink SHARP (on several nodes only with CollNet); NVLSTree with
    NVLink SHARP on several nodes; CollNetDirect with CollNet."""
    out = ["tree", "ring"]
    if g.collnet:
        out.append("collnet_direct")
    if g.nvls and (g.nodes == 1 or g.collnet):
        out.append("nvls")
    if g.nvls and g.nodes > 1:
        out.append("nvls_tree")
    return tuple(out)


def bandwidth(g: Graph, algo: str, proto: str, nbytes: float | None = None) -> float:
    """NCCL's algorithm bandwidth, GB/s (tuning.cc:324-381, the tree's correction at 640)."""
    p = PROTOCOLS.index(proto)
    if algo in IN_NETWORK:
        return _in_network_bandwidth(g, algo, proto)
    raw = g.channels * g.bw
    ll_max = (LL_MAX[g.gpu][0] if g.nodes == 1 else LL_MAX["intel"][g._index()])
    if algo == "ring":
        bus = {"LL": min(ll_max, raw * .5), "LL128": min(raw * .92, g.channels * RING_LL128[g.gpu]),
               "Simple": raw}[proto]
        return bus * g.nranks / (2 * (g.nranks - 1))
    bus = min(raw * .92, g.channels * TREE[g.gpu][g._index()])
    if proto == "LL":
        bus = min(bus / 3.8, ll_max)
    elif proto == "LL128":
        bus = min(bus * (7 / 9 if g.nodes == 1 else 120 / 128),
                  g.channels * TREE_LL128[g.gpu][g._index()])
    bw = bus * .5
    if nbytes is not None:
        log_size = int(nbytes) >> 6
        log_size = log_size.bit_length() - 1 if log_size else -1
        if 0 <= log_size < 23:
            bw *= TREE_CORRECTION[p][log_size]
    return bw


def _in_network_bandwidth(g: Graph, algo: str, proto: str) -> float:
    """NVLS, NVLSTree, CollNetDirect: NCCL's algbw, GB/s; 0 where NCCL disables it."""
    if proto != "Simple" or algo not in algorithms(g) or g.nranks == 1:
        return 0.0
    ratio = g.nranks / (2 * (g.nranks - 1))
    if algo == "collnet_direct":                  # the heads at the NIC's speed (see above)
        heads = g.nvls[0] if g.nvls else g.ppn
        bus = heads * 2 * g.bw / max(1.0, g.ppn / heads - (g.ppn / heads - 1) / 2)
        return bus * (COLLNET_HOPPER if g.gpu == "hopper" else 1.0) * .5
    heads, bw_intra, bw_inter = g.nvls
    intra = bw_intra * NVLS_EFFICIENCY[g.gpu] * (heads - 1) / heads * 2
    inter = bw_inter * (2 if algo == "nvls_tree" and g.nodes <= 2 else 1)
    cap = NVLS_TREE[g.gpu][g._index()] if algo == "nvls_tree" else float("inf")
    return heads * min(intra, inter, cap) * ratio


def latency(g: Graph, algo: str, proto: str, nbytes: float | None = None) -> float:
    """NCCL's latency, us (tuning.cc:384-428; the ring's plateau factor at 647-650)."""
    p = PROTOCOLS.index(proto)
    intra = HW["nvlink"][algo][p]
    inter = HW["net"]["tree" if g.ppn == 1 else algo][p]
    if algo == "nvls":
        return intra + (inter if g.nodes > 1 else 0.0)
    if algo == "nvls_tree":
        return BASE[algo][p] + intra + 2 * int(math.log2(g.nodes)) * inter
    if algo == "collnet_direct":
        return (BASE[algo][p] + 2 * (min(1, g.ppn - 1) * intra + (g.ppn - 1) * ARITY_LATENCY)
                + inter)
    if algo == "tree":
        return BASE["tree"][p] + 2 * ((g.ppn - 1) * intra + int(math.log2(g.nodes)) * inter)
    nsteps = 2 * (g.nranks - 1)
    ninter = 2 * (g.nodes - 1) if g.nodes > 1 else 0
    if g.nodes > 1:
        intra = max(intra, NET_OVERHEAD * (3 if proto == "Simple" else 1))
    lat = BASE["ring"][p] + (nsteps - ninter) * intra + ninter * inter
    if (proto == "Simple" and g.nodes > 1 and nbytes is not None
            and nbytes / (g.channels * g.nranks) >= 64):
        lat *= PLATEAU[g.gpu]
    return lat


def time(g: Graph, algo: str, proto: str, nbytes: float) -> float:
    """NCCL's predicted all-reduce time, seconds (tuning.cc:653); inf where NCCL has no such
    (algorithm, protocol) on ``g`` (its bandwidth 0: tuning.cc:636-639)."""
    bw = bandwidth(g, algo, proto, nbytes)
    if bw <= 0:
        return float("inf")
    return (latency(g, algo, proto, nbytes) + nbytes / (1000 * bw)) * 1e-6


def choose(g: Graph, nbytes: float, algos=("ring", "tree")) -> tuple[str, str]:
    """The (algorithm, protocol) NCCL's tuning picks among ``algos`` (``algorithms(g)``: all it
    enables): the least predicted time (``src/enqueue.cc`` ``topoGetAlgoInfo``)."""
    return min(((a, p) for a in algos for p in PROTOCOLS), key=lambda ap: time(g, *ap, nbytes))


def efficiency(g: Graph, algo: str, proto: str, nbytes: float) -> float:
    """The share of its links' bandwidth a protocol gets in NCCL's model: its bandwidth over the
    graph's raw one (busbw before the caps and factors), as the timed executor applies it."""
    raw = g.channels * g.bw
    ratio = g.nranks / (2 * (g.nranks - 1)) if algo == "ring" else .5
    return bandwidth(g, algo, proto, nbytes) / (raw * ratio)


# ----------------------------------------------------------------------------- the timed executor

def call_graph(fabric, collective: str, algorithm: str, channels: int | None):
    """NCCL's tuning graph when NCCL has a model of this call (a ring or tree all-reduce on a
    fabric that names its GPU), with the call's channels, else None."""
    if (fabric.gpu is None or collective != "allreduce"
            or algorithm not in ("ring", "double_binary_tree")):
        return None
    return graph_of(fabric, channels)


def as_nccl_runs(fabric, nccl, name: str, tree: bool, nbytes: int):
    """``fabric`` under protocol ``name`` and its per-call base latency; with NCCL's graph, its
    adjustments too (``nccl_tuning``): the protocol's bandwidth share (caps and factors), a
    multi-node ring's intra-node hop no faster than the network overhead, and the multi-node
    Simple ring's 1.4x latency."""
    p = fabric.protocols[name]
    if nccl is None:
        return fabric.with_protocol(name, tree), p.base_of(tree)
    kind = "tree" if tree else "ring"
    floor = scale = 0.0
    if kind == "ring" and nccl.nodes > 1:
        floor = NET_OVERHEAD * (3 if name == "Simple" else 1) * 1e-6
        if name == "Simple" and nbytes / (nccl.channels * nccl.nranks) >= 64:
            scale = PLATEAU[nccl.gpu]
    scale = scale or 1.0
    eff = min(1.0, efficiency(nccl, kind, name, nbytes))
    return (fabric.with_protocol(name, tree, efficiency=eff, intra_floor=floor, scale=scale),
            p.base_of(tree) * scale)
