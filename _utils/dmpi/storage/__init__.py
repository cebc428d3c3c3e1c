"""The shared storage's own side: users' quotas (:mod:`dmpi.storage.quota`), the
GlusterFS volume that enforces them (:mod:`dmpi.storage.glusterfs`), the directories
every node ensures on it (:mod:`dmpi.storage.shared`) and what it trusts on the hosts
that speak to it (:mod:`dmpi.storage.hosts`)."""
