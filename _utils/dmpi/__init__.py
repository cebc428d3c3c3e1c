"""
DockerMPI's library: what the Salt modules under ``_modules``, ``_states``, ``_runners``
and ``_engines`` share, as ordinary Python modules.

- :mod:`dmpi.contract`: what master and nodes must agree on (ids, names, paths,
  labels, job states, event tags).
- :mod:`dmpi.errors`: the one exception hierarchy.

Salt delivers the package with the rest of ``_utils`` (``saltutil.sync_all``), and puts
that folder on ``sys.path`` while it loads a module, so the Salt faces import it with a
plain ``import dmpi.contract``; tests and benchmarks import it the same way.

This file imports nothing: Salt's loader may load the folder itself as a utils module.
"""
