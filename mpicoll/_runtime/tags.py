"""Message tags: the call's number and a hash of its arguments, so mismatched calls cannot match.

Every call of mpicoll's schedules sends and receives with one tag,

    tag = number + CALLS * (hash(signature) % HASHES)

``number`` counts the calls on the communicator (modulo ``CALLS``: requests in flight together
never share a tag), ``signature`` is the text of the call's arguments that every rank must
agree on -- the collective, algorithm, count, dtype, op, root and the algorithm's options --
and its hash is ``zlib.crc32`` of that text (stable across processes and versions, and of
whatever dtype or op names there are: nothing indexes a fixed table). Ranks that pass
different arguments to the same call then use different tags: none of their messages match,
so no rank can return a partial or wrong result; they wait, and when the deadline passes the
roll call (``watch.py``), which carries each rank's signature, raises ``ArgumentMismatch`` on
every rank naming who passed what.

The layout comes from ``MPI_TAG_UB`` (an attribute of ``COMM_WORLD``, valid for every
communicator; ``tag_space``): tags ``TAG_UB``, ``TAG_UB - 1`` and ``TAG_UB - 2`` are the roll
call's, the presence check's and the notices' (``notice.py``), ``TAG_UB - 3`` and ``TAG_UB - 4`` the
failure detector's (``detector.py``), so calls use 0 .. TAG_UB - 5. ``CALLS`` is 2**13 where the tag space allows
(MPICH: TAG_UB = 2**29 - 1, so HASHES = 65535: two mismatched calls share a tag with
probability 1/65535), and both shrink with a smaller TAG_UB: at MPI's guaranteed minimum,
32767, CALLS = 128 and HASHES = 255; below TAG_UB = 4097 (fewer than 64 call numbers with 64
hashes) there is no hash (HASHES = 1): call numbers only, the old behaviour.

The hash in the tag is not the signature's alone: ``CommState.label`` folds in a running hash
of the signatures of every earlier call on the communicator (``chain``), so once two ranks'
histories differ -- a call whose arguments differed but which completed anyway (a ``bcast``
whose ranks each passed ``root=self``: every root's sends complete without a receiver) -- no
later call of theirs matches either, and the next one is found as a mismatch (``watch.py``).

Not caught by the tags: two mismatched signatures whose hashes collide (modulo HASHES), and the
MPI library's own collectives (``algorithm="mpi"``), which take no tag -- ``call.Call`` checks
those with a one-number agreement instead.
"""

from __future__ import annotations

import functools
import zlib
from typing import NamedTuple

from mpi4py import MPI

from ..registry import COLLECTIVES

__all__ = ["TagSpace", "tag_space", "Signature", "signature", "fields", "tag_ub", "chain"]

_MAX_CALL_BITS = 13


_tag_ub = None


def tag_ub() -> int:
    """``MPI_TAG_UB`` (an attribute of ``COMM_WORLD``), read once: the roll call's tag."""
    global _tag_ub
    if _tag_ub is None:
        _tag_ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
    return _tag_ub


class TagSpace(NamedTuple):
    calls: int          # distinct call numbers
    hashes: int         # distinct hash values

    def tag(self, number: int, hashed: int) -> int:
        return number % self.calls + self.calls * (hashed % self.hashes)


@functools.lru_cache(maxsize=8)
def tag_space(tag_ub: int) -> TagSpace:
    """The tag layout for a communicator whose ``MPI_TAG_UB`` is ``tag_ub``."""
    usable = tag_ub - 4                     # tags 0 .. tag_ub - 5 (watch._RESERVED)
    bits = usable.bit_length() - 1          # 2**bits <= usable
    calls = 1 << min(_MAX_CALL_BITS, bits // 2)
    hashes = usable // calls
    if hashes < 2 or calls < 64:
        return TagSpace(usable, 1)            # too small to share: call numbers only
    return TagSpace(calls, hashes)


class Signature(NamedTuple):
    text: str           # "allreduce ring count=10 dtype=float64 op=sum"
    hashed: int         # zlib.crc32(text)
    library: bool       # the MPI library's own collective (no tags: see call.Call.agree)
    offset: int         # what the hash adds to the call's number: tag_space(TAG_UB).tag(0, hashed)


_cache: dict = {}


def signature(collective: str, algorithm: str, fields: dict) -> Signature:
    """The signature of a call (cached: the same arguments cost one dict lookup, ~0.25 us).

    The cache key is the values in the caller's keyword order (building the (name, value) pairs
    would double the cost): each call site of ``Call.agree`` passes its own fixed set of names,
    and no two sites of one collective and algorithm pass as many values."""
    key = (collective, algorithm, len(fields), *fields.values())
    sig = _cache.get(key)
    if sig is None:
        declared = COLLECTIVES.get(collective, {}).get(algorithm)
        library = declared is not None and declared.library
        if len(_cache) > 4096:
            _cache.clear()
        parts = [collective, algorithm] + [
            f"{name}={_text(value)}" for name, value in sorted(fields.items())
            if value is not None]
        text = " ".join(parts)
        hashed = zlib.crc32(text.encode())
        sig = _cache[key] = Signature(text, hashed, library, tag_space(tag_ub()).tag(0, hashed))
    return sig


def chain(history: int, hashed: int) -> int:
    """The running hash after a call of signature hash ``hashed`` (32 bits, as crc32's)."""
    return (history * 0x01000193 ^ hashed) & 0xFFFFFFFF       # FNV-1's step


def _text(value) -> str:
    if isinstance(value, tuple):            # a node layout
        return "/".join(",".join(map(str, node)) for node in value)
    return str(value)


def fields(text: str) -> dict:
    """``signature``'s text back as ``{field: value}`` (collective and algorithm included)."""
    words = text.split(" ")
    out = {"collective": words[0], "algorithm": words[1]} if len(words) > 1 else {}
    out.update(word.split("=", 1) for word in words[2:])
    return out
