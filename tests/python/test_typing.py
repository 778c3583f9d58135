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
