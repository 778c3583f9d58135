"""shmcache.Client, the admin API of the package (sessions, server info,
stop): its calls against a real server, and its argument checks, which
raise as DatasetCache's do (TypeError for a wrong type, ValueError for a
value out of range, naming the argument) instead of the native module's
"incompatible function arguments" dump."""

import os
import signal

import pytest

import shmcache
from conftest import continued_after, stopped, wait_for


def test_sessions_caches_listing_and_server_info(server, session):
    c = shmcache.Client()
    s = c.create_session()
    assert isinstance(s, int) and s != 0
    c.check_session(s)
    cache = c.open_cache(s, "train", "fp", size_mb=8)
    assert cache.session_id == s
    listed = {x["session_id"]: x["caches"] for x in c.list_sessions()}
    assert [st["name"] for st in listed[s]] == ["train"]
    assert session in listed
    info = c.server_info()
    assert info["pid"] == server.pid and info["port"] == server.port
    assert s in info["sessions"]
    cache.close()
    c.destroy_session(s)
    with pytest.raises(shmcache.NotFoundError, match=f"session {s} does not exist"):
        c.check_session(s)
    with pytest.raises(shmcache.NotFoundError):
        c.destroy_session(s)
    assert isinstance(c, shmcache.Client)


@pytest.mark.parametrize("kwargs, name", [
    (dict(port="50052"), "port"), (dict(port=5.0), "port"), (dict(port=True), "port"),
    (dict(hostname=None), "hostname"), (dict(hostname=127), "hostname"),
    (dict(run_dir=3), "run_dir"), (dict(timeout_ms="5000"), "timeout_ms"),
    (dict(timeout_ms=1.5), "timeout_ms"),
])
def test_wrong_types_raise_type_error_naming_the_argument(kwargs, name):
    with pytest.raises(TypeError, match=name) as e:
        shmcache.Client(**kwargs)
    assert "incompatible" not in str(e.value)


@pytest.mark.parametrize("kwargs, name", [
    (dict(port=1), "port"), (dict(port=-5), "port"), (dict(port=65536), "port"),
    (dict(timeout_ms=0), "timeout_ms"), (dict(timeout_ms=-1), "timeout_ms"),
])
def test_values_out_of_range_raise_value_error_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        shmcache.Client(**kwargs)


@pytest.mark.parametrize("make, said", [
    (lambda: shmcache.Client(port=80),
     "Input port is not within the required interval of [1025, 65535]: got 80; pass "
     "the port the server was started with (`shmcache --start -p N`), or leave it out "
     "for $SHMCACHE_PORT or the default 50052."),
    (lambda: shmcache.Client(timeout_ms=0), "got 0; pass a timeout in milliseconds"),
    (lambda: shmcache.DatasetCache(session_id=-1),
     "got -1; pass the id `shmcache -g` printed, or leave it out for $SHMCACHE_SESSION_ID"),
    (lambda: shmcache.DatasetCache(session_id=1, size_mb=-8),
     "got -8; pass the cache's memory budget in MB, or 0 for as much as the server allows"),
    (lambda: shmcache.DatasetCache(session_id=1, read_threads=1000),
     "got 1000; pass a number of threads (0 or 1: the calling thread alone), or leave it "
     "out for min(4, CPUs)"),
    (lambda: shmcache.DatasetCache(session_id=1, prefetch_size=0),
     "got 0; pass a positive number, or leave it out"),
], ids=["port", "timeout_ms", "session_id", "size_mb", "read_threads", "prefetch_size"])
def test_a_value_out_of_range_says_what_to_pass_instead(make, said):
    """MindSpore's words name the interval; the value given and what to
    pass follow, where they said the interval alone."""
    with pytest.raises(ValueError) as e:
        make()
    assert said in str(e.value), e.value


@pytest.mark.parametrize("var, value, said", [
    ("SHMCACHE_PORT", "", "SHMCACHE_PORT: port '' is not a number in 1025..65535 (it is "
     "empty)"),
    ("SHMCACHE_PORT", "050052", "SHMCACHE_PORT: port '050052' is not a number in "
     "1025..65535 (a leading zero)"),
    ("SHMCACHE_HOST", "", "SHMCACHE_HOST: host '' is empty; set it to 127.0.0.1, "
     "localhost or ::1, or unset it"),
    ("SHMCACHE_RUN_DIR", "", "run dir '' (SHMCACHE_RUN_DIR) is not an absolute path "
     "(it is empty); set SHMCACHE_RUN_DIR to an absolute directory, or unset it for "
     f"/tmp/shmcache-{os.geteuid()}"),
])
def test_environment_values_are_read_as_the_admin_reads_them(monkeypatch, var, value,
                                                             said):
    """An empty $SHMCACHE_PORT, $SHMCACHE_HOST or $SHMCACHE_RUN_DIR (an
    unset variable in a script) was taken as unset, a leading zero as
    decimal: refused, naming the variable, as `shmcache` refuses them."""
    monkeypatch.setenv(var, value)
    with pytest.raises(RuntimeError) as e:
        shmcache.Client()
    assert said in str(e.value), e.value


