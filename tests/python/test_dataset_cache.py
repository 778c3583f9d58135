"""shmcache.DatasetCache: argument checks, round trips, views, failures."""

import gc
import warnings

import numpy as np
import pytest

import shmcache
from shmcache import CacheWarning, DatasetCache


# ---- argument checks (MindSpore's DatasetCache contract) ------------------

@pytest.mark.parametrize("kwargs", [
    dict(session_id="1"), dict(session_id=1.0), dict(session_id=True),
    dict(session_id=1, size_mb="0"), dict(session_id=1, size_mb=1.5),
    dict(session_id=1, size="0"), dict(session_id=1, size=1.5),
    dict(session_id=1, spilling=1), dict(session_id=1, spilling="yes"),
    dict(session_id=1, hostname=127), dict(session_id=1, port="50052"),
    dict(session_id=1, port=5.0), dict(session_id=1, num_connections="4"),
    dict(session_id=1, prefetch_size=2.0), dict(session_id=1, name=3),
])
def test_wrong_types_raise_type_error(kwargs):
    with pytest.raises(TypeError):
        DatasetCache(**kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(session_id=-1), dict(session_id=2**32),
    dict(session_id=1, size_mb=-1), dict(session_id=1, size=-1),
    dict(session_id=1, size_mb=2**43), dict(session_id=1, size=2**43),  # bytes past int64
    dict(session_id=1, port=1024), dict(session_id=1, port=65536),
    dict(session_id=1, port=0),
    dict(session_id=1, num_connections=0), dict(session_id=1, num_connections=-3),
    dict(session_id=1, prefetch_size=0), dict(session_id=1, name=""),
])
def test_out_of_range_raises_value_error(kwargs):
    with pytest.raises(ValueError):
        DatasetCache(**kwargs)


@pytest.mark.parametrize("host", ["10.0.0.1", "example.com", "192.168.1.2"])
def test_non_local_host_raises_runtime_error(host):
    with pytest.raises(RuntimeError, match="local host"):
        DatasetCache(1, hostname=host)


def test_missing_session_raises_runtime_error(server, session):
    with pytest.raises(RuntimeError, match="does not exist"):
        DatasetCache(session + 1 if session < 2**32 - 1 else 1)


def test_a_missing_session_is_named_with_its_server_and_the_fix(server, session):
    """A user with several servers (one per port) is told which one does
    not hold the session, and the commands for that one: the message said
    "on the cache server" and `shmcache -g`, which asks the default port's."""
    server.admin("-d", str(session))
    with pytest.raises(shmcache.NotFoundError) as e:
        DatasetCache(session)
    assert str(e.value) == (
        f"Session {session} does not exist on the cache server on port "
        f"{server.port}; list those it holds with `shmcache --list_sessions -p "
        f"{server.port}`, or create one with `shmcache -g -p {server.port}`.")


@pytest.mark.parametrize("from_env", [True, False])
def test_session_0_is_no_session_one_warning_and_rows_from_the_source(
        server, session, monkeypatch, from_env):
    # What the Slurm task prolog exports when the prolog could not make a
    # session: training goes on, even with a server of this user answering.
    DatasetCache(session).put(1, (np.zeros(3),))
    for var in ("SHMCACHE_SESSION_ID", "SESSION_ID"):
        monkeypatch.setenv(var, "0")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        c = DatasetCache() if from_env else DatasetCache(0)
        assert c.put(2, (np.zeros(3),)) is False
        assert c.get(1) is None
    warned = [str(x.message) for x in w if issubclass(x.category, CacheWarning)]
    assert len(warned) == 1 and "session 0 is no session" in warned[0], warned
    assert c.bypassed
    assert DatasetCache(session).get(2) is None


def test_session_0_names_the_port_given_in_the_command_that_creates_one(server):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        DatasetCache(0, port=server.port)
    (warned,) = [str(x.message) for x in w if issubclass(x.category, CacheWarning)]
    assert f"create one with `shmcache -g -p {server.port}`" in warned, warned


def test_no_session_says_where_one_comes_from(monkeypatch):
    for var in ("SHMCACHE_SESSION_ID", "SESSION_ID"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match=r"set \$SHMCACHE_SESSION_ID \(scripts/cache.sh "
                       r"and the Slurm prolog export it; `shmcache -g` prints one\)"):
        DatasetCache()


