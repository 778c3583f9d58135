"""The one CacheWarning names the real cause: full, no room in the shm
filesystem, or an unreachable server. (A file planted under a cache's name
no longer stops a cache from opening: names are random and a taken one is
skipped; tests/reliability/planted_files_test.cc covers it.)"""

import json
import re
import warnings

import numpy as np
import pytest

from conftest import wait_for
from shmcache import CacheWarning, DatasetCache

MB = np.zeros(1 << 20, dtype=np.uint8)


def cache_warnings(record):
    return [str(x.message) for x in record if issubclass(x.category, CacheWarning)]


def test_server_memory_cap_used_up_at_open_is_named(start_server):
    s = start_server("--memory_cap_mb", "16")
    sid = s.new_session()
    first, second = DatasetCache(sid, name="a"), DatasetCache(sid, name="b")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        stored = [first.put(i, MB) for i in range(32)]
        assert stored[0] and not stored[-1]
        assert second.put(0, MB) is False       # no room for another cache
    msgs = cache_warnings(w)
    assert len(msgs) == 2, msgs
    # Said once, with the library's numbers and the fix.
    assert msgs[0].startswith("shmcache: cache ") and msgs[0].count("full") == 1, msgs[0]
    assert "is full: its budget of 16 MB is used up" in msgs[0] and "size_mb" in msgs[0]
    assert "cached rows are still served" in msgs[0]
    assert msgs[1].startswith("shmcache: the server's memory cap is used up (fix: ")
    assert "unreachable" not in msgs[1] and "bypassed" in msgs[1]
    assert first.get(0) is not None


def test_a_full_cache_is_named_by_its_name_and_session(start_server):
    """The warning names the cache as the user knows it (its name, as
    `shmcache --list_sessions` shows it, and its session), where it said
    "cache 1234567 is full": both the writer that filled it (the server's
    words) and one that finds it already full (the library's)."""
    s = start_server()
    sid = s.new_session()
    filler = DatasetCache(sid, size_mb=8, name="train-images")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        stored = [filler.put(i, MB) for i in range(16)]
        assert stored[0] and not stored[-1]
        late = DatasetCache(sid, size_mb=8, name="train-images")
        assert late.put(100, MB) is False
    msgs = cache_warnings(w)
    assert len(msgs) == 2, msgs
    for msg in msgs:
        assert re.match(rf"shmcache: cache \d+ \(session {sid}, 'train-images'\) is "
                        r"full: its budget of 8 MB is used up", msg), msg
    filler.close()
    late.close()


def test_a_server_under_another_run_dir_is_named_not_started_again(
        server, session, monkeypatch, tmp_path):
    """No server answers in this process's run dir, but one of this user
    runs on the port with another: the warning names its run dir, its pid
    and the SHMCACHE_RUN_DIR that reaches it, where it said "not running ...
    start it with 'shmcache --start'", a start that is refused (one server
    per user and port). The words are the library's (what every client of
    it says: test_client.py, tests/server_elsewhere_test.cc)."""
    here = tmp_path / "elsewhere"
    here.mkdir(mode=0o700)
    monkeypatch.setenv("SHMCACHE_RUN_DIR", str(here))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        c = DatasetCache(session, port=server.port)
        assert c.put(1, MB) is False and c.get(1) is None
    (msg,) = cache_warnings(w)
    p = f" -p {server.port}" if server.port != 50052 else ""
    assert msg == (
        f"shmcache: the cache server is unreachable (Unavailable: no cache server is "
        f"running on port {server.port} with run dir {here}; a server of yours on port "
        f"{server.port} runs with run dir {server.run_dir} (process id {server.pid}), and "
        f"a user has one server per port: use it by running this process with "
        f"SHMCACHE_RUN_DIR={server.run_dir}, or stop it with "
        f"'SHMCACHE_RUN_DIR={server.run_dir} shmcache --stop{p}' before starting one "
        f"here); the cache is bypassed and rows are read from the source"), msg


def test_size_mb_0_over_a_used_up_cap_says_what_holds_it_and_what_to_do(start_server):
    """size_mb=0 asks for all the server allows: a cache that filled the
    whole cap is not told to ask for a larger size_mb, and a cache that
    finds the cap used up by others is told how much of it, which sessions
    hold it and how to free or raise it."""
    s = start_server("--memory_cap_mb", "16")
    sid = s.new_session()
    first, second = DatasetCache(sid, name="a"), DatasetCache(sid, name="b")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(32):
            first.put(i, MB)
        second.put(0, MB)
    whole, none_left = cache_warnings(w)
    assert "larger size_mb" not in whole, whole
    assert "size_mb=0" in whole and "memory cap of 16 MB" in whole, whole
    assert "spilling=True" in whole and "--memory_cap_mb" in whole, whole
    assert none_left.count("used up") == 1, none_left
    assert f"of the 16 MB cap" in none_left and f"session {sid}" in none_left, none_left
    # The commands ask the server on its port, which is not the default one.
    assert f"`shmcache --list_sessions -p {s.port}`" in none_left, none_left
    assert f"`shmcache -d ID -p {s.port}`" in none_left, none_left
    assert "a larger --memory_cap_mb" in none_left, none_left


