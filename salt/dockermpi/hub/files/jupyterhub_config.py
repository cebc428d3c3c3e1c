# JupyterHub configuration of the DockerMPI hub (managed by Salt: dockermpi.hub).
#
# The site's choices come from settings.json next to this file, which the state renders
# from the `mpi:hub` pillar (mode 0600: it holds the admin token and the login secrets).
# Nothing here is edited per site.
import json
import os
import pathlib

from dockermpi_spawner import DockerMPISpawner

c = get_config()  # noqa: F821 (provided by JupyterHub)
settings = json.loads(pathlib.Path(
    os.environ.get("DOCKERMPI_HUB_SETTINGS", "/etc/dockermpi/hub/settings.json")
).read_text())
state = pathlib.Path(settings["state_dir"])

# --- the hub, its proxy and its state ------------------------------------------------
c.JupyterHub.bind_url = settings["bind_url"]
c.JupyterHub.hub_bind_url = settings["hub_bind_url"]
# How notebooks (JUPYTERHUB_API_URL) and the proxy reach the hub API.
c.JupyterHub.hub_connect_url = settings["hub_api_url"]
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
# The proxy serves users over TLS when the site gives it a certificate (mpi:hub:tls), and
# verifies the API's certificate on the master with the site's CA for it (mpi:api:tls:ca;
# without one, the system's CAs): users' tokens cross the network only encrypted.
if settings["ssl_cert"]:
    c.JupyterHub.ssl_cert = settings["ssl_cert"]
    c.JupyterHub.ssl_key = settings["ssl_key"]
c.ConfigurableHTTPProxy.command = [settings["proxy_command"]] + (
    ["--client-ssl-ca", settings["api_ca_file"]] if settings["api_ca_file"] else [])
c.ConfigurableHTTPProxy.pid_file = str(state / "jupyterhub-proxy.pid")
# Notebooks keep running while the hub restarts (a configuration change restarts it).
c.JupyterHub.cleanup_servers = False

# Each user's server on an origin of its own (<name>.<host>), this API on another
# (dockermpi--service.<host>) and the hub on <host>: a page a user's server serves can
# neither read the hub's pages nor use another user's cookies there.
if settings["subdomain_host"]:
    c.JupyterHub.subdomain_host = settings["subdomain_host"]

# --- who may log in ---------------------------------------------------------------------
c.Authenticator.admin_users = set(settings["admin_users"])
if settings["authenticator"] == "github":
    github = settings["github"]
    c.JupyterHub.authenticator_class = "github"
    c.GitHubOAuthenticator.client_id = github["client_id"]
    c.GitHubOAuthenticator.client_secret = github["client_secret"]
    c.GitHubOAuthenticator.oauth_callback_url = github["callback_url"]
    c.GitHubOAuthenticator.allowed_organizations = set(github["allowed_organizations"])
    c.GitHubOAuthenticator.scope = ["read:org"]
else:
    dummy = settings["dummy"]
    c.JupyterHub.authenticator_class = "dummy"
    if dummy["password"]:
        c.DummyAuthenticator.password = dummy["password"]
    if dummy["allowed_users"]:
        c.Authenticator.allowed_users = set(dummy["allowed_users"])
    else:
        c.Authenticator.allow_all = True

# --- DockerMPI's user API, and the admin service (the test suite, site tooling) ---------
# The API runs on the master (the mpi_api engine); the proxy serves it to browsers at
# /services/dockermpi/ on its own origin, and notebooks call it directly (below). It accepts a token only with the scope below, which users and
# their servers' tokens get here; a token the hub gives another server for a visiting
# user (OAuth) carries no such scope.
DOCKERMPI_SCOPE = "access:services!service=dockermpi"
c.JupyterHub.services = [{"name": "dockermpi", "url": settings["api_service_url"],
                          "display": False}]
