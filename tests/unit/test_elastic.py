"""``mpicoll.elastic`` in one process: State's access, commit and restore (arrays in place, the
last two commits), the micro-batches of every rank count, and ``run``'s recovery path (a
``ProcessFailed`` raised by hand: restore, reset callbacks, train again; ``min_ranks``). The
same with real deaths across ranks: tests/jobs/test_elastic.py."""

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import elastic


class Ranks:
    """Stands for rank ``rank`` of a communicator of ``size`` (microbatches needs no more)."""

    def __init__(self, size, rank):
        self.size, self.rank = size, rank

    def Get_size(self):
        return self.size

    def Get_rank(self):
        return self.rank


def test_lazy_export():
    assert mpicoll.elastic is elastic
    assert {"State", "run", "microbatches"} <= set(elastic.__all__)


def test_state_access_commit_restore():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    state = elastic.State(w=w, step=0, cursor={"epoch": 1, "offset": 5})
    assert state.w is w and state["w"] is w and state.step == 0 and "cursor" in state
    state.commit()
    w += 100
    state.step = 7
    state.cursor["offset"] = 9              # a plain value is deep-copied by commit
    state.restore()
    assert state.w is w                     # in place: views of it stay valid
    assert np.array_equal(w, np.arange(6, dtype=np.float32).reshape(2, 3))
    assert state.step == 0 and state.cursor == {"epoch": 1, "offset": 5}
    with pytest.raises(AttributeError, match="no 'missing'"):
        state.missing


def test_restore_without_commit_raises():
    with pytest.raises(RuntimeError, match="nothing was committed"):
        elastic.State(w=np.zeros(3)).restore()


def test_last_two_commits_are_kept():
    w = np.zeros(4)
    state = elastic.State(w=w, step=0)
    for step in range(1, 4):
        w[:] = step
        state.step = step
        state.commit()
    assert state.commits == 3
    state.restore(2)
    assert state.step == 2 and (w == 2).all() and state.commits == 2
    with pytest.raises(RuntimeError, match="commit 1 is not kept"):
        state.restore(1)


def test_mapping_of_arrays_is_a_state_dict():
    sd = {"fc.weight": np.ones((2, 2)), "fc.bias": np.zeros(2)}
    state = elastic.State(model=sd, step=3)
    state.commit()
    sd["fc.weight"][:] = 5
    state.restore()
    assert (sd["fc.weight"] == 1).all()


@pytest.mark.parametrize("size", [1, 2, 3, 4, 6, 8, 12, 24])
def test_microbatches_cover_the_batch_at_every_rank_count(size):
    batch = np.random.default_rng(0).permutation(1000)[:384]
    seen = []
    for rank in range(size):
        mine = list(elastic.microbatches(batch, 16, Ranks(size, rank)))
        assert len(mine) == 24 // size and all(m.shape == (16,) for m in mine)
        seen += mine
    # the same micro-batches, in the same order, whatever the rank count
    assert np.array_equal(np.concatenate(seen), batch)


@pytest.mark.parametrize("args, match", [
    ((384, 16, Ranks(5, 0)), "24 micro-batches .* 5 ranks"),
    ((100, 16, Ranks(1, 0)), "not a whole number of micro-batches of 16"),
    ((384, 0, Ranks(1, 0)), "micro must be a positive int"),
    ((np.zeros((2, 2)), 2, Ranks(1, 0)), "1-D array"),
])
def test_microbatches_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        list(elastic.microbatches(*args))


def test_run_restores_the_commit_and_resets():
    """A ProcessFailed at step 3 of 5 (raised by hand, on one rank): run restores step 3's
    commit, calls the reset callbacks with the new communicator, and trains again."""
    w = np.zeros(3)
    state = elastic.State(w=w, step=0)
    calls, resets = [], []
    state.register_reset_callbacks(lambda comm: resets.append(comm.Get_size()))

    def train(state, comm):
        calls.append(state.step)
        while state.step < 5:
            if state.step == 3 and len(calls) == 1:
                w[:] = -1                   # half-way through a step: not committed
                raise mpicoll.ProcessFailed("rank 1 died (by hand)", [1])
            state.w += 1
            state.step += 1
            state.commit()
        return "done"

    assert elastic.run(train, state, MPI.COMM_SELF) == "done"
    assert calls == [0, 3] and resets == [1] and state.step == 5 and (w == 5).all()