def test_a_full_caches_warning_says_how_full_and_what_to_do(start_server):
    """CachedLoader's full warning, whether the cache filled under it or
    was full when it opened (a second run, or a worker whose sibling filled
    it): the rows and bytes it holds, its budget, the server's cap, and the
    three ways out (a larger size_mb, spilling, a smaller dataset)."""
    from helpers import Images
    from shmcache.torch import CachedDataset, CachedLoader
    s = start_server("--memory_cap_mb", "16")
    sid = s.new_session()
    msgs = []
    for run in ("fills", "already full"):
        ds = CachedDataset(Images(400, side=64), cache=DatasetCache(sid, size_mb=2, name="t"))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            assert sum(len(labels) for _, labels in CachedLoader(ds, batch_size=64)) == 400
            # The misses are put by the dataset's background writer, which
            # warns at the put the cache refuses: the epoch may end before
            # it gets there (under load, with half of the rows that fit).
            assert ds.flush(60), ds.stats()
        (msg,) = cache_warnings(w)
        msgs.append(msg)
        held = ds.cache.stats()
        assert 0 < held.mem_rows < 400, run
        # The figures when it warned: no row was stored after its first refusal.
        said = re.search(r"is full: its budget of 2 MB is used up by (\d+) rows "
                         r"\((\d+\.\d) MB\)", msg)
        assert said, (run, msg)
        assert said.group(1) == str(held.mem_rows), (run, msg)
        assert said.group(2) == f"{held.mem_bytes / (1 << 20):.1f}", (run, msg)
        assert "the server's memory cap is 16 MB" in msg, (run, msg)
        assert "a larger size_mb" in msg and "spilling=True" in msg, (run, msg)
        assert "a smaller dataset" in msg and "cached rows are still served" in msg, msg
        assert msg.count("full") == 1, msg


def test_a_size_over_the_server_cap_is_compared_in_mb(start_server):
    s = start_server("--memory_cap_mb", "64")
    sid = s.new_session()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        DatasetCache(sid, size_mb=32, name="fits").open()
        big = DatasetCache(sid, size_mb=1000, name="big").open()
    msgs = cache_warnings(w)
    assert len(msgs) == 1, msgs
    assert msgs[0].startswith("shmcache: cache size 1000 MB is more than the 64 MB "
                              "the server can have (memory_cap_mb: "), msgs[0]
    assert "--memory_cap_mb" in msgs[0]
    assert big.size_mb == 1000 and not big.bypassed


def test_a_size_over_the_cap_is_noted_once_and_filling_up_is_not_said_again(start_server):
    """The note on a size over the cap says that rows beyond the cap are
    read from the source: the cache filling up is not said again."""
    s = start_server("--memory_cap_mb", "16")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        c = DatasetCache(s.new_session(), size_mb=1000, name="big").open()
        stored = [c.put(i, MB) for i in range(32)]
    assert stored[0] and not stored[-1]
    (note,) = cache_warnings(w)
    assert note.startswith("shmcache: cache size 1000 MB is more than the 16 MB"), note


def test_a_size_over_the_cap_is_noted_and_the_server_gone_is_still_said(start_server):
    """The note is not the cache's one warning: the server gone later is
    still said (the note took the warning's place, and training went on
    without a word of it)."""
    s = start_server("--memory_cap_mb", "16")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        c = DatasetCache(s.new_session(), size_mb=1000, name="big").open()
        assert c.put(0, MB)
        s.kill()
        stored = [c.put(i, MB) for i in range(1, 17)]
    assert not stored[-1]
    note, gone = cache_warnings(w)
    assert note.startswith("shmcache: cache size 1000 MB is more than the 16 MB"), note
    assert "unreachable" in gone and "more than" not in gone, gone
    assert c.get(0) is not None


def test_size_is_a_deprecated_name_of_size_mb(start_server):
    s = start_server("--memory_cap_mb", "64")
    sid = s.new_session()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        c = DatasetCache(sid, size=1000, name="old").open()   # MindSpore's keyword
    (dep,) = [str(x.message) for x in w if x.category is DeprecationWarning]
    assert "size_mb=" in dep and "MB" in dep
    assert [m.split(" is more")[0] for m in cache_warnings(w)] == \
        ["shmcache: cache size 1000 MB"]
    assert c.size_mb == c.size == 1000
    with pytest.raises(TypeError, match="size_mb"):
        DatasetCache(sid, size_mb=8, size=8)


