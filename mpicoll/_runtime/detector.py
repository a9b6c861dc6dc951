"""The failure detector: a rank that dies is known to every survivor within seconds, the
survivors agree on who died, and every survivor's current or next call raises ``ProcessFailed``
naming the same ranks (docs/reliability.md, "A rank that dies").

**Who is watched.** Every communicator mpicoll has set up (``CommState.ready``): at set-up its
ranks exchange who they are (``identity``: host, the machine's boot id and pid namespace, pid,
the process's start time). Then a daemon thread, the *detector* (one per process; without
``MPI_THREAD_MULTIPLE`` the caller's waits run its steps instead), every ``MPICOLL_HEARTBEAT``
seconds:

* checks every rank on its own machine (same boot id and pid namespace) directly: a process
  that is gone, a zombie, or another process under a recycled pid (another start time) is
  dead. No message is needed, so a rank that is busy -- numpy, torch, a Python loop, asleep,
  60 s without an mpicoll call -- is never taken for dead;
* watches by heartbeats the ranks it cannot see (ULFM's ring of observers, made node-aware):
  each rank beats every period to its living ring successors up to and including the first one
  on another node (nodes by host name, or ``MPICOLL_RANKS_PER_NODE``; on one node each rank is
  its own), leaving out those that see its process. A watched rank silent for
  ``MPICOLL_HEARTBEAT_TIMEOUT`` seconds is dead, so a node whose ranks die together is found
  within one timeout (a plain ring took k timeouts for k ranks). After a death the watch sets
  are made again over the living, a newly watched rank given a full timeout. (Two ranks of
  different nodes that die together and are neighbours in the ring are a timeout apart.)

Heartbeats and the agreement's messages travel on mpicoll's duplicate of the communicator, with
tags that calls never use (``TAG_UB - 3``, ``TAG_UB - 4``: ``tags.tag_space``).

**Agreement.** A rank that learns of a death -- its own look, or another rank's message --
starts rounds: in round k it sends every rank it believes alive its set of failed ranks, and
waits for the round-k set of each of them, or for their death. Every set received joins its
own. It decides when two rounds in a row were *stable* (every set received equal to the one it
sent, and its own unchanged meanwhile). A rank that dies during the rounds is found by the same
looks and joins the set, so the rounds go on until the living agree (the idea of ULFM's ERA
agreement: uniform agreement among the living). A rank that decided answers later rounds, so
one that is still going can finish. The decided set breaks the communicator: every waiting or
later call on it raises ``ProcessFailed`` naming those ranks, and ``mpicoll.shrink`` builds a
communicator of the others.

Limit: two deaths a few milliseconds apart, the second after some survivors decided, can give
those survivors' errors the first death only; the next agreement (``shrink`` waits for it)
names both everywhere.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import signal
import socket
import sys
import threading
import time
import weakref

import numpy as np
from mpi4py import MPI

from .. import settings
from ..errors import CommunicatorBroken, ProcessFailed
from ..shm import probe
from .tags import tag_ub

__all__ = ["identity", "watch", "forget", "failure", "settle", "revoke", "HEARTBEAT_TAG_OFFSET",
           "AGREE_TAG_OFFSET"]

HEARTBEAT_TAG_OFFSET = 3        # TAG_UB - 3: heartbeats
AGREE_TAG_OFFSET = 4            # TAG_UB - 4: the agreement's rounds, revocations
REVOKE = -1                     # an agreement message's round: the sender revoked the communicator
DECIDED = -2                    # ... the sender decided on the set it carries
ACTIVE_POLL = 1e-3              # the thread's period while an agreement is under way
SLEEP_SLICE = 0.02              # it sleeps in slices this long, to see ``_wake``
DECISION_SECONDS = 3.0          # how long a call that found a death waits for the agreement
# Modules whose import holds the GIL (the detector thread's too) for long: ml_dtypes' takes 0.43 s
# here, 2.3 s at load 9 on 2 cores, past a heartbeat timeout. Imported before heartbeats are
# judged (``watch``), not at the first reproducible or bfloat16 call in the middle of a job.
HOLD_THE_GIL = ("ml_dtypes",)
# Ranks finish a communicator's set-up at different times (that import, a kernel load, the
# CPU): a rank watched by heartbeats gets this much more for its first one on it.
SETUP_GRACE = 3.0


def _machine() -> str:
    """What tells two processes they can see each other's pids: the boot and the pid namespace."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}:{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return f"nopid:{socket.gethostname()}:{os.getpid()}"     # sees no one


