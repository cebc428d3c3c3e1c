"""What an image holds for MPI jobs: the probe run inside it when it is approved, and
what its answer says.

The probe is a POSIX ``/bin/sh`` script (no other shell, no tool beyond what the
smallest images have is required: a missing one leaves its section empty). It runs on
a node in a throw-away container with no network, as nobody, read-only
(:mod:`dmpi.node.imagefacts`). Its answer is the image's content, so it is read as
hostile text: only known sections, each bounded, printable characters only.
"""

import re

#: Each section starts with a line ``@@ <name>``; the script never fails part-way.
PROBE_SCRIPT = r"""
exec 2>/dev/null </dev/null
echo '@@ path'; echo "$PATH"
echo '@@ os'; cat /etc/os-release
echo '@@ glibc'; getconf GNU_LIBC_VERSION || ldd --version
for name in mpirun mpiexec mpiexec.hydra prterun; do
  found=$(command -v "$name") && { echo "@@ command $name"; echo "$found"; }
done
launcher=$(command -v mpirun || command -v mpiexec)
if [ -n "$launcher" ]; then
  echo '@@ launcher'; echo "$launcher"
  echo '@@ launcher_version'; "$launcher" --version
fi
for name in sshd dropbear; do
  found=$(command -v "$name" || { [ -x "/usr/sbin/$name" ] && echo "/usr/sbin/$name"; }) \
    && { echo "@@ command $name"; echo "$found"; }
done
python=$(command -v python3)
if [ -n "$python" ]; then
  echo '@@ python3'; echo "$python"
  echo '@@ python'
  "$python" -c '
import sys
print("version", sys.version.split()[0])
try:
    import mpi4py
    mpi4py.rc.initialize = mpi4py.rc.finalize = False
    print("mpi4py", mpi4py.__version__)
    from mpi4py import MPI
    print("mpi4py_library", MPI.Get_library_version().strip().splitlines()[0])
except Exception as exc:
    print("mpi4py_error", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
'
fi
echo '@@ end'
"""

#: Facts kept from an older probe than this are found again (highstate probes anew).
PROBE_VERSION = 2
#: At most this much of the answer is read (the node caps what it takes from Docker).
MAX_ANSWER_BYTES = 64 * 1024
#: Each fact is at most this long once read.
MAX_FACT_CHARS = 200
_COMMANDS = ("mpirun", "mpiexec", "mpiexec.hydra", "prterun", "sshd", "dropbear")
_SECTIONS = ("path", "os", "glibc", "launcher", "launcher_version", "python3", "python",
             "end") + tuple(f"command {name}" for name in _COMMANDS)
_UNPRINTABLE_RE = re.compile(r"[^\x20-\x7e]")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
#: Variables of an image's ENV a job's ranks do not get from it: DockerMPI sets them for
#: the job's user, or they would steer the MPI's own launch.
NOT_FORWARDED_RE = re.compile(
    r"^(HOME|USER|LOGNAME|SHELL|PWD|OLDPWD|HOSTNAME|TERM|SSH_.*|DMPI_.*|OMPI_.*|PRTE_.*"
    r"|PMIX_.*|ORTE_.*|OPAL_.*|HYDRA_.*|I_MPI_.*|MPIR_.*|MPICH_.*|UCX_.*)\Z")
_PATH_RE = re.compile(r"^/[A-Za-z0-9._+/-]{0,199}\Z")

#: What each MPI flavour is called for people, and the family a version number follows.
FLAVOUR_NAMES = {"openmpi4": "Open MPI 4", "openmpi5": "Open MPI 5", "openmpi": "Open MPI",
                 "mpich": "MPICH (Hydra)", "intelmpi": "Intel MPI"}
_FAMILIES = {"openmpi4": "Open MPI", "openmpi5": "Open MPI", "openmpi": "Open MPI",
             "mpich": "MPICH", "intelmpi": "Intel MPI"}
#: The flavours DockerMPI can launch jobs of, and what a job on such an image needs.
LAUNCHABLE = ("openmpi4", "openmpi5", "mpich", "intelmpi")


