"""Per-communicator state, cached on the communicator as an MPI attribute.

The first collective on a communicator duplicates it (collective), so mpicoll's point-to-point
messages live in their own context and can never match the user's. It first runs a *presence
check* on the caller's communicator: each rank sends an empty message with tag
``MPI.TAG_UB - 1`` to every other rank and waits (with a timeout: polled under the deadline) for
theirs. Only when every rank is known to be there does it create the duplicate
(``MPI_Comm_idup``, also polled). A missing rank is found with cancellable receives, so no
collective request is left pending on the caller's communicator (MPI cannot cancel or free one,
and MPICH's ``MPI_Finalize`` then reports "Builtin communicator ... has pending 1 references"
for ``COMM_WORLD``). The node layout is discovered right after (one ``allgather`` of the host
names on the duplicate: ``node_layout``), so later calls never block in it. The state also
numbers the calls (each call uses its own tag, so a message left over from a call that failed
cannot be taken by the next, and requests in flight together never take each other's; the tag
also carries a hash of the call's arguments: ``tags``), keeps grow-only scratch buffers per
dtype, and caches the node layout for ``hierarchical``. After a call fails mid-way (a
timeout), ``broken`` says why and mpicoll refuses further calls on the communicator. When the user frees the communicator, MPI
calls ``_delete``: mpicoll's stray messages are dropped and the duplicate is freed with it.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections import OrderedDict

import numpy as np
from mpi4py import MPI

from .. import idle, settings
from ..errors import CollectiveTimeout, CommunicatorBroken, ConcurrentCall
from ..topology import virtual_nodes
from . import detector, notice, stragglers
from .stragglers import RECENT_ENTRIES
from .tags import tag_space
from .watch import roll_call_tag

__all__ = ["state", "attach", "known", "CommState", "node_layout", "enter", "leave", "exclusive",
           "concurrent"]

def new_traffic() -> dict:
    """Counters of what the executors sent and received (kept per communicator, in its
    state); ``shared_bytes``: what ``allreduce_shm`` wrote into its shared-memory window (no
    network)."""
    return {"bytes_sent": 0, "bytes_received": 0, "messages_sent": 0, "internode_bytes": 0,
            "shared_bytes": 0}


class CommState:
    def __init__(self, comm: MPI.Intracomm):
        self.comm = self.parent = comm          # the duplicate once ``ready`` has made it
        self._dup: MPI.Request | None = None    # its MPI_Comm_idup while unfinished
        self._presence = None                   # the presence check posted by ``start``
        self._duplicate_freed = False           # (free_duplicate: once)
        self.made = False
        self.calls = 0
        self.tags = tag_space(roll_call_tag())     # call numbers x argument hashes (tags.py)
        self.broken: str | None = None
        self.abandoned: list = []               # requests of failed calls, kept alive (watch.py)
        self._scratch: dict = {}
        self._nodes: dict = {}
        self.traffic = new_traffic()             # what the MPI executor sent on this communicator
        self.shared = None                      # mpicoll.shm's window of this communicator
        self.node_shared: dict = {}             # the same per node layout (hierarchical's)
        self.cached = OrderedDict()             # plan.Prepared: plain calls' prepared calls, LRU
        self.last_cached = (None, None)         # the most recently used: (key, entry)
        self.last_plan = None                   # the last call's plan (plan.last: what auto chose)
        # fail fast, never diverge (docs/reliability.md)
        self.history = 0                        # running hash of the calls' signatures (tags.chain)
        self.recent = np.full(RECENT, -1, np.int64)  # call n's tag at [n % RECENT] (no int kept)
        self.last = self.before = None          # the last call's tags.Signature, the one before
        self._calls, self._hashes = self.tags    # (for label)
        self.notices: list = []                 # other ranks' notices not acted on yet (notice.py)
        self.failed_here: set = set()           # calls (absolute numbers) that failed on this rank
        self.outbox: list = []                  # (message, request) of the notices this rank sent
        self.lock = threading.RLock()           # held by the thread in a call on it (enter)
        self.background = None                  # first nonblocking calls being started (executors/background.py)
        self.freed = False                      # the user freed the communicator (free)
        self.watched = None                     # its part of the failure detector (detector.py)
        self.failed: frozenset = frozenset()    # the ranks agreed dead (detector.py)
        self.idents: list = []                  # every rank's detector.identity()
        self.entered = np.zeros(RECENT_ENTRIES)  # when this rank entered call n, at [n % ...]
        notice.register(comm, self)

    def check(self, what: str = "mpicoll") -> None:
        """Raise ``CommunicatorBroken`` if an earlier call on this communicator failed mid-way
        (``ProcessFailed`` if a rank of it died)."""
        if self.watched is not None and self.watched.known:
            raise detector.failure(self, what)
        if self.broken:
            raise CommunicatorBroken(
                f"{what}: mpicoll will not use this communicator again: an earlier call failed "
                f"({self.broken}) and its messages may still be in flight; create a new "
                "communicator to go on: comm.Dup() on every rank, or mpicoll.shrink(comm) on "
                "every survivor if a rank died")

    def start(self) -> None:
        """The set-up's first steps, on the caller's thread of a nonblocking call, without
        waiting for any rank (``setup``: the call returns at once): post the presence check's
        messages and start ``MPI_Comm_idup``, so that it takes its place among the collectives
        this rank starts on the communicator (MPI's ordering rule). ``ready``, on the
        background thread, then waits for them and uses only the duplicate and what was posted
        here: the user may free the communicator meanwhile."""
        self.check()
        if self.made or self._dup is not None:
            return
        self._collect_notices()                 # (judged by ``ready``)
        detector.prepare()                      # (its signal handler: main thread only)
        self._presence = post_presence(self.parent)
        self.failed_here.clear()                # (first calls that failed reuse the number)
        self.comm, self._dup = self.parent.Idup()

    def ready(self, watch=None) -> None:
        """Make the duplicate (under ``watch``'s deadline, if any), then find the nodes. While
        the first nonblocking calls are started in the background (``setup``), wait for them:
        they come first."""
        background = self.background
        if background is not None:
            background.wait_empty()
        self.check()
        if self.made:
            return
        if self._dup is None:
            presence(self.parent, watch)
            self._judge_notices()
            self.failed_here.clear()            # (first calls that failed reuse the number)
            self.comm, self._dup = self.parent.Idup()
        elif self._presence is not None:        # posted by ``start``: the others' messages
            (peers, posted), self._presence = self._presence, None
            wait_posted(posted, peers, watch, "the presence check before MPI_Comm_idup (first "
                        "call on the communicator)")
            self._judge_notices(probe=False)
            wait_posted([self._dup], [], watch, "MPI_Comm_idup (mpicoll's duplicate of the "
                        "communicator)")
        if watch is None:
            self._dup.Wait()
        else:
            watch.wait([self._dup], "MPI_Comm_idup (mpicoll's duplicate of the communicator)")
        # MPI may have given the duplicate the context id of a communicator freed before, on
        # which a failed call left messages this rank never received (sent after it freed
        # that one, so not drained then). No rank can have sent on the duplicate yet (each
        # first joins node_layout's collectives on it): every message found now is such a one.
        drain(self.comm, (MPI.ANY_TAG,))
        # made, then no Idup pending: ``start`` (the caller's thread, whose next nonblocking
        # call may come right now) sees one or the other, never neither -- it once saw neither
        # here and started a second MPI_Comm_idup, on that rank alone: the set-up then used a
        # duplicate MPICH had not finished (an assertion in csel.c) or waited for ever
        self.made = True
        self._dup = None
        notice.register(self.comm, self)
        # one allgather on the duplicate, no communicator made (MPI_Comm_split_type was one,
        # run by the background thread: all ranks hung in it, issue 40)
        watching = detector.enabled()
        hosts, idents = zip(*self.comm.allgather(
            (node_name(), detector.identity() if watching else None)))
        self._nodes[None] = node_layout(hosts)
        idle.note(next(len(r) for r in self._nodes[None] if self.comm.Get_rank() in r))
        if watching:
            self.idents = list(idents)
            detector.watch(self, self.idents)
        stragglers.write_at_exit()

    def _judge_notices(self, probe: bool = True) -> None:
        """After the presence check: notices of an earlier first call that failed (notice.py)
        are judged, not left (``probe``: received now; else those ``start`` received)."""
        if probe:
            self._collect_notices()
        if self.notices:
            error = notice.judge(self, self.calls + 1, "mpicoll")
            if error is not None:
                error.in_flight = False
                raise error

    def _collect_notices(self) -> None:
        """Receive the notices that have arrived on the caller's communicator."""
        if self.parent.Iprobe(MPI.ANY_SOURCE, roll_call_tag() - notice.NOTICE_TAG_OFFSET):
            self.notices += notice.collect(self.parent)

    @property
    def ranks_per_node(self) -> int | None:
        """For ``auto``: the ranks of the largest node, None on one node."""
        nodes = self.nodes()
        return max(map(len, nodes)) if len(nodes) > 1 else None

    @property
    def real_nodes(self) -> tuple:
        """The hosts the ranks run on (``node_layout``), whatever ``MPICOLL_RANKS_PER_NODE``
        says: which ranks can share memory."""
        return self._nodes[None]

    def next_number(self) -> int:
        """The next call's number; ``label`` gives its tag."""
        self.calls += 1
        self.entered[self.calls & RECENT_ENTRIES_MASK] = time.monotonic()
        if self.notices:                        # another rank failed in a later call: now?
            error = notice.judge(self, self.calls, "mpicoll")
            if error is not None:
                self.mark_broken(f"PeerError: {error}", replace=True)
                raise error
        number = self.calls % self.tags.calls
        self.recent[number & RECENT_MASK] = -1      # until label gives it a tag
        return number

    def label(self, number: int, sig) -> int:
        """The tag of call ``number`` (``next_number``) whose signature is ``sig``: the number,
        and the signature's hash folded with the running hash of every earlier call's
        (``tags.chain``, inlined here), so that ranks whose earlier calls differed never match
        again. Called once per call, in the order of the numbers."""
        if sig is None:
            return number
        history, hashed = self.history, sig.hashed
        self.history = (history * 0x01000193 ^ hashed) & 0xFFFFFFFF
        tag = number + self._calls * ((hashed ^ history) % self._hashes)
        self.recent[number & RECENT_MASK] = tag
        self.before, self.last = self.last, sig
        return tag

    @property
    def last_signature(self) -> str:
        return "" if self.last is None else self.last.text

    def mark(self, watch) -> None:
        """Give ``watch`` what the roll call compares beyond the signature, right after
        ``label``: the running hash after its call and the previous call's signature."""
        watch.history = self.history
        watch.previous = "" if self.before is None else self.before.text

    def history_mark(self) -> tuple:
        """What ``rewind`` restores: the running hash and the last two signatures."""
        return self.history, self.before, self.last

    def rewind(self, mark: tuple) -> None:
        """Forget the call labelled since ``history_mark`` gave ``mark``: it failed before
        communicating, on every rank alike (as if not called), so the histories stay equal."""
        self.history, self.before, self.last = mark

    def take_number(self) -> int:
        """Number a call that fails before it is numbered (no tag, no communication): its
        notice names it (``Call._tell``)."""
        self.calls += 1
        return self.calls

    def absolute(self, number: int) -> int:
        """The absolute number (``calls`` at its start) of the recent call ``number``."""
        return self.calls - (self.calls - number) % self.tags.calls

    # ------------------------------------------------------------ failures

    def mark_broken(self, reason: str, *, replace: bool = False) -> bool:
        """Break the communicator: ``check`` raises from now on, naming ``reason``; an earlier
        reason stays unless ``replace``. Returns whether it was not broken before."""
        first = not self.broken
        if first or replace:
            self.broken = reason
        return first

    def ranks_failed(self, failed: frozenset, why: str) -> None:
        """The failure detector agreed ``failed`` dead: ``why`` breaks the communicator, over
        any earlier reason but a death's."""
        self.failed = failed
        if not (self.broken or "").startswith("ProcessFailed"):
            self.broken = why

    def abandon(self, requests) -> None:
        """Keep a failed call's ``requests`` (and their buffers) alive until the communicator
        is freed (``free_duplicate`` completes or cancels them)."""
        self.abandoned += list(requests)

    def watched_by(self, watched) -> None:
        """The failure detector watches this communicator through ``watched``."""
        self.watched = watched

    # ------------------------------------------------------------ notices (notice.py)

    def add_notices(self, notices: list) -> None:
        """Other ranks' notices, received: judged by ``notice.judge``."""
        self.notices += notices

    def keep_notices(self, notices: list) -> None:
        """The notices ``notice.judge`` keeps for later calls."""
        self.notices = notices

    def sent(self, messages: list) -> None:
        """``(message, request)`` of the notices this rank sent, kept alive until they
        complete (the completed ones are dropped once there are more than 256)."""
        if len(self.outbox) > 256:
            self.outbox = [(m, r) for m, r in self.outbox if not r.Test()]
        self.outbox += messages

    # ------------------------------------------------------------ what calls keep here

    def start_background(self, queue) -> None:
        """``queue`` (``executors.background.Background``) starts the first nonblocking calls;
        ``ready`` waits for it."""
        self.background = queue

    def end_background(self, queue) -> None:
        """``queue`` has started its calls (or stopped)."""
        if self.background is queue:
            self.background = None

    def window(self, nodes=None):
        """mpicoll.shm's window of this communicator (``nodes``: of this rank's node in that
        node layout), or None."""
        return self.shared if nodes is None else self.node_shared.get(nodes)

    def set_window(self, nodes, window) -> None:
        """Keep ``window`` as ``window(nodes)``'s (None: forget it)."""
        if nodes is not None:
            self.node_shared.pop(nodes, None)
            if window is not None:
                self.node_shared[nodes] = window
        else:
            self.shared = window

    def remember_plan(self, plan) -> None:
        """The plan of the last call made here (``plan.last``: what ``auto`` chose)."""
        self.last_plan = plan

    def remember_cached(self, key, entry) -> None:
        """``cache``'s most recently used plan: ``(key, entry)``, replaced whole (thread-safe)."""
        self.last_cached = key, entry

    # ------------------------------------------------------------ buffers and layout

    def scratch(self, dtype: np.dtype, n: int) -> np.ndarray:
        """A scratch array of ``n`` elements, reused across calls (grown when too small)."""
        buf = self._scratch.get(dtype)
        if buf is None or buf.size < n:
            buf = self._scratch[dtype] = np.empty(max(n, 1), dtype)
        return buf[:n]

    def nodes(self) -> tuple:
        """The node layout: a tuple of nodes, each the tuple of its ranks in ``comm``.

        ``MPICOLL_RANKS_PER_NODE=k`` makes virtual nodes of k consecutive ranks; otherwise the
        hosts do (``real_nodes``, found by the set-up: ``node_layout``).
        """
        k = settings.get("MPICOLL_RANKS_PER_NODE")
        if k not in self._nodes:
            self._nodes[k] = virtual_nodes(self.comm.Get_size(), k)
        return self._nodes[k]

    def free(self, comm: MPI.Comm | None = None) -> None:
        """The user freed the communicator: drop mpicoll's stray messages, free the duplicate.

        A failed call can leave roll-call and presence messages that no one will receive (sent
        to a rank that was not in the call), and data messages (sent with another tag than the
        receiver's, by a rank that passed other arguments). Once every rank has freed a
        communicator MPI may give its context to a new one, where they would be received, so
        they are received and dropped here (those still in flight cannot be). Not for
        ``COMM_WORLD``/``COMM_SELF``, whose attributes MPI deletes inside ``MPI_Finalize``, and
        whose context is never reused."""
        self.freed = True
        if MPI.Is_finalized():
            return
        parent = self.parent if comm is None else comm
        builtin = parent in (MPI.COMM_WORLD, MPI.COMM_SELF)     # freed inside MPI_Finalize
        tag = roll_call_tag()
        background = self.background
        if background is not None:
            # The set-up is under way on the background thread (executors/background.py): comm.Free() is
            # local, so it must not wait for the other ranks' set-up. The background thread
            # frees the duplicate once its calls started. MPICH defers this call until the
            # set-up's requests on the communicator complete, then makes it from inside that
            # thread's MPI_Test, where no MPI call may be made ("pthread_mutex_lock: Resource
            # deadlock avoided"): then the communicator's strays are not drained.
            notice.forget(parent)
            if not builtin and threading.current_thread() is not background.thread:
                drain(parent, (tag, tag - PRESENCE_TAG_OFFSET, tag - notice.NOTICE_TAG_OFFSET))
            return
        notice.forget(parent)
        if not builtin:
            drain(parent, (tag, tag - PRESENCE_TAG_OFFSET, tag - notice.NOTICE_TAG_OFFSET))
        self.free_duplicate()

    def free_duplicate(self) -> None:
        """The duplicate's part of ``free``: the requests in flight on it completed, its stray
        messages dropped, its shared memory and itself freed. Once, by whichever thread comes
        first (``free``, or the background thread of a set-up the user freed: executors/background.py)."""
        with _freeing:
            if self._duplicate_freed:
                return
            self._duplicate_freed = True
        builtin = self.parent in (MPI.COMM_WORLD, MPI.COMM_SELF)
        if self.made and not builtin:
            settle(self)
        _orphans.extend(release(self.abandoned + [r for _, r in self.outbox]))
        _orphans.extend(m for m, _ in self.outbox)
        self.abandoned, self.outbox = [], []
        if self.made:
            notice.forget(self.comm)
            detector.forget(self)
        if not self.broken:                     # collective: not after a failure
            for shared in ([self.shared] if self.shared is not None else []) + \
                    list(self.node_shared.values()):
                shared.free()
        if self.made and self.comm != MPI.COMM_NULL:
            if not builtin:     # mpicoll's own: every tag (a failed call's data messages too)
                drain(self.comm, (MPI.ANY_TAG,))
            if self.broken and not builtin:     # messages may still come: free it later
                _quarantine.append((time.monotonic(), self.comm))
            else:
                self.comm.Free()
        if not builtin:                         # (not inside MPI_Finalize)
            free_quarantined()


_freeing = threading.Lock()


def free_quarantined(seconds: float | None = None) -> None:
    """Free the duplicates of broken communicators freed ``seconds`` (default
    ``QUARANTINE_SECONDS``) ago or more, dropping what arrived on them meanwhile.

    A failed call can leave data messages in flight, which ``free`` cannot drain; were the
    duplicate freed at once, MPI could give its context to the next communicator made, where
    they would arrive as strays of another call (a new ``comm.Dup()``'s first call then failed
    with "rank(s) [0] are in another call", 1 run in ~60 of the fault matrix's "Free after
    failure"). Within a node they arrive in microseconds, across nodes in milliseconds."""
    limit = time.monotonic() - (QUARANTINE_SECONDS if seconds is None else seconds)
    while _quarantine and _quarantine[0][0] <= limit:
        _, comm = _quarantine.pop(0)
        drain(comm, (MPI.ANY_TAG,))
        comm.Free()


QUARANTINE_SECONDS = 1.0
_quarantine: list = []      # (when, duplicate) of broken communicators the user freed


def enter(state: CommState, what: str) -> None:
    """This thread enters a call on ``state``'s communicator (release with ``leave``): a
    reentrant lock, so a call inside a call of the same thread passes; raise
    ``ConcurrentCall`` if another thread is in a call on it."""
    if not state.lock.acquire(False):
        concurrent(state, what)


def leave(state: CommState) -> None:
    state.lock.release()


def concurrent(state: CommState, what: str):
    error = ConcurrentCall(
        f"{what}: another thread of this process is in a collective on this communicator; "
        "collectives on one communicator must come in the same order on every rank, which two "
        "threads cannot promise: give each thread its own communicator (comm.Dup()), or "
        "serialise the calls; mpicoll will not use this communicator again")
    # the threads may enter in another order on other ranks, pairing calls of different
    # threads: broken here, and the others told (their next wait raises PeerError)
    if state.mark_broken(f"ConcurrentCall: {error}"):
        if state.made:
            try:
                notice.post(state, state.calls + 1, notice.BROKEN, f"ConcurrentCall: {error}")
            except MPI.Exception:
                pass
    raise error


def exclusive(method):
    """For a method ``(self, state, ...)`` that runs a call on ``state`` (``api.Prepared``):
    ``enter`` / ``leave`` around it (~0.2 us)."""
    @functools.wraps(method)
    def run(self, state, *args):
        lock = state.lock
        if not lock.acquire(False):
            concurrent(state, self.collective)
        try:
            return method(self, state, *args)
        finally:
            lock.release()
    return run


RECENT = 64                 # calls whose tags a CommState remembers (watch.Watch.look)
RECENT_ENTRIES_MASK = RECENT_ENTRIES - 1
RECENT_MASK = RECENT - 1
_orphans: list = []         # requests (and buffers) of freed communicators, kept alive


def settle(state: CommState) -> None:
    """The user frees ``state``'s communicator while requests (``iallreduce`` ...) are in
    flight on it (MPI allows that: the operations complete, then the communicator goes).
    Complete them -- every rank frees its communicator, so the others' requests progress
    too -- under each one's deadline; one that cannot complete fails, cleanly, with
    ``CommunicatorBroken`` (or its ``CollectiveTimeout``), never touching the freed
    communicator afterwards (``executors.progress.settle``)."""
    progress = sys.modules.get("mpicoll.executors.progress")   # not loaded: nothing in flight
    if progress is not None:                # (looked up, not imported: no import cycle)
        progress.settle(state, "the communicator was freed while it was in flight")


def release(items: list) -> list:
    """Complete what can be of a freed communicator's abandoned requests (and notices sent):
    test each, cancel an unfinished one (a receive whose message will never come) and test it
    again; return those still unfinished, with every buffer (kept alive: MPI may still write
    into them). A request left pending keeps its communicator -- and its context id, of which
    MPICH has 2048 per process -- alive: without this a job whose calls kept failing on fresh
    ``comm.Dup()``s ran out of communicators after ~2000 failures."""
    kept = []
    for item in items:
        if isinstance(item, tuple):             # (requests, buffers): collectives' buffers,
            requests = release(item[0])         # kept while a request is unfinished (watch.kept)
            if requests:
                kept.append((requests, item[1]))
            continue
        if not isinstance(item, MPI.Request):
            kept.append(item)                   # a buffer (or a handle array)
            continue
        try:
            if item == MPI.REQUEST_NULL or item.Test():
                continue
            if isinstance(item, MPI.Prequest):  # (an MPI library's persistent collective:
                kept.append(item)               # cancelling one kills MPICH's process)
                continue
            item.Cancel()
            end = time.monotonic() + CANCEL_SECONDS
            while not item.Test():
                if time.monotonic() > end:
                    kept.append(item)           # (a send MPI could not cancel)
                    break
        except MPI.Exception:
            kept.append(item)
    return kept


CANCEL_SECONDS = 0.05       # per request: a cancelled receive completes at once


def drain(comm: MPI.Intracomm, tags) -> None:
    """Receive and drop the messages with these tags that have arrived on ``comm``."""
    status = MPI.Status()
    for tag in tags:
        while comm.Iprobe(MPI.ANY_SOURCE, tag, status):
            comm.Recv(np.empty(status.Get_count(MPI.BYTE), np.uint8), status.Get_source(),
                      status.Get_tag())


PRESENCE_TAG_OFFSET = 1     # the presence check's tag: MPI.TAG_UB - 1 (the roll call's: TAG_UB)


def presence(comm: MPI.Intracomm, watch=None) -> None:
    """Return once every rank of ``comm`` has entered its first mpicoll call on it; past
    ``watch``'s deadline (if any) raise ``CollectiveTimeout`` (a roll call names the missing
    ranks).

    Empty messages, so nothing is left to complete: on a timeout the unfinished receives are
    cancelled and the sends (eager) are already complete. A rank that comes after the others
    gave up finds their roll call here and raises before starting ``MPI_Comm_idup``."""
    wait_presence(comm, post_presence(comm), watch)


def post_presence(comm: MPI.Intracomm) -> tuple:
    """The presence check's messages, posted: receives from every other rank, then sends;
    returns the rank of each request and the requests."""
    tag = roll_call_tag() - PRESENCE_TAG_OFFSET
    others = [r for r in range(comm.Get_size()) if r != comm.Get_rank()]
    return others + others, ([comm.Irecv(_EMPTY, r, tag) for r in others]
                             + [comm.Isend(_EMPTY, r, tag) for r in others])


def wait_posted(requests: list, peers: list, watch, step: str) -> None:
    """Complete ``requests`` posted on a communicator the user may free meanwhile (the
    background set-up, executors/background.py), never touching that communicator: under Open MPI a probe
    of a freed one crashes the process. Past ``watch``'s deadline (if any), cancel what is
    unfinished and raise ``CollectiveTimeout`` naming the ranks (``peers``: each request's)
    whose requests did not complete."""
    pause = 1e-5
    while not MPI.Request.Testall(requests):
        if watch is not None and time.monotonic() > watch.deadline:
            waiting = sorted({p for p, r in zip(peers, requests) if r})
            for request in requests:
                if request:
                    try:
                        request.Cancel()
                    except MPI.Exception:
                        pass            # (an Idup cannot be cancelled: it stays pending)
            watch.abandoned += [r for r in requests if r]
            raise CollectiveTimeout(watch.what, step, 0, waiting_on=waiting,
                                    timeout=watch.timeout)
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)


def wait_presence(comm: MPI.Intracomm, posted: tuple, watch=None) -> None:
    """Wait for ``post_presence``'s requests (see ``presence``)."""
    others, requests = posted
    if watch is None:
        MPI.Request.Waitall(requests)
        return
    try:
        watch.wait(requests, "the presence check before MPI_Comm_idup (first call on the "
                   "communicator)", peers=others, heed_roll_call=True)
    finally:
        for request in requests[:len(requests) // 2]:
            if request and not request.Test():
                request.Cancel()
                request.Wait()


_EMPTY = np.empty(0, np.int8)


def node_name() -> tuple:
    """This rank's node: its host name (``MPI_Get_processor_name``) and, under ``srun``, the
    Slurm node it runs on (``SLURMD_NODENAME``). The launcher's node map is what MPICH's
    ``COMM_TYPE_SHARED`` split follows: Hydra's is by host name; Slurm's PMI by node name, which
    tells apart the emulated nodes of one machine (slurm/local-cluster.sh, one host name).
    Both together: a name Hydra copies to every rank from its own environment keeps the hosts
    apart."""
    return MPI.Get_processor_name(), os.environ.get("SLURMD_NODENAME")


def node_layout(hosts) -> tuple:
    """Ranks grouped by node, nodes ordered by their first rank: ``hosts[r]`` is rank r's
    ``node_name()``. Found by an ``allgather`` of the names rather than by
    ``MPI_Comm_split_type``, so that the set-up makes no communicator but the duplicate: a
    background thread (executors/background.py) making one while the caller's thread makes
    others can wait forever for MPI's context-id agreement."""
    nodes: dict = {}
    for rank, host in enumerate(hosts):
        nodes.setdefault(host, []).append(rank)
    return tuple(sorted(tuple(ranks) for ranks in nodes.values()))


def _delete(comm, keyval, value) -> None:
    value.free(comm)        # (comm: the handle being freed; the user's object may be null now)


_keyval = None


def attach(comm: MPI.Intracomm) -> CommState:
    """The mpicoll state of ``comm`` (created on first use, without communicating)."""
    global _keyval
    if _keyval is None:
        _keyval = MPI.Comm.Create_keyval(delete_fn=_delete)
    st = comm.Get_attr(_keyval)
    if st is None:
        st = CommState(comm)
        comm.Set_attr(_keyval, st)
    return st


def known(comm: MPI.Intracomm) -> CommState | None:
    """The mpicoll state of ``comm`` if it has one (no check, no creation)."""
    return None if _keyval is None else comm.Get_attr(_keyval)


def state(comm: MPI.Intracomm) -> CommState:
    """The mpicoll state of ``comm``, ready to use: created (collectively) on first use."""
    st = attach(comm)
    st.ready()
    return st
