"""Training that survives a dead rank: a state committed in memory, restored on the survivors,
and micro-batches that keep a step's gradient the same at any rank count (docs/elastic.md).

    state = mpicoll.elastic.State(w=w, b=b, step=0)     # named arrays and plain values
    state.register_reset_callbacks(rebuild)  # rebuild(comm) after each recovery

    def train(state, comm):
        while state.step < steps:
            for idx in mpicoll.elastic.microbatches(batch_of(state.step), micro, comm):
                ...                                      # this rank's micro-batches
            ...                                          # all-reduce, update state.w in place
            state.step += 1
            state.commit()                               # an in-memory copy

    mpicoll.elastic.run(train, state, comm=None, min_ranks=1, spares=0)

``run`` calls ``train(state, comm)``. When a rank dies, every survivor's mpicoll call raises
``ProcessFailed`` (the failure detector, ``mpicoll.recovery``); ``run`` catches it, the
survivors ``mpicoll.shrink`` the communicator, agree on the last commit they all hold (a rank
may have committed one step more than another: the survivors take the smallest, and every
``State`` keeps its last two commits), restore it, broadcast it from the lowest surviving rank
so every rank holds the same bits, run the reset callbacks, and call ``train`` again on the new
communicator. With fewer than ``min_ranks`` survivors the ``ProcessFailed`` propagates. A rank
that dies during the recovery is found the same way, and the recovery starts again without it.
``spares=S``: the last S ranks wait as hot spares, and one takes a dead rank's place.
"""

from __future__ import annotations

import copy
import io
import json
import os
import pickle
import shutil
import threading
import time
import zlib
from collections.abc import Mapping

import numpy as np
from mpi4py import MPI

from .api import allreduce, bcast
from .errors import ProcessFailed
from .schedule import block_displs
from .recovery import _watched, shrink

__all__ = ["State", "Shard", "shard_bounds", "run", "microbatches"]

_PLAIN, _ARRAYS, _SHARDS = "_plain", "_arrays", "_shards"
SAVE_TIMEOUT = 600.0        # seconds rank 0's writer waits for the other ranks' shards


class Shard:
    """This rank's block of a 1-D array of ``total`` elements cut over the ranks as
    ``schedule.block_displs(total, size)`` does (a ZeRO-style optimizer state): put it in a
    ``State`` (``State(m=Shard(block, total))``; ``state.m`` is then the block itself).
    ``commit`` keeps it locally; ``save`` writes every rank's block and ``load`` cuts the array
    again for the loading rank count. ``run`` cannot restore it after a death -- the dead
    rank's block died with it -- and says so: resume from a checkpoint instead."""

    def __init__(self, block, total: int):
        self.block = np.asarray(block)
        if self.block.ndim != 1:
            raise ValueError(f"a Shard is a 1-D block, got shape {self.block.shape}")
        self.total = int(total)


def shard_bounds(total: int, size: int, rank: int) -> tuple[int, int]:
    """[lo, hi): rank ``rank``'s block of ``total`` elements over ``size`` ranks."""
    displs = block_displs(total, size)
    return displs[rank], displs[rank + 1]


def _as_array(value):
    """A numpy view of ``value`` if it is an array (numpy, or a CPU torch tensor), else None.
    torch is never imported here: a tensor is known by its type's module."""
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__.split(".")[0] == "torch" and hasattr(value, "detach"):
        if value.device.type != "cpu":
            raise TypeError(f"State holds CPU tensors only, got one on {value.device}")
        return value.detach().numpy()           # shares the tensor's memory
    return None


