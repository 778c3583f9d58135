"""Every ```cpp block of README.md and docs/ compiles warning-free against
the public headers, as a trainer compiles it: g++ (and clang++ where it is
installed) with -std=c++20 -Wall -Wextra -Wpedantic -Werror. A block is the
body of a function; its #include lines go above it, and the names it uses
without declaring them are the function's parameters, given by the HTML
comment just before the block:
<!-- compiled as the body of f(uint32_t session, uint64_t row_id) -->
(an unused one warns, so the list stays true)."""

import re
import shutil
import subprocess

import pytest

from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:<!-- compiled as the body of f\((?P<params>[^)]*)\) -->\n)?"
                   r"```cpp\n(?P<body>.*?)```", re.S)
COMPILERS = [c for c in ("g++", "clang++") if shutil.which(c)]
FLAGS = ["-std=c++20", "-Wall", "-Wextra", "-Wpedantic", "-Werror"]


def snippets():
    for page in PAGES:
        text = page.read_text()
        for m in BLOCK.finditer(text):
            line = text.count("\n", 0, m.start("body")) + 1
            yield pytest.param(m.group("params") or "", m.group("body"),
                               id=f"{page.relative_to(ROOT)}:{line}")


def program(params, body):
    """The block as a translation unit: its includes, then its statements
    as the body of f(params)."""
    lines = body.splitlines()
    includes = [x for x in lines if x.startswith("#include")]
    rest = [x for x in lines if not x.startswith("#include")]
    return "\n".join(["#include <cstddef>", "#include <cstdint>", *includes,
                      f"void f({params});", f"void f({params}) {{", *rest, "}", ""])


def test_the_docs_have_cpp_blocks():
    found = [p.id for p in snippets()]
    assert any(i.startswith("README.md:") for i in found), found
    assert any(i.startswith("docs/cpp-api.md:") for i in found), found


@pytest.mark.parametrize("params,body", list(snippets()))
@pytest.mark.parametrize("compiler", COMPILERS or [None])
def test_a_cpp_block_compiles_warning_free(tmp_path, compiler, params, body):
    if compiler is None:
        pytest.skip("no C++ compiler (g++, clang++) on PATH")
    src = tmp_path / "snippet.cc"
    src.write_text(program(params, body))
    r = subprocess.run([compiler, *FLAGS, f"-I{ROOT / 'include'}", "-c", str(src),
                        "-o", str(tmp_path / "snippet.o")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{compiler}:\n{r.stderr}\n{src.read_text()}"