def _start_time(pid: int) -> int:
    """The process's start time (clock ticks after boot, ``/proc/PID/stat`` field 22), or -1."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            head = f.read()
    except OSError:
        return -1
    fields = head[head.rfind(b")") + 2:].split()
    return int(fields[19]) if len(fields) > 19 else -1


def identity() -> tuple:
    """(host, machine, pid, start time) of this process, exchanged at a communicator's set-up."""
    pid = os.getpid()
    return socket.gethostname(), _machine(), pid, _start_time(pid)


def _alive(ident: tuple) -> bool:
    """Whether the process of ``ident`` (on this machine) still runs, and is the process that
    started then (not a recycled pid): ``shm.probe.alive``."""
    return probe.alive(ident[2], ident[3])


_looked: dict = {}          # identity -> alive, for one pass over every watched communicator
# the error classes of ULFM (MPI 5's draft; Open MPI's mpirun --with-ft ulfm) for a dead peer
PROC_FAILED = {getattr(MPI, name) for name in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING",
                                                "ERR_REVOKED") if hasattr(MPI, name)}


def _alive_now(ident: tuple) -> bool:
    """``_alive``, asked once per process per pass (``step_all``): a process is a rank of
    every communicator it shares with this one, and tests make hundreds."""
    alive = _looked.get(ident)
    if alive is None:
        alive = _looked[ident] = _alive(ident)
    return alive


def describe(ranks, idents) -> str:
    """``rank 2 (host h, pid 123)`` for each of ``ranks``."""
    return ", ".join(f"rank {r} (host {idents[r][0]}, pid {idents[r][2]})" for r in sorted(ranks))


