"""
The job address pool: the hosts of the site's job network (``mpi:job_network:addresses``),
handed out round-robin to the ranks of starting jobs.
"""

import functools
import ipaddress


@functools.lru_cache(maxsize=16)
def _pool_bounds(cidr):
    """(address class, first host as an int, number of hosts) of a job address pool."""
    network = ipaddress.ip_network(cidr)
    size = network.num_addresses - (2 if network.num_addresses > 2 else 0)
    first = int(network.network_address) + (1 if network.num_addresses > 2 else 0)
    return type(network.network_address), first, size


def pick(cidr, start, count, taken):
    """
    ``count`` addresses of the pool ``cidr`` not in ``taken``, going round from index
    ``start``: ``(addresses, index after the last one)``, or ``(None, start)`` when
    the pool has fewer free. Round-robin, so an address just freed is reused last (peers
    may still cache the link-layer address of a container that just left). Costs the
    addresses looked at, not the size of the pool.
    """
    kind, first, size = _pool_bounds(cidr)
    found = []
    for step in range(min(size, count + len(taken))):
        index = (start + step) % size
        address = str(kind(first + index))
        if address not in taken:
            found.append(address)
            if len(found) == count:
                return found, (index + 1) % size
    return None, start