def test_an_empty_session_variable_says_what_left_it_empty(monkeypatch):
    """README's `export SHMCACHE_SESSION_ID=$(shmcache -g | awk ...)` after
    a -g that failed (no server) exports an empty value: the error says so
    and where the cause was printed, where it said none was set."""
    monkeypatch.delenv("SESSION_ID", raising=False)
    monkeypatch.setenv("SHMCACHE_SESSION_ID", "")
    with pytest.raises(ValueError) as e:
        DatasetCache()
    assert str(e.value).startswith(
        "no session: $SHMCACHE_SESSION_ID set but empty, as a `shmcache -g` that failed "
        "leaves it (it printed why: is the server started? `shmcache --start`)"), e.value


@pytest.mark.parametrize("value", ["abc", "-1", "4294967296"])
def test_a_session_variable_out_of_range_is_named(monkeypatch, value):
    """$SHMCACHE_SESSION_ID=-1 (or past 32 bits) was told as an argument:
    "Input session_id is not within the required interval ...; pass the id
    `shmcache -g` printed, or leave it out for $SHMCACHE_SESSION_ID", which
    is where it came from. It is named as 'abc' is."""
    monkeypatch.delenv("SESSION_ID", raising=False)
    monkeypatch.setenv("SHMCACHE_SESSION_ID", value)
    with pytest.raises(ValueError) as e:
        DatasetCache()
    assert str(e.value) == (f"$SHMCACHE_SESSION_ID={value!r} is not a session id (a "
                            "number in 0..4294967295 from `shmcache -g`)")


@pytest.mark.parametrize("value, flaw", [
    (" 12", "white space before it"), ("12 ", "white space after it"),
    ("+12", "a '+' sign"), ("1_2", None), ("\uff11\uff12", None)])
def test_a_session_variable_is_read_as_typed(monkeypatch, value, flaw):
    """As `shmcache -d " 12"` is refused: int() took white space, a '+',
    '_' and non-ASCII digits, hiding a quoting slip."""
    monkeypatch.delenv("SESSION_ID", raising=False)
    monkeypatch.setenv("SHMCACHE_SESSION_ID", value)
    with pytest.raises(ValueError) as e:
        DatasetCache()
    head = (f"$SHMCACHE_SESSION_ID={value!r} is not a session id (a number in "
            "0..4294967295 from `shmcache -g`)")
    assert str(e.value) == head + (f" ({flaw}): set it to the number alone" if flaw
                                   else "")


def test_local_hosts_and_all_arguments_accepted(server, session):
    for host in shmcache.LOCAL_HOSTS:
        c = DatasetCache(session, size_mb=0, spilling=False, hostname=host,
                         port=server.port, num_connections=12, prefetch_size=20)
        # The first host stores the row; the others find it there.
        assert c.put(1, (np.zeros(3),)) is (host == shmcache.LOCAL_HOSTS[0])
    assert DatasetCache(session).get(1)[0].shape == (3,)


def test_fingerprint_mismatch_raises_runtime_error(server, session):
    DatasetCache(session, name="train", fingerprint="decode+resize").open()
    with pytest.raises(RuntimeError, match="different pipeline") as e:
        DatasetCache(session, name="train", fingerprint="decode+crop").open()
    # One sentence: the cache, both fingerprints and the fix, said once
    # (it read "...holds rows of a different pipeline: Fingerprint mismatch:
    # cache 'train' ... holds rows of another pipeline ...").
    assert str(e.value) == (
        f"Cache 'train' in session {session} holds rows of a different pipeline "
        "(fingerprint 'decode+resize', this one is 'decode+crop'); use another cache "
        "name or session"), str(e.value)


def test_bad_row_ids(server, session):
    c = DatasetCache(session)
    with pytest.raises(TypeError):
        c.put("1", (1,))
    with pytest.raises(ValueError):
        c.put(-1, (1,))
    with pytest.raises(ValueError):
        c.get(2**64)
    with pytest.raises(TypeError):
        c.put(1, (object(),))


# ---- rows ---------------------------------------------------------------