def test_run_below_min_ranks_propagates():
    state = elastic.State(w=np.zeros(2))

    def train(state, comm):
        raise mpicoll.ProcessFailed("rank 1 died (by hand)", [1])

    with pytest.raises(mpicoll.ProcessFailed, match="fewer than min_ranks=2"):
        elastic.run(train, state, MPI.COMM_SELF, min_ranks=2)
    with pytest.raises(ValueError, match="min_ranks"):
        elastic.run(train, state, MPI.COMM_SELF, min_ranks=0)
    with pytest.raises(ValueError, match="spares must be an int from 0 to 0"):
        elastic.run(train, state, MPI.COMM_SELF, spares=1)


def test_commit_cost_is_a_copy():
    """commit copies into buffers made once: 8 MB in well under the time of a fresh deep copy
    of the arrays (a loose bound: the machine is shared)."""
    import time
    state = elastic.State(**{f"p{i}": np.ones(1 << 18) for i in range(4)}, step=0)
    state.commit()
    state.commit()
    t = time.perf_counter()
    for _ in range(5):
        state.commit()
    per = (time.perf_counter() - t) / 5
    assert per < 0.25, per


@pytest.mark.parametrize("asynchronous", [False, True])
def test_save_load_round_trip(tmp_path, asynchronous):
    w = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    state = elastic.State(w=w, step=7, cursor={"epoch": 2})
    state.save(tmp_path / "c", MPI.COMM_SELF, asynchronous=asynchronous)
    w[:] = 0                                # the save took a copy when it was called
    state.commit()                          # waits for an asynchronous save
    loaded = elastic.State.load(tmp_path / "c", MPI.COMM_SELF)
    assert loaded.step == 7 and loaded.cursor == {"epoch": 2}
    assert loaded.commits == 0              # the number of commits when it was saved
    assert loaded.w.dtype == np.float32 and not np.array_equal(loaded.w, w)
    assert np.array_equal(loaded.w, np.random.default_rng(0).standard_normal((3, 4))
                          .astype(np.float32))
    assert not (tmp_path / "c.tmp").exists()


def test_load_finds_a_damaged_file(tmp_path):
    elastic.State(w=np.arange(100.0), step=1).save(tmp_path / "c", MPI.COMM_SELF)
    raw = bytearray((tmp_path / "c" / "w.npy").read_bytes())
    raw[-1] ^= 1
    (tmp_path / "c" / "w.npy").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="w.npy does not match its checksum"):
        elastic.State.load(tmp_path / "c", MPI.COMM_SELF)


@pytest.mark.parametrize("total", [0, 1, 7, 100])
def test_shard_bounds_partition_every_rank_count(total):
    for size in range(1, 6):
        bounds = [elastic.shard_bounds(total, size, r) for r in range(size)]
        assert bounds[0][0] == 0 and bounds[-1][1] == total
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        assert max(hi - lo for lo, hi in bounds) - min(hi - lo for lo, hi in bounds) <= 1


@pytest.mark.parametrize("asynchronous", [False, True])
def test_shard_is_committed_saved_and_loaded(tmp_path, asynchronous):
    """A Shard: the block is the state's item, committed and restored in place; save writes it
    as velocity.rank0.npy with its bounds in the manifest; load gives the block back."""
    block = np.arange(5, dtype=np.float32)
    state = elastic.State(w=np.ones(2), velocity=elastic.Shard(block, 5), step=3)
    assert state.velocity is block and "velocity" in state.keys()
    state.commit()
    block[:] = -1
    state.restore()
    assert np.array_equal(block, np.arange(5))
    state.save(tmp_path / "c", MPI.COMM_SELF, asynchronous=asynchronous)
    state.wait_saved()
    import json
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert manifest["shards"]["velocity"] == {"total": 5, "dtype": "<f4",
                                              "parts": [["velocity.rank0.npy", 0, 5]]}
    loaded = elastic.State.load(tmp_path / "c", MPI.COMM_SELF)
    assert np.array_equal(loaded.velocity, np.arange(5)) and loaded.step == 3
    with pytest.raises(ValueError, match="1-D"):
        elastic.Shard(np.zeros((2, 2)), 4)


def test_run_refuses_to_recover_a_sharded_state():
    state = elastic.State(v=elastic.Shard(np.zeros(3), 3), step=0)

    def train(state, comm):
        raise mpicoll.ProcessFailed("rank 1 died (by hand)", [1])

    with pytest.raises(RuntimeError, match="sharded arrays .*'v'.*State.load"):
        elastic.run(train, state, MPI.COMM_SELF)
