"""A fabric model for the timed executor: nodes of GPUs, NVSwitch inside, rails, leaves, a spine.

Ranks are placed in blocks: rank ``r`` is local rank ``r % per_node`` of node ``r // per_node``.
Every rank has

* a port on the node's switch (NVSwitch-like): an ``intra`` link each way;
* its own NIC, on rail = its local rank: a ``nic`` link each way to a leaf switch.

Leaves (``leaf=``): ``"rail"`` -- rail-optimized, one leaf per rail per group of
``nodes_per_leaf`` nodes (all nodes by default); ``"node"`` -- top-of-rack, one leaf per group of
``nodes_per_leaf`` nodes (1 by default); ``"single"`` -- one switch for every NIC, no spine. Each
leaf has one aggregate link up to the spine and one down, of capacity (NICs on the leaf x NIC
bandwidth) / ``oversubscription``; a flow through the spine also rides one physical uplink, so it
never gets more than the ``spine`` class's bandwidth.

A message takes one of three paths:

* ``intra``: source port up, destination port down (same node, ``per_node > 1``);
* ``leaf`` (same rail): source NIC up, destination NIC down (NIC -> leaf -> NIC);
* ``spine`` (cross-rail, or another group): NIC up, leaf up, leaf down, NIC down
  (NIC -> leaf -> spine -> leaf -> NIC).

A path's latency is the alpha of its class (``intra``, ``nic``, ``spine``: the spine's alpha is
the whole cross-spine path's). ``gamma`` is seconds per byte reduced.

A fabric may also declare the hosts' network stack (``stack``, bytes per second; None: not
modelled): the CPU work of moving a byte between nodes through the kernel's TCP stack and the
MPI library's copies, which every inter-node byte costs once on the host that sends it and once
on the host that receives it. Each host is one more shared link of capacity ``stack`` on every
inter-node path (twice on a path whose two ends share the host), so the ranks of a host share
it, as they share its cores. ``nodes_per_host`` nodes share one host (1 on a cluster; the
emulated nodes of ``slurm/local-cluster.sh up --fabric`` all share the one machine's).
``stack_per_flow`` (bytes per second; None: no cap) is the most one inter-node message gets
from the stack, alone (a core's work). A host may also declare ``copy`` (bytes per second; None:
not modelled): the bytes of messages between ranks of one node that its cores copy through the
MPI library's shared memory in all, every such message at once. Each host is then one more
shared link of capacity ``copy`` on every intra-node path: the ranks of its nodes share its
cores and memory bandwidth (an intra-node port's own ``intra`` bandwidth is what one message gets
alone). ``jobs/experiments/fabric_stack.py`` measures all three.

NCCL-like fabrics also declare ``channels`` (0: one per NIC, i.e. ``per_node``: the timed
executor splits a collective over that many rings or trees, each on its own NIC), ``protocols``
(``Protocol``: per-hop alpha of each link class, bandwidth efficiency and a per-call base, as
NCCL's LL / LL128 / Simple; the timed executor picks the fastest per call and reports it) and
``overlap`` (a rank's reduction runs while its messages arrive, as a pipelining executor does),
``pipelined`` (event-driven steps: ``timed``, ``sharing.advance_pipelined``) and ``gpu``
("hopper", "ampere": NCCL's tuning model picks the protocol, ``nccl_tuning``), ``nvls`` (NVLink
SHARP in the node's switch) and ``collnet`` (IB SHARP in the network's switches, enabled in
NCCL): ``innetwork``.

Presets (``preset(name, ...)``): ``flat``, ``dgx-a100``, ``dgx-h100``, ``dgx-h200`` (the
machines as NCCL runs them: 8 channels, NCCL's protocols and tuning, event-driven steps;
``dgx-h100-nccl`` and ``dgx-a100-nccl`` are their names before issue 45), ``dgx-h100-roce``
(the H100 on 400 GbE RoCE), ``dgx-h100-sharp`` (on NDR InfiniBand with IB SHARP enabled),
``dgx-h100-textbook`` (one channel, lockstep), ``seed-lab``, ``this-machine``, or a JSON file
with the fields of ``Fabric`` (``docs/simulator.md`` gives the sources of the numbers).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

__all__ = ["LinkClass", "Protocol", "Fabric", "Routes", "PRESETS", "preset", "from_json", "INTRA", "LEAF",
           "SPINE", "PATH_NAMES"]

INTRA, LEAF, SPINE = 0, 1, 2
# The three paths, by kind. With top-of-rack leaves "same-rail" is "same leaf" and "cross-rail"
# is "through the spine"; ``cross_rail_hops`` counts rails (local ranks) whatever the leaves.
PATH_NAMES = ("intra-node", "same-rail", "cross-rail")
LEAVES = ("rail", "node", "single")


@dataclass(frozen=True)
class LinkClass:
    """One class of link: seconds per message (``alpha``), bytes per second (``bandwidth``)."""

    alpha: float
    bandwidth: float

    def __post_init__(self):
        if not (self.alpha >= 0 and self.bandwidth > 0):
            raise ValueError(f"a link class needs alpha >= 0 and bandwidth > 0, got "
                             f"alpha={self.alpha!r}, bandwidth={self.bandwidth!r}")


CLASSES = ("intra", "nic", "spine")
TREES = ("double_binary_tree", "binomial")      # the algorithms timed with a protocol's tree alphas


@dataclass(frozen=True)
class Protocol:
    """One protocol (NCCL's LL, LL128, Simple): per-hop ``alpha`` of each link class (a dict
    ``{"intra": s, "nic": s, "spine": s}``), the fraction of each link's bandwidth it gets
    (``efficiency``) and a ``base`` latency once per call. ``tree_alpha`` / ``tree_base`` (optional)
    are the ones of tree algorithms (``TREES``), as NCCL's tuning table has one row per algorithm."""

    alpha: dict
    efficiency: float = 1.0
    base: float = 0.0
    tree_alpha: dict | None = None
    tree_base: float | None = None

    def __post_init__(self):
        for a in (self.alpha, self.tree_alpha or self.alpha):
            if set(a) != set(CLASSES) or not all(v >= 0 for v in a.values()):
                raise ValueError(f"a protocol's alpha needs {list(CLASSES)} >= 0, got {a!r}")
        if not (0 < self.efficiency <= 1 and self.base >= 0):
            raise ValueError(f"a protocol needs 0 < efficiency <= 1 and base >= 0, got "
                             f"{self.efficiency!r}, {self.base!r}")

    def alphas(self, tree: bool) -> dict:
        return self.tree_alpha if tree and self.tree_alpha else self.alpha

    def base_of(self, tree: bool) -> float:
        return self.tree_base if tree and self.tree_base is not None else self.base


