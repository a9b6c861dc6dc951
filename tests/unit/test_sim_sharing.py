"""The timed executor at datacenter scale (issue 24): max-min sharing that is true, the fast
paths equal to the general one, the bottleneck link, streamed (linear) memory, channels,
protocols, a cheap import.

The hand-checkable cases use 1 MB messages on 1 GB/s links with no latency, so a message alone
takes 1 ms.
"""

import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

from mpicoll.simulators import allranks, timed
from mpicoll.simulators import fabric as fabrics
from mpicoll.simulators.allranks import Wave

pytestmark = pytest.mark.timeout(300)

MB, GBPS = 1_000_000, 1e9


def _flat(n):
    return fabrics.preset("flat", n, 1, alpha=0.0, bandwidth=GBPS)


def _wave(src, dst, sizes, fab, delay=None, **kw):
    w = Wave(np.array(src), np.array(dst), np.array(sizes, dtype=np.int64), False, False, 0)
    return timed.run([w], fab, itemsize=1, delay=delay, **kw)


# ----------------------------------------------------------------------------- max-min by hand

@pytest.mark.parametrize("general", [False, True])
def test_four_flows_first_ends_at_one_and_a_half_ms(general):
    # 0->1, 0->2, 3->2, 4->2: rank 2's downlink is shared by three (1/3 GB/s each), so 0->1
    # gets the 2/3 GB/s left on rank 0's uplink and ends at 1.5 ms; the three end at 3 ms.
    r = _wave([0, 0, 3, 4], [1, 2, 2, 2], [MB] * 4, _flat(5), general=general)
    assert r.finish[1] == pytest.approx(1.5e-3)
    assert r.finish[[0, 2, 3, 4]] == pytest.approx([3e-3] * 4)
    assert r.max_link == "NIC down, rank 2"


@pytest.mark.parametrize("general", [False, True])
def test_unequal_flows_small_one_ends_at_two_ms(general):
    # 1 MB and 3 MB into rank 2: half the link each until the small one ends (2 ms), then the
    # big one alone: 2 MB more at 1 GB/s, 4 ms.
    r = _wave([0, 1], [2, 2], [MB, 3 * MB], _flat(3), general=general)
    assert list(r.finish * 1e3) == pytest.approx([2, 4, 4])


@pytest.mark.parametrize("general", [False, True])
def test_straggler_on_an_incast_link_does_not_share_with_a_finished_flow(general):
    # Rank 1 is 10 ms late: rank 0's message has the link alone and ends at 1 ms; rank 1's
    # starts at 10 ms and ends at 11.
    r = _wave([0, 1], [2, 2], [MB, MB], _flat(3), delay=[0, 10e-3, 0], general=general)
    assert list(r.finish * 1e3) == pytest.approx([1, 11, 11])


def test_maxmin_gives_a_flow_bottlenecked_elsewhere_its_share():
    # A crosses a 0.25 GB/s link and a 1 GB/s link that B also crosses: A gets 0.25, B the
    # 0.75 left (not 0.5); after A ends (4 ms) ... B ended first, at 1/0.75 = 1.33 ms.
    end = timed.maxmin([0, 0], [MB, MB], [[0, 1], [1]], [0.25 * GBPS, GBPS])
    assert end == pytest.approx([4e-3, MB / 0.75e9])
    # a late flow re-solves the rates when it starts: 2 MB from 0, 1 MB from 1 ms on one link
    end = timed.maxmin([0, 1e-3], [2 * MB, MB], [[0], [0]], [GBPS])
    assert end == pytest.approx([3e-3, 3e-3])
    # a per-flow cap leaves the rest of the link to the others
    end = timed.maxmin([0, 0], [MB, MB], [[0], [0]], [GBPS], flowcap=[0.1 * GBPS, np.inf])
    assert end == pytest.approx([10e-3, MB / 0.9e9])


# ----------------------------------------------------------------------------- fast == general

CASES = [
    ("ring", fabrics.preset("dgx-h100-textbook", 4, 4), {}),
    ("ring", fabrics.preset("seed-lab", 2, 8), {}),
    ("hierarchical", fabrics.preset("dgx-h100-textbook", 6, 2), {}),
    ("hierarchical", fabrics.preset("dgx-h100-textbook", 4, 4), {"outer": "ring"}),
    ("recursive_doubling", fabrics.preset("seed-lab", 2, 4), {}),
    ("ring", fabrics.preset("dgx-h100-nccl", 2, 4), {"protocol": "Simple"}),
    ("double_binary_tree", fabrics.preset("dgx-h100-nccl", 2, 4), {"protocol": "LL"}),
]


