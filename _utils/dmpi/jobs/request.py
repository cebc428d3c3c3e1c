"""
Validation of an MPI job request as users hand it to ``salt-run mpi.submit``.

Users are not trusted, and every argument may be anything Salt's CLI or API can pass:
text, numbers, booleans, None, lists and mappings nested at will, megabytes long, with
non-ASCII digits, NUL characters or lone surrogates (undecodable bytes on the command
line). Whatever comes in, each function here either returns the normalised request or
raises :class:`RequestError` with a one-line message naming the argument and what is
wrong with it, quoting at most about 60 characters of the value. No other exception
leaves this module.

Everything here is pure: no Salt, no I/O, no cluster state. What needs the cluster
(approved images, which nodes exist, whether the job fits) is checked by the runner.

:depends: nothing outside the standard library
"""

import math
import posixpath
import re
import shlex

from dmpi.contract import DATA_MOUNT, IMAGE_NAME_RE, USER_RE
from dmpi.errors import RequestError

__all__ = [
    "DATA_MOUNT",
    "DEFAULT_LIMITS",
    "RESERVED_ENV_NAMES",
    "RESERVED_ENV_PREFIXES",
    "USER_RE",
    "RequestError",
    "parse_duration",
    "parse_walltime",
    "parse_nodes",
    "validate_request",
    "valid_user",
]

#: Environment variables DockerMPI or Open MPI set for the job; users may not set them.
RESERVED_ENV_NAMES = ("HOME",)
RESERVED_ENV_PREFIXES = ("OMPI_", "PMIX_", "OPAL_", "ORTE_", "DMPI_")
#: Site limits a request is held to; the site's ``mpi:limits`` pillar overrides them.
DEFAULT_LIMITS = {
    "max_walltime": 86400,  # seconds, as salt/dockermpi/defaults.yaml
    "max_np": 4096,
    "max_cmd_bytes": 65536,  # UTF-8 bytes of all program words together
    "max_cmd_words": 4096,
    "max_env_bytes": 65536,  # UTF-8 bytes of all names and values together
    "max_env_vars": 256,
}

DEFAULT_WALLTIME = 3600
# No site limit can allow more; checked before any arithmetic on what the user wrote.
WALLTIME_CEILING = 3650 * 86400
WALLTIME_MAX_CHARS = 20
WALLTIME_FORMS = "use 90s, 30m, 2h, 1d, MM:SS, HH:MM:SS, D-HH or D-HH:MM:SS"
MAX_NODES = 1000
GRAIN_MAX_CHARS = 256
ENV_NAME_MAX_CHARS = 128
PATH_MAX_BYTES = 4096
NAME_MAX_BYTES = 255
IMAGE_MAX_CHARS = 128
SHOWN_CHARS = 60

# Character classes are spelled out: \d and \w also match other scripts' digits and letters.
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NODE_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NODE_LIST_RE = re.compile(r"[A-Za-z0-9_.-]+(?:\s*,\s*[A-Za-z0-9_.-]+)*")
_GRAIN_RE = re.compile(r"G@[A-Za-z0-9_.-]+(?::[A-Za-z0-9_.*-]+)+")
_WALLTIME_RE = re.compile(
    r"(?P<number>[0-9]+)(?P<unit>[smhd])?"
    r"|(?:(?P<days>[0-9]+)-)?(?P<clock>[0-9]+(?::[0-9]+){0,2})"
)
_WALLTIME_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_CONTROL_CHARS_RE = re.compile(r"[\x00-\x1f\x7f]")
# Stands for a run of ASCII digits too long to be worth converting: above any sane limit.
_TOO_LARGE = 10**30
_NODES_FORMS = (
    "nodes= takes a count, a node list or one grain match G@key:value, "
    "never pillar or other targets"
)


# --------------------------------------------------------------------------- helpers


def _shown(value):
    """``value`` for a message: one line of at most about 60 characters, whatever it is."""
    text = _short_repr(value, depth=2)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


