"""
Publish the master's salt-api certificate in the Salt mine, so hosts that call the API
(the JupyterHub host, which hands it to every notebook) can verify it.

.. code-block:: yaml

    mpi-api-certificate-published:
      mpi_api.certificate_published:
        - name: dockermpi_api_certificate
        - path: /etc/dockermpi/api/tls.crt

Other minions read it with ``salt['mine.get']('roles:mpi-master',
'dockermpi_api_certificate', tgt_type='grain')``.
"""

__virtualname__ = "mpi_api"


def __virtual__():
    return __virtualname__


def certificate_published(name, path):
    """
    Make the mine entry ``name`` of this minion hold the PEM text of the certificate at
    ``path``: sent again only when the mine holds something else (a new certificate, a
    cleared mine). ``test=True`` says whether it would be sent.

    name
        The mine function alias other minions ask for.
    path
        The certificate file (PEM) on this minion.
    """
    ret = {"name": name, "result": False, "changes": {}, "comment": ""}
    try:
        with open(path, encoding="ascii") as handle:
            pem = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        ret["comment"] = f"cannot read the certificate {path}: {exc}"
        if __opts__["test"]:
            ret["result"] = None  # an earlier state of this run would write it
        return ret
    minion = __grains__["id"]
    published = (__salt__["mine.get"](minion, name) or {}).get(minion)
    if published == pem:
        ret.update(result=True, comment=f"the mine already holds {path} as {name}")
        return ret
    ret["changes"] = {"published": path}
    if __opts__["test"]:
        ret.update(result=None, comment=f"{path} would be published in the mine as {name}")
        return ret
    if not __salt__["mine.send"](name, mine_function="file.read", path=path):
        ret.update(changes={}, comment=f"the master did not take {name} into the mine")
        return ret
    ret.update(result=True, comment=f"{path} published in the mine as {name}")
    return ret