@pytest.fixture
def small_tmpfs(small_tmpfs_of):
    return small_tmpfs_of("24m")


def test_full_shm_filesystem_is_named_not_cache_full(start_server, small_tmpfs):
    s = start_server("--shm_dir", str(small_tmpfs))
    c = DatasetCache(s.new_session())
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        stored = [c.put(i, MB) for i in range(48)]   # 48 MB into 24 MB
    assert stored[0] and not stored[-1]
    (msg,) = cache_warnings(w)
    assert msg.startswith("shmcache: no room left in the shared-memory filesystem ("), msg
    assert str(small_tmpfs) in msg and "cache is full" not in msg
    assert c.get(0) is not None


def test_unreachable_server_is_named(server, session):
    server.kill()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert DatasetCache(session).get(1) is None
    (msg,) = cache_warnings(w)
    assert msg.startswith("shmcache: the cache server is unreachable ("), msg


def test_a_server_stopped_under_an_open_cache_is_named(server, session):
    """`shmcache --stop` destroys every session as it goes: a trainer's
    cache then finds its session destroyed, and the warning says that this
    is also what a stopped server looks like (told only "session S was
    destroyed", the user who stopped the server looks for a `shmcache -d`)."""
    cache = DatasetCache(session)
    assert cache.put(1, np.zeros(4, dtype=np.float32))
    server.stop()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert not cache.put(2, np.zeros(4, dtype=np.float32))
        assert cache.get(3) is None
    (msg,) = cache_warnings(w)
    assert f"session {session} was destroyed" in msg, msg
    assert "server stopped (shmcache --stop)" in msg, msg


# ---- CachedDataset's warnings name the user's line ----------------------

def _ours(record, category=CacheWarning):
    (w,) = [x for x in record if x.category is category]
    return w


class _Uncacheable:
    """Samples with a str (a file name, say): no column type."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return np.zeros(2, dtype=np.float32), f"file-{i}"


@pytest.mark.parametrize("via", ["index", "DataLoader"])
def test_an_uncacheable_sample_is_warned_about_at_the_users_line(server, session, via):
    """Reached by ds[i] or through DataLoader(num_workers=0) (whose fetcher
    asks for a batch): the warning names the script's line, not the
    package's nor torch's."""
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader
    from shmcache.torch import CachedDataset
    ds = CachedDataset(_Uncacheable(), DatasetCache(session), name=f"u-{via}")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        if via == "index":
            ds[1]
        else:
            list(DataLoader(ds, batch_size=2, num_workers=0))
    w = _ours(w)
    assert "cannot be cached" in str(w.message)
    assert w.filename == __file__, (w.filename, w.lineno)


@pytest.mark.parametrize("via", ["index", "DataLoader"])
def test_a_full_put_queue_is_warned_about_at_the_users_line(server, session,
                                                             monkeypatch, via):
    pytest.importorskip("torch")
    import threading

    import shmcache.async_put
    from torch.utils.data import DataLoader
    from shmcache.torch import CachedDataset
    from helpers import Images
    monkeypatch.setattr(shmcache.async_put, "_warned_causes", set())
    ds = CachedDataset(Images(6), DatasetCache(session), name=f"q-{via}", put_queue=1)
    release = threading.Event()
    real = ds.cache.put_encoded

    def stuck(ids, rows, strict):       # the writer holds row 0: the queue is full
        assert release.wait(60)
        return real(ids, rows, strict)
    ds.cache.put_encoded = stuck
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            if via == "index":
                for i in range(6):
                    ds[i]
            else:
                list(DataLoader(ds, batch_size=3, num_workers=0))
    finally:
        release.set()
    # One warning per cause: the queue slower than the dataset, and, where
    # the held put has waited a second by then (a loaded machine), the
    # stalled server too; each at the user's line.
    ours = [x for x in w if x.category is CacheWarning]
    assert ours
    assert len({str(x.message) for x in ours}) == len(ours), [str(x.message) for x in ours]
    for x in ours:
        assert "put queue is full" in str(x.message), str(x.message)
        assert x.filename == __file__, (x.filename, x.lineno)
    assert ds.flush(60)


def test_dataloaders_pin_memory_warning_names_the_users_line(server, session,
                                                              monkeypatch):
    """pin_memory=True without CUDA: CachedLoader gives what the installed
    torch's DataLoader warns (torch 1.13: nothing; a later one's warning
    stands in), at the script's line."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("pinning works here: nothing to warn about")
    from helpers import Images
    from shmcache.torch import CachedDataset, CachedLoader, _device
    monkeypatch.setattr(_device, "_dataloader_pin_warnings",
                        lambda: (("pin_memory needs CUDA", UserWarning),))
    ds = CachedDataset(Images(4), DatasetCache(session), name="pinned")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        CachedLoader(ds, batch_size=2, pin_memory=True)
    w = _ours(w, UserWarning)
    assert str(w.message) == "pin_memory needs CUDA"
    assert w.filename == __file__, (w.filename, w.lineno)