DTYPES = [np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32,
          np.uint64, np.int64, np.float16, np.float32, np.float64, np.bool_]


def test_round_trip_dtypes_and_shapes(server, session):
    c = DatasetCache(session)
    rng = np.random.default_rng(0)
    rows = {}
    for i, dt in enumerate(DTYPES):
        for j, shape in enumerate([(), (0,), (7,), (3, 5), (2, 3, 4, 1)]):
            a = (rng.random(shape) * 100).astype(dt)
            rows[i * 10 + j] = (a, i, 1.5 * j, b"\x00bytes\xff" * j)
    for k, row in rows.items():
        assert c.put(k, row) is True
    for k, row in rows.items():
        for copy in (True, False):
            got = c.get(k, copy=copy)
            assert isinstance(got, tuple) and len(got) == 4
            assert got[0].dtype == row[0].dtype and got[0].shape == row[0].shape
            np.testing.assert_array_equal(got[0], row[0])
            assert got[1] == row[1] and got[1].dtype == np.int64
            assert got[2] == row[2] and got[2].dtype == np.float64
            assert got[3] == row[3]
    assert c.get(9999) is None
    st = c.stats()
    assert st["mem_rows"] == len(rows) and st["misses"] >= 1


def test_dict_rows_projection_and_bare_arrays(server, session):
    c = DatasetCache(session)
    img = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)
    assert c.put(5, {"image": img, "label": 3})
    assert c.put(6, np.arange(4.0))
    got = c.get(5)
    assert set(got) == {"image", "label"}
    np.testing.assert_array_equal(got["image"], img)
    assert c.get(5, columns=["label"]) == {"label": 3}
    assert c.get(5, columns="label") == 3
    np.testing.assert_array_equal(c.get(6), np.arange(4.0))
    with pytest.raises(KeyError):
        c.get(5, columns=["nope"])


def test_get_columns_tells_a_missing_column_from_a_missing_row(server, session):
    c = DatasetCache(session)
    assert c.put(5, {"image": np.arange(4), "label": 3})
    with pytest.raises(KeyError, match="row 5 has no column 'nope'"):
        c.get_columns(5, ["label", "nope"])
    assert c.get_columns(6, ["label"]) is None      # a miss
    # Stored names: the int's column carries the number tag.
    assert [shmcache.rows.split_name(n) for n, _, _ in c.get_columns(5, ["label"])] == \
        [("label", shmcache.rows.NUMBER_TAG)]
    assert not c.bypassed


def test_empty_projection_is_a_value_error(server, session):
    c = DatasetCache(session)
    assert c.put(5, {"image": np.arange(4), "label": 3})
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # and no CacheWarning
        for copy in (True, False):
            for empty in ([], ()):
                with pytest.raises(ValueError, match="no column"):
                    c.get(5, columns=empty, copy=copy)
                with pytest.raises(ValueError, match="no column"):
                    c.get(6, columns=empty, copy=copy)   # a miss too
        with pytest.raises(ValueError, match="no column"):
            c.view(5, columns=[])
    assert not c.bypassed
    assert c.get(5, columns=["label"]) == {"label": 3}


def test_first_writer_wins(server, session):
    a, b = DatasetCache(session), DatasetCache(session)
    assert a.put(1, (np.array([1]),)) is True
    assert b.put(1, (np.array([2]),)) is False
    assert b.get(1)[0][0] == 1


def test_torch_tensors_and_bfloat16(server, session):
    torch = pytest.importorskip("torch")
    c = DatasetCache(session)
    t = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    c.put(1, {"x": t, "y": torch.tensor([1, 2], dtype=torch.int32)})
    got = c.get(1)
    assert got["x"].dtype == np.uint16   # numpy has no bfloat16
    assert torch.equal(torch.from_numpy(got["x"].view(np.int16).copy()).view(torch.bfloat16), t)
    assert got["y"].dtype == np.int32