def _short_repr(value, depth):
    # Never the plain repr of a container or an unknown object: it could be megabytes
    # long, nest deeper than the recursion limit, or raise (ints over 4300 digits do).
    if value is None or isinstance(value, (bool, float)):
        return repr(value)
    if isinstance(value, int):
        return repr(value) if abs(value) < 10**40 else "<a number of over 40 digits>"
    if isinstance(value, (str, bytes)):
        return repr(value[:SHOWN_CHARS + 1])  # repr escapes newlines and surrogates
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        opening, closing = (
            "[]" if isinstance(value, list) else "()" if isinstance(value, tuple) else "{}"
        )
        if depth == 0:
            return f"{opening}...{closing}" if value else opening + closing
        items = []
        for item in (value.items() if isinstance(value, dict) else value):
            if len(items) == 3:
                items.append("...")
                break
            if isinstance(value, dict):
                key, item = item
                items.append(f"{_short_repr(key, depth - 1)}: {_short_repr(item, depth - 1)}")
            else:
                items.append(_short_repr(item, depth - 1))
        return opening + ", ".join(items) + closing
    return f"<{type(value).__name__}>"


def _whole_number(value, accept_text):
    """``value`` as an int if it is a whole number (with ``accept_text``, also a string of
    ASCII digits); None otherwise. Digit strings too long to matter give ``_TOO_LARGE``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if accept_text and isinstance(value, str):
        text = value.strip()
        if text.isascii() and text.isdigit():
            digits = text.lstrip("0") or "0"
            return int(digits) if len(digits) <= 20 else _TOO_LARGE
    return None


def _utf8_size(text):
    """UTF-8 bytes of ``text``; None when it holds lone surrogates (undecodable input)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def _limits(limits):
    """The site's limits merged over :data:`DEFAULT_LIMITS`; other keys are ignored."""
    if limits is None:
        limits = {}
    if not isinstance(limits, dict):
        raise RequestError(
            f"limits must be a mapping of limit names to numbers, got {_shown(limits)}"
        )
    merged = {}
    for name, default in DEFAULT_LIMITS.items():
        given = limits.get(name)
        value = default if given is None else _whole_number(given, accept_text=True)
        if value is None or value < 1:
            raise RequestError(
                f"site limit {name} must be a positive whole number, got {_shown(given)}"
            )
        merged[name] = value
    return merged


# -------------------------------------------------------------------------- walltime


def parse_walltime(value):
    """
    Seconds from a walltime.

    value
        Text: a number with a unit (``90s``, ``30m``, ``2h``, ``1d``), or Slurm's
        ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``. ASCII digits
        only, at most 20 characters, case and surrounding blanks ignored.

    A bare number (``90``, or the int 90) is refused: it could mean seconds or, as in
    Slurm, minutes, and either reading surprises someone. (Salt's YAML also turns ``2:00``
    typed on the ``salt-run`` command line into the number 120, which is refused too
    rather than read as two hours.) The ``mpi`` client of the notebook image takes a bare
    number as minutes, like Slurm's ``-t``, and sends ``<n>m``.

    Returns the seconds (an int above zero, at most ten years); raises
    :class:`RequestError` otherwise.
    """
    return parse_duration(value, "walltime")


def parse_duration(value, what):
    """
    Seconds from a duration written as a walltime is (:func:`parse_walltime`: ``90s``,
    ``30m``, ``2h``, ``7d``, ``HH:MM:SS``, ...; no bare number), for settings that are
    durations too (``mpi:fair_share:half_life``).

    what
        What the value is, to start each message (``walltime``, a pillar key).

    Returns the seconds (an int above zero, at most ten years); raises
    :class:`RequestError` naming ``what`` otherwise.
    """
    shown = _shown(value)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise RequestError(f"{what} {shown} is not a time: {WALLTIME_FORMS}")
    if not isinstance(value, str) or value.strip().isascii() and value.strip().isdigit():
        hint = ("; quote a clock time on the salt-run command line: walltime='\"2:00\"'"
                if what == "walltime" else "")
        raise RequestError(
            f"{what} {shown} has no unit (seconds or minutes?): {WALLTIME_FORMS}{hint}")
    total = _parse_duration_text(value, shown, what)
    if total <= 0:
        raise RequestError(f"{what} {shown} must be longer than zero")
    if total > WALLTIME_CEILING:
        raise RequestError(f"{what} {shown} is longer than ten years")
    return total


