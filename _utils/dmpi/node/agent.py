"""
DockerMPI's remote-start agent: the sshd and ssh that start a job's ranks, brought by
the node into any image.

An image need not hold an ssh server or client, and whatever ssh configuration it holds
changes nothing. The node assembles OpenSSH's ``sshd`` and ``ssh`` from its own Debian
packages (downloaded by apt, never installed, so no service starts on the node), with
every library they load and glibc's own loader, and patches the two programs (patchelf)
to load that loader and those libraries from :data:`AGENT_DIR`. Job containers mount the
agent read-only at that same path, so it runs in images of any glibc age, or with no
glibc at all, and needs nothing of the image but ``/bin/sh`` for the commands it runs.

On the node, :data:`AGENT_DIR` is a symlink to the current build in ``<AGENT_DIR>.d``
(named by the hash of its files). A new build is made beside the old
one and the link swapped; the previous build stays, since running jobs have it mounted.

:depends: apt-get, dpkg-deb, ldd (Debian's apt, dpkg and libc-bin)
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile

from dmpi.contract import AGENT_DIR, AGENT_SSH, AGENT_SSHD
from dmpi.errors import NodeError

#: What the agent is assembled from.
PACKAGES = ("openssh-server", "openssh-client")
#: Downloaded with them to patch the programs; never part of the agent.
PATCHELF_PACKAGE = "patchelf"
#: The agent's programs: path in the agent -> path in their package.
PROGRAMS = {os.path.relpath(AGENT_SSHD, AGENT_DIR): "usr/sbin/sshd",
            os.path.relpath(AGENT_SSH, AGENT_DIR): "usr/bin/ssh"}
MANIFEST = "manifest.json"
#: Raised when the way the agent is assembled changes, so nodes build it again.
AGENT_VERSION = 1
#: Library directories of a Debian system (amd64, arm64 and the rest: multiarch).
_LIB_DIRS = ("lib", "usr/lib")
_LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+(\S+|not found)")
_LOADER_LINE = re.compile(r"^\s*(/\S*ld-linux\S*)\s+\(")
COMMAND_SECONDS = 300


def _run(argv, what, env=None):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False,
                              timeout=COMMAND_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NodeError(f"cannot {what}: {exc}") from exc
    if done.returncode != 0:
        raise NodeError(f"cannot {what}: {argv[0]} exited {done.returncode}: "
                        f"{(done.stderr or done.stdout).strip()[-2000:]}")
    return done.stdout


def candidate_versions():
    """``{package: version}`` apt would install now of :data:`PACKAGES`: a build made of
    other versions is made again (a security update of OpenSSH reaches the agent at the
    next highstate)."""
    out = _run(["apt-cache", "policy", *PACKAGES], "ask apt for OpenSSH's versions",
               env=dict(os.environ, LC_ALL="C"))
    found, package = {}, None
    for line in out.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            package = line[:-1]
        elif package and line.strip().startswith("Candidate:"):
            version = line.split(":", 1)[1].strip()
            if version and version != "(none)":
                found[package] = version
    missing = [p for p in PACKAGES if p not in found]
    if missing:
        raise NodeError(f"apt has no candidate of {', '.join(missing)}: the node's apt "
                        "sources must offer Debian's OpenSSH packages")
    return found


def current(agent_dir=AGENT_DIR):
    """The manifest of the agent at ``agent_dir``, or None when there is none."""
    try:
        with open(os.path.join(agent_dir, MANIFEST), encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def problems(agent_dir=AGENT_DIR, wanted=None):
    """Why the agent at ``agent_dir`` must be built again (empty when it is fine): none
    there, made the old way, of other package versions than ``wanted`` (``{package:
    version}``), or a file changed or gone."""
    manifest = current(agent_dir)
    if manifest is None:
        return ["there is no agent"]
    found = []
    if manifest.get("agent_version") != AGENT_VERSION:
        found.append(f"it is of agent version {manifest.get('agent_version')}, "
                     f"not {AGENT_VERSION}")
    for package, version in sorted((wanted or {}).items()):
        had = (manifest.get("packages") or {}).get(package)
        if had != version:
            found.append(f"it holds {package} {had}, not {version}")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return found + ["its manifest lists no files"]
    for name, digest in sorted(files.items()):
        path = os.path.join(agent_dir, name)
        try:
            if _sha256(path) != digest:
                found.append(f"{name} changed")
        except OSError:
            found.append(f"{name} is missing")
    return found


def _download(packages, where):
    """Fetch ``packages`` and whatever of their dependencies the node lacks as .deb
    files into ``where`` (nothing is installed)."""
    os.makedirs(os.path.join(where, "partial"), exist_ok=True)
    _run(["apt-get", "install", "--yes", "--download-only", "--no-install-recommends",
          "-o", f"Dir::Cache::archives={where}", "-o", "Debug::NoLocking=1",
          *packages], f"download {', '.join(packages)}",
         env=dict(os.environ, LC_ALL="C", DEBIAN_FRONTEND="noninteractive"))
    return sorted(os.path.join(where, n) for n in os.listdir(where) if n.endswith(".deb"))


def _extract(debs, root):
    """Unpack ``debs`` under ``root``; ``{package: version}`` of what they hold."""
    versions = {}
    for deb in debs:
        fields = _run(["dpkg-deb", "--show", "--showformat", "${Package}\t${Version}",
                       deb], f"read {deb}").split("\t")
        versions[fields[0]] = fields[1]
        _run(["dpkg-deb", "--extract", deb, root], f"unpack {deb}")
    return versions


def _installed_version(package):
    out = subprocess.run(["dpkg-query", "--show", "--showformat", "${Version}", package],
                         capture_output=True, text=True, check=False)
    return out.stdout.strip() if out.returncode == 0 else None


def _from(root, relative):
    """A package's file: unpacked under ``root`` when apt fetched it, else installed."""
    for base in (root, "/"):
        path = os.path.join(base, relative)
        if os.path.isfile(path):
            return path
    raise NodeError(f"/{relative} is neither installed nor in the downloaded packages")


