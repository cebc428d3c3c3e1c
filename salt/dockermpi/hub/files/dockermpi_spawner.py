"""
DockerMPI's JupyterHub spawner: DockerSpawner on the hub host's own Docker engine (its
unix socket), with identity and uid from the DockerMPI master.

Before a user's notebook server starts, the spawner asks DockerMPI's API on the master
who the user is (``GET /api/v1/whoami`` of the hub's service ``dockermpi``, with the
server's own hub token, which carries the service's scope). The answer names the
user's account (a name safe for Docker), uid, gid and directory on the shared storage,
which the master has created and owns by that uid before it answers. The container then
runs as ``uid:gid`` with that directory alone bind-mounted at ``/data`` (HOME and working
directory), every capability dropped, no-new-privileges, memory, pids and CPU limits;
``DOCKERMPI_API_URL`` tells the ``mpi`` client inside where the API is (on the master,
called directly over TLS), ``DOCKERMPI_API_CA`` which CA signs its certificate, and
``DOCKERMPI_REFRESH_SECONDS`` how often, at most, its jobs panel reads the user's jobs
unasked (mpi:hub:panel_refresh_seconds).

Where the site offers several approved images for notebooks (``allowed_images``: short
name -> reference by digest), the spawn form lets the user pick one; the notebook runs
it, and ``DOCKERMPI_IMAGE`` (the default image of the jobs the notebook submits) names
it, so a notebook and its jobs run the same software.

Installed by the dockermpi.hub state next to jupyterhub_config.py (on PYTHONPATH of the
dockermpi-hub service).

:depends: jupyterhub, dockerspawner 14, tornado
"""

import html
import json
import os.path
import re

from dockerspawner import DockerSpawner
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import Float, Integer, Unicode, default

#: Where the user's directory appears in the notebook (as in job containers).
DATA_MOUNT = "/data"
#: The CA of the API's certificate in a notebook (DOCKERMPI_API_CA), where the site gives one.
NOTEBOOK_CA_FILE = "/etc/dockermpi/api-ca.pem"
#: The answer of mpi.whoami: every key the spawner needs.
WHOAMI_KEYS = ("user", "account", "uid", "gid", "dir", "dir_in_job")
#: An account as the master hands it out (it names a container and a directory).
ACCOUNT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
#: Lowest uid/gid a user may run as (the master's uid range starts above it).
ID_FLOOR = 1000


class WhoamiError(web.HTTPError):
    """The master did not give the user's identity; the spawn fails with this message
    (an HTTP error, so the hub shows it to the user and API callers, not just 'error')."""

    def __init__(self, message):
        super().__init__(503, "%s", message)
        self.message = message

    def __str__(self):
        return self.message


