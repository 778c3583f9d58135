"""scripts/check_docs.py (the docs check of scripts/test.sh, which runs it
over the repository) finds each kind of broken reference in a page, and
passes what exists."""

import subprocess
import sys

from conftest import ROOT

CHECK = ROOT / "scripts" / "check_docs.py"


def test_each_kind_of_broken_reference_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## Real section\n\ntext\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[fine](other.md#real-section), [here](#page), `scripts/cache.sh`,\n"
        "`shmcache/row.h`, `python/test_spill.py`, `sessions_test.cc`, `train.py`,\n"
        "`/dev/shm/shmcache.<uid>.<port>.*`.\n\n"
        "[a section](other.md#no-such-section) and [a page](gone.md)\n"
        "`scripts/no_such_script.sh` and `shmcache/no_such.h`\n"
        "`python/test_no_such.py`, `no_such_test.cc`\n\n"
        "```sh\nscripts/no_such_tool.sh --flag\n```\n")
    r = subprocess.run([sys.executable, str(CHECK), str(page)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    found = r.stdout.splitlines()[:-1]
    assert [line.split(": ", 1)[1] for line in found] == [
        "link other.md#no-such-section: no section #no-such-section in other.md",
        "link gone.md: no such file",
        "scripts/no_such_script.sh: no such file or directory",
        "shmcache/no_such.h: no such header in include/",
        "python/test_no_such.py: no such file in tests/",
        "no_such_test.cc: no file of that name in the repository",
        "scripts/no_such_tool.sh: no such file or directory",
    ], r.stdout
    assert r.stdout.splitlines()[-1].endswith("7 broken references")



def test_a_program_a_meson_build_declares_passes_whether_or_not_it_was_built(tmp_path):
    # shmcache_bench is built only where hiredis and liblmdb are installed,
    # which a fresh machine's test.sh does not install; a page that shows
    # how to build it still names a real target.
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n```sh\nninja -C build-bench benchmarks/shmcache_bench\n"
                    "ninja -C build-bench benchmarks/no_such_bench\n```\n")
    r = subprocess.run([sys.executable, str(CHECK), str(page)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert [line.split(": ", 1)[1] for line in r.stdout.splitlines()[:-1]] == [
        "benchmarks/no_such_bench: no such file or directory"], r.stdout