class State:
    """Named arrays (numpy arrays, or a torch ``state_dict``: a mapping of tensors) and plain
    values (step, epoch, a data cursor ...), as attributes or items: ``state.w``,
    ``state["step"]``.

    ``commit()`` keeps an in-memory copy of everything (arrays into buffers allocated at the
    first commit; plain values deep-copied); ``restore()`` puts the last commit back, arrays in
    place (so views of them -- a model's parameters, ``Buckets`` -- stay valid). The last two
    commits are kept, so the survivors of a death can all go back to the same one."""

    def __init__(self, **values):
        object.__setattr__(self, _ARRAYS, {})      # name -> array (or mapping name -> array)
        object.__setattr__(self, _PLAIN, {})
        object.__setattr__(self, _SHARDS, {})      # name -> (this rank's block, total)
        object.__setattr__(self, "commits", 0)     # how many commits this rank made
        object.__setattr__(self, "_kept", [])      # [(commit number, arrays copy, plain copy)]
        object.__setattr__(self, "_callbacks", [])
        for name, value in values.items():
            self[name] = value

    # -- access
    def __setitem__(self, name: str, value) -> None:
        arrays, plain, shards = (getattr(self, k) for k in (_ARRAYS, _PLAIN, _SHARDS))
        arrays.pop(name, None)
        plain.pop(name, None)
        shards.pop(name, None)
        if isinstance(value, Shard):
            shards[name] = (value.block, value.total)
        elif _as_array(value) is not None or (isinstance(value, Mapping) and value and all(
                _as_array(v) is not None for v in value.values())):
            arrays[name] = value
        else:
            plain[name] = value

    def __getitem__(self, name: str):
        for where in (getattr(self, _ARRAYS), getattr(self, _PLAIN)):
            if name in where:
                return where[name]
        if name in getattr(self, _SHARDS):
            return getattr(self, _SHARDS)[name][0]
        raise KeyError(name)

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"State has no {name!r}") from None

    def __setattr__(self, name: str, value) -> None:
        self[name] = value

    def __contains__(self, name: str) -> bool:
        return any(name in getattr(self, k) for k in (_ARRAYS, _PLAIN, _SHARDS))

    def keys(self) -> list[str]:
        return [*getattr(self, _ARRAYS), *getattr(self, _SHARDS), *getattr(self, _PLAIN)]

    def __repr__(self) -> str:
        return f"<State {self.keys()}, {self.commits} commits>"

    def _flat(self, shards: bool = True) -> list[tuple[str, np.ndarray]]:
        """Every array as (dotted name, numpy view), in a fixed order: the replicated ones, then
        (``shards``) this rank's blocks."""
        out = []
        for name, value in getattr(self, _ARRAYS).items():
            if isinstance(value, Mapping):
                out += [(f"{name}.{k}", _as_array(v)) for k, v in value.items()]
            else:
                out.append((name, _as_array(value)))
        if shards:
            out += [(name, block) for name, (block, _) in getattr(self, _SHARDS).items()]
        return out

    # -- commit and restore
    def commit(self) -> None:
        """Keep an in-memory copy of every array and plain value (the last two are kept)."""
        self.wait_saved()
        kept = self._kept
        if len(kept) == 2:                      # reuse the older copy's buffers
            _, buffers, _ = kept.pop(0)
        else:
            buffers = {}
        for name, a in self._flat():
            b = buffers.get(name)
            if b is None or b.shape != a.shape or b.dtype != a.dtype:
                buffers[name] = b = np.empty_like(a, order="C")
            np.copyto(b, a)
        object.__setattr__(self, "commits", self.commits + 1)
        kept.append((self.commits, buffers, copy.deepcopy(getattr(self, _PLAIN))))

    def restore(self, commit: int | None = None) -> None:
        """Put back the last commit (or commit number ``commit``, one of the last two)."""
        if not self._kept:
            raise RuntimeError("State.restore: nothing was committed (call state.commit())")
        chosen = self._kept[-1] if commit is None else next(
            (k for k in self._kept if k[0] == commit), None)
        if chosen is None:
            raise RuntimeError(f"State.restore: commit {commit} is not kept here (kept: "
                               f"{[k[0] for k in self._kept]})")
        number, buffers, plain = chosen
        for name, a in self._flat():
            np.copyto(a, buffers[name])
        object.__setattr__(self, _PLAIN, copy.deepcopy(plain))
        self._kept[:] = [k for k in self._kept if k[0] <= number]
        object.__setattr__(self, "commits", number)

    # -- checkpoints on disk
    def save(self, path, comm=None, *, asynchronous: bool = False) -> None:
        """Called by every rank of ``comm`` (default ``COMM_WORLD``). Rank 0 writes the
        replicated state once into the directory ``path``: one ``.npy`` per array, the plain
        values pickled; every rank writes its ``Shard`` blocks (``NAME.rank<r>.npy``); rank 0
        then writes ``manifest.json`` with every file's CRC-32 and each shard's blocks. All of
        it goes to ``path.tmp``, renamed to ``path`` once complete: a crash never leaves half a
        checkpoint under ``path``. ``asynchronous=True`` writes from a background thread (at
        the lowest CPU priority), from a copy taken now; a later ``commit``, ``save`` or
        ``wait_saved`` waits for it (and raises its error)."""
        self.wait_saved()
        comm = _mpi(comm)
        rank, size = comm.Get_rank(), comm.Get_size()
        path = str(path)
        blocks = getattr(self, _SHARDS)
        snap = self._snapshot([(name, block) for name, (block, _) in blocks.items()])
        shards = {name: (snap[name], total) for name, (_, total) in blocks.items()}
        if rank == 0:
            shutil.rmtree(path + ".tmp", ignore_errors=True)
            os.makedirs(path + ".tmp")
        if shards:
            allreduce(np.zeros(1), comm=comm)               # path.tmp exists before they write
        elif rank != 0:
            return
        if rank == 0:
            arrays = self._snapshot(self._flat(shards=False))
            plain = pickle.dumps(getattr(self, _PLAIN))
            job = lambda: _write(path, arrays, plain, self.commits, shards, size)  # noqa: E731
        else:
            job = lambda: _write_shards(path, shards, rank, size)  # noqa: E731
        if not asynchronous:
            job()
            return
        box: list = []

        def write() -> None:
            try:
                _yield_cpu()
                job()
            except BaseException as exc:    # noqa: BLE001 - raised by wait_saved
                box.append(exc)
        thread = threading.Thread(target=write, name="mpicoll-save", daemon=True)
        thread.start()
        object.__setattr__(self, "_saving", (thread, box))

    def _snapshot(self, flat) -> dict:
        """Copies of ``flat``'s arrays for ``save``, into buffers kept from the last save (a
        fresh 256 MiB buffer cost 0.03-1.3 s of page faults here, the copy itself 0.03 s)."""
        kept = self.__dict__.setdefault("_saved_buffers", {})
        out = {}
        for name, a in flat:
            b = kept.get(name)
            if b is None or b.shape != a.shape or b.dtype != a.dtype:
                kept[name] = b = np.empty_like(a, order="C")
            np.copyto(b, a)
            out[name] = b
        return out

    def wait_saved(self) -> None:
        """Wait for an asynchronous ``save`` to be on disk (raises its error, if any)."""
        saving = self.__dict__.get("_saving")
        if saving is None:
            return
        thread, box = saving
        thread.join()
        object.__setattr__(self, "_saving", None)
        if box:
            raise box[0]

    @classmethod
    def load(cls, path, comm=None) -> "State":
        """A ``State`` of what ``save`` wrote to ``path``, read on every rank of ``comm``, at
        any rank count: the replicated arrays whole, each ``Shard`` cut again for this rank
        (``shard_bounds``) from the saved blocks it overlaps. Every file read is checked
        against the manifest's CRC-32 (``ValueError`` naming the file that differs). Its arrays
        are numpy arrays (copy them into a model with ``np.copyto``); it is committed once, so
        ``run`` can start from it."""
        path = str(path)
        comm = _mpi(comm)
        with open(os.path.join(path, "manifest.json")) as f:
            manifest = json.load(f)

        def read(name: str) -> np.ndarray:
            with open(os.path.join(path, name), "rb") as f:
                data = f.read()
            if zlib.crc32(data) != manifest["crc32"][name]:
                raise ValueError(f"State.load: {os.path.join(path, name)} does not match its "
                                 f"checksum in manifest.json (a damaged checkpoint)")
            return data
        try:
            state = cls._read(read, manifest, comm)
            error = ""
        except ValueError as exc:
            error = str(exc)
        errors = [e for e in comm.allgather(error) if e]    # every rank raises, together
        if errors:
            raise ValueError("; ".join(dict.fromkeys(errors)))
        object.__setattr__(state, "commits", manifest["commits"] - 1)
        state.commit()
        return state

    @classmethod
    def _read(cls, read, manifest: dict, comm) -> "State":
        state = cls(**{name: np.load(io.BytesIO(read(name + ".npy")))
                       for name in manifest["arrays"]})
        for name, saved in manifest.get("shards", {}).items():
            lo, hi = shard_bounds(saved["total"], comm.Get_size(), comm.Get_rank())
            block = np.empty(hi - lo, np.dtype(saved["dtype"]))
            for file, start, end in saved["parts"]:
                if start < hi and end > lo:         # this saved block overlaps ours
                    part = np.load(io.BytesIO(read(file)))
                    a, b = max(start, lo), min(end, hi)
                    block[a - lo:b - lo] = part[a - start:b - start]
            state[name] = Shard(block, saved["total"])
        for name, value in pickle.loads(read("plain.pkl")).items():
            state[name] = value
        return state

    def register_reset_callbacks(self, *callbacks) -> None:
        """Functions called as ``fn(comm)``, with the survivors' new communicator, after each
        recovery and before ``train`` runs again (re-shard the data, rebuild ``Buckets`` on
        ``comm`` ...)."""
        for fn in callbacks:
            if not callable(fn):
                raise TypeError(f"a reset callback must be callable, got {fn!r}")
        self._callbacks.extend(callbacks)

    def sync(self, comm, root: int = 0) -> None:
        """Collective: every rank takes ``root``'s arrays and plain values (broadcast)."""
        for _, a in self._flat(shards=False):     # (a Shard is this rank's own)
            if a.flags.c_contiguous:
                bcast(a, root, comm=comm)
            else:
                b = np.ascontiguousarray(a)
                bcast(b, root, comm=comm)
                np.copyto(a, b)
        data = pickle.dumps(getattr(self, _PLAIN)) if comm.Get_rank() == root else b""
        length = bcast(np.array([len(data)], np.int64), root, comm=comm)
        raw = np.frombuffer(data, np.uint8).copy() if data else np.empty(int(length[0]),
                                                                             np.uint8)
        bcast(raw, root, comm=comm)
        object.__setattr__(self, _PLAIN, pickle.loads(raw.tobytes()))

    def _recover(self, comm) -> None:
        """Collective on the survivors: all restore the same commit -- the newest every one of
        them holds -- and take the lowest rank's copy of it."""
        if getattr(self, _SHARDS):
            raise RuntimeError(f"elastic.run: the State holds sharded arrays "
                               f"({sorted(getattr(self, _SHARDS))}): a dead rank's block died "
                               f"with it; resume from a checkpoint (State.save, State.load)")
        none = np.iinfo(np.int64).max           # a spare that joins holds no commit
        mine = self._kept[-1][0] if self._kept else none
        agreed = int(allreduce(np.array([mine], np.int64), op=MPI.MIN, comm=comm)[0])
        if agreed == none:
            raise RuntimeError("elastic.run: no surviving rank holds a commit (the training "
                               "ranks all died)")
        if self._kept:
            self.restore(agreed)
        self.sync(comm)                         # rank 0 is a former training rank: it holds it
        self._kept.clear()                      # the agreed state, now the same everywhere,
        object.__setattr__(self, "commits", agreed - 1)
        self.commit()                           # is commit ``agreed`` on every rank
        for fn in self._callbacks:
            fn(comm)


