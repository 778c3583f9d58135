#!/usr/bin/env python3
"""Checks that what the project's pages point at exists.

  scripts/check_docs.py            every tracked *.md, and the docs/ and
                                   README.md references of the sources
  scripts/check_docs.py PAGE.md..  only those pages

In a page (README.md, docs/*.md, any tracked *.md):
- every relative link or image, [text](path#anchor): the file or directory
  exists, and an #anchor names a heading of the page it points at (GitHub's
  anchors: lower case, punctuation dropped, spaces as dashes);
- every path of the repository the page names, in prose, code spans or
  code blocks: a token whose first directory is one of the repository's
  (scripts/cache.sh, include/shmcache/row.h, tests/python/...), a
  header as it is included (shmcache/row.h: include/shmcache/row.h), a
  test named from tests/ (python/test_spill.py, reliability/..., fuzz/...),
  and a bare file name with a source extension (sessions_test.cc): it
  exists (the bare name somewhere in the tree).
In a source file (C++, Python, shell, meson, YAML): every docs/*.md and
README.md#anchor it names exists.

Prints one line per broken reference, "page:line: what", then a summary
line; exits 1 when any is broken. scripts/test.sh runs it as one check.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Names a page uses for files of the user's own, not of this repository.
USER_FILES = {"train.py", "train.cc", "main.py", "mypipe.py", "prolog.sh",
              "task_prolog.sh", "epilog.sh"}
SOURCE_EXT = (".cc", ".h", ".py", ".pyi", ".sh", ".md", ".yaml", ".patch",
              ".build", ".map", ".in", ".png", ".json", ".toml", ".ini")
# Files a run writes (scripts/bench.sh), not in a fresh clone.
GENERATED = {"benchmarks/results/latest.json", "benchmarks/results/ab.json"}
# Directories of tests/ that pages name without the "tests/" in front.
TEST_DIRS = ("python/", "reliability/", "fuzz/", "support/")

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
TOKEN = re.compile(r"[A-Za-z0-9_./+@<>*{}$-]*[A-Za-z0-9_+@<>*}-]")
FENCE = re.compile(r"^\s*(```|~~~)")


def declared_targets(files: list[str]) -> set[str]:
    """The programs meson.build files declare, as DIR/NAME: a page may name
    one that this machine's build left out (shmcache_bench needs hiredis and
    liblmdb, which a fresh machine's test.sh does not install)."""
    targets = set()
    for f in files:
        if Path(f).name == "meson.build":
            text = (ROOT / f).read_text()
            for name in re.findall(r"executable\(\s*'([^']+)'", text):
                targets.add(str(Path(f).parent / name))
    return targets


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [p for p in out.splitlines() if (ROOT / p).exists()]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"`|\*\*?|__?", "", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)   # a link: its text
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m and not in_code:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


class Checker:
    def __init__(self) -> None:
        self.files = tracked()
        self.basenames = {Path(p).name for p in self.files}
        self.top = {p.split("/")[0] for p in self.files if "/" in p}
        self.dirs = {str(Path(p).parent) for p in self.files}
        self.targets = declared_targets(self.files)
        self.broken: list[str] = []
        self._anchors: dict[Path, set[str]] = {}

    def exists(self, rel: str) -> bool:
        """A file or directory of the tree, or a build product: a program a
        meson.build declares (ninja targets such as benchmarks/shmcache_bench
        are named so), or anything else test.sh's build made."""
        rel = rel.rstrip("/")
        return (ROOT / rel).exists() or rel in self.dirs or rel in GENERATED \
            or rel in self.targets or (ROOT / "build" / rel).exists()

    def anchor_ok(self, page: Path, anchor: str) -> bool:
        if page not in self._anchors:
            self._anchors[page] = anchors(page)
        return anchor in self._anchors[page]

    def report(self, where: str, what: str) -> None:
        self.broken.append(f"{where}: {what}")

    # ---- pages -----------------------------------------------------------

    def check_page(self, page: Path) -> None:
        rel_page = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
        in_code = False
        for no, line in enumerate(page.read_text().splitlines(), 1):
            where = f"{rel_page}:{no}"
            if FENCE.match(line):
                in_code = not in_code
                continue
            if not in_code:
                for target in LINK.findall(line):
                    self.check_link(page, target, where)
                line = LINK.sub(lambda m: " ", line)   # the target is checked
            for token in TOKEN.findall(line):
                self.check_token(token, where)

    def check_link(self, page: Path, target: str, where: str) -> None:
        if re.match(r"[a-z][a-z0-9+.-]*:", target):     # http:, mailto:
            return
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if page.is_relative_to(ROOT) and not dest.is_relative_to(ROOT):
            self.report(where, f"link {target} leaves the repository")
            return
        if not dest.exists():
            self.report(where, f"link {target}: no such file")
        elif anchor and dest.suffix == ".md" and not self.anchor_ok(dest, anchor):
            self.report(where, f"link {target}: no section #{anchor} in {dest.name}")

    def check_token(self, token: str, where: str) -> None:
        token = token.rstrip(".")
        if re.search(r"[<>*{}$]", token):    # a pattern: <uid>, *.prom, ${x}
            return
        if "/" in token:
            first = token.split("/")[0]
            if token.startswith(("/", "./", "../")) or "//" in token:
                return
            if first in self.top:
                if not self.exists(token):
                    self.report(where, f"{token}: no such file or directory")
            elif first == "shmcache" and token.endswith(".h"):
                if not self.exists("include/" + token):
                    self.report(where, f"{token}: no such header in include/")
            elif token.startswith(TEST_DIRS) and token.endswith(SOURCE_EXT):
                if not self.exists("tests/" + token):
                    self.report(where, f"{token}: no such file in tests/")
            return
        if token.endswith(SOURCE_EXT) and "." in token[1:] and token not in USER_FILES \
                and not token.startswith(".") and token not in self.basenames:
            self.report(where, f"{token}: no file of that name in the repository")

    # ---- sources ---------------------------------------------------------

    def check_source(self, path: Path) -> None:
        rel = path.relative_to(ROOT)
        for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for m in re.finditer(r"\b((?:docs/[\w.-]+\.md|README\.md)(?:#[\w-]+)?)", line):
                ref = m.group(1)
                file, _, anchor = ref.partition("#")
                where = f"{rel}:{no}"
                if not self.exists(file):
                    self.report(where, f"{ref}: no such page")
                elif anchor and not self.anchor_ok(ROOT / file, anchor):
                    self.report(where, f"{ref}: no section #{anchor} in {file}")


def main(argv: list[str]) -> int:
    c = Checker()
    if argv:
        pages = [Path(a).resolve() for a in argv]
        sources: list[Path] = []
    else:
        pages = [ROOT / p for p in c.files if p.endswith(".md")]
        sources = [ROOT / p for p in c.files
                   if p.endswith((".cc", ".h", ".py", ".pyi", ".sh", ".build", ".yaml",
                                  ".in")) and not p.startswith("subprojects/")
                   and p != "scripts/check_docs.py"]
    for page in pages:
        c.check_page(page)
    for src in sources:
        c.check_source(src)
    for line in c.broken:
        print(line)
    print(f"docs: {len(pages)} pages and {len(sources)} sources checked, "
          f"{len(c.broken)} broken references")
    return 1 if c.broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