def test_zero_copy_views_are_read_only_and_outlive_the_cache_object(server, session):
    c = DatasetCache(session)
    a = np.random.default_rng(1).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    c.put(7, (a,))
    (v,) = c.view(7)
    assert not v.flags.writeable and not v.flags.owndata
    with pytest.raises(ValueError):
        v[0, 0, 0] = 1
    with pytest.raises(ValueError):
        v.setflags(write=True)
    # The view keeps the mapping alive after every other reference is gone.
    del c
    gc.collect()
    np.testing.assert_array_equal(v, a)
    # A copy is private and writable.
    (w,) = DatasetCache(session).get(7, copy=True)
    assert w.flags.writeable
    w[0, 0, 0] ^= 1
    np.testing.assert_array_equal(DatasetCache(session).view(7)[0], a)


# ---- never break training --------------------------------------------------

def test_full_cache_warns_once_and_keeps_going(server, session):
    c = DatasetCache(session, size_mb=1, name="small")
    row = (np.zeros(64 * 1024, dtype=np.uint8),)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        stored = [c.put(i, row) for i in range(64)]   # 4 MB into 1 MB
    assert stored[0] is True and stored[-1] is False
    assert sum(stored) < 64
    assert len([x for x in w if issubclass(x.category, CacheWarning)]) == 1
    assert not c.accepting
    assert c.get(0) is not None          # what is cached still reads
    assert c.get(63) is None


_FILL_RUN = """
import sys, warnings
import numpy as np
from shmcache import CacheWarning, DatasetCache
session, size_mb, spilling = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
c = DatasetCache(session, size_mb=size_mb, spilling=spilling, name="runs")
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    stored = sum(c.put(i, (np.full(3072, i % 251, np.uint8),)) for i in range(2400))
said = [str(x.message) for x in w if issubclass(x.category, CacheWarning)]
st = c.stats()
print(stored, st.mem_rows + st.disk_rows, st.budget_bytes >> 20, len(said))
print(said[0] if said else "")
"""


@pytest.mark.parametrize("fix", ["larger size_mb", "spilling=True"])
def test_a_full_caches_fix_works_in_the_next_run(spill_server, fix):
    """A run fills its 4 MB cache; its warning says to open the cache with
    a larger size_mb or with spilling=True. The next run (another process,
    the same session and cache) does: it stores the rows the first could
    not, and the first run's rows are still there. Before, the cache kept
    what its first open asked and the next run was refused every new row
    with the same warning."""
    import subprocess
    import sys
    session = spill_server.new_session()

    def run(size_mb, spilling):
        out = subprocess.run(
            [sys.executable, "-c", _FILL_RUN, str(session), str(size_mb), str(int(spilling))],
            check=True, capture_output=True, text=True).stdout
        counts, said = out.split("\n", 1)
        return [int(x) for x in counts.split()], said.strip()

    (_, rows, budget, warned), said = run(4, False)
    assert budget == 4 and 0 < rows < 2400 and warned == 1
    assert fix in said, said
    size = 12 if fix == "larger size_mb" else 4
    (_, now, budget, warned), said = run(size, fix == "spilling=True")
    assert budget == size and warned == 0, said
    assert now == 2400
    c = DatasetCache(session, name="runs")
    assert all(int(c.get(i)[0][0]) == i % 251 for i in range(0, 2400, 7))


def test_too_large_row_is_dropped_alone_with_one_warning(server, session):
    c = DatasetCache(session, size_mb=8, name="small")
    big = (np.zeros(10 << 20, dtype=np.uint8),)
    small = (np.ones(3072, dtype=np.uint8),)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert c.put(0, big) is False
        assert c.put(1, big) is False
        stored = [c.put(i, small) for i in range(2, 102)]
    assert all(stored)
    cw = [x for x in w if issubclass(x.category, CacheWarning)]
    assert len(cw) == 1, [str(x.message) for x in cw]
    assert "10.0 MB" in str(cw[0].message) and "8 MB" in str(cw[0].message)
    assert c.accepting
    st = c.stats()
    assert st["mem_rows"] == 100 and st["disk_rows"] == 0 and not st["full"]
    assert c.get(0) is None and c.get(2) is not None


def test_dead_daemon_at_construction_warns_and_misses(server, session):
    server.kill()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        c = DatasetCache(session)
        assert c.put(1, (1,)) is False
        assert c.get(1) is None
    assert len([x for x in w if issubclass(x.category, CacheWarning)]) == 1
    assert c.bypassed