def _parse_duration_text(value, shown, what):
    # Length first: 20 characters hold at most 20 digits, so no big int is ever built.
    if len(value) > 4 * WALLTIME_MAX_CHARS or len(value.strip()) > WALLTIME_MAX_CHARS:
        raise RequestError(
            f"{what} {shown} is not a time: at most {WALLTIME_MAX_CHARS} characters, "
            + WALLTIME_FORMS
        )
    text = value.strip().lower()
    match = _WALLTIME_RE.fullmatch(text) if text.isascii() else None
    if match is None:
        raise RequestError(f"{what} {shown} is not a time: {WALLTIME_FORMS}")
    if match["number"] is not None:
        return int(match["number"]) * _WALLTIME_UNITS[match["unit"]]
    parts = [int(part) for part in match["clock"].split(":")]
    if match["days"] is not None:
        parts += [0] * (3 - len(parts))  # D-HH, D-HH:MM: the clock counts from hours
    elif len(parts) == 2:
        parts = [0] + parts  # MM:SS
    hours, minutes, seconds = parts
    return int(match["days"] or 0) * 86400 + hours * 3600 + minutes * 60 + seconds


# ----------------------------------------------------------------------------- nodes


def parse_nodes(nodes):
    """
    The shape of the ``nodes`` argument: which nodes a job may run on.

    nodes
        None or ``""``: any MPI node. A count: an int of at least 1 or a string of
        ASCII digits (the job spreads evenly over that many nodes). A node list: a
        list or tuple of node ids, or node ids separated by commas (a single id is a
        list of one); ids are ``[A-Za-z0-9_.-]``, at most 64 characters, no duplicates,
        at most 1000 of them. One grain match ``G@key:value`` (nested keys with ``:``,
        ``*`` globs in the value), such as ``G@rack:a``. Nothing else: no pillar
        (``I@``), compound or other Salt targets, since those could reach beyond what
        the user may select.

    Returns None, ``{"count": n}``, ``{"list": [ids]}`` or ``{"grain": "key:value"}``
    (without ``G@``). Whether those nodes exist is for the caller to check. Raises
    :class:`RequestError` otherwise.
    """
    if nodes is None:
        return None
    if isinstance(nodes, bool):
        raise RequestError(f"nodes={_shown(nodes)} is not accepted: {_NODES_FORMS}")
    count = _whole_number(nodes, accept_text=True)
    if count is not None:
        if count < 1:
            raise RequestError(f"nodes={_shown(nodes)}: need at least one node")
        if count > MAX_NODES:
            raise RequestError(
                f"nodes={_shown(nodes)} is more than the {MAX_NODES} nodes a job may use"
            )
        return {"count": count}
    if isinstance(nodes, (list, tuple)):
        return {"list": _node_ids(nodes)}
    if not isinstance(nodes, str):
        raise RequestError(f"nodes={_shown(nodes)} is not accepted: {_NODES_FORMS}")
    text = nodes.strip()
    if not text:
        return None
    if len(text) <= GRAIN_MAX_CHARS and _GRAIN_RE.fullmatch(text):
        return {"grain": text[2:]}
    # The bound keeps the regex and the split linear in a length we chose.
    if len(text) <= MAX_NODES * 66 and _NODE_LIST_RE.fullmatch(text):
        return {"list": _node_ids([node.strip() for node in text.split(",")])}
    raise RequestError(f"nodes={_shown(nodes)} is not accepted: {_NODES_FORMS}")


