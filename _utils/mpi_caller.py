"""
Who calls the ``mpi`` runner's functions: an admin (``salt-run``, the job controller) or a
JupyterHub user the ``mpi_api`` engine has authenticated.

The API engine runs each user's call in a worker thread of its own process and marks
that thread with the user's hub name for the call's length; the runner reads the mark.
A thread-local, not a contextvar: Salt's loader runs every function in a copy of the
caller's context, so a contextvar set through the loader would not outlive the call
that set it.

CLI Example:

.. code-block:: python

    with __utils__["mpi_caller.as_hub_user"]("alice"):
        __runners__["mpi.list"]()   # alice's jobs only
"""

import contextlib
import threading

_calling = threading.local()


def hub_user():
    """The hub user the calling thread acts for, or None (an admin)."""
    return getattr(_calling, "hub_user", None)


@contextlib.contextmanager
def as_hub_user(name):
    """Act as hub user ``name`` in this thread until the block ends."""
    if not isinstance(name, str) or not name:
        raise ValueError("a hub user name is required")
    if hub_user() is not None:
        raise RuntimeError("this thread already acts for a hub user")
    _calling.hub_user = name
    try:
        yield
    finally:
        _calling.hub_user = None
