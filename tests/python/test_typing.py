"""The package's type information: py.typed and the stub of the
extension module ship with it, and the stub names what the module has.
mypy itself runs over the package in scripts/test.sh."""

import ast
from pathlib import Path

import shmcache
from shmcache import _shmcache

PACKAGE = Path(shmcache.__file__).parent


def _stub_names():
    """{"": module-level names, class name: its method/property names}."""
    tree = ast.parse((PACKAGE / "_shmcache.pyi").read_text())
    names = {"": set()}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            names[""].add(node.name)
        elif isinstance(node, ast.AnnAssign) and not node.target.id.startswith("_"):
            names[""].add(node.target.id)       # constants: MAX_ROW_ID: int
        if isinstance(node, ast.ClassDef):
            names[""].add(node.name)
            names[node.name] = {n.name for n in node.body
                                if isinstance(n, ast.FunctionDef)
                                and not n.name.startswith("__")}
    return names


def _public(obj):
    return {n for n in dir(obj) if not n.startswith("_")}


def test_py_typed_and_the_stub_ship_with_the_package():
    assert (PACKAGE / "py.typed").is_file()
    assert (PACKAGE / "_shmcache.pyi").is_file()


def test_the_stub_names_exactly_what_the_extension_has():
    stub = _stub_names()
    assert stub[""] == _public(_shmcache)
    for cls in ("Cache", "Client"):
        assert stub[cls] == _public(getattr(_shmcache, cls)), cls


def test_error_classes_of_the_stub_are_runtime_errors():
    for name in sorted(_stub_names()[""]):
        obj = getattr(_shmcache, name)
        if name.endswith("Error"):
            assert issubclass(obj, RuntimeError), name
            assert name == "Error" or issubclass(obj, _shmcache.Error), name


def _stub_signatures():
    """{(class or "", function): [(name or None when positional-only,
    has a default)]} of the stub's functions, self left out."""
    tree = ast.parse((PACKAGE / "_shmcache.pyi").read_text())
    out = {}

    def params(fn):
        a = fn.args
        plain = a.posonlyargs + a.args
        first_default = len(plain) - len(a.defaults)
        got = [(None if i < len(a.posonlyargs) else p.arg, i >= first_default)
               for i, p in enumerate(plain)]
        return [g for g, p in zip(got, plain) if p.arg != "self"]

    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out["", node.name] = params(node)
        elif isinstance(node, ast.ClassDef):
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and not any(
                        isinstance(d, ast.Name) and d.id == "property"
                        for d in fn.decorator_list):
                    out[node.name, fn.name] = params(fn)
    return out


def _runtime_params(doc):
    """[(name, has a default)] of the first line of a native function's
    docstring, "f(self: T, a: int, b: bool = True) -> R", self left out."""
    inside = doc.splitlines()[0].split("(", 1)[1].rsplit(")", 1)[0]
    out, depth, cur = [], 0, ""
    for ch in inside + ",":
        depth += ch in "[(" and 1 or (ch in "])" and -1 or 0)
        if ch == "," and depth == 0:
            if cur.strip():
                name = cur.split(":")[0].split("=")[0].strip()
                out.append((name, "=" in cur))
            cur = ""
        else:
            cur += ch
    return [p for p in out if p[0] != "self"]


def test_the_stub_gives_each_function_its_real_parameters():
    # Names, order and defaults: a call written from the stub (keywords
    # included) is one the extension takes. Positional-only parameters of
    # the stub are the native ones pybind11 names arg0, arg1, ...
    for (cls, name), stub in sorted(_stub_signatures().items()):
        owner = getattr(_shmcache, cls) if cls else _shmcache
        real = _runtime_params(getattr(owner, name).__doc__)
        assert len(real) == len(stub), (cls, name, real, stub)
        for (r_name, r_default), (s_name, s_default) in zip(real, stub):
            assert r_default == s_default, (cls, name, r_name)
            if s_name is None:
                assert r_name.startswith("arg") or cls == "Cache" and name == "read", \
                    (cls, name, r_name)
            else:
                assert r_name == s_name, (cls, name, r_name, s_name)
