"""
The DockerMPI site settings as the formula sees them: the ``mpi`` pillar merged over
``salt/dockermpi/defaults.yaml`` and checked as a whole.

``salt/dockermpi/map.jinja`` merges through :func:`merge` (the one merge of the formula)
and the ``mpi_config.valid`` state (``salt/dockermpi/config.sls``), which every other
state of the formula requires, fails the highstate with :func:`problems`. The checks
themselves live in :mod:`dmpi.settings`, shared with the ``mpi`` runner.

:depends: the ``dmpi`` package (``_utils``)
"""

import dmpi_current

# A minion that outlived an upgrade imports the library below anew (dmpi_current).
dmpi_current.ensure()

import dmpi.settings
from dmpi.errors import ConfigError
from dmpi.node import revision
from salt.exceptions import SaltInvocationError

__virtualname__ = "mpi_config"


def __virtual__():
    return __virtualname__


def merge(defaults, pillar=None):
    """
    Return the ``mpi`` settings: ``pillar`` laid over ``defaults``. Mappings merge key by
    key; a list or scalar set in pillar replaces the default.

    defaults
        The ``mpi`` mapping of ``salt/dockermpi/defaults.yaml``.

    pillar
        The ``mpi`` pillar (default: none, which gives the defaults). Anything but a
        mapping raises ``SaltInvocationError``.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_config.merge '{slots_per_node: 2, ports: {sshd: [20000, 20099]}}' '{slots_per_node: 4}'
    """
    try:
        return dmpi.settings.merge(defaults, pillar)
    except ConfigError as exc:
        raise SaltInvocationError(str(exc)) from None


def problems(config):
    """
    Return everything wrong with merged ``mpi`` settings, one message per problem, each
    naming the pillar key (``mpi:ports:oob 20100-20299 overlaps mpi:ports:btl
    20250-20999``); an empty list when they are valid.

    config
        The merged settings (:func:`merge`).

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_config.problems '{slots_per_node: 0, ports: {sshd: [20000, 20099]}}'
    """
    return dmpi.settings.problems(config)


def validate(config):
    """
    Return merged ``mpi`` settings checked and normalised (canonical networks and paths,
    port ranges as integer pairs, ``cpus_per_slot`` a float). Raises
    ``SaltInvocationError`` listing every problem, one per line.

    config
        The merged settings (:func:`merge`).

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_config.validate "$(cat merged-mpi-settings.json)"
    """
    try:
        return dmpi.settings.validate(config)
    except ConfigError as exc:
        raise SaltInvocationError(str(exc)) from None


def encrypted_or_local(url):
    """
    Return whether a token sent to ``url`` is encrypted (https) or stays on its host
    (http to a loopback address): what the API's state asks of the URLs users' tokens
    travel to.

    CLI Example:

    .. code-block:: bash

        salt master mpi_config.encrypted_or_local https://hub.example.org/hub/api
    """
    return dmpi.settings.is_encrypted_or_local(url)


def endpoint(url):
    """
    Return ``[host, port]`` that ``url`` connects to (the scheme's port when the URL names
    none), or None when it is no http(s) URL with a host: the hub's firewall state lets
    notebooks reach the API's endpoint (``mpi:hub:api_service_url``) alone.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_config.endpoint https://10.0.0.2:8001
    """
    found = dmpi.settings.endpoint(url)
    return list(found) if found else None


def host_networks(cluster_network, job_addresses):
    """
    Return the cluster network without the job address pool, as the fewest CIDRs: the
    hosts' part of it, which no job address is in.

    CLI Example:

    .. code-block:: bash

        salt master mpi_config.host_networks 10.251.1.0/24 10.251.1.128/25
    """
    return dmpi.settings.host_networks(cluster_network, job_addresses)


def is_loopback(host):
    """
    Return whether ``host`` (an address or ``localhost``) is its machine's loopback.

    CLI Example:

    .. code-block:: bash

        salt master mpi_config.is_loopback 127.0.0.1
    """
    return dmpi.settings.is_loopback(host)


def engine_revision():
    """
    Return a short digest of the ``mpi_node`` engine's code synced to this minion (the
    engine, ``mpi_job`` and the ``dmpi`` library), which highstate writes into the
    engine's configuration: a minion started before a code upgrade then restarts into
    it. (Here, not in ``mpi_job``, because the formula renders it before the Docker SDK
    ``mpi_job`` needs is installed.)

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_config.engine_revision
    """
    return revision.engine_revision(__opts__["extension_modules"])


def node_engine_running(storage_path, job_root="/var/lib/dockermpi/jobs", health=None,
                        revision=None, multiprocessing=None):
    """
    Whether this minion was started with the ``mpi_node`` engine configured for these
    paths (minion engines are read at start only, so a newer configuration needs a
    restart of the minion). It needs nothing of DockerMPI's library, so the restart it
    decides still happens when an upgrade left this minion's loaded library behind the
    synced one (then ``mpi_job`` may not load until the restart).

    health
        The seconds between health looks the engine should run with, when its
        configuration names them (since it reports health: a minion started before that
        runs an engine without it, and restarts).
    revision
        The engine code's revision (:func:`mpi_config.engine_revision
        <_modules.mpi_config.engine_revision>`), when its configuration names it.
    multiprocessing
        When given, whether the minion must run its calls in processes of their own
        (True, Salt's default) or in threads (False); read at start only, like engines.

    CLI Example:

    .. code-block:: bash

        salt '*' mpi_config.node_engine_running /srv/dockermpi health=10 revision=0123abcd multiprocessing=False
    """
    if multiprocessing is not None and \
            bool(__opts__.get("multiprocessing", True)) != bool(multiprocessing):
        return False
    wanted = {"storage_path": storage_path, "job_root": job_root}
    if health is not None:
        wanted["health"] = health
    if revision is not None:
        wanted["revision"] = revision
    for engine in __opts__.get("engines") or []:
        if isinstance(engine, dict) and engine.get("mpi_node") == wanted:
            return True
    return False