def _node_ids(nodes):
    if not nodes:
        raise RequestError("nodes is an empty list: name at least one node")
    if len(nodes) > MAX_NODES:
        raise RequestError(
            f"nodes lists {len(nodes)} nodes, more than the {MAX_NODES} a job may use"
        )
    seen = set()
    for node in nodes:
        if not isinstance(node, str) or not _NODE_ID_RE.fullmatch(node):
            raise RequestError(
                f"nodes lists {_shown(node)}, which is not a node id: letters, digits, "
                "'.', '_' and '-', at most 64 characters"
            )
        if node in seen:
            raise RequestError(f"nodes lists {node} twice")
        seen.add(node)
    return list(nodes)


# --------------------------------------------------------------------------- request


def validate_request(user, image, np, cmd, nodes, slots_per_node, walltime, env, workdir,
                     limits=None):
    """
    Check every argument of a job request that needs no cluster state.

    user
        The job's user: letters, digits, ``-`` and ``_``, starting with a letter or
        digit, at most 64 characters.
    image
        Short name of an image (whether it is approved is the caller's check):
        letters, digits, ``.``, ``_``, ``-``, at most 128 characters.
    np
        Number of ranks: a positive int or a string of ASCII digits, at most ``max_np``.
    cmd
        The program and its arguments: text split into words like a shell would (no
        shell runs it), or a list of strings. Not empty, not starting with an option,
        no NUL, valid UTF-8, at most ``max_cmd_words`` words and ``max_cmd_bytes`` bytes.
    nodes
        Which nodes, see :func:`parse_nodes`.
    slots_per_node
        Ranks per node: None or a positive int, at most ``max_np``.
    walltime
        Time limit, see :func:`parse_walltime`; None means one hour (or ``max_walltime``
        if that is shorter). At most ``max_walltime``.
    env
        None or ``{NAME: value}`` exported to every rank. Names are
        ``[A-Za-z_][A-Za-z0-9_]*`` of at most 128 characters, not ``HOME`` nor starting
        with ``OMPI_``, ``PMIX_``, ``OPAL_``, ``ORTE_`` or ``DMPI_`` (DockerMPI and Open
        MPI set those). Values are text or numbers (ints, finite floats), turned into
        text; booleans, None, lists and mappings are refused, since ``True`` is rarely
        what a user who wrote ``yes`` meant. At most ``max_env_vars`` variables and
        ``max_env_bytes`` bytes of names and values.
    workdir
        Working directory of the ranks: relative to :data:`DATA_MOUNT` or absolute
        under it, never leaving it; no control characters, at most 4096 bytes, no
        component over 255 bytes. None or ``""`` means :data:`DATA_MOUNT`.
    limits
        The site's limits (pillar ``mpi:limits``): ``max_walltime``, ``max_np``,
        ``max_cmd_bytes``, ``max_cmd_words``, ``max_env_bytes``, ``max_env_vars``;
        missing ones come from :data:`DEFAULT_LIMITS`, other keys are ignored.

    Returns ``{"user", "image", "np", "program", "nodes", "slots_per_node", "walltime",
    "env", "workdir"}``: ``program`` a list of strings, ``nodes`` as from
    :func:`parse_nodes`, ``walltime`` in seconds, ``env`` text to text and ``workdir``
    an absolute normalised path. Raises :class:`RequestError` at the first wrong
    argument.
    """
    limits = _limits(limits)
    _check_user(user)
    _check_image(image)
    ranks = _check_np(np, limits["max_np"])
    program = _check_cmd(cmd, limits["max_cmd_words"], limits["max_cmd_bytes"])
    placement = parse_nodes(nodes)
    per_node = _check_slots_per_node(slots_per_node, limits["max_np"])
    seconds = _check_walltime(walltime, limits["max_walltime"])
    environment = _check_env(env, limits["max_env_vars"], limits["max_env_bytes"])
    directory = _check_workdir(workdir)
    return {
        "user": user,
        "image": image,
        "np": ranks,
        "program": program,
        "nodes": placement,
        "slots_per_node": per_node,
        "walltime": seconds,
        "env": environment,
        "workdir": directory,
    }


def valid_user(user):
    """
    Whether ``user`` is a valid user name (see :data:`USER_RE`), for callers that take a
    user alone.

    user
        Anything; only a string of letters, digits, ``-`` and ``_``, starting with a
        letter or digit, at most 64 characters, is valid.
    """
    return isinstance(user, str) and USER_RE.match(user) is not None