def _library_path(root):
    """LD_LIBRARY_PATH that finds the unpacked libraries first."""
    found = []
    for base in _LIB_DIRS:
        top = os.path.join(root, base)
        if os.path.isdir(top):
            found.append(top)
            found += sorted(os.path.join(top, d) for d in os.listdir(top)
                            if d.endswith("-linux-gnu"))
    return ":".join(found)


def _libraries(program, library_path):
    """``({soname: path}, loader path)`` of everything ``program`` loads."""
    out = _run(["ldd", program], f"list the libraries of {program}",
               env=dict(os.environ, LD_LIBRARY_PATH=library_path))
    libraries, loader, missing = {}, None, []
    for line in out.splitlines():
        linked = _LDD_LINE.match(line)
        if linked:
            if linked.group(2) == "not found":
                missing.append(linked.group(1))
            else:
                libraries[linked.group(1)] = linked.group(2)
            continue
        loaded = _LOADER_LINE.match(line)
        if loaded:
            loader = loaded.group(1)
    if missing:
        raise NodeError(f"{program} needs {', '.join(missing)}, found in no package")
    if loader is None:
        raise NodeError(f"{program} names no ELF loader")
    return libraries, loader


def build(agent_dir=AGENT_DIR, builds_dir=None):
    """
    Assemble the agent and make ``agent_dir`` link to it (see the module's docstring).

    agent_dir
        Where job containers mount the agent, and the link on the node.
    builds_dir
        Where the builds are kept (default ``<agent_dir>.d``).

    Returns its manifest: ``{"agent_version", "packages": {package: version},
    "files": {path: sha256}, "build": name}``. Raises NodeError when a package cannot
    be fetched or a program's library is found nowhere; the current agent stays then.
    """
    builds_dir = builds_dir or agent_dir + ".d"
    os.makedirs(builds_dir, mode=0o755, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".staging-", dir=builds_dir) as staging:
        root = os.path.join(staging, "root")
        debs = _download(PACKAGES + (PATCHELF_PACKAGE,), os.path.join(staging, "debs"))
        fetched = _extract(debs, root)
        packages = {p: fetched.get(p) or _installed_version(p) for p in PACKAGES}
        library_path = _library_path(root)
        patchelf = _from(root, "usr/bin/patchelf")
        out = os.path.join(staging, "agent")
        os.makedirs(os.path.join(out, "lib"))
        interpreter = None
        for name, relative in PROGRAMS.items():
            program = _from(root, relative)
            libraries, loader = _libraries(program, library_path)
            for soname, path in libraries.items():
                shutil.copyfile(path, os.path.join(out, "lib", soname))
            interpreter = os.path.basename(loader)
            shutil.copyfile(loader, os.path.join(out, "lib", interpreter))
            target = os.path.join(out, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(program, target)
            # DT_RPATH (not RUNPATH) holds for every library the program loads, and comes
            # before the image's LD_LIBRARY_PATH and ld.so.cache.
            _run([patchelf, "--set-interpreter", f"{agent_dir}/lib/{interpreter}",
                  "--force-rpath", "--set-rpath", f"{agent_dir}/lib", target],
                 f"patch {name}", env=dict(os.environ, LD_LIBRARY_PATH=library_path))
        files = {}
        for folder, _dirs, names in os.walk(out):
            os.chmod(folder, 0o755)
            for file_name in names:
                path = os.path.join(folder, file_name)
                executable = os.path.relpath(path, out) in PROGRAMS or \
                    file_name == interpreter
                os.chmod(path, 0o755 if executable else 0o644)
                files[os.path.relpath(path, out)] = _sha256(path)
        name = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
        manifest = {"agent_version": AGENT_VERSION, "packages": packages, "files": files,
                    "build": name}
        with open(os.path.join(out, MANIFEST), "w", encoding="utf-8") as handle:
            json.dump(manifest, handle, indent=1, sort_keys=True)
        os.chmod(os.path.join(out, MANIFEST), 0o644)
        final = os.path.join(builds_dir, name)
        if os.path.isdir(final):
            shutil.rmtree(final)
        os.rename(out, final)
    _link(agent_dir, final)
    _prune(builds_dir, keep={name, _previous_build(builds_dir, name)})
    return manifest


def _link(agent_dir, build_dir):
    """Point ``agent_dir`` at ``build_dir`` in one step."""
    if os.path.isdir(agent_dir) and not os.path.islink(agent_dir):
        raise NodeError(f"{agent_dir} is a directory, not DockerMPI's link to its agent")
    temporary = f"{agent_dir}.link-{os.getpid()}"
    if os.path.lexists(temporary):
        os.unlink(temporary)
    os.symlink(build_dir, temporary)
    os.replace(temporary, agent_dir)
    _remember(os.path.dirname(build_dir), os.path.basename(build_dir))


_HISTORY = ".history"


def _remember(builds_dir, name):
    history = _history(builds_dir)
    history = [n for n in history if n != name] + [name]
    with open(os.path.join(builds_dir, _HISTORY), "w", encoding="utf-8") as handle:
        handle.write("\n".join(history[-8:]) + "\n")


def _history(builds_dir):
    try:
        with open(os.path.join(builds_dir, _HISTORY), encoding="utf-8") as handle:
            return [line.strip() for line in handle if line.strip()]
    except OSError:
        return []


def _previous_build(builds_dir, name):
    earlier = [n for n in _history(builds_dir) if n != name]
    return earlier[-1] if earlier else None


def _prune(builds_dir, keep):
    for entry in os.listdir(builds_dir):
        path = os.path.join(builds_dir, entry)
        if entry not in keep and not entry.startswith(".") and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)


def host_path():
    """The build :data:`AGENT_DIR` links to, which job containers mount; NodeError when
    the node has no agent (highstate builds it)."""
    resolved = os.path.realpath(AGENT_DIR)
    if current(resolved) is None:
        raise NodeError(f"this node has no remote-start agent at {AGENT_DIR} "
                        "(highstate builds it: state dockermpi.node.agent)")
    for name in PROGRAMS:
        if not os.access(os.path.join(resolved, name), os.X_OK):
            raise NodeError(f"the remote-start agent at {AGENT_DIR} lacks {name} "
                            "(highstate builds it again)")
    return resolved


def state():
    """``"ok"``, or why the node's agent cannot start jobs (for its health report)."""
    try:
        host_path()
    except NodeError as exc:
        return str(exc)
    return "ok"