def test_dead_daemon_keeps_hits_and_warns_once(server, session):
    c = DatasetCache(session)
    big = np.ones(256 * 1024, dtype=np.uint8)
    for i in range(4):
        c.put(i, (big,))
    server.kill()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        # Hits come from mapped memory; puts need chunks from the daemon.
        for i in range(4):
            assert c.get(i) is not None
        stored = [c.put(i, (big,)) for i in range(4, 200)]
    assert stored[-1] is False
    assert len([x for x in w if issubclass(x.category, CacheWarning)]) == 1


# ---- Typed errors, context manager, stats object, signatures -------------

def test_errors_keep_their_types_and_stay_runtime_errors(server, session):
    with pytest.raises(shmcache.NotFoundError, match="does not exist") as e:
        DatasetCache(session + 1 if session < 2**32 - 1 else 1)
    assert isinstance(e.value, RuntimeError)
    DatasetCache(session, name="train", fingerprint="decode+resize").open()
    with pytest.raises(shmcache.FingerprintMismatchError,
                       match="different pipeline") as e:
        DatasetCache(session, name="train", fingerprint="decode+crop").open()
    assert isinstance(e.value, RuntimeError)


def test_context_manager_closes_the_cache_at_the_end_of_the_block(server, session):
    with DatasetCache(session) as c:
        assert isinstance(c, DatasetCache)
        assert c.put(1, np.arange(4))
        assert c.get(1) is not None
    # Closed: this object serves no more (one warning), the row stays cached.
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert c.get(1) is None
    assert c.bypassed and len([x for x in w if x.category is CacheWarning]) == 1
    np.testing.assert_array_equal(DatasetCache(session).get(1), np.arange(4))
    # An exception in the block goes on after the cache is closed.
    with pytest.raises(KeyError):
        with DatasetCache(session).open() as c2:
            raise KeyError("from the block")
    with pytest.warns(CacheWarning, match="was closed .* and then used"):
        assert c2.get(1) is None
    assert c2.bypassed


# Each call after close(), the first after it: what it returns (a miss,
# nothing stored), as a bypassed cache's.
_AFTER_CLOSE = {
    "get": (lambda c: c.get(1), None),
    "view": (lambda c: c.view(1), None),
    "put": (lambda c: c.put(2, np.arange(4)), False),
    "put_batch": (lambda c: c.put_batch([2], [np.arange(4)]), [False]),
    "contains": (lambda c: c.contains(1), False),
    "stats": (lambda c: c.stats(), None),
    "read_into": (lambda c: c.read_into([1], np.zeros((1, 4), np.int64)).tolist(),
                  [False]),
}


@pytest.mark.parametrize("call", sorted(_AFTER_CLOSE))
def test_a_closed_cache_says_it_was_closed_and_what_to_do(server, session, call):
    """Any call of a closed DatasetCache, a put too, degrades as a bypassed
    cache does (never raises: training goes on from the source) with one
    CacheWarning that says the cache was closed and used after, and what
    to do; the rows stay cached for a new DatasetCache."""
    c = DatasetCache(session, name="closed")
    assert c.put(1, np.arange(4))
    c.close()
    fn, miss = _AFTER_CLOSE[call]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert fn(c) == miss
        for again in _AFTER_CLOSE.values():
            assert again[0](c) == again[1]
    said = [str(x.message) for x in w if x.category is CacheWarning]
    assert len(said) == 1, said
    assert f"cache 'closed' of session {session} was closed (close(), or the end " \
        "of its `with` block) and then used" in said[0], said[0]
    assert "open a new DatasetCache" in said[0], said[0]
    assert c.bypassed
    np.testing.assert_array_equal(DatasetCache(session, name="closed").get(1),
                                  np.arange(4))
    assert not DatasetCache(session, name="closed").contains(2)


def test_a_cache_closed_before_its_first_use_stays_closed(server, session):
    """close() before any call opened the cache (a `with` block that used
    nothing, a trainer closing a cache it then hands to workers) closes it
    all the same: it was a no-op, and the next call opened the cache and
    stored what the user had closed it against, unannounced."""
    c = DatasetCache(session, name="never-opened")
    c.close()
    with pytest.warns(CacheWarning, match="was closed .* and then used"):
        assert not c.put(1, np.arange(4))
    assert c.bypassed
    assert not DatasetCache(session, name="never-opened").contains(1)