def _check_user(user):
    if not valid_user(user):
        raise RequestError(
            f"user {_shown(user)} is not a valid user name: letters, digits, '-' and '_' "
            "only, starting with a letter or digit, at most 64 characters"
        )


def _check_image(image):
    if image is None or image == "":
        raise RequestError("image is required: the short name of an approved image")
    if not isinstance(image, str) or not IMAGE_NAME_RE.match(image):
        raise RequestError(
            f"image {_shown(image)} is not an image name: letters, digits, '.', '_' and '-' "
            f"only, at most {IMAGE_MAX_CHARS} characters"
        )


def _check_np(np, max_np):
    ranks = _whole_number(np, accept_text=True)
    if ranks is None or ranks < 1:
        raise RequestError(f"np must be a positive whole number of ranks, got {_shown(np)}")
    if ranks > max_np:
        raise RequestError(
            f"np={_shown(np)} exceeds the site's limit of {max_np} ranks (mpi:limits:max_np)"
        )
    return ranks


def _check_cmd(cmd, max_words, max_bytes):
    if cmd is None:
        raise RequestError("cmd is required: the program and its arguments")
    if isinstance(cmd, str):
        if len(cmd) > max_bytes:  # before shlex, which walks the text a character at a time
            raise RequestError(
                f"cmd is {len(cmd)} characters long, over the site's limit of {max_bytes} "
                "bytes (mpi:limits:max_cmd_bytes)"
            )
        if "\0" in cmd:
            raise RequestError("cmd must not contain NUL characters")
        if _utf8_size(cmd) is None:
            raise RequestError("cmd must be valid UTF-8 text (it holds undecodable bytes)")
        try:
            program = shlex.split(cmd)
        except ValueError as exc:
            raise RequestError(f"cmd cannot be split into words: {exc}") from None
    elif isinstance(cmd, (list, tuple)):
        if len(cmd) > max_words:
            raise RequestError(
                f"cmd has {len(cmd)} words, over the site's limit of {max_words} "
                "(mpi:limits:max_cmd_words)"
            )
        for position, word in enumerate(cmd, 1):
            if not isinstance(word, str):
                raise RequestError(
                    f"cmd must be the program and its arguments as text or a list of text, "
                    f"but word {position} is {_shown(word)} (quote it if YAML changed it)"
                )
        program = list(cmd)
    else:
        raise RequestError(
            f"cmd must be the program and its arguments as text or a list, got {_shown(cmd)} "
            "(quote it if the shell or YAML changed it)"
        )
    if not program or not program[0]:
        raise RequestError("cmd is empty: give the program to run")
    if program[0].startswith("-"):
        raise RequestError(f"cmd must start with a program, not an option: {_shown(program[0])}")
    if len(program) > max_words:
        raise RequestError(
            f"cmd has {len(program)} words, over the site's limit of {max_words} "
            "(mpi:limits:max_cmd_words)"
        )
    total = 0
    for position, word in enumerate(program, 1):
        if "\0" in word:
            raise RequestError("cmd must not contain NUL characters")
        size = _utf8_size(word)
        if size is None:
            raise RequestError(
                f"cmd word {position} is not valid UTF-8 text (it holds undecodable bytes)"
            )
        total += size
        if total > max_bytes:
            raise RequestError(
                f"cmd is over the site's limit of {max_bytes} bytes (mpi:limits:max_cmd_bytes)"
            )
    return program


def _check_slots_per_node(slots_per_node, max_np):
    if slots_per_node is None:
        return None
    if (isinstance(slots_per_node, bool) or not isinstance(slots_per_node, int)
            or slots_per_node < 1):
        raise RequestError(
            f"slots_per_node must be a positive whole number, got {_shown(slots_per_node)}"
        )
    if slots_per_node > max_np:
        raise RequestError(
            f"slots_per_node={_shown(slots_per_node)} exceeds the site's limit of {max_np} "
            "ranks (mpi:limits:max_np)"
        )
    return slots_per_node


