"""stat_files (file_stats.cc), the default cache name's view of a dataset's
files: each entry's size and mtime as stat(2) of its path gives them, or
-1, -1 where that fails, whatever the paths look like (stat-ed through
their directory's descriptor when they share one), and no descriptor is
left open."""

import os
import struct

import pytest

from shmcache._shmcache import stat_files


def as_stat_sees(paths):
    """What stat_files must return: os.stat of each path, in order."""
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out += [st.st_size, st.st_mtime_ns]
        except OSError:
            out += [-1, -1]
    return out


def stats(paths):
    got = stat_files(paths)
    return list(struct.unpack(f"={2 * len(paths)}q", got))


def open_fds():
    return sorted(os.listdir("/proc/self/fd"))


@pytest.fixture
def tree(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    for d, n in ((a, 3), (b, 2)):
        for k in range(n):
            (d / f"{k}.jpg").write_bytes(b"x" * (10 * k + len(d.name)))
    os.utime(a / "1.jpg", ns=(1, 123_456_789))
    os.symlink(a, tmp_path / "link")                     # a directory link
    os.symlink(a / "2.jpg", b / "to_a2.jpg")            # a file link
    os.symlink(tmp_path / "gone", b / "dangling.jpg")   # a link to nothing
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_each_entry_is_what_stat_of_its_path_gives(tree):
    t = str(tree)
    paths = [
        f"{t}/a/0.jpg", f"{t}/a/1.jpg", f"{t}/b/0.jpg",   # two directories
        f"{t}/a/2.jpg",                                   # the first again
        f"{t}/link/1.jpg", f"{t}/b/to_a2.jpg",            # links followed
        f"{t}/b/dangling.jpg", f"{t}/a/missing.jpg",      # no file: -1, -1
        f"{t}/gone/0.jpg", f"{t}/a/0.jpg/x",              # no such directory
        f"{t}/b/../a/0.jpg", f"{t}//a///1.jpg",           # odd spellings
        f"{t}/a/", f"{t}/a/0.jpg/",                       # trailing slashes
        "a/1.jpg", "b/1.jpg", "a", "",                    # relative, bare, empty
        "/" + os.path.relpath(f"{t}/a/0.jpg", "/"),       # under "/"
        f"{t}/{'d' * 300}/0.jpg",                         # a name too long
    ]
    assert stats(paths) == as_stat_sees(paths)
    # The same through DatasetFolder's (path, class) tuples.
    assert stats([(p, 0) for p in paths]) == as_stat_sees(paths)


def test_a_long_list_over_several_directories_and_threads(tree):
    for d in range(3):
        sub = tree / f"class{d}"
        sub.mkdir()
        for k in range(700):
            (sub / f"{k}.bin").write_bytes(b"y" * ((k * 7 + d) % 50))
    paths = [str(tree / f"class{d}" / f"{k}.bin") for d in range(3) for k in range(700)]
    paths[1500] = str(tree / "class2" / "absent.bin")
    paths[10] = str(tree / "class1" / "3.bin")     # another directory, between
    before = open_fds()
    assert stats(paths) == as_stat_sees(paths)
    assert open_fds() == before, "a directory descriptor was left open"


def test_a_file_written_again_is_seen_at_the_next_call(tree):
    paths = [str(tree / "a" / f"{k}.jpg") for k in range(3)]
    first = stats(paths)
    (tree / "a" / "1.jpg").write_bytes(b"rewritten in place")
    second = stats(paths)
    assert second != first
    assert second == as_stat_sees(paths)


def test_a_path_longer_than_path_max_is_refused_as_stat_refuses_it(tmp_path, monkeypatch):
    # Directories nested to just under PATH_MAX (4096), made one level at a
    # time, and a file in them: the file exists, its directory has a path
    # stat(2) takes, but its own path is too long for stat(2).
    monkeypatch.chdir(tmp_path)
    name = "n" * 240
    for _ in range(16):
        os.mkdir(name)
        os.chdir(name)
    leaf = "f" * 200
    with open(leaf, "wb") as f:
        f.write(b"12345")
    deep = os.path.join(str(tmp_path), *[name] * 16)
    paths = [os.path.join(deep, leaf), os.path.join(deep, "absent.jpg")]
    assert len(deep) < 4095 < 4096 < len(paths[0])
    assert stats(paths) == as_stat_sees(paths) == [-1, -1, -1, -1]