class Watched:
    """One communicator's part of the detector: what its rank knows and agrees of its peers."""

    def __init__(self, state, idents: list):
        comm = state.comm
        self.state = weakref.ref(state)
        self.comm, self.me, self.size = comm, comm.Get_rank(), comm.Get_size()
        self.idents = idents
        only_heartbeats = settings.get("MPICOLL_HEARTBEAT_ONLY")
        mine = idents[self.me][1]
        self.seen = [r != self.me and not only_heartbeats and idents[r][1] == mine
                     and not mine.startswith("nopid:") for r in range(self.size)]
        nodes = state.nodes()   # rank -> its node; on one node each rank its own (plain ring)
        self.node = list(range(self.size))
        for i, ranks in enumerate(nodes if len(nodes) > 1 else ()):
            for r in ranks:
                self.node[r] = i
        self.known: set = set()             # failed ranks known here
        self.decided: frozenset = frozenset()   # the last agreed set
        self.decisions: list = []           # every agreed set, in order (each holds the last)
        self.found_at = None                # when this rank first knew of a failure
        self.first: frozenset = frozenset()  # ... and of which ranks
        self.revoked_by = None              # a rank that revoked the communicator
        self.acked = 0                      # failures acknowledged (Comm.Ack_failed)
        self.round, self.stable, self.active = 0, 0, False
        self.sent: frozenset = frozenset()  # the set this rank sent in its current round
        self.adopt = None                   # a set another rank decided on (DECIDED)
        self.excluded = None                # (rank, set): the larger side declared this one dead
        self.inbox: dict = {}               # round -> {rank: set}
        self.heard: dict = {}               # rank -> when its last heartbeat came
        self.since: dict = {}               # rank watched by heartbeats -> since when
        self.beat_to: list = []             # ranks this one sends heartbeats to
        self.ring_known = -1                # len(known) the two were made for (``_ring``)
        self.next_beat = 0.0
        self.outbox: list = []              # (buffer, request)
        self.words = (self.size + 63) // 64
        self.tags = tag_ub() - HEARTBEAT_TAG_OFFSET, tag_ub() - AGREE_TAG_OFFSET
        self._beat = np.zeros(1, np.int64)          # what heartbeats send (never written)
        self._heard = np.zeros(1, np.int64)         # ... and are received into
        self._status = MPI.Status()

    # ------------------------------------------------------------------------- one step

    def step(self, now: float, period: float, timeout: float) -> None:
        if self.excluded is not None:       # out of the communicator: silent from now on
            return
        try:
            self._receive(now)
        except MPI.Exception as exc:
            if exc.Get_error_class() not in PROC_FAILED:
                raise
            self._library_knows()
        if self.excluded is not None:
            return
        # the rounds the messages received complete first, then a look: a rank that decided
        # and left (its program ended) sent all this rank needs before it went
        self._agree_if_needed()
        self._look(now, timeout)
        self._agree_if_needed()
        self._heartbeat(now, period)

    def _agree_if_needed(self) -> None:
        if self.active or self.known != self.decided or any(r > self.round for r in self.inbox):
            self._agree()

    def _receive(self, now: float) -> None:
        comm, (beat, agree), status = self.comm, self.tags, self._status
        while comm.Iprobe(MPI.ANY_SOURCE, beat, status):
            src = status.Get_source()
            comm.Recv(self._heard, src, beat)
            self.heard[src] = now
        while comm.Iprobe(MPI.ANY_SOURCE, agree, status):
            src = status.Get_source()
            msg = np.empty(1 + self.words, np.int64)
            comm.Recv(msg, src, agree)
            if src in self.known:           # fail-stop: a rank agreed or found dead here is
                continue                    # not heard (a late one must not split the living)
            got = self._members(msg[1:])
            number = int(msg[0])
            if number == REVOKE:
                self._revoked(src)
                continue
            if self.me in got and self._outnumbered(got):
                self._exclude(src, got)
                return
            self._learn(got)
            if number == DECIDED:
                self.adopt = frozenset(got)
                continue
            if number >= self.round:
                self.inbox.setdefault(number, {})[src] = frozenset(got)
            self.heard[src] = now           # (any message says the sender lives)

    def _outnumbered(self, got) -> bool:
        """Whether the ranks alive by ``got`` (another rank's failed set, this one in it) are
        more than those on this rank's side (alive here, and not of theirs: they count this
        one dead), or as many with a lower first rank: that side goes on."""
        theirs = [r for r in range(self.size) if r not in got]
        mine = [r for r in range(self.size) if r not in self.known and r in got]
        return (len(theirs), -theirs[0]) > (len(mine), -mine[0])

    def _exclude(self, src: int, got) -> None:
        """The larger side of the communicator counts this rank dead (its heartbeats came
        late): it is out (fail-stop, as ULFM's), so two sides never both go on alone."""
        self.excluded = (src, frozenset(got))
        self.active = False
        self.known = set(range(self.size)) - {self.me}  # (so every wait looks, and raises)
        st = self.state()
        if st is not None:
            st.ranks_failed(frozenset({self.me}), f"ProcessFailed: rank {self.me} was declared "
                            f"dead by rank {src} and the ranks alive with it")
        with _decided:
            _decided.notify_all()

    def _library_knows(self) -> None:
        """An MPI library with ULFM (Open MPI's ``mpirun --with-ft ulfm``) found a death
        itself and fails receives from any source until it is acknowledged: learn its failed
        processes, and acknowledge them so that the looks go on."""
        comm = self.comm
        try:
            failed = comm.Get_failed()
            try:
                group = comm.Get_group()
                ranks = MPI.Group.Translate_ranks(failed, list(range(failed.Get_size())), group)
                group.Free()
            finally:
                failed.Free()
            comm.Ack_failed()
        except (MPI.Exception, AttributeError, NotImplementedError):
            return
        self._learn(r for r in ranks if r != MPI.UNDEFINED)

    def _look(self, now: float, timeout: float) -> None:
        # (no list or tuple made on the way: free lists keep them, which the callers'
        # allocation tests, tracing every thread, would count as kept)
        for r in range(self.size):
            if self.seen[r] and r not in self.known and not _alive_now(self.idents[r]):
                self._found(r)
        if len(self.known) != self.ring_known:
            self._ring(now)
        for r in self.since:            # (a rank not heard yet here: SETUP_GRACE more)
            last = self.heard.get(r, 0.0)
            if r not in self.known and now - max(last, self.since[r]) > \
                    (timeout if last else timeout + SETUP_GRACE):
                self._found(r)

    def _ring(self, now: float) -> None:
        """Whom this rank sends heartbeats to and whom it watches by them, among the living:
        rank s gets rank r's heartbeats if every living rank between r and s (ring order) is on
        r's node and s cannot see r's process. Going forward, that is the successors up to and
        including the first one on another node; going back, the nearest living predecessor and
        the ranks before it on that predecessor's node. Both sides compute it from the same
        node layout and the same deaths (a rank that learns of a death later only watches or
        sends more until then). A rank newly watched has a full timeout from ``now``."""
        me, size, node = self.me, self.size, self.node
        beat_to = []
        for k in range(1, size):                            # forward: who hears this rank
            s = (me + k) % size
            if s in self.known:
                continue
            if not self.seen[s]:
                beat_to.append(s)
            if node[s] != node[me]:
                break
        since, first = {}, None
        for k in range(1, size):                            # back: whom this rank hears
            p = (me - k) % size
            if p in self.known:
                continue
            if first is None:
                first = p
            elif node[p] != node[first]:
                break
            if not self.seen[p]:
                since[p] = self.since.get(p, now)
        self.beat_to, self.since = beat_to, since
        self.ring_known = len(self.known)

    def _found(self, rank: int) -> None:
        """This rank's own look found ``rank`` dead."""
        self._learn({rank})

    def _learn(self, ranks) -> None:
        new = set(ranks) - self.known - {self.me}
        if new:
            self.known |= new
            if self.found_at is None:
                self.found_at = time.monotonic()
                self.first = frozenset(new)

    def _heartbeat(self, now: float, period: float) -> None:
        if now < self.next_beat:
            return
        self.next_beat = now + period
        self._tidy()
        if len(self.known) != self.ring_known:
            self._ring(now)
        for r in self.beat_to:
            self._send(self._beat, r, self.tags[0])

    def _send(self, msg: np.ndarray, dest: int, tag: int) -> None:
        try:
            self.outbox.append((msg, self.comm.Isend(msg, dest, tag)))
        except MPI.Exception:
            pass                            # (a dead peer's connection: its death is found)

    def _tidy(self) -> None:
        if not self.outbox:
            return
        kept = []
        for msg, req in self.outbox:
            try:
                if req.Test():
                    continue
            except MPI.Exception:
                continue
            kept.append((msg, req))
        if len(kept) > 256:                 # sends to the dead: kept alive, never tested again
            _orphans.extend(kept)
            kept = []
        self.outbox = kept

    # ------------------------------------------------------------------------- agreement

    def _agree(self) -> None:
        if not self.active:
            self.active, self.stable = True, 0
            self.round = max([self.round + 1] + list(self.inbox))
            self._send_round()
        while True:
            if self.adopt is not None and self.adopt != self.decided:
                # another rank decided: every living rank's messages of two rounds carried
                # that set, this one's too, so it is this rank's decision as well (a later
                # death, maybe that rank's own end, makes a new agreement)
                self.active, adopt, self.adopt = False, self.adopt, None
                self._decide(adopt)
                return
            expected = [r for r in range(self.size) if r != self.me and r not in self.known]
            got = self.inbox.get(self.round, {})
            if any(r not in got for r in expected):
                return
            stable = self.known == self.sent and all(got[r] == self.sent for r in expected)
            self.stable = self.stable + 1 if stable else 0
            self.inbox = {k: v for k, v in self.inbox.items() if k > self.round}
            if self.stable >= 2:
                self.active = False
                self._decide(frozenset(self.known))
                return
            self.round += 1
            self._send_round()

    def _send_round(self) -> None:
        self.sent = frozenset(self.known)
        msg = np.zeros(1 + self.words, np.int64)
        msg[0] = self.round
        self._bits(msg[1:], self.sent)
        for r in range(self.size):
            if r != self.me and r not in self.known:
                self._send(msg, r, self.tags[1])

    def _bits(self, words: np.ndarray, ranks) -> None:
        u = words.view(np.uint64)
        for r in ranks:
            u[r // 64] |= np.uint64(1 << (r % 64))

    def _members(self, words: np.ndarray) -> set:
        u = words.view(np.uint64)
        return {r for r in range(self.size) if int(u[r // 64]) >> (r % 64) & 1}

    def _decide(self, failed: frozenset) -> None:
        if failed == self.decided:
            return
        self.decided = failed
        self.decisions.append(failed)
        msg = np.zeros(1 + self.words, np.int64)
        msg[0] = DECIDED
        self._bits(msg[1:], failed)
        for r in range(self.size):          # (so one that lags decides the same, even if
            if r != self.me and (r not in self.known    # this rank ends meanwhile; and a rank
                                 or r in failed and not self.seen[r]):  # only heartbeats named
                self._send(msg, r, self.tags[1])    # dead hears it: if alive, it stops)
        st = self.state()
        if st is not None:
            st.ranks_failed(failed, f"ProcessFailed: {describe(failed, self.idents)} failed")
        with _decided:
            _decided.notify_all()

    def died(self, ranks, what: str):
        """``ranks`` were seen dead (``detector.died``): learn it, and return the agreed
        ``ProcessFailed`` (or, with no rank known dead here, None)."""
        with _lock:
            self._learn(ranks)
        _wake.set()
        state = self.state()
        return None if state is None else failure(state, what, frozenset(ranks) or None)

    def revoke(self) -> None:
        """Tell every other rank this one revoked the communicator (ULFM's ``Revoke``)."""
        msg = np.zeros(1 + self.words, np.int64)
        msg[0] = REVOKE
        for r in range(self.size):
            if r != self.me and r not in self.known:
                self._send(msg, r, self.tags[1])

    def _revoked(self, rank: int) -> None:
        if self.revoked_by is None:
            self.revoked_by = rank
            st = self.state()
            if st is not None:
                st.mark_broken(f"Revoked: rank {rank} revoked the communicator (Comm.Revoke)")


# ----------------------------------------------------------------------------- the thread

_lock = threading.RLock()           # the watched communicators and every step
_decided = threading.Condition(threading.Lock())
_watched: list = []
_orphans: list = []
_thread: threading.Thread | None = None
_stopping = False
_wake = threading.Event()


def enabled() -> bool:
    return settings.get("MPICOLL_HEARTBEAT") is not None


def prepare() -> None:
    """On the caller's thread, before a set-up that a background thread finishes
    (``executors/background.py``): what ``watch`` can do only from the main thread."""
    if enabled():
        _keep_hydra_from_ending_survivors()


def watch(state, idents: list) -> None:
    """Watch ``state``'s communicator (made: its duplicate exists) from now on."""
    if not enabled() or state.comm.Get_size() == 1:
        return
    w = Watched(state, idents)
    if not all(w.seen[r] for r in range(w.size) if r != w.me):
        _import_now(HOLD_THE_GIL)           # heartbeats: no silence of seconds later
    _keep_hydra_from_ending_survivors()
    with _lock:
        _watched.append(w)
        # the first heartbeats now, not at the thread's next pass (up to a period on): this
        # rank is heard at once, and judged from then with no SETUP_GRACE
        w._heartbeat(time.monotonic(), settings.get("MPICOLL_HEARTBEAT") or 1.0)
    state.watched_by(w)
    if MPI.Query_thread() == MPI.THREAD_MULTIPLE and settings.get("MPICOLL_PROGRESS") != "caller":
        _ensure_thread()


def _import_now(names) -> None:
    """Import the modules ``names`` that are installed and not imported yet. Every rank of the
    communicator does it at the same point (right after the set-up's allgather of identities),
    before its heartbeats start: a rank judges its peers from its first look after it."""
    for name in names:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except ImportError:
                pass


def _keep_hydra_from_ending_survivors() -> None:
    """MPICH's launcher (Hydra), started with ``-disable-auto-cleanup``, tells the survivors of
    a dead rank with ``SIGUSR1``, whose default action ends the process: ignore it, unless the
    program handles it itself, so the survivors live to recover (``mpicoll survive`` keeps
    Hydra's other way of ending them at bay). Only from the main thread (Python's rule for
    signal handlers)."""
    if "HYDI_CONTROL_FD" not in os.environ or \
            threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    except (ValueError, OSError):
        pass


def forget(state) -> None:
    """Stop watching ``state``'s communicator (before its duplicate is freed)."""
    w = getattr(state, "watched", None)
    if w is None:
        return
    with _lock:
        if w in _watched:
            _watched.remove(w)
        _orphans.extend(w.outbox)
        w.outbox = []


def step_all() -> None:
    """One look at every watched communicator (the thread's pass, or a caller's)."""
    period = settings.get("MPICOLL_HEARTBEAT") or 1.0
    timeout = settings.get("MPICOLL_HEARTBEAT_TIMEOUT") or float("inf")
    now = time.monotonic()
    _looked.clear()
    i = len(_watched)
    while i:                                # (backwards, no copy: one may be dropped)
        i -= 1
        w = _watched[i]
        try:
            w.step(now, period, timeout)
        except Exception as exc:            # noqa: BLE001 - the thread must go on
            # (MPI.Exception: the communicator is gone, freed under us): stop watching it
            if w in _watched:
                _watched.remove(w)
            if not isinstance(exc, MPI.Exception):
                sys.stderr.write(f"mpicoll: the failure detector stopped watching a "
                                 f"communicator: {type(exc).__name__}: {exc}\n")


def _loop() -> None:
    while not _stopping:
        with _lock:
            if _stopping:
                return
            step_all()
            active = any(w.active for w in _watched)
        # sleep a period, in slices, woken by ``_wake``; nothing made on the way (an Event's
        # wait makes a lock, a clock read a float: free lists keep them, and an allocation
        # test traces every thread)
        slices = 1 if active else round((settings.get("MPICOLL_HEARTBEAT") or 1.0) / SLEEP_SLICE)
        for _ in range(max(slices, 1)):
            if _wake.is_set() or _stopping:
                break
            time.sleep(ACTIVE_POLL if active else SLEEP_SLICE)
        _wake.clear()


def _ensure_thread() -> None:
    global _thread
    if _thread is None or not _thread.is_alive():
        _thread = threading.Thread(target=_loop, name="mpicoll-detector", daemon=True)
        _thread.start()


@contextlib.contextmanager
def paused():
    """No thread for the block (``mpicoll.testing.background_paused``): it ends, and starts
    again after. A thread that merely waits still makes objects, which an allocation test,
    tracing every thread, would count."""
    global _stopping
    with _lock:
        _stopping = True
        _wake.set()
    thread = _thread
    if thread is not None:
        thread.join()
    try:
        yield
    finally:
        _stopping = False
        _wake.clear()
        if thread is not None:
            _ensure_thread()


@atexit.register
def _stop() -> None:
    """Stop the thread before mpi4py's own atexit hook finalizes MPI (hooks run last-first)."""
    global _stopping
    _stopping = True
    _wake.set()
    if _thread is not None:
        _thread.join(timeout=5)


# ----------------------------------------------------------------------------- for calls

def failure(state, what: str, seen: frozenset | None = None, wait: bool = True):
    """The ``ProcessFailed`` (or revocation's ``CommunicatorBroken``) a call on ``state`` must
    raise, or None: a rank of it is known dead here. With ``wait``, first wait (up to
    ``DECISION_SECONDS``) for an agreement on the deaths the call saw (``seen``; default the
    first found here), so that every survivor names the same ranks."""
    w = getattr(state, "watched", None)
    if w is None:
        return None
    if w.excluded is not None:
        src, got = w.excluded
        alive = [r for r in range(w.size) if r not in got]
        return ProcessFailed(
            f"{what}: this rank (rank {w.me}) was declared dead by the others (rank {src} told "
            f"it; alive with it: ranks {alive}): its heartbeats came later than "
            "MPICOLL_HEARTBEAT_TIMEOUT (a stalled or overloaded process?). The survivors go on "
            "without it (mpicoll.shrink); this rank cannot rejoin them: end this process",
            [w.me], {w.me: w.idents[w.me][0]})
    if w.revoked_by is not None and not w.known:
        return CommunicatorBroken(f"{what}: rank {w.revoked_by} revoked this communicator "
                                  "(Comm.Revoke); mpicoll will not use it again")
    if not w.known:
        return None
    failed = settle(w, seen or w.first) if wait else frozenset(w.known)
    return _error(w, what, failed)


def settle(w, cover: frozenset | None = None, limit: float = DECISION_SECONDS) -> frozenset:
    """Wait (up to ``limit`` s) until ``w``'s agreement decided on every death known here --
    or, with ``cover``, on a set that holds ``cover`` (a call names the deaths it saw as the
    others agreed on them, not a rank that ended its program since); returns the decided set
    (past ``limit``: what is known)."""
    end = time.monotonic() + limit
    threaded = _thread is not None and _thread.is_alive()
    _wake.set()

    def settled():
        """The first agreed set that holds ``cover`` (or, without, the agreement on every
        death known here), None while there is none."""
        if cover:
            return next((d for d in w.decisions if cover <= d), None)
        return w.decided if not w.active and w.known == w.decided else None

    while settled() is None and time.monotonic() < end:
        if threaded:
            with _decided:
                _decided.wait(0.005)
        else:
            with _lock:
                step_all()
            time.sleep(2e-4)
    return settled() or frozenset(w.known)


def _error(w, what: str, failed: frozenset):
    return ProcessFailed(
        f"{what}: {describe(failed, w.idents)} failed (the process died); mpicoll will not use "
        "this communicator again: mpicoll.shrink(comm) on every survivor gives a communicator "
        "of the survivors (docs/reliability.md)", failed,
        {r: w.idents[r][0] for r in failed})


def died(state, ranks, what: str):
    """Another part of mpicoll saw ``ranks`` of ``state``'s communicator die (``shm`` waits on
    their pids; it calls ``state.watched.died``): the detector learns it now, and the agreed
    ``ProcessFailed`` is returned (None: the communicator is not watched)."""
    w = getattr(state, "watched", None)
    return None if w is None else w.died(ranks, what)


_next_tick = 0.0


def tick() -> None:
    """Without the detector's thread (no ``MPI_THREAD_MULTIPLE``), a waiting call runs its
    steps, once a period at most; with it, nothing."""
    global _next_tick
    if _thread is not None or not _watched:
        return
    now = time.monotonic()
    if now >= _next_tick and _lock.acquire(False):
        try:
            _next_tick = now + (settings.get("MPICOLL_HEARTBEAT") or 1.0)
            step_all()
        finally:
            _lock.release()


def revoke(state) -> None:
    w = getattr(state, "watched", None)
    if w is not None:
        with _lock:
            w.revoke()