def _yield_cpu() -> None:
    """The calling thread (the background writer) at the lowest CPU priority (Linux: a thread's
    nice value is its own), so the training's threads get the cores first."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):       # not Linux: the writer competes as it is
        pass


def _put(path: str, name: str, *parts) -> int:
    """Write ``parts`` (bytes-like) to the file ``path/name``, fsynced; their CRC-32."""
    crc = 0
    with open(os.path.join(path, name), "wb") as f:
        for part in parts:
            f.write(part)
            crc = zlib.crc32(part, crc)
        f.flush()
        os.fsync(f.fileno())
    return crc


def _put_array(path: str, name: str, a: np.ndarray) -> int:
    """An ``.npy`` file: its header, then the array's bytes straight from its memory."""
    head = io.BytesIO()
    fmt = np.lib.format
    fmt.write_array_header_1_0(head, fmt.header_data_from_array_1_0(a))
    return _put(path, name, head.getvalue(), a.reshape(-1).view(np.uint8).data)


def _write_shards(path: str, shards: dict, rank: int, size: int) -> dict:
    """This rank's blocks into ``path.tmp``, then ``done.rank<r>.json`` (their CRC-32s and
    bounds; written last, through a rename: rank 0 takes it as the blocks' arrival)."""
    tmp = path + ".tmp"
    done = {"crc32": {}, "parts": {}}
    for name, (block, total) in shards.items():
        file = f"{name}.rank{rank}.npy"
        done["crc32"][file] = _put_array(tmp, file, block)
        done["parts"][name] = [file, *shard_bounds(total, size, rank)]
    with open(os.path.join(tmp, f".done.rank{rank}"), "w") as f:
        json.dump(done, f)
    os.rename(os.path.join(tmp, f".done.rank{rank}"), os.path.join(tmp, f"done.rank{rank}.json"))
    return done