def test_a_cap_held_by_destroyed_sessions_is_not_blamed_on_live_ones(start_server):
    """Memory of a destroyed session that a process still maps counts
    against the cap: the warning says that this is what holds it, not that
    the live sessions' caches do (they hold nothing), and does not tell the
    user to destroy sessions, which frees nothing; what it names does
    (the mapping process lets go of the cache)."""
    s = start_server("--memory_cap_mb", "16")
    old = s.new_session()
    first = DatasetCache(old, name="a")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(32):
            first.put(i, MB)
        s.admin("-d", str(old))
        sid = s.new_session()
        assert DatasetCache(sid, name="b").put(0, MB) is False
    held = cache_warnings(w)[-1]
    assert "16.0 MB of the 16 MB cap" in held, held
    assert f"session {sid}" not in held and "shmcache -d" not in held, held
    assert "destroyed sessions" in held and "exit" in held, held
    del first   # as the mapping process's exit would
    wait_for(lambda: json.loads(s.admin("--server_info", "--json").stdout)
             ["memory_held_bytes"] == 0, what="the held memory released")
    assert DatasetCache(sid, name="c").put(0, MB) is True


def test_warnings_as_errors_do_not_stop_the_background_writer(start_server):
    """Under warnings.simplefilter("error") (python -W error), the cache
    filling up on CachedDataset's background writer has nobody to raise
    to: the writer reports it as a thread's uncaught error and goes on,
    and flush() returns once the rows are handled. (The warning, raised,
    was caught by the writer's own guard, whose warning was raised in turn
    and ended the writer: flush() then waited for good.)"""
    pytest.importorskip("torch")
    import threading
    from torch.utils.data import DataLoader
    from helpers import MiBRows
    from shmcache.torch import CachedDataset
    s = start_server("--memory_cap_mb", "16")
    ds = CachedDataset(MiBRows(64), DatasetCache(s.new_session(), name="errors"))
    reported = []
    hook = threading.excepthook
    threading.excepthook = lambda args: reported.append(args.exc_value)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            n = sum(len(b[1]) for b in DataLoader(ds, batch_size=4, num_workers=0))
            assert n == 64
            assert ds.flush(60)
    finally:
        threading.excepthook = hook
    assert ds.cache.stats().full
    assert [type(e) for e in reported] == [CacheWarning], reported
    assert "full" in str(reported[0])


# ---- the one warning, over processes --------------------------------------

def _said_in_children(children, act):
    """Forks `children` processes that spin until all are running, then run
    act() at once; the number of CacheWarnings they said, all together."""
    import mmap
    import os
    go = mmap.mmap(-1, 1 + children)     # shared with the children
    pids = []
    for k in range(children):
        pid = os.fork()
        if pid == 0:
            said = 99
            try:
                go[1 + k] = 1
                while go[0] == 0:
                    pass
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    act()
                said = len(cache_warnings(w))
            finally:
                os._exit(said)
        pids.append(pid)
    try:
        wait_for(lambda: all(go[1:]), what="the children spinning")
    finally:
        go[0] = 1     # (a child that never started spinning acts late)
        codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
    assert all(0 <= c <= children for c in codes), codes
    return sum(codes)


def test_processes_meeting_the_cause_at_once_say_it_once(server, session):
    """Workers that use a closed cache at the same instant claim the one
    warning together: exactly one says it. (The claim was a read of the
    shared byte, then a write: two processes between the two both said
    it.)"""
    said = []
    for _ in range(40):
        cache = DatasetCache(session)
        cache.close()
        said.append(_said_in_children(8, lambda: cache.get(1)))
    assert said == [1] * len(said), said


def test_a_cache_costs_no_file_descriptor_for_its_flags(server, session):
    """Many caches in one process (a CachedDataset per file of a dataset,
    say) share the descriptor of their warning flags' memory: each cache
    and each CachedDataset held one (two with its mapping's), and a
    program under ulimit -n 1024 failed at a few hundred."""
    import os
    import resource
    pytest.importorskip("torch")
    from helpers import Images
    from shmcache.torch import CachedDataset
    base = DatasetCache(session)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (before + 64, hard))
    try:
        shards = [CachedDataset(Images(2), base, name=f"shard-{k}", async_puts=False)
                  for k in range(300)]
        held = len(os.listdir("/proc/self/fd")) - before
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert held <= 4, held
    assert shards[299][1] is not None