def test_a_non_local_host_is_a_runtime_error_as_for_dataset_cache():
    with pytest.raises(RuntimeError, match="local host"):
        shmcache.Client(hostname="example.com")


@pytest.mark.parametrize("call", ["destroy_session", "check_session"])
def test_session_ids_are_checked(server, call):
    c = shmcache.Client()
    f = getattr(c, call)
    for bad in ("1", 1.0, None, True):
        with pytest.raises(TypeError, match="session_id") as e:
            f(bad)
        assert "incompatible" not in str(e.value)
    for bad in (-1, 2**32):
        with pytest.raises(ValueError, match="session_id") as e:
            f(bad)
        # What to pass, not DatasetCache's "or leave it out": the call needs one.
        assert "shmcache -g" in str(e.value) and "leave it out" not in str(e.value)


@pytest.mark.parametrize("call", [
    lambda c: c.destroy_session(0), lambda c: c.check_session(0),
    lambda c: c.open_cache(0, "n", "f")], ids=["destroy", "check", "open_cache"])
def test_session_0_is_no_session_id(server, call):
    """As `shmcache -d 0`: 0 is no session the server could hold (what a
    launcher that could not create one exports), not one that is gone."""
    with pytest.raises(ValueError) as e:
        call(shmcache.Client())
    assert str(e.value) == (
        "session_id 0 is no session: ids are 1..4294967295, as `shmcache -g` prints "
        "(a launcher that could not create a session exports 0); list the sessions "
        "with `shmcache --list_sessions`")


def test_session_0_names_the_port_given_in_the_commands(server):
    """The commands it suggests ask the server on the port the client was
    given, when it is not the default one (without -p they ask another);
    Client() with the port of $SHMCACHE_PORT names none (test above)."""
    with pytest.raises(ValueError) as e:
        shmcache.Client(port=server.port).destroy_session(0)
    assert f"as `shmcache -g -p {server.port}` prints" in str(e.value), e.value
    assert f"`shmcache --list_sessions -p {server.port}`" in str(e.value), e.value


def test_open_cache_arguments_are_checked(server, session):
    c = shmcache.Client()
    for kwargs, name in [(dict(name=3), "name"), (dict(fingerprint=None), "fingerprint"),
                         (dict(size_mb="8"), "size_mb"),
                         (dict(spill_requested=1), "spill_requested"),
                         (dict(session_id="1"), "session_id")]:
        args = dict(session_id=session, name="n", fingerprint="f", **{})
        args.update(kwargs)
        with pytest.raises(TypeError, match=name) as e:
            c.open_cache(**args)
        assert "incompatible" not in str(e.value)
    for kwargs, name in [(dict(size_mb=-1), "size_mb"), (dict(session_id=-1), "session_id")]:
        args = dict(session_id=session, name="n", fingerprint="f")
        args.update(kwargs)
        with pytest.raises(ValueError, match=name):
            c.open_cache(**args)


def _port_arg(port):
    return f" -p {port}" if port != 50052 else ""


def test_a_client_of_another_run_dir_is_told_which_server_runs_on_the_port(
        server, tmp_path):
    """No server in the run dir it looks in, one of this user's on the port
    with another run dir: the library's error names that server (its run
    dir and pid) and how to reach or stop it, where it said "not running;
    start it with 'shmcache --start'" (a start that is refused)."""
    here = tmp_path / "here"
    here.mkdir(mode=0o700)
    with pytest.raises(shmcache.UnavailableError) as e:
        shmcache.Client(port=server.port, run_dir=str(here))
    p = _port_arg(server.port)
    assert str(e.value) == (
        f"Unavailable: no cache server is running on port {server.port} with run dir "
        f"{here}; a server of yours on port {server.port} runs with run dir "
        f"{server.run_dir} (process id {server.pid}), and a user has one server per "
        f"port: use it by running this process with SHMCACHE_RUN_DIR={server.run_dir}, "
        f"or stop it with 'SHMCACHE_RUN_DIR={server.run_dir} shmcache --stop{p}' before "
        "starting one here")
    shmcache.Client(port=server.port, run_dir=str(server.run_dir))   # what it says works


def test_a_stopped_server_is_named_as_stopped(server):
    """A server stopped by SIGSTOP (Ctrl-Z, a debugger) accepts the
    connection and answers nothing: the error says it is stopped and how to
    resume it, where it said "unreachable (timed out)"."""
    with continued_after(server.pid):
        os.kill(server.pid, signal.SIGSTOP)
        wait_for(lambda: stopped(server.pid), what="the server stopped")
        with pytest.raises(shmcache.UnavailableError) as e:
            shmcache.Client(port=server.port, run_dir=str(server.run_dir), timeout_ms=200)
    assert str(e.value) == (
        f"Unavailable: the cache server on port {server.port} (process id {server.pid}) "
        "is stopped (SIGSTOP, Ctrl-Z or a debugger) and answers nothing: resume it with "
        f"'kill -CONT {server.pid}', or stop it with 'shmcache --stop{_port_arg(server.port)}'")
    shmcache.Client(port=server.port, run_dir=str(server.run_dir))   # resumed, it answers
