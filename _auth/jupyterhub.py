"""
Salt external authentication with JupyterHub API tokens: a notebook calls salt-api with
its user's hub name as ``username`` and the ``JUPYTERHUB_API_TOKEN`` JupyterHub gave its
server as ``password``; this module asks the hub whose token it is.

.. code-block:: yaml

    # /etc/salt/master.d/dockermpi-api.conf (written by the dockermpi.api state)
    external_auth:
      jupyterhub:
        ^url: http://hub.example.org:8081/hub/api   # the hub's REST API
        '*':
          - '@runner':
            - '^mpi\\.(whoami|submit|launch|wait|status|list|history|usage|logs|cancel)$'

A token is accepted only when the hub answers ``GET /user`` with a *user* (not a
service) of exactly that name; a forged, expired or revoked token, or one of a user the
hub deleted, gets 403 there and is refused here. Nothing is cached: every call asks the
hub. Names Salt takes for an admin's (``root``, the master's user, ``sudo_*``: see
``mpi_config.is_admin_caller``) are refused whatever the hub says, so the ``mpi``
runner can tell a hub user from root by name.

:depends: the hub's API reachable from the master; ``mpi_config`` utils synced
"""

import json
import logging
import re
import urllib.error
import urllib.request

import salt.loader

log = logging.getLogger(__name__)

__virtualname__ = "jupyterhub"

HUB_TIMEOUT = 5  # seconds; salt-api's caller waits on this
_TOKEN_RE = re.compile(r"^[\x21-\x7e]{8,512}\Z")  # printable ASCII: nothing to inject
_ANSWER_LIMIT = 1 << 20
_utils = None


def __virtual__():
    return __virtualname__


def _is_admin_name(name):
    global _utils  # one utils loader per master process
    if _utils is None:
        _utils = salt.loader.utils(__opts__, whitelist=["mpi_config"])
    return _utils["mpi_config.is_admin_caller"](name, __opts__.get("user"))


def _settings():
    return (__opts__.get("external_auth") or {}).get("jupyterhub") or {}


def _hub_user(url, token, ca_file):
    """The hub's model of the token's owner, or None when the hub refuses the token."""
    request = urllib.request.Request(
        url.rstrip("/") + "/user",
        headers={"Authorization": f"token {token}", "Accept": "application/json"},
    )
    handlers = [urllib.request.ProxyHandler({})]  # the token goes to the hub only
    if url.startswith("https:"):
        import ssl  # pylint: disable=import-outside-toplevel

        handlers.append(urllib.request.HTTPSHandler(
            context=ssl.create_default_context(cafile=ca_file or None)))
    try:
        with urllib.request.build_opener(*handlers).open(request, timeout=HUB_TIMEOUT) as answer:
            return json.loads(answer.read(_ANSWER_LIMIT))
    except urllib.error.HTTPError as exc:
        if exc.code not in (401, 403, 404):
            log.warning("jupyterhub eauth: the hub answered %s for a token check", exc.code)
        return None
    except (OSError, ValueError) as exc:  # unreachable, TLS, not JSON
        log.error("jupyterhub eauth: cannot ask the hub at %s: %s", url, exc)
        return None


def auth(username, password, **kwargs):
    """
    Whether ``password`` is a live JupyterHub API token of the hub user ``username``.

    CLI Example (from salt-api, as a notebook does):

    .. code-block:: bash

        curl -sS --cacert /etc/dockermpi/api-ca.pem https://master:8000/run \\
            -H 'Content-Type: application/json' -d '[{"client": "runner",
            "fun": "mpi.whoami", "eauth": "jupyterhub", "username": "'"$JUPYTERHUB_USER"'",
            "password": "'"$JUPYTERHUB_API_TOKEN"'"}]'
    """
    settings = _settings()
    url = settings.get("^url")
    if not url:
        log.error("jupyterhub eauth: external_auth:jupyterhub:^url (the hub's API) is not set")
        return False
    if not isinstance(username, str) or not isinstance(password, str):
        return False
    if not _TOKEN_RE.match(password) or not 0 < len(username) <= 255:
        return False
    if _is_admin_name(username):
        log.warning("jupyterhub eauth: refused hub user %r: an admin's name", username[:64])
        return False
    found = _hub_user(url, password, settings.get("^ca_file"))
    return (isinstance(found, dict) and found.get("kind", "user") == "user"
            and found.get("name") == username)