def _check_walltime(walltime, max_walltime):
    if walltime is None:
        return min(DEFAULT_WALLTIME, max_walltime)
    seconds = parse_walltime(walltime)
    if seconds > max_walltime:
        raise RequestError(
            f"walltime {_shown(walltime)} exceeds the site's limit of {max_walltime} seconds "
            "(mpi:limits:max_walltime)"
        )
    return seconds


def _check_env(env, max_vars, max_bytes):
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise RequestError(
            f"env must be a mapping of variable names to values, got {_shown(env)}"
        )
    if len(env) > max_vars:
        raise RequestError(
            f"env has {len(env)} variables, over the site's limit of {max_vars} "
            "(mpi:limits:max_env_vars)"
        )
    environment = {}
    total = 0
    for name, value in env.items():
        if (not isinstance(name, str) or len(name) > ENV_NAME_MAX_CHARS
                or not _ENV_NAME_RE.fullmatch(name)):
            raise RequestError(
                f"environment variable name {_shown(name)} is not valid: letters, digits and "
                f"'_', not starting with a digit, at most {ENV_NAME_MAX_CHARS} characters"
            )
        if name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
            raise RequestError(
                f"environment variable {name} is reserved: DockerMPI sets it for the job"
            )
        text = _env_value(name, value, max_bytes)
        total += len(name) + _utf8_size(text)
        if total > max_bytes:
            raise RequestError(
                f"env is over the site's limit of {max_bytes} bytes of names and values "
                "(mpi:limits:max_env_bytes)"
            )
        environment[name] = text
    return environment


def _env_value(name, value, max_bytes):
    """The text of one variable's value."""
    if isinstance(value, str):
        if len(value) > max_bytes:  # before encoding megabytes
            raise RequestError(
                f"env is over the site's limit of {max_bytes} bytes of names and values "
                "(mpi:limits:max_env_bytes)"
            )
        if "\0" in value:
            raise RequestError(
                f"environment variable {name} needs a plain value without NUL characters"
            )
        if _utf8_size(value) is None:
            raise RequestError(
                f"environment variable {name} needs a plain value of valid UTF-8 text "
                "(it holds undecodable bytes)"
            )
        return value
    # str() of an int over 4300 digits raises; no variable needs one that long anyway.
    plain_number = (
        isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**64
        or isinstance(value, float) and math.isfinite(value)
    )
    if not plain_number:
        raise RequestError(
            f"environment variable {name} needs a plain value (text or a number), got "
            f"{_shown(value)}; quote it if YAML changed it"
        )
    return str(value)


def _check_workdir(workdir):
    if workdir is None or workdir == "":
        return DATA_MOUNT
    if not isinstance(workdir, str):
        raise RequestError(
            f"workdir must be a path as text, got {_shown(workdir)} (quote it if YAML changed it)"
        )
    if len(workdir) > PATH_MAX_BYTES:  # before any work on megabytes
        raise RequestError(f"workdir is longer than {PATH_MAX_BYTES} bytes")
    if _CONTROL_CHARS_RE.search(workdir):
        raise RequestError(
            f"workdir {_shown(workdir)} must not contain NUL, newlines or other control "
            "characters"
        )
    if _utf8_size(workdir) is None:
        raise RequestError("workdir must be valid UTF-8 text (it holds undecodable bytes)")
    resolved = posixpath.normpath(posixpath.join(DATA_MOUNT, workdir))
    if resolved != DATA_MOUNT and not resolved.startswith(DATA_MOUNT + "/"):
        raise RequestError(
            f"workdir {_shown(workdir)} leaves the user's data directory (seen as {DATA_MOUNT})"
        )
    if _utf8_size(resolved) > PATH_MAX_BYTES:
        raise RequestError(f"workdir is longer than {PATH_MAX_BYTES} bytes")
    if any(len(part.encode("utf-8")) > NAME_MAX_BYTES for part in resolved.split("/")):
        raise RequestError(
            f"workdir {_shown(workdir)} has a component longer than {NAME_MAX_BYTES} bytes"
        )
    return resolved