# The hub's own minutely check of a service's URL trusts only its internal_ssl CA, not the
# site's CA of the API, so it would log "Cannot connect" for a healthy API; the spawner
# asks the API (whoami, with that CA) before every notebook starts instead.
c.JupyterHub.service_check_interval = 0
c.JupyterHub.load_roles = [
    {"name": "user", "scopes": ["self", DOCKERMPI_SCOPE]},
    {"name": "server", "scopes": ["users:activity!user", "access:servers!server",
                                  DOCKERMPI_SCOPE]},
]
if settings["admin_token"]:
    c.JupyterHub.services.append({"name": "dockermpi-admin", "api_token": settings["admin_token"]})
    c.JupyterHub.load_roles.append({
        "name": "dockermpi-admin",
        "description": "DockerMPI's admin service: users, their tokens and servers",
        "scopes": ["admin:users", "admin:servers", "tokens", "read:hub", "list:users"],
        "services": ["dockermpi-admin"],
    })

# --- notebooks: an approved image by digest, the user's uid from the master -------------
c.JupyterHub.spawner_class = DockerMPISpawner
c.DockerMPISpawner.image = settings["image_reference"]
c.DockerMPISpawner.image_name = settings["image"]
# The images offered in the spawn form (short name -> reference); one: no form.
c.DockerMPISpawner.allowed_images = settings["images"]
c.DockerMPISpawner.pull_policy = "never"  # the state pulled it by digest
# Notebooks call the API on the master directly, over TLS (the hub host's firewall lets
# them reach its address and port alone): through the proxy, which opens a connection to
# the API for every request, each call would cost two TLS handshakes and wait behind the
# proxy's one thread (bench/api_load.py). Browsers reach the API through the proxy, on its
# own origin (api_url). The state (hub/config.sls) decides which URL and CA they get.
c.DockerMPISpawner.api_url = settings["notebook_api_url"]
c.DockerMPISpawner.api_ca = settings["notebook_api_ca_file"]
c.DockerMPISpawner.api_service_url = settings["api_service_url"]
c.DockerMPISpawner.api_service_ca = settings["api_ca_file"]
c.DockerMPISpawner.users_dir = settings["users_dir"]
c.DockerMPISpawner.panel_refresh_seconds = settings["panel_refresh_seconds"]
c.DockerMPISpawner.use_internal_ip = True
c.DockerMPISpawner.network_name = "bridge"
c.DockerMPISpawner.remove = True
# The server is what other users' browsers talk to: it loads no configuration, server
# extension or Python package the user wrote (~/.jupyter, the user's data dir, the user
# site under ~/.local: python3 -s). The user's kernels and terminals still see what the
# user installs with pip --user.
c.DockerMPISpawner.disable_user_config = True
c.DockerMPISpawner.cmd = ["python3", "-s", "-m", "jupyterhub.singleuser"]
c.DockerMPISpawner.mem_limit = f"{settings['limits']['memory_mb']}M"
c.DockerMPISpawner.cpu_limit = float(settings["limits"]["cpus"])
c.DockerMPISpawner.extra_host_config = {
    "cap_drop": ["ALL"],
    "security_opt": ["no-new-privileges"],
    "pids_limit": settings["limits"]["pids"],
    "memswap_limit": f"{settings['limits']['memory_mb']}M",  # no swap beside it
    # Nothing of the hub host's disk but the user's own directory: a read-only root and
    # a /tmp in memory (Jupyter writes only to HOME=/data and /tmp, images/notebook).
    "read_only": True,
    "tmpfs": {"/tmp": f"size={settings['limits']['tmp_size_mb']}m,mode=1777,nosuid,nodev"},
    # Ports below 1024 for root alone, as on a host (Docker lowers the floor to 0): a
    # notebook binding one could pass for a host's root to a server that trusts those.
    "sysctls": {"net.ipv4.ip_unprivileged_port_start": "1024"},
    # Names notebooks resolve where the site's DNS does not reach them (the API's origin).
    "extra_hosts": settings["notebook_hosts"],
}