@pytest.mark.parametrize("name, fab, opts", CASES,
                         ids=[f"{c[0]}-{c[1].name}-{i}" for i, c in enumerate(CASES)])
@pytest.mark.parametrize("nbytes", [4096, 1000001, 1 << 22])
def test_fast_paths_equal_the_general_solution(name, fab, opts, nbytes):
    rng = np.random.default_rng(nbytes)
    for delay in (None, rng.exponential(20e-6, fab.size)):
        fast = timed.simulate("allreduce", name, fab, nbytes, delay=delay, **opts)
        slow = timed.simulate("allreduce", name, fab, nbytes, delay=delay, general=True, **opts)
        np.testing.assert_allclose(fast.finish, slow.finish, rtol=1e-9)
        assert fast.max_link_time == pytest.approx(slow.max_link_time, rel=1e-9)  # ties: any
        assert fast.path_bytes == pytest.approx(slow.path_bytes)


# ----------------------------------------------------------------------------- bottleneck

def test_max_link_is_the_bottleneck_not_the_busiest():
    # 100 MB over NVLink (450 GB/s, 0.22 ms) and 10 MB across rails through the spine
    # (5 GB/s, 2 ms): the NVLink port carries 10x the bytes, the spine link holds things back.
    fab = fabrics.preset("seed-lab", 2, 8)
    r = _wave([0, 7], [1, 8], [100 * MB, 10 * MB], fab)
    assert r.max_link == "leaf 7 -> spine"
    assert r.max_link_bytes == 10 * MB
    assert r.max_link_time == pytest.approx(10 * MB / 5e9)


# ----------------------------------------------------------------------------- scale, memory

def _peak(fn):
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_uneven_ring_memory_is_linear_and_hops_streamed():
    # 1e8 B on N ranks: blocks of unequal size, every wave a new shape (issue 24: 13.7 GB at
    # 16,384 ranks when each wave's hop pairs were kept). Memory must grow like N, not N^2.
    timed.simulate("allreduce", "ring", _flat(4), 1 << 20)                 # compile
    peaks = {}
    for n in (512, 1024):
        r, peaks[n] = _peak(lambda n=n: timed.simulate("allreduce", "ring", _flat(n), 10 ** 8))
        assert r.waves == 2 * (n - 1) and r.internode_hops == n
        assert 10 ** 8 % (4 * n) != 0
    assert peaks[1024] < 3 * peaks[512], peaks
    assert peaks[1024] < 20 << 20, peaks


def test_hierarchical_outer_ring_has_a_direct_form_and_streams():
    fab = fabrics.preset("dgx-h100-textbook", 48, 8)
    count = 10 ** 6 + 3                           # uneven shards and blocks
    algo = __import__("mpicoll.registry", fromlist=["lookup"]).lookup("allreduce", "hierarchical")
    gen = allranks.waves(algo, fab.size, count, nodes=fab.node_layout(), inner="ring",
                         outer="ring")
    assert not isinstance(gen, list)             # a generator: never all waves at once
    x = timed.simulate("allreduce", "hierarchical", fab, 4 * count, outer="ring")
    small = fabrics.preset("dgx-h100-textbook", 6, 4)
    a = timed.simulate("allreduce", "hierarchical", small, 4 * count, outer="ring")
    b = timed.simulate("allreduce", "hierarchical", small, 4 * count, outer="ring", direct=False)
    np.testing.assert_allclose(a.finish, b.finish, rtol=1e-12)
    assert x.waves == 2 * 7 + 2 * 47 + 0 and x.time > 0


# ----------------------------------------------------------------------------- channels

@pytest.mark.parametrize("nodes, g", [(1, 8), (2, 8), (3, 8), (4, 8), (5, 4), (16, 8), (4, 2)])
def test_channel_rings_stay_on_rails_and_use_every_nic_once(nodes, g):
    sends, recvs = {}, {}
    for c in range(g):
        ring = allranks.ring_channel_order(nodes, g, c)
        assert sorted(ring) == list(range(nodes * g))
        for a, b in zip(ring, np.roll(ring, -1)):
            if a // g != b // g:
                assert a % g == b % g, (c, a, b)             # the hop between nodes: one rail
                sends.setdefault(a, []).append(c)
                recvs.setdefault(b, []).append(c)
    if nodes > 1:
        assert sorted(sends) == sorted(recvs) == list(range(nodes * g))
        assert all(len(v) == 1 for v in [*sends.values(), *recvs.values()])