def _write(path: str, arrays: dict, plain: bytes, commits: int, shards: dict,
           size: int) -> None:
    """Rank 0's part of ``State.save``: the replicated arrays and the plain values, its own
    blocks, then -- once every rank's ``done.rank<r>.json`` is there -- the manifest, and the
    rename of ``path.tmp`` to ``path``."""
    tmp = path + ".tmp"
    sums = {name + ".npy": _put_array(tmp, name + ".npy", a) for name, a in arrays.items()}
    sums["plain.pkl"] = _put(tmp, "plain.pkl", plain)
    saved = {name: {"total": total, "dtype": block.dtype.str, "parts": []}
             for name, (block, total) in shards.items()}
    if shards:
        _write_shards(path, shards, 0, size)
        end = time.monotonic() + SAVE_TIMEOUT
        for r in range(size):
            done = os.path.join(tmp, f"done.rank{r}.json")
            while not os.path.exists(done):
                if time.monotonic() > end:
                    raise RuntimeError(f"State.save: rank {r}'s blocks did not reach {tmp} "
                                       f"within {SAVE_TIMEOUT:g} s")
                time.sleep(0.01)
            with open(done) as f:
                part = json.load(f)
            sums.update(part["crc32"])
            for name, bounds in part["parts"].items():
                saved[name]["parts"].append(bounds)
    with open(os.path.join(tmp, "manifest.json"), "w") as f:
        json.dump({"arrays": list(arrays), "shards": saved, "commits": commits,
                   "crc32": sums}, f, indent=1)
    shutil.rmtree(path, ignore_errors=True)
    os.rename(tmp, path)