def _put_in_a_spawned_process(cache, q):
    q.put((cache.put(7, np.arange(4)), cache.get(1) is None, cache.bypassed))


def test_a_closed_cache_stays_closed_where_it_is_unpickled(server, session):
    """A closed cache handed to a spawned process (a DataLoader worker with
    multiprocessing_context='spawn'), or pickled, is closed there too: once
    it reopened the cache in the worker, and stored what the user had
    closed it against. named() of it is another cache, open."""
    import multiprocessing as mp
    import pickle
    c = DatasetCache(session, name="closed")
    assert c.put(1, np.arange(4))
    c.close()
    copy = pickle.loads(pickle.dumps(c))
    with pytest.warns(CacheWarning, match="was closed .* and then used"):
        assert copy.get(1) is None
    assert copy.bypassed and not copy.put(7, np.arange(4))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_put_in_a_spawned_process, args=(c, q))
    p.start()
    try:
        assert q.get(timeout=120) == (False, True, True)
    finally:
        p.join(60)
        if p.is_alive():
            p.kill()
            p.join()
    assert p.exitcode == 0
    assert not DatasetCache(session, name="closed").contains(7)
    other = c.named("other")
    assert other.put(2, np.arange(4)) and not other.bypassed


def test_stats_is_a_typed_object_with_the_dict_view(server, session):
    c = DatasetCache(session)
    c.put(1, np.zeros(8))
    c.get(1)
    c.get(2)
    st = c.stats()
    assert isinstance(st, shmcache.CacheStats)
    assert (st.hits, st.misses, st.mem_rows) == (1, 1, 1)
    assert st["hits"] == st.hits and st.get("mem_rows", 0) == 1
    assert isinstance(st.full, bool) and st.name == "default"
    keys = {"session_id", "cache_id", "name", "mem_rows", "mem_bytes",
            "disk_rows", "disk_bytes", "puts_full", "spill_reads", "hits",
            "misses", "numa_hits", "reserved_bytes", "budget_bytes",
            "avg_row_bytes", "full", "spills_now"}
    assert set(st) == keys and dict(st) == st.as_dict() and len(st) == len(keys)
    # The dataclass's fields are the native table's (format/stats_fields.h).
    assert set(shmcache._shmcache.STAT_FIELDS) == keys
    assert "async_puts" not in st
    with pytest.raises(KeyError):
        st["nothing"]


def test_stats_read_the_old_name_of_spills_now_for_one_release(server, session):
    st = DatasetCache(session).stats()
    assert "spilling" not in st and "spilling" not in list(st)
    with pytest.warns(DeprecationWarning, match="spills_now"):
        assert st["spilling"] is st.spills_now is False
    with pytest.warns(DeprecationWarning, match="spills_now"):
        assert st.spilling is False


def test_public_methods_have_no_private_parameters():
    import inspect
    torch_mod = pytest.importorskip("shmcache.torch")
    for cls in (DatasetCache, torch_mod.CachedDataset,
                torch_mod.CachedIterableDataset, torch_mod.CachedLoader):
        for name, fn in inspect.getmembers(cls, inspect.isfunction):
            if name.startswith("_") and name not in ("__init__", "__getitem__",
                                                     "__getitems__", "__iter__"):
                continue
            params = inspect.signature(fn).parameters
            private = [p for p in params if p.startswith("_")]
            assert not private, f"{cls.__name__}.{name} takes {private}"


def test_reserved_row_ids_are_not_for_rows(server, session):
    c = DatasetCache(session)
    for row_id in (shmcache.MAX_ROW_ID + 1, 2**64 - 1, 2**64 - 2):
        with pytest.raises(ValueError):
            c.put_columns(row_id, [("x", None, np.zeros(1))])
        with pytest.raises(ValueError):
            c.get_columns(row_id)