def _clean(text):
    return _UNPRINTABLE_RE.sub("?", text.replace("\0", "")).strip()[:MAX_FACT_CHARS]


def sections(answer):
    """``{section: [lines]}`` of the probe's answer (bytes or text); unknown sections,
    and anything before the first, are dropped."""
    if isinstance(answer, bytes):
        answer = answer[:MAX_ANSWER_BYTES].decode("utf-8", "replace")
    found, current = {}, None
    for line in answer[:MAX_ANSWER_BYTES].splitlines():
        if line.startswith("@@ "):
            name = line[3:].strip()
            current = name if name in _SECTIONS else None
            if current is not None:
                found.setdefault(current, [])
        elif current is not None and line.strip() and len(found[current]) < 40:
            found[current].append(line)
    return found


def _path(lines):
    value = _clean(lines[0]) if lines else ""
    return value if _PATH_RE.match(value) else None


def _os_name(lines):
    fields = {}
    for line in lines:
        key, _, value = line.partition("=")
        fields[key.strip()] = value.strip().strip("\"'")
    return _clean(fields.get("PRETTY_NAME") or fields.get("NAME") or "") or None


def _glibc(lines):
    for line in lines:
        match = re.search(r"(?:glibc|GLIBC|GNU libc)\D*([0-9]+\.[0-9]+)", line)
        if match:
            return match.group(1)
    return None


def mpi_of(version_lines):
    """``(flavour, version)`` from the launcher's ``--version`` text, or ``(None, None)``:
    Open MPI prints ``mpirun (Open MPI) 4.1.4``, Hydra (MPICH, MVAPICH) ``HYDRA build
    details:`` then ``Version: 4.0.2``, Intel MPI ``Intel(R) MPI Library ..., Version
    2021.10 ...``."""
    text = "\n".join(version_lines)
    match = re.search(r"\(Open MPI\)\s+([0-9]+)\.([0-9]+)(\.[0-9]+)?", text)
    if match:
        major = int(match.group(1))
        flavour = {4: "openmpi4", 5: "openmpi5"}.get(major, "openmpi")
        return flavour, _clean(match.group(0).split(")")[-1])
    match = re.search(r"Intel\(R\) MPI Library.*?Version\s+([0-9][0-9A-Za-z.]*)", text)
    if match:
        return "intelmpi", _clean(match.group(1))
    if "HYDRA build details" in text:
        match = re.search(r"^\s*Version:\s*([0-9][0-9A-Za-z.]*)", text, re.MULTILINE)
        return "mpich", _clean(match.group(1)) if match else None
    return None, None


def hydra_device(version_lines):
    """The devices an MPICH was built with (``ch4:ucx``, ``ch4:ucx,ofi``, ``ch3:nemesis``)
    from the ``--with-device=`` of Hydra's ``Configure options``, or None."""
    match = re.search(r"--with-device=([A-Za-z0-9:,_]{1,40})", "\n".join(version_lines))
    return match.group(1) if match else None


def _python(lines):
    found = {}
    for line in lines:
        key, _, value = line.partition(" ")
        if key in ("version", "mpi4py", "mpi4py_library", "mpi4py_error"):
            found[key] = _clean(value) or None
    return found


def parse(answer):
    """The facts of the probe's answer: ``{"os", "glibc", "path", "mpi": {"flavour",
    "version", "launcher", "device" (MPICH's build, else None)} or None, "commands":
    {name: path}, "python3": path or None, "python_version", "mpi4py", "mpi4py_library",
    "mpi4py_error", "complete"}`` (``complete``: the script ran to its end)."""
    found = sections(answer)
    flavour, version = mpi_of(found.get("launcher_version", []))
    device = hydra_device(found.get("launcher_version", [])) if flavour == "mpich" else None
    launcher = _path(found.get("launcher", []))
    python = _python(found.get("python", []))
    return {
        "os": _os_name(found.get("os", [])),
        "glibc": _glibc(found.get("glibc", [])),
        "path": _clean(found["path"][0]) if found.get("path") else None,
        "mpi": None if launcher is None else {
            "flavour": flavour, "version": version, "launcher": launcher, "device": device},
        "commands": {name: path for name in _COMMANDS
                     if (path := _path(found.get(f"command {name}", [])))},
        "python3": _path(found.get("python3", [])),
        "python_version": python.get("version"),
        "mpi4py": python.get("mpi4py"),
        "mpi4py_library": python.get("mpi4py_library"),
        "mpi4py_error": python.get("mpi4py_error"),
        "complete": "end" in found,
        "probe_version": PROBE_VERSION,
    }


