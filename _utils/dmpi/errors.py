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


class StoreError(DockerMPIError, RuntimeError):
    """The job store cannot be used, or cannot do what was asked (no uid left, a name
    taken)."""
