{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mpi with context %}
{#- Every node sees the shared data path; how depends on mpi:storage:type.
    The NFS server itself is a role of its own (top.sls). #}
{%- set kinds = {"nfs": ".nfs-client", "preshared": ".preshared"} %}
{%- if mpi.storage.type not in kinds %}
{{- raise("mpi:storage:type must be one of " ~ (kinds | list | sort | join(", ")) ~ ", got " ~ (mpi.storage.type | json)) }}
{%- endif %}

include:
  - {{ kinds[mpi.storage.type] }}