def test_channels_give_nccl_bus_bandwidth_across_nodes():
    # 4 DGX-H100, 4 GiB, Simple: 8 rings, one per NIC at 48 GB/s: busbw 8 x 48 = 384 GB/s
    # less the per-step latency (2(p-1) steps of 14 us on ~11 us ... ), one channel ~48.
    fab = fabrics.preset("dgx-h100-nccl", 4, 8)
    r8 = timed.simulate("allreduce", "ring", fab, 4 << 30)
    r1 = timed.simulate("allreduce", "ring", fab, 4 << 30, channels=1)
    assert (r8.channels, r1.channels, r8.protocol) == (8, 1, "Simple")
    assert 0.9 * 384e9 < r8.busbw <= 384e9
    assert r1.busbw < 48e9 and r1.max_link.startswith("NIC")
    assert r8.cross_rail_hops == 0


def test_protocol_picked_per_size_and_reported():
    fab = fabrics.preset("dgx-h100-nccl", 2, 8)
    small = timed.simulate("allreduce", "ring", fab, 8192)
    big = timed.simulate("allreduce", "ring", fab, 1 << 30)
    assert (small.protocol, big.protocol) == ("LL", "Simple")
    ll = timed.simulate("allreduce", "ring", fab, 8192, protocol="LL")
    simple = timed.simulate("allreduce", "ring", fab, 8192, protocol="Simple")
    assert ll.time == small.time < simple.time
    # LL's per-call base (6.6 us) is on every rank's critical path
    assert small.critical["delay"] == pytest.approx(6.6e-6)
    with pytest.raises(ValueError, match="unknown protocol"):
        timed.simulate("allreduce", "ring", fab, 8192, protocol="nope")


def test_overlap_hides_the_reduction_behind_the_transfer():
    base = fabrics.preset("flat", 4, 1, alpha=0.0, bandwidth=GBPS, gamma=0.5e-9)
    over = fabrics.Fabric(**{**base.__dict__, "overlap": True})
    plain = timed.simulate("allreduce", "ring", base, 4 * MB)
    hid = timed.simulate("allreduce", "ring", over, 4 * MB)
    step = MB / GBPS                                   # 1 MB blocks
    assert plain.time == pytest.approx(6 * step + 3 * 0.5 * step)
    assert hid.time == pytest.approx(6 * step)


# ----------------------------------------------------------------------------- import