def _mpi(comm):
    return MPI.COMM_WORLD if comm is None else getattr(comm, "comm", comm)


def run(train, state: State, comm=None, min_ranks: int = 1, spares: int = 0):
    """Call ``train(state, comm)``; on ``ProcessFailed`` shrink, restore the last commit every
    survivor holds, run the reset callbacks and call ``train`` again on the survivors'
    communicator. Returns what ``train`` returns. Collective over ``comm`` (default
    ``COMM_WORLD``). At the start every rank takes rank 0's state, and it is committed.
    Fewer than ``min_ranks`` training ranks left: the ``ProcessFailed`` propagates.

    ``spares=S``: the last S ranks of ``comm`` are hot spares. They wait outside the training
    communicator (the first N - S ranks), asleep but for a look every ``SPARE_POLL`` seconds.
    When a rank dies, everybody shrinks ``comm``; the training communicator is the first
    N - S ranks of the survivors again, so the lowest spares join it and receive the committed
    state from the lowest surviving rank. With no spare left, the job shrinks. A spare that
    never joins returns None when the training ranks are done."""
    if not isinstance(state, State):
        raise TypeError(f"state must be a mpicoll.elastic.State, got {type(state).__name__}")
    if isinstance(min_ranks, bool) or not isinstance(min_ranks, int) or min_ranks < 1:
        raise ValueError(f"min_ranks must be an int >= 1, got {min_ranks!r}")
    world = _mpi(comm)
    if isinstance(spares, bool) or not isinstance(spares, int) or not \
            0 <= spares < world.Get_size():
        raise ValueError(f"spares must be an int from 0 to {world.Get_size() - 1} (fewer than "
                         f"the {world.Get_size()} ranks), got {spares!r}")
    wanted = world.Get_size() - spares         # the training communicator's size
    state.sync(world)                          # also sets ``world`` up: the detector watches it
    training = _training(world, wanted)
    control = world.Dup() if spares else None  # the end of training, told to the spares
    if training is not None:
        state.commit()
    recovering = False
    while True:
        try:
            if training is None:
                if _idle(world, control, min(wanted, world.Get_size())):
                    return None
            else:
                if recovering:
                    state._recover(training)
                result = train(state, training)
                if control is not None and training.Get_rank() == 0:
                    dead = _known_dead(world)
                    for spare in range(training.Get_size(), world.Get_size()):
                        if spare not in dead:
                            control.send(None, dest=spare, tag=_DONE)
                return result
        except ProcessFailed as error:
            failed = error
        else:                               # a spare that heard of a training rank's death
            failed = ProcessFailed("a training rank died", sorted(_known_dead(world)))
        world = _shrink(world)
        if min(wanted, world.Get_size()) < min_ranks:
            raise ProcessFailed(f"{failed} -- elastic.run: {world.Get_size()} ranks survive "
                                f"(spares included), fewer than min_ranks={min_ranks}",
                                failed.ranks, failed.hosts) from failed
        if control is not None:
            control = world.Dup()
        training = _training(world, wanted)
        recovering = True


