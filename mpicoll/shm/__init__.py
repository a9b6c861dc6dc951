"""Shared memory as a transport: ranks on one node reduce straight from each other's memory.

Two users compose it: the ``shm`` all-reduce (``algorithms/allreduce_shm.py``: every rank of
the communicator in one window) and ``hierarchical``'s node phases with ``inner="shm"`` (one
window per node, and the inter-node all-reduce of each rank's reduced slice in between).

Modules, bottom up:

* ``probe``     -- what the OS allows: ``process_vm_readv`` between ranks (and the
                   ``PR_SET_PTRACER`` widening it may need), whether a rank's process lives;
* ``kernels``   -- the compiled core: atomic flags, the waits, the window-copy protocol and
                   the single copy, reducing with ``mpicoll.kernels``' kernels (every op and
                   dtype MPI allows, the bits of numpy's ufuncs);
* ``window``    -- the window: one file in /dev/shm that the node's ranks map, made with two
                   small messages on the call's tag and flag waits (no MPI collective), freed
                   locally; the single-copy probe;
* ``policy``    -- when it can run (``check``, ``supports``, ``usable``, ``check_node_phases``)
                   and when it is chosen by default (``single_copy_expected``,
                   ``node_phases_by_default``): what ``api`` and ``select`` ask;
* ``transport`` -- ``window_allreduce``: which window, which path, the deadline and the failures.

The protocol (p ranks, rank r owns slice r of ``schedule.block_displs``; ``seq`` a sequence
number every rank counts alike, one per chunk of the window copy, one per single-copy call):

    window copy (below 16 KiB, or where the ranks may not read each other's memory)
      Phase 1 (copy in)  r copies its input -- all but slice r -- into its segment and
                         publishes ``arrived[r] = seq`` (with the hash of the call's arguments
                         beside it: a rank that sees another hash raises ArgumentMismatch);
      Phase 2 (reduce)   once every ``arrived[j] >= seq``, r reduces slice r of all p inputs in
                         rank order, ``op(...op(op(x_0, x_1), x_2)..., x_(p-1))``, in blocks
                         that stay in L1, into its segment and its output; publishes
                         ``reduced[r]``;
      Phase 3 (copy out) once every ``reduced[j] >= seq``, r copies every other slice out.
    single copy (from 16 KiB, ``MPICOLL_SHM_SINGLE_COPY``)
      Phase 1 (publish)  r publishes its buffers' addresses beside ``arrived[r]``;
      Phase 2 (reduce)   r reads its slice of every other input in place (``process_vm_readv``)
                         and reduces it in rank order into its output; publishes ``reduced[r]``
                         (at 2 ranks up to 256 KiB each rank reduces the whole vector instead);
      Phase 3 (gather)   r reads every other rank's reduced slice from that rank's output;
      Phase 4 (release)  r publishes ``gathered[r]`` and waits for every rank's (until then
                         another rank may still read r's buffers).

Each slice is reduced once, by one rank, in the fixed order 0..p-1, then copied: every rank
ends with the same bits, those of ``acc = x_0; ufunc(acc, x_j, out=acc)`` for j = 1 .. p-1
(the left fold tests/mpi/test_shm.py checks, for every op and dtype).

Memory ordering: a flag is written with a C11 release store after the data it covers and read
with an acquire load before the data (``kernels.load_acquire`` / ``store_release``, LLVM atomic
instructions: plain ``mov``s on x86-64, barriers on weaker processors), as MPICH's
``release_gather`` waits on ``MPL_atomic_uint64_t`` flags. The segments are double-buffered by
the parity of ``seq``: before r writes buffer ``seq % 2`` again every rank has finished reading
it in chunk ``seq - 2`` (it published ``arrived = seq - 1`` after, and r waited for that).

Waiting: a wait spins for 20 us, then yields the core between polls, and returns to Python
after 2 ms (``transport._late``); while the rank it waits for is late it then naps between
short looks (``window.Patience``: 1 ms, growing to 1/8 of the lateness, at most 16 ms) on a
futex in the window that a rank coming to the call wakes (``Window.ring``). When the node's
ranks outnumber this process's cores (``MPICOLL_YIELD_WHEN_IDLE``, ``mpicoll/idle.py``) a
wait yields at once, returns after 20 us and naps from 50 us: the rank it waits for needs the
core. A rank that died or gave up ends the call at once with ``CommunicatorBroken``; with a deadline,
``Watch.overdue`` raises ``CollectiveTimeout`` naming the ranks whose flags are missing. Details, cost and measurements: docs/algorithms.md ("shm"),
docs/reliability.md ("Shared memory"), docs/performance.md.
"""

import importlib

# name -> the submodule that defines it, imported on first use: ``select`` and ``api`` ask the
# policy on every call, while the compiled kernels, the window and the transport load only when
# shm runs (the first call of a job that never picks shm doesn't pay for them).
_LAZY = {"warmup": "kernels", "Window": "window", "CHUNK_BYTES": "window", "MIN_BYTES": "window",
         "size_class": "window",
         **dict.fromkeys(("DTYPES", "OPS", "check", "check_node_phases", "node_phases_by_default",
                          "outside_real_nodes", "single_copy_expected", "supports", "usable"),
                         "policy"),
         **dict.fromkeys(("PIECE_BYTES", "SINGLE_COPY_MIN_BYTES", "WHOLE_MAX_BYTES", "window_allreduce",
                          "window_rank"), "transport")}
_SUBMODULES = ("kernels", "policy", "probe", "transport", "window")

__all__ = ["window_allreduce", "check", "supports", "usable", "check_node_phases",
           "node_phases_by_default", "outside_real_nodes", "single_copy_expected", "warmup",
           "window_rank", "Window", "size_class", "OPS", "DTYPES", "CHUNK_BYTES", "MIN_BYTES",
           "SINGLE_COPY_MIN_BYTES", "PIECE_BYTES", "WHOLE_MAX_BYTES"]


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))
