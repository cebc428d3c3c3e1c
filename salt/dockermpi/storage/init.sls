{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- Every node sees the shared data path; how depends on mpi:storage:type.
    The NFS and GlusterFS servers are roles of their own (top.sls). Any other type is
    reported by the settings check (.config), and nothing is applied. #}
{%- set kinds = {"nfs": ".nfs-client", "glusterfs": ".glusterfs-client",
                "preshared": ".preshared"} %}
{%- set kind = kinds.get(mpi.storage.type | string) %}

include:
  - {{ tplroot }}.config
  - .hosts
{%- if kind %}
  - {{ kind }}
{%- endif %}