SPARE_POLL = 0.05           # seconds between a waiting spare's looks
_DONE = 1                   # tag on run's duplicate of the communicator: training is over


def _training(world, wanted: int):
    """The first ``wanted`` ranks of ``world`` (all of them if fewer): the training
    communicator, or None on a spare (MPI_Comm_create_group: the spares take no part)."""
    if world.Get_size() <= wanted:
        return world
    if world.Get_rank() >= wanted:
        return None
    group = world.Get_group()
    first = group.Range_incl([(0, wanted - 1, 1)])
    try:
        return world.Create_group(first)
    finally:
        first.Free()
        group.Free()


def _known_dead(world) -> frozenset:
    w = _watched(world)
    return frozenset() if w is None else frozenset(w.known)


def _idle(world, control, training_size: int) -> bool:
    """A spare's wait: True when the training is over, False when a training rank died (a
    spare's death is left for the next shrink)."""
    while True:
        if control.Iprobe(source=MPI.ANY_SOURCE, tag=_DONE):
            control.recv(source=MPI.ANY_SOURCE, tag=_DONE)
            return True
        if any(r < training_size for r in _known_dead(world)):
            return False
        time.sleep(SPARE_POLL)


def _shrink(world):
    """``mpicoll.shrink(world)`` once its detector knows of the death (a training rank hears
    of it on the training communicator first), set up so that its detector watches it."""
    end = time.monotonic() + 5.0
    while not _known_dead(world) and time.monotonic() < end:
        time.sleep(1e-3)
    world = shrink(world)
    allreduce(np.zeros(1), comm=world)  # set up: watched from now on
    return world


def microbatches(global_batch, micro: int, comm=None):
    """Yield this rank's fixed-size micro-batches of a step: ``global_batch`` (a number of
    samples B, or the step's sample indices) is cut into B / ``micro`` micro-batches, and rank r
    of N takes the r-th N-th of them, each as an array of ``micro`` indices (``np.arange``
    slices of range(B), or slices of the given indices). The micro-batches do not depend on N,
    so a reproducible sum over them (``mpicoll.reproducible.sum``, then an all-reduce with
    ``reproducible=True``) gives a step's gradient the same bits at any rank count. N must
    divide the number of micro-batches (else ``ValueError``). ``comm``: anything with
    ``Get_size``/``Get_rank`` (default ``COMM_WORLD``)."""
    if isinstance(micro, bool) or not isinstance(micro, (int, np.integer)) or micro < 1:
        raise ValueError(f"micro must be a positive int (samples per micro-batch), got {micro!r}")
    if isinstance(global_batch, (int, np.integer)) and not isinstance(global_batch, bool):
        if global_batch < 1:
            raise ValueError(f"global_batch must be positive, got {global_batch}")
        indices = np.arange(global_batch)
    else:
        indices = np.asarray(global_batch)
        if indices.ndim != 1 or indices.size == 0:
            raise ValueError(f"global_batch must be a sample count or a 1-D array of sample "
                             f"indices, got shape {indices.shape}")
    total = indices.size
    if total % micro:
        raise ValueError(f"a global batch of {total} samples is not a whole number of "
                         f"micro-batches of {micro}")
    count = total // micro
    comm = _mpi(comm)
    size, rank = comm.Get_size(), comm.Get_rank()
    if count % size:
        raise ValueError(f"{count} micro-batches of {micro} (global batch {total}) can't be "
                         f"shared by {size} ranks: the rank count must divide {count}")
    share = count // size
    for m in range(rank * share, (rank + 1) * share):
        yield indices[m * micro:(m + 1) * micro]