@dataclass(frozen=True)
class Fabric:
    """``nodes`` x ``per_node`` ranks on intra-node ports, NICs, leaves and a spine."""

    name: str
    nodes: int
    per_node: int
    intra: LinkClass
    nic: LinkClass
    spine: LinkClass
    gamma: float = 0.0
    leaf: str = "rail"
    nodes_per_leaf: int | None = None      # None: "rail" -> all nodes, "node" -> 1
    oversubscription: float = 1.0
    channels: int = 1                      # 0: one per NIC (per_node)
    protocols: dict | None = None          # name -> Protocol
    overlap: bool = False                  # reduction overlapped with the transfer
    stack: float | None = None             # bytes/s a host's network stack moves (None: free)
    nodes_per_host: int = 1                # nodes sharing one host (and its stack)
    stack_per_flow: float | None = None    # bytes/s of one inter-node message (None: no cap)
    copy: float | None = None              # bytes/s of intra-node messages a host copies
    pipelined: bool = False                # event-driven steps, static link shares (NCCL-like)
    gpu: str | None = None                 # "ampere" / "hopper": NCCL's tuning picks protocols
    nvls: bool = False                     # NVLink SHARP: the NVSwitch reduces (innetwork)
    collnet: bool = False                  # IB SHARP: the network's switches reduce (innetwork)

    def __post_init__(self):
        if self.nodes < 1 or self.per_node < 1:
            raise ValueError(f"a fabric needs nodes >= 1 and per_node >= 1, got nodes="
                             f"{self.nodes}, per_node={self.per_node}")
        if self.leaf not in LEAVES:
            raise ValueError(f"unknown leaf layout {self.leaf!r}; expected one of {list(LEAVES)}")
        if self.oversubscription <= 0 or self.gamma < 0:
            raise ValueError(f"oversubscription must be > 0 and gamma >= 0, got "
                             f"{self.oversubscription} and {self.gamma}")
        if self.channels < 0:
            raise ValueError(f"channels must be >= 0 (0: one per NIC), got {self.channels}")
        if (not all(v is None or v > 0 for v in (self.stack, self.stack_per_flow, self.copy))
                or self.nodes_per_host < 1):
            raise ValueError(f"stack, stack_per_flow and copy must be None or > 0 bytes/s and "
                             f"nodes_per_host >= 1, got stack={self.stack!r}, stack_per_flow="
                             f"{self.stack_per_flow!r}, copy={self.copy!r}, nodes_per_host="
                             f"{self.nodes_per_host!r}")

    @property
    def nchannels(self) -> int:
        """Channels of a call: ``channels``, or one per NIC of a node (0)."""
        return self.channels or self.per_node

    def with_protocol(self, name: str, tree: bool = False, *, efficiency: float | None = None,
                      intra_floor: float = 0.0, scale: float = 1.0) -> "Fabric":
        """This fabric as protocol ``name`` sees it: its alphas, bandwidths x its efficiency.
        ``efficiency`` replaces the protocol's; ``intra_floor`` (s) is the least intra-node
        alpha; ``scale`` multiplies every alpha (NCCL's adjustments, ``nccl_tuning``)."""
        p = self.protocols[name]
        a = dict(p.alphas(tree))
        a["intra"] = max(a["intra"], intra_floor)
        eff = p.efficiency if efficiency is None else efficiency
        cls = {c: LinkClass(a[c] * scale, getattr(self, c).bandwidth * eff) for c in CLASSES}
        return replace(self, name=f"{self.name}/{name}", protocols=None, **cls)

    @property
    def size(self) -> int:
        return self.nodes * self.per_node

    def resized(self, nodes: int, per_node: int) -> "Fabric":
        return replace(self, nodes=nodes, per_node=per_node)

    def node_layout(self) -> tuple:
        """The ranks of each node, as ``mpicoll.topology`` gives them to algorithms."""
        g = self.per_node
        return tuple(tuple(range(n * g, (n + 1) * g)) for n in range(self.nodes))

    def describe(self) -> str:
        gb = lambda c: f"{c.alpha * 1e6:g}us {c.bandwidth / 1e9:g}GB/s"   # noqa: E731
        return (f"{self.name}: {self.nodes} node(s) x {self.per_node}, intra {gb(self.intra)}, "
                f"nic {gb(self.nic)}, spine {gb(self.spine)}, leaf={self.leaf}"
                + (f" ({self.nodes_per_leaf} nodes per leaf)" if self.nodes_per_leaf else "")
                + f", oversubscription {self.oversubscription:g}, "
                f"gamma {self.gamma * 1e12:g} ps/B"
                + (f", {self.nchannels} channel(s)" if self.nchannels > 1 else "")
                + (f", protocols {'/'.join(self.protocols)}" if self.protocols else "")
                + (", reduction overlapped" if self.overlap else "")
                + (", event-driven steps" if self.pipelined else "")
                + (", NVLink SHARP" if self.nvls else "")
                + (", IB SHARP (CollNet)" if self.collnet else "")
                + (f", stack {self.stack / 1e9:g}GB/s per host"
                   + (f" of {self.nodes_per_host} nodes" if self.nodes_per_host > 1 else "")
                   if self.stack else "")
                + (f", {self.stack_per_flow / 1e9:g}GB/s per flow" if self.stack_per_flow
                   else "")
                + (f", copies {self.copy / 1e9:g}GB/s per host"
                   + (f" of {self.nodes_per_host} nodes" if self.nodes_per_host > 1 else "")
                   if self.copy else ""))

    def to_json(self) -> dict:
        return asdict(self)

    def routes(self) -> "Routes":
        return Routes(self)


