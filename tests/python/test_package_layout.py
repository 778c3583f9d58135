"""The Python package's layering, checked on its source: no module reaches
into another module's private members (what a module offers the others is
named without an underscore), a private module is imported only from
inside its own package, every module is listed in its directory's
meson.build (so that the build tree, `pip install` and the wheel have it),
and the public import paths answer."""

import ast
import re

from conftest import ROOT

SOURCE = ROOT / "clients" / "python" / "shmcache"

# Underscored names of other libraries that are their public API, or the
# only way to a value they have no public name for: os._exit; a torch
# group's timeout (torch 1.13 names it in the group's options only:
# ProcessGroup.Options._timeout; torch >= 2.5 in its backends' options
# only: ProcessGroup._device_types, ProcessGroup._get_backend), read where
# a torch without them degrades (torch/partitioned/exchange_timeout.py);
# an RLock's _is_owned, the lock protocol threading.Condition itself reads,
# and the only way to ask whether this thread holds it (async_put.py: a
# signal handler that interrupted a locked section must not wait for it);
# torch's _remove_worker_pids, the only way to keep a DataLoader iterator's
# workers out of torch's SIGCHLD reports (torch/_misses.py: the miss
# workers' deaths are the pool's to report).
EXTERNAL = {"_exit", "_timeout", "_device_types", "_get_backend", "_is_owned",
            "_remove_worker_pids"}


def _private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path):
    rel = path.relative_to(SOURCE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _defined_here(tree):
    """The private names a module defines: functions, classes, methods,
    assignments (names and attributes: self._x = ...), annotations, imports
    bound under a private alias, parameters."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            # Attribute names listed (__slots__, a tuple of attributes).
            names.update(e.value for e in node.elts
                         if isinstance(e, ast.Constant) and isinstance(e.value, str))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str):
            names.add(node.slice.value)      # self.__dict__["_x"] = ...
    return {n for n in names if _private(n)}


def _absolute(module, node, is_package):
    """The absolute module an ImportFrom names."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def violations(source, module, is_package=False):
    """What `source` (the text of `module`) does against the rules: reads
    a private member it does not define, imports a private name, or imports
    a private module from outside the package that holds it."""
    tree = ast.parse(source)
    own = _defined_here(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) \
                and node.attr not in own and node.attr not in EXTERNAL:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "setattr", "hasattr") \
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and _private(node.args[1].value) \
                and node.args[1].value not in own:
            found.append(f"line {node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom):
                target = _absolute(module, node, is_package)
                names = [target + "." + a.name for a in node.names]
            else:
                names = [a.name for a in node.names]
            for full in names:
                parts = full.split(".")
                if parts[0] != "shmcache":
                    if any(_private(p) for p in parts[-1:]) and isinstance(node, ast.ImportFrom):
                        found.append(f"line {node.lineno}: imports {full}")
                    continue
                for k, part in enumerate(parts):
                    if not _private(part):
                        continue
                    # shmcache.a._b is private to shmcache.a (and below it).
                    owner = ".".join(parts[:k])
                    if not (module == owner or module.startswith(owner + ".")):
                        found.append(f"line {node.lineno}: imports {full} "
                                     f"from outside {owner}")
    return found


def _modules():
    return sorted(SOURCE.rglob("*.py"))


def test_no_module_reaches_into_another_modules_private_members():
    bad = {}
    for path in _modules():
        found = violations(path.read_text(), _module_name(path),
                           path.name == "__init__.py")
        if found:
            bad[str(path.relative_to(ROOT))] = found
    assert not bad, bad


def test_the_check_finds_what_the_package_used_to_do():
    # Calls the package made before its layering (issue 34): each is found.
    assert violations("def f(cache):\n    return cache._put_encoded([1], [], True)\n",
                      "shmcache.datasets")
    assert violations("def f(cds):\n    cds._uncacheable(1, 'x')\n",
                      "shmcache.partitioned_rows")
    assert violations("from .loader import CachedLoader, _LoaderIter\n",
                      "shmcache.partitioned")
    assert violations("x = getattr(c, '_cache')\n", "shmcache.loader")
    # A private module of shmcache.torch, imported from the top package.
    assert violations("from .torch import _pipeline\n", "shmcache.prefill")
    assert violations("from .torch._misses import Sample\n", "shmcache.prefill")
    # What the rules allow: a module's own privates, a private module of
    # its package or of a package above it.
    assert not violations("class A:\n    def f(self, other):\n"
                          "        return self._x, other._x\n    _x = 1\n", "shmcache.m")
    assert not violations("from .._misses import Sample\n",
                          "shmcache.torch.partitioned.loader")
    assert not violations("from . import _shmcache\n", "shmcache", is_package=True)


def _listed(meson_build):
    text = meson_build.read_text()
    return set(re.findall(r"'([\w.]+\.pyi?|py\.typed)'", text))


def test_meson_lists_every_module_of_the_package():
    dirs = {p.parent for p in _modules()}
    for d in sorted(dirs):
        here = {p.name for p in d.glob("*.py")}
        if d == SOURCE:
            here |= {"_shmcache.pyi", "py.typed"}
        assert _listed(d / "meson.build") == here, d


def test_public_import_paths():
    import shmcache
    import shmcache.torch as st
    for name in shmcache.__all__:
        assert getattr(shmcache, name) is not None, name
    for name in st.__all__:
        assert getattr(st, name) is not None, name
    from shmcache.torch import (BatchSource, CachedDataset, CachedIterableDataset,  # noqa: F401
                                CachedLoader, NodeAffineSampler, PartitionedLoader,
                                cache_for_dataset, dataset_fingerprint, node_partition)
    from shmcache import rows, shards, stats  # noqa: F401
    assert callable(CachedLoader.iter_source)
