"""The shared storage's own side: users' quotas (:mod:`dmpi.storage.quota`) and the
GlusterFS volume that enforces them (:mod:`dmpi.storage.glusterfs`)."""