def test_import_is_cheap():
    code = ("import sys, mpicoll.simulators.timed, mpicoll.simulators.allranks; "
            "print(sorted(m for m in ('numba', 'mpicoll.registry', 'mpicoll.kernels') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "[]"


# ----------------------------------------------------------------------------- pipelining

def test_hierarchical_pipeline_overlaps_node_and_network_phases_by_hand():
    """2 nodes x 2 ranks, alpha = gamma = 0, NVLink 2 GB/s, NIC 1 GB/s, inner and outer ring:
    a node-phase wave (n/2 bytes on NVLink) and a network wave (n/4 on the NIC) take the same
    time, so every wave of k chunks takes n/(4k) / 1 GB/s; chunk j starts 2 waves (the network
    phase) after chunk j-1: 2k + 2 waves, (k + 1)/(2k) of the unpipelined n / 1 GB/s."""
    from mpicoll.simulators.fabric import Fabric, LinkClass
    fab = Fabric("hand", 2, 2, intra=LinkClass(0.0, 2e9), nic=LinkClass(0.0, 1e9),
                 spine=LinkClass(0.0, 1e9))
    n = 4 << 20
    base = timed.simulate("allreduce", "hierarchical", fab, n, inner="ring", outer="ring")
    assert base.time == pytest.approx(n / 1e9, rel=1e-12)
    for k in (1, 2, 4, 8):
        r = timed.simulate("allreduce", "hierarchical", fab, n, inner="ring", outer="ring",
                           pipeline=k)
        assert r.time == pytest.approx((k + 1) / (2 * k) * n / 1e9, rel=1e-12), k
        assert r.waves == 2 * k + 2
        assert r.path_bytes == base.path_bytes           # the same data, moved sooner


def test_hierarchical_pipeline_with_channels_moves_the_same_bytes_sooner():
    fab = fabrics.preset("dgx-h100-nccl", 4, 8)
    a = timed.simulate("allreduce", "hierarchical", fab, 1 << 30, outer="ring")
    b = timed.simulate("allreduce", "hierarchical", fab, 1 << 30, outer="ring", pipeline=4)
    assert b.path_bytes == pytest.approx(a.path_bytes)
    assert b.time < 0.9 * a.time
    with pytest.raises(ValueError, match="pipeline= needs hierarchical"):
        timed.simulate("allreduce", "ring", fabrics.preset("dgx-h100-textbook", 2, 4), 1 << 20,
                       pipeline=2)


def test_pipeline_table_in_the_doc_is_the_json_and_today():
    """docs/simulator.md's pipelining table is ``render pipeline docs/simulator-pipeline.json``,
    and its first row (4 nodes, 64 MiB, outer ring) at k = 1, 2, 4, re-simulated today, gives
    the recorded times (about 1.6 s of CPU)."""
    import json
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "docs" / "generators"))
    import sim_validation
    doc = (root / "docs" / "simulator.md").read_text()
    rows = json.loads((root / "docs" / "simulator-pipeline.json").read_text())
    begin, end = "<!-- sim_validation pipeline: begin -->", "<!-- sim_validation pipeline: end -->"
    assert begin in doc and end in doc
    assert doc.split(begin, 1)[1].split(end, 1)[0].strip("\n") == \
        sim_validation.render_pipeline(rows), \
        "stale: python docs/generators/sim_validation.py pipeline --json docs/simulator-pipeline.json"
    today = sim_validation.pipeline_rows(sim_validation.PIPELINE[:1], ("ring",), (1, 2, 4))
    assert (today[0]["outer"], today[0]["bytes"]) == (rows[0]["outer"], rows[0]["bytes"])
    assert today[0]["time"] == pytest.approx(rows[0]["time"][:3], rel=1e-9)


# ----------------------------------------------------------------------------- issue 45

def test_unequal_ring_blocks_at_scale_are_an_upper_bound_with_the_calls_bytes(monkeypatch):
    """Beyond EXACT_RING_MESSAGES a ring with unequal blocks is timed at equal blocks of the
    larger size: never below the exact replay, above it by at most 2(P-1) element transfers
    per channel step, and with the exact bytes in total."""
    for fab in (_flat(64), fabrics.preset("dgx-h100-nccl", 4, 8)):
        nbytes = 4 * (64 * 8 * 1000 + 37)                  # unequal blocks on 64 and 32 ranks
        exact = timed.simulate("allreduce", "ring", fab, nbytes, protocol="Simple"
                               if fab.protocols else None)
        monkeypatch.setattr(timed, "EXACT_RING_MESSAGES", 0)
        bound = timed.simulate("allreduce", "ring", fab, nbytes, protocol="Simple"
                               if fab.protocols else None)
        monkeypatch.undo()
        assert exact.rounded == 0 < bound.rounded
        P = fab.size
        slack = 2 * (P - 1) * 4 / min(fab.nic.bandwidth, fab.intra.bandwidth) + 1e-12
        assert exact.time <= bound.time <= exact.time + slack, (exact.time, bound.time)
        assert sum(bound.path_bytes.values()) == pytest.approx(sum(exact.path_bytes.values()))


def test_nccl_fabric_picks_the_protocol_nccls_tuning_picks():
    from mpicoll.simulators import nccl_tuning
    for nodes in (1, 2, 16):
        fab = fabrics.preset("dgx-h100-nccl", nodes, 8)
        g = nccl_tuning.graph_of(fab)
        for nbytes in (8192, 1 << 20, 64 << 20, 1 << 30):
            for name, kind in (("ring", "ring"), ("double_binary_tree", "tree")):
                r = timed.simulate("allreduce", name, fab, nbytes)
                assert r.protocol == nccl_tuning.choose(g, nbytes, (kind,))[1], (nodes, nbytes)
        fastest = timed.simulate("allreduce", "ring", fab, 1 << 20, protocol="fastest")
        assert fastest.time <= timed.simulate("allreduce", "ring", fab, 1 << 20).time