class Routes:
    """Link ids, capacities and paths of a fabric, computed with array arithmetic.

    Links (directed): ``intra`` up/down per rank, ``nic`` up/down per rank, up/down per leaf,
    the network stack and the memory copies of each host (with ``stack`` or ``copy``), and one
    unused link of infinite capacity that pads the shorter paths to four links (six with hosts).
    """

    def __init__(self, fabric: Fabric):
        f = self.fabric = fabric
        N, g = f.size, f.per_node
        self.size = N
        if f.leaf == "rail":
            npl = f.nodes_per_leaf or f.nodes
            self.nleaves = -(-f.nodes // npl) * g
        elif f.leaf == "node":
            npl = f.nodes_per_leaf or 1
            self.nleaves = -(-f.nodes // npl)
        else:
            npl, self.nleaves = f.nodes, 1
        self.nodes_per_leaf = npl
        nph = f.nodes_per_host
        self.nhosts = -(-f.nodes // nph) if (f.stack or f.copy) else 0
        # Shifting every rank by a whole leaf group (and host) maps the fabric onto itself.
        group = int(np.lcm(npl, nph)) if self.nhosts else npl
        self.period = group * g if f.nodes % group == 0 else N
        ranks = np.arange(N)
        self.leaf_of = self.leaf(ranks)
        ports = np.bincount(self.leaf_of, minlength=self.nleaves)
        up = ports * f.nic.bandwidth / f.oversubscription
        self.host0 = 4 * N + 2 * self.nleaves       # first host's stack link
        self.copy0 = self.host0 + self.nhosts       # first host's copy link
        self.nlinks = self.copy0 + self.nhosts + 1
        self.pad = self.nlinks - 1
        self.capacity = np.concatenate([
            np.full(2 * N, f.intra.bandwidth), np.full(2 * N, f.nic.bandwidth), up, up,
            np.full(self.nhosts, f.stack or np.inf), np.full(self.nhosts, f.copy or np.inf),
            [np.inf]])
        self.alpha = np.array([f.intra.alpha, f.nic.alpha, f.spine.alpha])
        flow = f.stack_per_flow or np.inf
        self.cap = np.array([f.intra.bandwidth, min(f.nic.bandwidth, flow),
                             min(f.spine.bandwidth, f.nic.bandwidth, flow)])
        self.up_leaf = 4 * N                     # first leaf -> spine link

    def leaf(self, r):
        f = self.fabric
        node, rail = r // f.per_node, r % f.per_node
        if f.leaf == "rail":
            return (node // self.nodes_per_leaf) * f.per_node + rail
        if f.leaf == "node":
            return node // self.nodes_per_leaf
        return np.zeros_like(r)

    def kind(self, src, dst):
        """INTRA, LEAF or SPINE for each message."""
        g = self.fabric.per_node
        same_node = (src // g == dst // g) & (g > 1)
        same_leaf = self.leaf_of[src] == self.leaf_of[dst]
        return np.where(same_node, INTRA, np.where(same_leaf, LEAF, SPINE))

    def links(self, src, dst, kind):
        """The (messages x 4, or 6 with hosts) link ids of each path, padded with the unused
        link: an inter-node path also crosses the stack of the sending host and of the receiving
        one (the same link twice when they are one host: it does both halves), an intra-node
        path its host's copies."""
        N = self.size
        out = np.full((len(src), 6 if self.nhosts else 4), self.pad, dtype=np.int64)
        intra, net, spine = kind == INTRA, kind != INTRA, kind == SPINE
        out[intra, 0], out[intra, 1] = src[intra], N + dst[intra]
        out[net, 0], out[net, 1] = 2 * N + src[net], 3 * N + dst[net]
        out[spine, 2] = 4 * N + self.leaf_of[src[spine]]
        out[spine, 3] = 4 * N + self.nleaves + self.leaf_of[dst[spine]]
        if self.nhosts:
            per_host = self.fabric.per_node * self.fabric.nodes_per_host
            out[net, 4] = self.host0 + src[net] // per_host
            out[net, 5] = self.host0 + dst[net] // per_host
            out[intra, 4] = self.copy0 + src[intra] // per_host
        return out

    def name(self, link: int) -> str:
        """A readable name of link ``link``."""
        N = self.size
        kinds = [("intra-node port up, rank", 0), ("intra-node port down, rank", N),
                 ("NIC up, rank", 2 * N), ("NIC down, rank", 3 * N)]
        for label, base in kinds:
            if base <= link < base + N:
                return f"{label} {link - base}"
        if link < 4 * N + self.nleaves:
            return f"leaf {link - 4 * N} -> spine"
        if link < 4 * N + 2 * self.nleaves:
            return f"spine -> leaf {link - 4 * N - self.nleaves}"
        if link < self.copy0:
            return f"network stack of host {link - self.host0}"
        if link < self.copy0 + self.nhosts:
            return f"memory copies of host {link - self.copy0}"
        return "(none)"


# ----------------------------------------------------------------------------- presets

def _flat(nodes, per_node, alpha=2e-6, bandwidth=25e9, gamma=0.0, **_):
    """One non-blocking switch: every path costs ``alpha`` + bytes / ``bandwidth``."""
    c = LinkClass(alpha, bandwidth)
    return Fabric("flat", nodes, per_node, c, c, c, gamma, leaf="single")


def _dgx_h100_textbook(nodes, per_node, gamma=None, **_):
    """DGX/HGX H100 nodes on a rail-optimized NDR InfiniBand fat tree, as a textbook fabric: one
    channel, one alpha per link class, lockstep steps (sources: docs). ``dgx-h100`` is the same
    machine as NCCL runs it."""
    return Fabric("dgx-h100-textbook", nodes, per_node,
                  intra=LinkClass(2e-6, 450e9),       # NVLink4 via NVSwitch, per GPU per direction
                  nic=LinkClass(5e-6, 50e9),          # ConnectX-7 NDR 400 Gb/s per GPU
                  spine=LinkClass(6e-6, 50e9),        # one more switch tier, 400 Gb/s links
                  gamma=1e-12 if gamma is None else gamma,  # ~1 TB/s reduction in HBM
                  leaf="rail", nodes_per_leaf=32, oversubscription=1.0)   # SU of 32 nodes


def _seed_lab(nodes, per_node, gamma=0.0, **_):
    """The seed's rail lab: L = 2 us, same rail ~50 GB/s, cross-rail ~5 GB/s; NVLink inside."""
    return Fabric("seed-lab", nodes, per_node,
                  intra=LinkClass(2e-6, 450e9), nic=LinkClass(2e-6, 50e9),
                  spine=LinkClass(2e-6, 5e9), gamma=gamma, leaf="rail")


def _this_machine(nodes, per_node, profile=None, **_):
    """From a ``mpicoll calibrate`` profile: intra = (alpha, 1/beta), inter = the _inter pair."""
    from ..model import load_profile    # (the model loads the registry: not at import, see timed)
    p = load_profile(profile)
    a_out, b_out = p.link(True)
    intra = LinkClass(p.alpha, 1 / p.beta)
    inter = LinkClass(a_out, 1 / b_out)
    return Fabric("this-machine", nodes, per_node, intra, inter, inter, p.gamma, leaf="single")


# NCCL 2.30 src/graph/tuning.cc, per-hop hardware latency of each protocol (LL, LL128, Simple),
# us: ring NVLink 0.6/1.9/3.4, NET 2.7/4.0/14; tree NVLink 0.6/1.25/4.0, NET 5.0/8.5/14; base
# ring 6.6/14/8.4, tree 6.8/14/8.4. Bandwidth: LL 1/2 of the link (8 B lines of 4 B data + 4 B
# flag), LL128 0.92 (tuning.cc's factor), Simple all of it.
_NCCL = {
    "LL": ((0.6, 2.7), (0.6, 5.0), 6.6, 6.8, 0.5),
    "LL128": ((1.9, 4.0), (1.25, 8.5), 14.0, 14.0, 0.92),
    "Simple": ((3.4, 14.0), (4.0, 14.0), 8.4, 8.4, 1.0),
}


def nccl_protocols() -> dict:
    """LL, LL128 and Simple with NCCL's own constants (``tuning.cc``)."""
    def cls(pair):
        return {"intra": pair[0] * 1e-6, "nic": pair[1] * 1e-6, "spine": pair[1] * 1e-6}
    return {name: Protocol(cls(ring), eff, base * 1e-6, cls(tree), tbase * 1e-6)
            for name, (ring, tree, base, tbase, eff) in _NCCL.items()}


def _nccl(name, nvlink, nic, nodes, per_node, gamma=None, gpu=None, nvls=False, collnet=False,
          **_):
    """A DGX on a rail-optimized fat tree as NCCL plans it: NVLink and NIC at the bandwidths
    NCCL's topology search assigns them, one channel per NIC, NCCL's protocols, the reduction
    inside the transfer (NCCL's kernels reduce each slice as it arrives)."""
    return Fabric(name, nodes, per_node, intra=LinkClass(0.0, nvlink), nic=LinkClass(0.0, nic),
                  spine=LinkClass(0.0, nic), gamma=1e-12 if gamma is None else gamma,
                  leaf="rail", nodes_per_leaf=32, channels=0, protocols=nccl_protocols(),
                  overlap=True, pipelined=True, gpu=gpu, nvls=nvls, collnet=collnet)


def _dgx_h100(nodes, per_node, name="dgx-h100", **kw):
    """H100: 18 NVLink4 x 20.6 GB/s (topo.h SM90_NVLINK_BW), NDR 400 Gb/s NIC = 50 GB/s, which
    NCCL's ring search runs at 48 GB/s per channel (search.cc sm90SpeedArrayInter)."""
    return _nccl(name, 18 * 20.6e9, 48e9, nodes, per_node, gpu="hopper", nvls=True, **kw)


def _dgx_h100_roce(nodes, per_node, **kw):
    """H100 on 400 GbE RoCE (ConnectX-7 in Ethernet mode, one per GPU): the same 50 GB/s line
    rate, run by NCCL's IB transport (``net_ib``, RoCE and InfiniBand alike) with the same
    tuning (``tuning.cc`` has one network row for both); no IB SHARP (an InfiniBand switch
    feature), so NCCL has NVLS in a node and NVLSTree across, never CollNet."""
    return _dgx_h100(nodes, per_node, name="dgx-h100-roce", **kw)


def _dgx_h100_sharp(nodes, per_node, **kw):
    """H100 on NDR InfiniBand with IB SHARP enabled in NCCL (Quantum-2 switches, the SHARP
    plugin, ``NCCL_COLLNET_ENABLE=1``): CollNetDirect and NVLS across nodes as well."""
    return _nccl("dgx-h100-sharp", 18 * 20.6e9, 48e9, nodes, per_node, gpu="hopper", nvls=True,
                 collnet=True, **kw)


def _dgx_h200(nodes, per_node, gamma=None, **kw):
    """H200: the H100's NVLink4 and ConnectX-7 NDR NICs (DGX H200 data sheet), HBM3e at 4.8 TB/s
    instead of 3.35: the reduction 1.43x faster (gamma 0.7 ps/B)."""
    return _nccl("dgx-h200", 18 * 20.6e9, 48e9, nodes, per_node, gpu="hopper", nvls=True,
                 gamma=0.7e-12 if gamma is None else gamma, **kw)


def _dgx_a100(nodes, per_node, name="dgx-a100", **kw):
    """A100: 12 NVLink3 x 20 GB/s (topo.h SM80_NVLINK_BW), HDR 200 Gb/s NIC = 25 GB/s, run at
    24 GB/s per channel (search.cc speedArrayInter)."""
    return _nccl(name, 12 * 20.0e9, 24e9, nodes, per_node, gpu="ampere", **kw)


def _named(fn, name):
    return lambda nodes, per_node, **kw: fn(nodes, per_node, name=name, **kw)


# The machines as NCCL runs them (8 channels, protocols, event-driven steps); the textbook
# fabric is ``dgx-h100-textbook``; ``-nccl`` names are the same machines (their names before
# issue 45).
PRESETS = {"flat": _flat, "dgx-a100": _dgx_a100, "dgx-h100": _dgx_h100, "dgx-h200": _dgx_h200,
           "dgx-h100-textbook": _dgx_h100_textbook, "seed-lab": _seed_lab,
           "this-machine": _this_machine, "dgx-h100-nccl": _named(_dgx_h100, "dgx-h100-nccl"),
           "dgx-a100-nccl": _named(_dgx_a100, "dgx-a100-nccl"), "dgx-h100-roce": _dgx_h100_roce,
           "dgx-h100-sharp": _dgx_h100_sharp}


def from_json(path, nodes: int, per_node: int) -> Fabric:
    """A fabric from a JSON file with ``Fabric``'s fields (``nodes``/``per_node`` optional)."""
    try:
        data = json.loads(Path(path).read_text())
        data.setdefault("name", Path(path).stem)
        data.setdefault("nodes", nodes)
        data.setdefault("per_node", per_node)
        for c in CLASSES:
            data[c] = LinkClass(**data[c])
        if data.get("protocols"):
            data["protocols"] = {k: Protocol(**v) for k, v in data["protocols"].items()}
        return Fabric(**data)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise ValueError(f"{path}: not a fabric file: {e}") from None


def preset(name: str, nodes: int, per_node: int, **params) -> Fabric:
    """The preset ``name`` (or the JSON file ``name``) with ``nodes`` x ``per_node`` ranks.

    ``params``: ``alpha``, ``bandwidth`` (flat), ``gamma``, ``profile`` (this-machine).
    """
    if name in PRESETS:
        return PRESETS[name](nodes, per_node, **{k: v for k, v in params.items()
                                                 if v is not None})
    if Path(name).is_file():
        return from_json(name, nodes, per_node)
    raise ValueError(f"unknown fabric {name!r}; expected one of {list(PRESETS)} or a JSON file")