def describe(facts):
    """One line for people: ``Open MPI 4.1.4 (/usr/bin/mpirun), mpi4py 3.1.4``."""
    mpi = (facts or {}).get("mpi")
    if not mpi:
        text = "no MPI launcher (mpirun, mpiexec) on PATH"
    else:
        flavour, version = mpi.get("flavour"), mpi.get("version")
        if flavour in _FAMILIES and version:
            name = f"{_FAMILIES[flavour]} {version}"
        else:
            name = FLAVOUR_NAMES.get(flavour, "an MPI DockerMPI does not know")
        text = f"{name} ({mpi.get('launcher')})"
    if (facts or {}).get("mpi4py"):
        text += f", mpi4py {facts['mpi4py']}"
    return text


def why_no_jobs(facts):
    """Why jobs cannot run on an image with these facts, or None when they can."""
    if facts.get("problem"):
        return facts["problem"]
    mpi = facts.get("mpi")
    if not mpi:
        return "it has no MPI launcher (mpirun or mpiexec) on its PATH"
    if mpi.get("flavour") not in LAUNCHABLE:
        launchable = ", ".join(FLAVOUR_NAMES[f] for f in LAUNCHABLE)
        return (f"it holds {describe(facts)}; DockerMPI launches jobs of {launchable} "
                "images")
    return None


def _version_tuple(version):
    return tuple(int(part) for part in re.findall(r"[0-9]+", version or "")[:3])


def why_one_node_only(facts):
    """Why jobs on an image with these facts must keep to one node, or None.

    MPICH before 4.2 built with the UCX netmod disconnects every peer in
    ``MPI_Finalize`` and then waits in a PMI barrier that does not progress UCX, so a
    peer still disconnecting spins forever (pmodels/mpich#6596, fixed in 4.2). Between
    nodes (UCX over TCP) that hangs a finished job to its walltime in a good share of runs
    (Debian 12's MPICH 4.0.2 with UCX 1.13: 3 of 15 runs of three ranks, a barrier only);
    within a node (UCX's shared memory) it did not."""
    mpi = (facts or {}).get("mpi") or {}
    version = _version_tuple(mpi.get("version"))
    if (mpi.get("flavour") == "mpich" and version and version < (4, 2)
            and "ucx" in (mpi.get("device") or "")):
        return (f"its MPICH {mpi['version']} ({mpi['device']}) can hang in MPI_Finalize "
                "when ranks span nodes (fixed in MPICH 4.2, pmodels/mpich#6596)")
    return None


def launch_of(facts):
    """What a job's launch takes from an image's facts (None: not probed):
    ``{"flavour": its MPI's (dmpi.launch.flavours; Open MPI 4 when not probed),
    "launcher": the absolute path of its mpirun or mpiexec (or "mpirun", found on PATH),
    "image_env": names of the image's ENV its ranks get as the launcher has them}``.
    A launcher run by its absolute path starts its daemons on the other nodes from the
    same prefix, and ranks started over ssh get the image's PATH (a virtualenv first,
    say) and library path rather than sshd's defaults."""
    mpi = (facts or {}).get("mpi") or {}
    names = [n for n in (facts or {}).get("env_names") or ["PATH"]
             if isinstance(n, str) and ENV_NAME_RE.match(n) and not NOT_FORWARDED_RE.match(n)]
    return {"flavour": mpi.get("flavour") or LAUNCHABLE[0],
            "launcher": mpi.get("launcher") or "mpirun", "image_env": sorted(set(names))}