def test_row_ids_out_of_range_raise_on_the_per_row_paths(server, session):
    # get, view and CachedDataset[i] of an open cache hand the id to the
    # native read unchecked: its range is checked there, as check_id does.
    c = DatasetCache(session, name="ids")
    assert c.put(0, np.zeros(3, np.uint8))
    torch_mod = pytest.importorskip("shmcache.torch")
    ds = torch_mod.CachedDataset([np.zeros(3, np.uint8)], DatasetCache(session),
                                 async_puts=False)
    for row_id in (-1, shmcache.MAX_ROW_ID + 1, 2**64, -2**70):
        reads = (c.get, c.view) if row_id < 0 else (c.get, c.view, ds.__getitem__)
        for read in reads:
            with pytest.raises(ValueError, match=rf"row id {row_id} outside \[0, "):
                read(row_id)
    # A dataset's negative index counts from its end, as DataLoader's
    # dataset does (test_cached_loader's negative-index test); past it, an
    # IndexError.
    assert ds[-1].tolist() == [0, 0, 0]
    with pytest.raises(IndexError, match="out of range"):
        ds[-2**70]
    assert c.get(0).tolist() == [0, 0, 0] and ds[0].tolist() == [0, 0, 0]


@pytest.mark.parametrize("columns", [3.5, object(), b"image"])
def test_a_columns_selection_of_another_type_is_a_type_error_naming_it(
        server, session, columns):
    c = DatasetCache(session, name="cols")
    assert c.put(0, {"image": np.arange(4), "label": 3})
    for read in (lambda: c.get(0, columns=columns), lambda: c.view(0, columns=columns),
                 lambda: c.get_columns(0, columns=columns),
                 lambda: c.read_into([0], (np.zeros((1, 4), np.int64),), columns=columns)):
        with pytest.raises(TypeError, match="columns") as e:
            read()
        assert "not iterable" not in str(e.value)


def test_copy_is_a_flag_on_every_read_as_on_get(server, session):
    # get() takes copy= by its truth value; get_batch and get_columns did not
    # (pybind11's "incompatible function arguments" for anything but a bool).
    c = DatasetCache(session, name="copyflag")
    assert c.put(0, (np.arange(4), 1))
    for copy in (1, 0, np.bool_(True), None):
        assert c.get(0, copy=copy)[0].tolist() == [0, 1, 2, 3]
        assert c.get_batch([0], copy=copy)[0][0].tolist() == [0, 1, 2, 3]
        assert c.get_columns(0, copy=copy)[0][2].tolist() == [0, 1, 2, 3]
        assert c.get_batch_columns([0], copy=copy)[0][0][2].tolist() == [0, 1, 2, 3]
    assert not c.get_batch([0], copy=0)[0][0].flags.writeable    # a view
    assert not c.get_columns(0, copy=0)[0][2].flags.writeable


@pytest.mark.parametrize("kwargs, error", [
    (dict(name=3), TypeError), (dict(name=""), ValueError), (dict(name="x" * 300), ValueError),
    (dict(name="ok", fingerprint=3), TypeError),
    (dict(name="ok", fingerprint="x" * 300), ValueError),
])
def test_named_checks_its_name_as_the_constructor(server, session, kwargs, error):
    c = DatasetCache(session)
    with pytest.raises(error, match="name|fingerprint"):
        c.named(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(name="caf\udce9"), dict(fingerprint="\ud800")])
def test_a_name_that_is_not_utf8_is_a_value_error_naming_it(kwargs):
    with pytest.raises(ValueError, match=f"Argument {next(iter(kwargs))} must be UTF-8"):
        DatasetCache(1, **kwargs)


def test_batch_calls_name_an_argument_of_another_type(server, session):
    c = DatasetCache(session, name="batchargs")
    for call, args, name in [
            (c.put_batch, (5, [1]), "row_ids"), (c.put_batch, ([1], (x for x in [1])), "rows"),
            (c.put_batch, ([1], None), "rows"), (c.get_batch, (5,), "row_ids"),
            (c.get_batch_columns, (None,), "row_ids")]:
        with pytest.raises(TypeError, match=name) as e:
            call(*args)
        assert "not iterable" not in str(e.value) and "has no len" not in str(e.value)


def test_contains_checks_the_id_of_a_bypassed_cache_too(monkeypatch):
    # As get does: a wrong id is the caller's mistake whatever the cache's state.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        c = DatasetCache(0)
    assert c.bypassed and 1 not in c
    with pytest.raises(TypeError):
        c.contains("1")
    with pytest.raises(ValueError):
        c.contains(-1)
