"""python3 -m shmcache.prefill: fills the cache a trainer then hits, resumes
after Ctrl-C without recomputing cached rows, prints plain progress lines
when stderr is not a terminal, and refuses bad input with one line."""

import os
import re
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

pytest.importorskip("torch")

from conftest import ROOT, wait_for  # noqa: E402
from helpers import counted_images, sample, to_array  # noqa: E402
from shmcache import DatasetCache  # noqa: E402
from shmcache.torch import CachedDataset, cache_for_dataset  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = ROOT / "scripts" / "my_training_script.py"
PROGRESS = re.compile(r"^prefill: (\d+)/(\d+) rows \(\d+\.\d%\), \d+ rows/s, ETA .+$")


def prefill_cmd(server, session, dataset, *args):
    return [sys.executable, "-m", "shmcache.prefill", str(dataset),
            "--session_id", str(session), "-p", str(server.port), *args]


def env(server, **extra):
    e = dict(server.env, **extra)
    e["PYTHONPATH"] = HERE + os.pathsep + e["PYTHONPATH"]   # helpers:...
    return e


def run_prefill(server, session, dataset, *args, **extra_env):
    return subprocess.run(prefill_cmd(server, session, dataset, *args),
                          env=env(server, **extra_env), capture_output=True,
                          text=True, timeout=300)


def the_cache(server, session):
    (cache,) = server.cache_rows(session).values()
    return cache


def test_trainer_hits_every_prefilled_cifar10_row(server, session, tmp_path):
    data = tmp_path / "cifar"
    subprocess.run([sys.executable, str(TRAIN), "--generate", "300",
                    "--dataset_path", str(data)], env=server.env, check=True,
                   capture_output=True, timeout=120)
    r = run_prefill(server, session, data, "-j", "2", "--progress_interval", "0.01")
    assert r.returncode == 0, r.stderr
    # stderr is a pipe: plain lines, no bar redrawn with \r.
    lines = r.stderr.splitlines()
    assert "\r" not in r.stderr and all(ln.startswith("prefill: ") for ln in lines)
    progress = [PROGRESS.match(ln) for ln in lines if PROGRESS.match(ln)]
    assert progress and progress[-1].groups() == ("300", "300")
    assert lines[-1].startswith("prefill: done: 300 rows cached (300 stored now")
    # The header and the line of `shmcache --list_sessions`, as it prints them.
    header, line = r.stdout.splitlines()
    listing = server.admin("--list_sessions").stdout.splitlines()
    assert header in listing and line in listing and line.startswith(f"{session:>12}")
    # The training script of the cache.sh workflow reads every row from the
    # cache: nothing is computed again.
    t = subprocess.run([sys.executable, str(TRAIN), "--session_id", str(session),
                        "--port", str(server.port), "--dataset_path", str(data)],
                       env=server.env, capture_output=True, text=True, timeout=300)
    assert t.returncode == 0 and "Got 300 samples" in t.stdout, t.stderr
    c = the_cache(server, session)
    assert (c["hits"], c["misses"], c["mem_cached"]) == (300, 0, 300)


