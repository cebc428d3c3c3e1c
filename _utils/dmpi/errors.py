"""
DockerMPI's exceptions: one base, one class per kind of failure, caught by class.

Each keeps the built-in base its callers caught before there was a library
(``ValueError`` for bad input, ``RuntimeError`` for the store), so a caller outside the
package may still catch the built-in type.
"""


class DockerMPIError(Exception):
    """Anything DockerMPI refuses or fails to do; the message says what and why."""


class ConfigError(DockerMPIError, ValueError):
    """The ``mpi`` settings are wrong; ``problems`` holds one line per problem, and the
    message is those lines."""

    def __init__(self, problems):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class RequestError(DockerMPIError, ValueError):
    """An argument of a job request is wrong; the message says which and why."""


class NoSuchJob(RequestError):
    """The job does not exist, or is not the caller's to see: the two are told alike, so
    that no user learns of another's jobs."""


class ClusterError(DockerMPIError, RuntimeError):
    """The cluster cannot do what was asked now (no node reports, a call to a node
    failed, the site's settings are invalid); the message says which. For a call to
    nodes, ``answered`` lists the nodes that did answer."""

    def __init__(self, message, answered=()):
        super().__init__(message)
        self.answered = list(answered)


class StoreError(DockerMPIError, RuntimeError):
    """The job store cannot be used, or cannot do what was asked (no uid left, a name
    taken)."""


class NodeError(DockerMPIError, RuntimeError):
    """A node cannot do what the master asked (its Docker engine, its disk, a user's
    directory, a tool)."""


class StartFailure(DockerMPIError):
    """A job's containers could not be started on a node, of one of :data:`KINDS`:

    - ``storage``: the shared storage is not mounted on the node;
    - ``user_dir``: the user's directory is missing, not the user's or open to others;
    - ``node``: anything else on the node (Docker, the image, the network, a timeout).

    A node reports it across Salt as text (:meth:`wire`); the master reads the kind back
    with :meth:`from_wire`, never by matching words of the message."""

    KINDS = ("storage", "user_dir", "node")
    _MARK = "[dockermpi-start:{kind}] "

    def __init__(self, kind, message):
        if kind not in self.KINDS:
            raise ValueError(f"kind must be one of {', '.join(self.KINDS)}, got {kind!r}")
        self.kind = kind
        self.message = message
        super().__init__(message)

    def wire(self):
        """The text a node's Salt function fails with: the kind's mark, then the message."""
        return self._MARK.format(kind=self.kind) + self.message

    @classmethod
    def from_wire(cls, text):
        """The failure nodes reported in ``text`` (Salt's error lines of one or more
        nodes, each perhaps prefixed, such as ``node1: ERROR: ``), marks removed. Its kind
        is the first of :data:`KINDS` any node reported, or ``node`` when no line carries
        a mark (an error raised by Salt or Docker rather than by DockerMPI)."""
        marks = {kind: cls._MARK.format(kind=kind) for kind in cls.KINDS}
        found = [kind for kind, mark in marks.items() if mark in text]
        for mark in marks.values():
            text = text.replace(mark, "")
        return cls(found[0] if found else "node", text)