def test_event_driven_ring_pays_the_network_latency_only_on_its_network_hops():
    """2 x 8 H100, ring LL, one channel, 8 KiB: the critical path is the 30 hops of the data,
    26 inside the nodes at max(0.6, NCCL's 1 us net overhead) and 4 across at 2.7 us, after
    the 6.6 us base -- not 30 x 2.7 us as in lockstep."""
    fab = fabrics.preset("dgx-h100-nccl", 2, 8)
    r = timed.simulate("allreduce", "ring", fab, 8192, protocol="LL", channels=1)
    assert r.critical["messages"] == 30
    assert r.critical["latency"] == pytest.approx((26 * 1.0 + 4 * 2.7) * 1e-6)
    assert r.critical["delay"] == pytest.approx(6.6e-6)


NVLINK = 18 * 20.6e9          # an H100's NVSwitch port, as NCCL plans it (topo.h)


def test_nccls_in_network_model_by_hand():
    """NCCL's tuning model of NVLS, NVLSTree and CollNetDirect (tuning.cc, the numbers worked by
    hand): the NVLS graph has 8 heads at 40 GB/s (9 x 40 <= 370.8 on every NVSwitch port), its
    bwInter 60 on one node, the NIC's 48 across; which algorithms NCCL enables where."""
    from mpicoll.simulators import nccl_tuning as nt
    one, two, many = (nt.graph_of(fabrics.preset("dgx-h100", k, 8)) for k in (1, 2, 16))
    assert (one.nvls, two.nvls, many.nvls) == ((8, 40.0, 60.0), (8, 40.0, 48.0), (8, 40.0, 48.0))
    assert nt.algorithms(one) == ("tree", "ring", "nvls")            # NVLSTree needs nodes
    assert nt.algorithms(two) == ("tree", "ring", "nvls_tree")       # NVLS across: CollNet
    assert nt.algorithms(nt.graph_of(fabrics.preset("dgx-a100", 4, 8))) == ("tree", "ring")
    sharp = nt.graph_of(fabrics.preset("dgx-h100-sharp", 4, 8))
    assert nt.algorithms(sharp) == ("tree", "ring", "collnet_direct", "nvls", "nvls_tree")
    nvls_bus = 8 * 40 * 0.85 * 7 / 8 * 2                             # 476 GB/s
    assert nt.bandwidth(one, "nvls", "Simple") == pytest.approx(nvls_bus * 8 / 14)
    assert nt.bandwidth(one, "nvls", "LL") == 0 and nt.time(one, "nvls", "LL", 1e6) == np.inf
    assert nt.bandwidth(two, "nvls_tree", "Simple") == pytest.approx(8 * 57.7 * 16 / 30)
    assert nt.bandwidth(many, "nvls_tree", "Simple") == pytest.approx(8 * 45.5 * 128 / 254)
    assert nt.time(two, "nvls", "Simple", 1e6) == np.inf             # not without CollNet
    assert nt.latency(one, "nvls", "Simple") == 25
    assert nt.latency(many, "nvls_tree", "Simple") == pytest.approx(25 + 2 * 4 * 20.9)
    assert nt.latency(sharp, "nvls", "Simple") == 25 + 18
    assert nt.latency(sharp, "collnet_direct", "Simple") == pytest.approx(2 * (3.7 + 7 * .4) + 31)
    assert nt.bandwidth(sharp, "collnet_direct", "Simple") == pytest.approx(8 * 48 * .85 * .5)