def test_prefill_resumes_after_ctrl_c_without_recomputing_cached_rows(
        server, session, tmp_path):
    gate, run1, run2 = tmp_path / "gate", tmp_path / "run1", tmp_path / "run2"
    p = subprocess.Popen(
        prefill_cmd(server, session, "helpers:counted_images", "-j", "2",
                    "--cache_name", "counted"),
        env=env(server, PREFILL_COUNTER=str(run1), PREFILL_GATE=str(gate),
                PREFILL_GATE_AT="40"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err = []
    threading.Thread(target=lambda: err.extend(p.stderr), daemon=True).start()
    cache = cache_for_dataset(counted_images(), DatasetCache(session), "counted")

    def cached():
        return {i for i in range(200) if cache.contains(i)}
    try:
        # Rows below 40 are stored, the workers then wait at the gate.
        wait_for(cached, timeout=120, what="the first rows cached")
        p.send_signal(signal.SIGINT)
        wait_for(lambda: any("stopping" in ln for ln in err), timeout=120,
                 what="the stopping line")
        gate.touch()
        assert p.wait(timeout=120) == 130
    finally:
        gate.touch()
        p.kill()
    wait_for(lambda: any("interrupted" in ln for ln in err), timeout=10,
             what="the interrupted line")
    first = cached()
    decoded1 = [int(x) for x in run1.read_text().split()]
    assert set(decoded1) == first           # what was computed was stored
    assert 0 < len(first) < 200
    r = run_prefill(server, session, "helpers:counted_images", "-j", "2",
                    "--cache_name", "counted", PREFILL_COUNTER=str(run2))
    assert r.returncode == 0, r.stderr
    decoded2 = [int(x) for x in run2.read_text().split()]
    assert not set(decoded2) & first        # cached rows were not computed
    assert sorted(decoded2 + decoded1) == list(range(200))
    for i in range(200):
        img, label = sample(i, 8)
        row = cache.get(i)
        assert np.array_equal(row[0], img) and int(row[1]) == label


def test_image_folder_prefill_is_hit_by_the_same_pipeline(server, session, tmp_path):
    datasets = pytest.importorskip("torchvision.datasets")
    from PIL import Image
    for k in range(6):
        d = tmp_path / "images" / ("cat", "dog")[k % 2]
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(sample(k)[0].transpose(1, 2, 0)).save(d / f"{k}.png")
    r = run_prefill(server, session, tmp_path / "images", "-j", "2",
                    "--transform", "helpers:to_array")
    assert r.returncode == 0, r.stderr
    ds = CachedDataset(datasets.ImageFolder(str(tmp_path / "images"), transform=to_array),
                       DatasetCache(session))
    got = [ds[i] for i in range(6)]
    c = ds.stats()
    assert (c["hits"], c["misses"], c["mem_rows"]) == (6, 0, 6)
    assert sorted(int(x[0][0, 0, 0]) for x in got) == \
        sorted(int(sample(k)[0][0, 0, 0]) for k in range(6))


@pytest.mark.parametrize("dataset,args,says", [
    ("/no/such/dir", [], "no dataset at"),
    ("no_such_module_x:make", [], "cannot import"),
    ("helpers:no_such_factory", [], "has no"),
    ("helpers:sample", [], "failed"),                  # sample() needs an argument
    ("helpers:counted_images", ["-j", "0"], "at least 1"),
    ("helpers:counted_images", ["--transform", "helpers:to_array"], "image folders"),
])
def test_bad_input_is_one_line_and_exit_1(server, session, dataset, args, says):
    r = run_prefill(server, session, dataset, *args)
    assert r.returncode == 1
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("prefill: ")
    assert says in r.stderr


def test_missing_session_is_one_line_and_exit_1(server):
    r = run_prefill(server, 4242, "helpers:counted_images")
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1
    assert "does not exist" in r.stderr


@pytest.mark.parametrize("args,says", [
    (["--session_id", "4242"], "does not exist"),
    (["--session_id", "-1"], "not within the required interval"),
    (["--size_mb", str(2**60)], "not within the required interval"),
    (["-p", "80"], "not within the required interval"),
    (["--session_id", "0"], "session 0 is no session"),
    # As typed, as `shmcache` takes -d and -p: int() took these.
    (["--session_id= 12"], "argument --session_id: session id ' 12' is not a number "
     "(white space before it); give the digits alone"),
    (["--session_id=+12"], "session id '+12' is not a number (a '+' sign)"),
    (["--session_id=1_2"], "argument --session_id: invalid int value: '1_2'"),
    (["-p", "050052"], "argument -p/--port: port '050052' is not a number (a leading "
     "zero)"),
    (["--port=5000 "], "port '5000 ' is not a number (white space after it)"),
])
def test_a_bad_session_or_argument_is_refused_before_the_dataset_is_loaded(
        server, session, tmp_path, args, says):
    """A session or server it cannot use is said at once, not after the
    dataset's factory (or an image folder's scan, minutes on ImageNet) ran."""
    made = tmp_path / "made"
    r = run_prefill(server, session, "prefill_helpers:rows", *args,
                    PREFILL_MADE=str(made))
    assert r.returncode == 1, r.stderr
    assert len(r.stderr.splitlines()) == 1 and says in r.stderr, r.stderr
    assert not made.exists()


def test_help_explains_every_option():
    """--help gives each option what it is and its default (argparse lists
    an option without help= bare: its name alone)."""
    r = subprocess.run([sys.executable, "-m", "shmcache.prefill", "--help"],
                       env=dict(os.environ), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())   # argparse wraps to the terminal's width
    for option, says in [("--session_id SESSION_ID", "shmcache -g"),
                         ("-j WORKERS, --workers WORKERS", "default: min(4, CPUs)"),
                         ("-p PORT, --port PORT", "default: $SHMCACHE_PORT, else 50052"),
                         ("--spilling", "default: off")]:
        at = out.find(f" {option} ", out.find("options:"))
        assert at >= 0, (option, out)
        assert says in out[at:at + len(option) + 200], (option, out[at:at + 300])
