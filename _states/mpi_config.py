"""
Fail early, and clearly, when the DockerMPI settings are wrong.

Every other state of the formula requires this one (``salt/dockermpi/config.sls``), so
on a node whose ``mpi`` pillar is wrong nothing is changed and the highstate says what
to fix, every problem at once:

.. code-block:: yaml

    mpi-config-settings-valid:
      mpi_config.valid:
        - name: mpi
        - config: {{ mpi | json }}

:depends: the ``mpi_config`` execution module
"""

__virtualname__ = "mpi_config"


def __virtual__():
    if "mpi_config.problems" in __salt__:
        return __virtualname__
    return (False, "mpi_config: the mpi_config execution module is not available")


def valid(name, config):
    """
    Succeed when ``config`` is valid DockerMPI settings; fail, naming every problem (one
    per line of the comment), when not. It changes nothing, so ``test=True`` gives the
    same result.

    name
        What the settings are called in messages: ``mpi``, the pillar key.

    config
        The ``mpi`` settings merged over the formula's defaults (``map.jinja``).
    """
    ret = {"name": name, "result": False, "changes": {}, "comment": ""}
    found = __salt__["mpi_config.problems"](config)
    if found:
        ret["comment"] = "\n".join(
            [f"The {name} pillar is invalid; no DockerMPI state is applied until it is fixed:"]
            + found
        )
        return ret
    ret["result"] = True
    ret["comment"] = f"The {name} pillar is valid"
    return ret
