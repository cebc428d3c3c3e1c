"""
Keep a long-lived Salt process on the library that is on disk.

A minion that runs its calls in threads (``multiprocessing: False``, as DockerMPI's nodes
do) imports the ``dmpi`` package once and keeps it in ``sys.modules``, while a
``saltutil.sync_all`` of an upgrade writes new files under it and Salt loads the new Salt
modules over the old package: a module that imports a name the old package lacks fails
to load, and one that loads mixes the two versions. :func:`ensure`, called by each Salt
module before it imports ``dmpi``, drops every ``dmpi`` module from ``sys.modules`` when
the package's files changed since it was imported, so the import that follows reads
them anew.

This file stays beside the package, outside it: an old copy of it in memory must still
do its work after an upgrade, so it keeps to what it needs.
"""

import importlib
import os
import sys
import threading

_PACKAGE = "dmpi"
_LOCK = threading.Lock()
_IMPORTED = {}  # package name -> (the package's module object, the stamp of its files then)


def ensure(package=_PACKAGE, root=None):
    """Make the next ``import <package>...`` give the code on disk: forget the package's
    modules when its files (under ``root``, by default the package's folder next to
    this file) changed since it was imported. True when they were forgotten.

    A package imported before the first check (by a process's own code, or by Salt
    modules older than this check) is taken as it is: forgetting it would leave that
    code holding other classes than the ones imported anew."""
    root = root or os.path.join(os.path.dirname(os.path.abspath(__file__)), package)
    with _LOCK:
        stamp = _stamp(root)
        loaded = sys.modules.get(package)
        known = _IMPORTED.get(package)
        if loaded is not None and (known is None or known[0] is not loaded):
            _IMPORTED[package] = (loaded, stamp)
            return False
        if loaded is not None and known[1] == stamp:
            return False
        forgot = loaded is not None
        for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
            del sys.modules[name]
        importlib.invalidate_caches()  # new files and folders are found
        _IMPORTED[package] = (importlib.import_module(package), stamp)
        return forgot


def _stamp(root):
    """(files, newest modification in ns, total size) of the ``.py`` files under ``root``:
    a sync that writes a changed file changes it."""
    files = newest = size = 0
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".py"):
                try:
                    found = os.stat(os.path.join(folder, name))
                except OSError:
                    continue
                files += 1
                newest = max(newest, found.st_mtime_ns)
                size += found.st_size
    return files, newest, size
