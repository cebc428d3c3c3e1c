"""
The revision of the code a node's ``mpi_node`` engine runs. A minion loads its engine
once, at start, so a highstate compares this digest of the code just synced with the
one in the running engine's configuration and restarts the minion when they differ.
Standard library only: the formula computes it while rendering, before the Docker SDK
that the engine's own modules need is installed.
"""

import hashlib
import os


#: What the ``mpi_node`` engine process loads once, at the minion's start, relative to the
#: minion's synced extension modules: the engine, its execution module and the library.
ENGINE_CODE = ("engines/mpi_node.py", "modules/mpi_job.py", "utils/dmpi")


def engine_revision(extension_modules):
    """A short digest of the engine's code as synced to this minion (``ENGINE_CODE``
    under ``extension_modules``): the running engine is only as new as the minion's last
    start, so a new revision in its configuration restarts the minion."""
    digest = hashlib.sha256()
    for part in ENGINE_CODE:
        top = os.path.join(extension_modules, part)
        paths = [top] if os.path.isfile(top) else sorted(
            os.path.join(d, f) for d, _, files in os.walk(top) for f in files
            if f.endswith(".py"))
        for path in paths:
            digest.update(os.path.relpath(path, extension_modules).encode() + b"\0")
            with open(path, "rb") as source:
                digest.update(hashlib.sha256(source.read()).digest())
    return digest.hexdigest()[:16]
