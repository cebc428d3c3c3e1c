"""
What each approved image on this node holds for MPI jobs: the probe of
:mod:`dmpi.launch.probe` run in a throw-away container, and the facts kept by image
reference in :data:`FACTS_FILE` (read by the node's health report, so the master
learns them).

The probe container has no network, runs as nobody with every capability dropped and
no new privileges, on a read-only root with a small /tmp, bounded in memory, processes
and time, and is removed whatever happens.
"""

import json
import os
import secrets
import tempfile
import threading

import docker.errors
import requests.exceptions

from dmpi.contract import IMAGE_REFERENCE_RE, LABEL_ROLE, PROBE_ROLE
from dmpi.errors import NodeError
from dmpi.launch import probe
from dmpi.node import containers
from dmpi.settings import NOBODY_ID

FACTS_FILE = "/var/lib/dockermpi/image-facts.json"
PROBE_PREFIX = "dmpi-probe-"
#: Seconds the probe may run (a launcher's ``--version`` that hangs ends it).
PROBE_SECONDS = 60
#: How many images' facts a node keeps (the oldest beyond this are dropped).
MAX_KEPT = 64


def _options(reference):
    return {
        "image": reference,
        "name": PROBE_PREFIX + secrets.token_hex(6),
        "entrypoint": ["/bin/sh", "-c", probe.PROBE_SCRIPT],
        "command": [],
        "user": f"{NOBODY_ID}:{NOBODY_ID}",
        "working_dir": "/",
        "network_mode": "none",
        "read_only": True,
        "tmpfs": {"/tmp": "size=16m,mode=1777"},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "mem_limit": 256 << 20,
        "memswap_limit": 256 << 20,
        "pids_limit": 64,
        "nano_cpus": 1_000_000_000,
        "labels": {LABEL_ROLE: PROBE_ROLE},
        "log_config": {"type": "json-file", "config": {"max-size": "1m"}},
    }


def _image_config(image):
    config = image.attrs.get("Config") or {}
    entrypoint = config.get("Entrypoint") or []
    names = [str(item).partition("=")[0] for item in config.get("Env") or []]
    return {"env_names": sorted({n for n in names if probe.ENV_NAME_RE.match(n)})[:64],
            "user": str(config.get("User") or "")[:probe.MAX_FACT_CHARS] or None,
            "workdir": str(config.get("WorkingDir") or "")[:probe.MAX_FACT_CHARS] or None,
            "entrypoint": [str(x)[:probe.MAX_FACT_CHARS] for x in entrypoint][:8]
            if isinstance(entrypoint, list) else None}


def _answer(container):
    """``(the first MAX_ANSWER_BYTES of what the created ``container`` writes, whether it
    ended by itself within PROBE_SECONDS)``. Read from the start as it is written (the
    engine's log would keep the end of a flood, not its start); the container is killed
    once that much came or the time is up. The stream is drained to its end all along: an
    engine whose output nobody reads cannot finish a kill."""
    stream = container.attach(stdout=True, stderr=False, stream=True, logs=True)
    chunks, size = [], [0]
    enough = threading.Event()  # the answer is complete, or as long as it may be

    def read():
        try:
            for chunk in stream:
                if size[0] < probe.MAX_ANSWER_BYTES:
                    chunks.append(chunk)
                    size[0] += len(chunk)
                    if size[0] >= probe.MAX_ANSWER_BYTES:
                        enough.set()
        except (docker.errors.DockerException, requests.exceptions.RequestException, OSError):
            pass  # the container was killed: what came is the answer
        finally:
            enough.set()

    reader = threading.Thread(target=read, name="image-probe", daemon=True)
    reader.start()
    container.start()
    timed_out = not enough.wait(PROBE_SECONDS)
    if reader.is_alive():
        try:
            container.kill()
        except docker.errors.APIError:
            pass  # it ended meanwhile
    reader.join(30)
    stream.close()
    return b"".join(chunks)[:probe.MAX_ANSWER_BYTES], not timed_out


def run_probe(reference, client=None):
    """The facts of the image ``reference`` (present on this node; ``mpi_image.probe``
    takes only references pinned by digest): what
    :func:`dmpi.launch.probe.parse` found, the image's own USER, WORKDIR and ENTRYPOINT,
    and ``problem`` when the probe could not run or did not finish. NodeError when the
    image is not here or the Docker engine cannot be reached."""
    client = client or containers.client()
    try:
        image = client.images.get(reference)
    except docker.errors.ImageNotFound:
        raise NodeError(f"image {reference} is not on this node (pull it first)") from None
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise NodeError(f"cannot inspect image {reference}: {exc}") from exc
    facts = dict(_image_config(image), problem=None)
    container = None
    try:
        container = client.containers.create(**_options(reference))
        answer, finished = _answer(container)
        facts.update(probe.parse(answer))
        if not finished:
            facts["problem"] = f"the probe did not finish within {PROBE_SECONDS} s"
        elif not facts["complete"]:
            facts["problem"] = "the probe (a /bin/sh script) did not run to its end"
    except docker.errors.APIError as exc:
        # Most often: the image has no /bin/sh to run the probe (nor a job's commands).
        facts.update(probe.parse(b""))
        facts["problem"] = ("the probe could not run in the image (is there a /bin/sh?): "
                            + str(exc.explanation or exc)[:200])
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise NodeError(f"cannot probe image {reference}: {exc}") from exc
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except (docker.errors.DockerException, requests.exceptions.RequestException):
                pass
    return facts


def kept():
    """``{reference: facts}`` of the images probed on this node ({} before any)."""
    try:
        with open(FACTS_FILE, encoding="utf-8") as handle:
            found = json.load(handle)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {}  # rewritten whole by the next probe
    if not isinstance(found, dict):
        return {}
    return {ref: facts for ref, facts in found.items()
            if isinstance(ref, str) and IMAGE_REFERENCE_RE.match(ref) and isinstance(facts, dict)}


def keep(reference, facts):
    """Keep ``facts`` of ``reference`` in :data:`FACTS_FILE`."""
    found = kept()
    found.pop(reference, None)
    found[reference] = facts
    write_json(FACTS_FILE, dict(list(found.items())[-MAX_KEPT:]))
    return facts


def write_json(path, data):
    """Replace ``path`` (readable by all, its directory made when missing) with ``data`` as
    JSON, atomically: a reader sees the old file or the new one, never a part."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + "-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, sort_keys=True)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