def _why(body):
    """What an error answer of the API says, in one line (its JSON ``error``)."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
    try:
        text = str(json.loads(text).get("error") or text)
    except (ValueError, AttributeError):
        pass
    return " ".join(text.split())[:300]


def check_identity(found, user, users_dir):
    """The master's answer for ``user``, checked: a dict of :data:`WHOAMI_KEYS` whose
    ``dir`` is ``<users_dir>/<account>``; raises :class:`WhoamiError` saying what is wrong."""
    if not isinstance(found, dict) or not all(k in found for k in WHOAMI_KEYS):
        raise WhoamiError(f"mpi.whoami answered {str(found)[:300]!r}, not the keys "
                          f"{', '.join(WHOAMI_KEYS)}")
    if found["user"] != user:
        raise WhoamiError(f"mpi.whoami answered for {found['user']!r}, not {user!r}")
    account = found["account"]
    if not isinstance(account, str) or not ACCOUNT_RE.match(account):
        raise WhoamiError(f"mpi.whoami gave the account {account!r}, which is no safe name")
    for key in ("uid", "gid"):
        value = found[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < ID_FLOOR:
            raise WhoamiError(f"mpi.whoami gave {key} {value!r}: a user never runs as "
                              f"an id below {ID_FLOOR}")
    expected = os.path.join(users_dir, account)
    if found["dir"] != expected:
        raise WhoamiError(f"mpi.whoami gave the directory {found['dir']!r}, not {expected!r}")
    return found


class DockerMPISpawner(DockerSpawner):
    """DockerSpawner that runs each notebook as the user's own uid from the master, with
    only the user's directory mounted. Configure ``api_url``, ``api_service_url``, ``users_dir``,
    ``image_name`` (besides DockerSpawner's ``image``, the approved reference by digest)."""

    api_url = Unicode(
        help="DockerMPI's API as notebooks reach it: DOCKERMPI_API_URL."
    ).tag(config=True)
    api_service_url = Unicode(
        help="DockerMPI's API as the hub reaches it on the master (the service's url)."
    ).tag(config=True)
    api_service_ca = Unicode(
        help="PEM file of the CA that signs the API's certificate ('': the system's CAs)."
    ).tag(config=True)
    api_ca = Unicode(
        help="PEM file of the CA that signs the certificate of api_url, given to notebooks "
        "as DOCKERMPI_API_CA ('': they use the system's CAs)."
    ).tag(config=True)
    users_dir = Unicode(
        help="<storage path>/users on the hub host: where mpi.whoami's directories lie."
    ).tag(config=True)
    image_name = Unicode(
        help="Short name of the approved image notebooks run unless the user picks "
        "another of allowed_images (DOCKERMPI_IMAGE in the notebook)."
    ).tag(config=True)
    panel_refresh_seconds = Integer(
        30, help="How often, at most, a notebook's jobs panel reads the user's jobs unasked "
        "(DOCKERMPI_REFRESH_SECONDS)."
    ).tag(config=True)
    whoami_timeout = Float(
        30.0, help="Seconds to wait for the master's answer to mpi.whoami."
    ).tag(config=True)
    name_prefix = Unicode(
        "dmpi-notebook", help="Notebook containers are named <name_prefix>-<account>."
    ).tag(config=True)

    async def whoami(self):
        """The master's mpi.whoami answer for this spawner's user (checked)."""
        user = self.user.name
        request = HTTPRequest(
            self.api_service_url.rstrip("/") + "/services/dockermpi/api/v1/whoami",
            headers={"Authorization": f"token {self.api_token}", "Accept": "application/json"},
            connect_timeout=self.whoami_timeout, request_timeout=self.whoami_timeout,
            ca_certs=self.api_service_ca or None,
        )
        where = f"DockerMPI's API ({self.api_service_url})"
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as exc:
            body = _why(exc.response.body) if exc.response else ""
            raise WhoamiError(f"{where} refused mpi.whoami for {user}: HTTP {exc.code} "
                              f"{body}".rstrip()) from exc
        except Exception as exc:  # TLS, connection refused, timeout: say which
            raise WhoamiError(f"{where} could not be asked mpi.whoami for {user}: "
                              f"{type(exc).__name__}: {exc}") from exc
        try:
            found = json.loads(response.body)
        except ValueError as exc:
            raise WhoamiError(f"{where} answered mpi.whoami for {user} with "
                              f"{response.body[:300]!r}") from exc
        if isinstance(found, dict) and found.get("error") and "uid" not in found:
            raise WhoamiError(f"{where} refused mpi.whoami for {user}: {found['error']}")
        return check_identity(found, user, self.users_dir)

    @default("options_form")
    def _offered_images_form(self):
        """A choice of the offered images, the site's default first selected; none when
        there is nothing to choose."""
        offered = self._get_allowed_images()
        if not isinstance(offered, dict) or len(offered) <= 1:
            return ""
        options = "".join(
            f'<option value="{html.escape(name)}"'
            f'{" selected" if name == self.image_name else ""}>{html.escape(name)}</option>'
            for name in offered)
        return ('<label for="dockermpi-image">Image of your notebook and, unless you name '
                'another, of the MPI jobs you run from it</label>'
                '<select class="form-control" id="dockermpi-image" name="image" required '
                f'autofocus>{options}</select>')

    def chosen_image(self):
        """The short name of the image this start runs: the user's choice among the
        offered images, else the site's default. An HTTP 400 naming the offered ones
        for anything else (the choice is the user's input)."""
        offered = self._get_allowed_images()
        if not isinstance(offered, dict) or not offered:
            offered = {self.image_name: self.image}
        chosen = (self.user_options or {}).get("image") or self.image_name
        if not isinstance(chosen, str) or chosen not in offered:
            raise web.HTTPError(400, "%s", f"image {str(chosen)[:100]!r} is not offered for "
                                f"notebooks (offered: {', '.join(sorted(offered))})")
        return chosen

    async def start(self):
        # Only an approved image offered for notebooks, named as the site named it.
        chosen = self.chosen_image()
        self.user_options = {"image": chosen} if self._get_allowed_images() else {}
        try:
            identity = await self.whoami()
        except WhoamiError as exc:
            self.log.error("Not starting %s's notebook: %s", self.user.name, exc)
            raise
        self.log.info("%s is account %s, uid %s, gid %s, directory %s", self.user.name,
                      identity["account"], identity["uid"], identity["gid"],
                      identity["dir"])
        self.object_name = f"{self.name_prefix}-{identity['account']}"
        self.volumes = {}
        self.read_only_volumes = {}
        # Mounts, not binds: a missing source fails the start instead of being created.
        self.mounts = [
            {"type": "bind", "source": identity["dir"], "target": DATA_MOUNT,
             "read_only": False},
        ]
        ca = {}
        if self.api_ca:
            self.mounts.append({"type": "bind", "source": self.api_ca,
                                "target": NOTEBOOK_CA_FILE, "read_only": True})
            ca = {"DOCKERMPI_API_CA": NOTEBOOK_CA_FILE}
        self.notebook_dir = DATA_MOUNT
        self.environment = {
            **self.environment,
            "HOME": DATA_MOUNT,
            "DOCKERMPI_API_URL": self.api_url,
            "DOCKERMPI_IMAGE": chosen,
            "DOCKERMPI_ACCOUNT": identity["account"],
            "DOCKERMPI_REFRESH_SECONDS": str(self.panel_refresh_seconds),
            **ca,
        }
        self.extra_create_kwargs = {
            **self.extra_create_kwargs,
            "user": f"{identity['uid']}:{identity['gid']}",
            "working_dir": DATA_MOUNT,
            "labels": {"io.dockermpi.notebook": identity["account"]},
        }
        return await super().start()