def test_nvls_tree_and_collnet_are_the_switches_reducing_by_hand():
    """NVLSTree: each port n (1 + 1/8) each way at 0.85 x 370.8 GB/s, each NIC n/8 each way on
    two nodes, 2n/8 on more, NCCL's per-channel cap (57.7 / 45.5 GB/s busbw), after
    25 + 2 lg(nodes) x 20.9 us; CollNetDirect: ports 2n 7/8 at 0.85 x 370.8, NICs n/8, after
    2(3.7 + 0.4 x 7) + 31 us; NVLS across nodes (IB SHARP): NICs n/8 after 25 + 18 us."""
    n = 1 << 30
    port = 0.85 * NVLINK
    for nodes, per_nic, cap in ((2, n / 8, 57.7e9), (4, n / 4, 45.5e9), (16, n / 4, 45.5e9)):
        fab = fabrics.preset("dgx-h100", nodes, 8)
        P = 8 * nodes
        r = timed.simulate("allreduce", "nvls_tree", fab, n)
        transfer = max(n * 1.125 / port, per_nic / 48e9, n / (8 * cap * P / (2 * (P - 1))))
        lat = (25 + 2 * int(np.log2(nodes)) * 20.9) * 1e-6
        assert r.time == pytest.approx(lat + transfer, rel=1e-12), nodes
        assert r.critical["latency"] == pytest.approx(lat) and r.protocol == "Simple"
    sharp = fabrics.preset("dgx-h100-sharp", 4, 8)
    r = timed.simulate("allreduce", "collnet", sharp, n)
    assert r.time == pytest.approx(44e-6 + max(2 * n * 7 / 8 / port, n / 8 / 48e9), rel=1e-12)
    r = timed.simulate("allreduce", "nvls", sharp, n)
    assert r.time == pytest.approx(43e-6 + max(n * 1.125 / port, n / 8 / 48e9), rel=1e-12)
    late = timed.simulate("allreduce", "nvls", sharp, n, delay=[0] * 31 + [2e-3])
    assert late.time == pytest.approx(r.time + 2e-3)
    for name, fab, why in (("nvls_tree", fabrics.preset("dgx-h100", 1, 8), "several nodes"),
                           ("collnet", fabrics.preset("dgx-h100", 4, 8), "IB SHARP"),
                           ("nvls_tree", fabrics.preset("dgx-a100", 4, 8), "NVLink SHARP")):
        with pytest.raises(ValueError, match=f"{name} needs .*{why}"):
            timed.simulate("allreduce", name, fab, n)


def test_nccls_choice_is_its_table_at_every_size():
    """``simulate("nccl")`` runs the (algorithm, protocol) NCCL's tuning picks among the ones
    the fabric has, from 8 B to 8 GiB: NVLS on one H100 node from the MB range, NVLSTree across
    nodes at large sizes, never on A100; ``auto`` is the same pick on such a fabric."""
    from mpicoll.simulators import nccl_tuning as nt
    names = {"ring": "ring", "tree": "double_binary_tree", "nvls": "nvls",
             "nvls_tree": "nvls_tree", "collnet_direct": "collnet"}
    picked = set()
    for name, nodes in (("dgx-h100", 1), ("dgx-h100", 2), ("dgx-h100", 16), ("dgx-a100", 4),
                        ("dgx-h100-sharp", 4)):
        fab = fabrics.preset(name, nodes, 8)
        g = nt.graph_of(fab)
        for nbytes in (8, 512, 32 << 10, 2 << 20, 128 << 20, 512 << 20, 8 << 30):
            algo, proto = nt.choose(g, nbytes, nt.algorithms(g))
            r = timed.simulate("allreduce", "nccl", fab, nbytes)
            assert (r.algorithm, r.protocol) == (names[algo], proto), (name, nodes, nbytes)
            picked.add((name, nodes, algo))
    assert {("dgx-h100", 1, "nvls"), ("dgx-h100", 2, "nvls_tree"),
            ("dgx-h100", 16, "nvls_tree")} <= picked
    assert not any(n == "dgx-a100" and a not in ("ring", "tree") for n, _, a in picked)
    fab = fabrics.preset("dgx-h100", 2, 8)
    assert timed.simulate("allreduce", "auto", fab, 8 << 30).algorithm == "nvls_tree"
    with pytest.raises(ValueError, match="auto is NCCL's choice"):
        timed.simulate("allreduce", "auto", _flat(4), 1024)


def test_nvls_is_the_switch_reducing_by_hand():
    """NVLS on 8 H100: each port carries n + n/8 each way at 0.85 x 370.8 GB/s after 25 us
    (NCCL's NVLS latency): 1 GiB in 25 us + 1.125 GiB / 315.18 GB/s; refused across nodes."""
    fab = fabrics.preset("dgx-h100", 1, 8)
    n = 1 << 30
    r = timed.simulate("allreduce", "nvls", fab, n)
    assert r.time == pytest.approx(25e-6 + n * 1.125 / (0.85 * 18 * 20.6e9), rel=1e-12)
    assert r.internode_bytes == 0 and r.protocol == "Simple"
    late = timed.simulate("allreduce", "nvls", fab, n, delay=[0, 1e-3] + [0] * 6)
    assert late.time == pytest.approx(r.time + 1e-3)
    with pytest.raises(ValueError, match="nvls needs one node"):
        timed.simulate("allreduce", "nvls", fabrics.preset("dgx-h100", 2, 8), n)
    with pytest.raises(ValueError, match="nvls needs one node"):
        timed.simulate("allreduce", "nvls", fabrics.preset("dgx-a100", 1, 8), n)
