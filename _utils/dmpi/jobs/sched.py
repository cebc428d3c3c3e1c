"""
Placement and queue planning for DockerMPI jobs: pure functions, no Salt, no I/O.

Jobs are started in the order given (submission order, or fair-share priority:
:mod:`dmpi.jobs.fairshare`), all or nothing across nodes. When the job at
the head of the queue cannot start, it gets a reservation (EASY backfill): the earliest
time enough slots will be free given the walltimes of running jobs, and the nodes it
would take then. A later job may start before it only if it fits now and either ends
(by its walltime) before that time or leaves the head's reserved slots untouched, so
backfill never delays the head.

Where a job's ranks go (``placement``): ``pack`` fills nodes in their preference order,
keeping the last nodes free for large jobs (like Slurm's default); ``spread`` takes the
nodes with the most free slots first (like Slurm's ``LLN`` and Kubernetes' default
scoring), so small jobs share the cluster's nodes and more of them run at once.
"""

import bisect
import math

#: The placement policies (``mpi:placement``).
PLACEMENTS = ("pack", "spread")


class NoFit(ValueError):
    """The job cannot be placed on the given free slots."""


def place(np, free, count=None, per_node=None, node_slots=None, placement="pack"):
    """
    Return ``{node: ranks}`` for ``np`` ranks on nodes with ``free`` slots.

    np
        Number of ranks.
    free
        ``{node: free slots}``, in the order nodes are preferred (block distribution:
        fill the first node, then the next; with ``placement="spread"`` nodes with more
        free slots come first, ties in this order).
    count
        Exactly this many nodes: ``per_node`` ranks each (the last may get fewer), or
        without ``per_node`` an even spread (shares differ by at most one rank).
    per_node
        This many ranks per node (the last node may get fewer).
    node_slots
        Slots of one node, to reject a ``per_node`` that can never fit.
    placement
        One of :data:`PLACEMENTS`.

    Raises :class:`NoFit` (a ValueError) saying why when the job does not fit.
    """
    spread = _is_spread(placement)
    shares = _shares(np, len(free), count, per_node, node_slots)
    result = _placement(np, _ordered(free.items(), spread), shares, per_node)
    if result is None:
        if count is not None:
            raise NoFit(
                f"np={np} over {count} nodes cannot be placed: free slots per node are {free}"
            )
        detail = f" with {per_node} ranks per node" if per_node else ""
        raise NoFit(f"np={np} cannot be placed{detail}: free slots per node are {free}")
    return result


def _is_spread(placement):
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    return placement == "spread"


def _ordered(free_items, spread):
    """``(node, free slots)`` pairs in the order the policy prefers them."""
    if not spread:
        return free_items
    return sorted(free_items, key=lambda item: -item[1])  # stable: ties keep their order


def _shares(np, nodes_up, count, per_node, node_slots):
    """
    Ranks per node of a job on exactly ``count`` nodes, largest first, or None without a
    count (block distribution). Raises :class:`NoFit` when the job cannot fit however many
    slots are free on the ``nodes_up`` nodes it may use.
    """
    if node_slots is not None and per_node is not None and per_node > node_slots:
        raise NoFit(f"slots_per_node={per_node} exceeds the {node_slots} slots each node has")
    if count is None:
        return None
    if count > nodes_up:
        raise NoFit(f"nodes={count} but only {nodes_up} nodes are available")
    if np < count:
        raise NoFit(f"np={np} is fewer than nodes={count}: every node needs a rank")
    if per_node:
        last = np - per_node * (count - 1)
        if last > per_node:
            raise NoFit(f"np={np} does not fit {count} nodes x {per_node} slots")
        if last <= 0:
            raise NoFit(f"np={np} at {per_node} ranks per node needs fewer than {count} nodes")
        shares = [per_node] * (count - 1) + [last]
    else:
        base, extra = divmod(np, count)
        shares = [base + 1] * extra + [base] * (count - extra)
    shares.sort(reverse=True)
    return shares


def _placement(np, free_items, shares, per_node):
    """
    The placement from ``(node, free slots)`` pairs in preference order, or None. Nodes
    without free slots never get a rank, so leaving them out changes nothing.
    """
    if shares is not None:
        return _take_shares(shares, free_items)
    placement, remaining = {}, np
    for node, available in free_items:
        if remaining == 0:
            break
        take = min(available, remaining) if per_node is None else min(per_node, remaining)
        if take <= 0 or take > available:
            continue
        placement[node] = take
        remaining -= take
    return None if remaining else placement


def _take_shares(shares, free_items):
    """Each node in preference order takes the largest share it has room for."""
    placement = {}
    for node, available in free_items:
        share = next((s for s in shares if s <= available), None)
        if share is None:
            continue
        placement[node] = share
        shares.remove(share)
        if not shares:
            return placement
    return None


def _try_place(np, free_items, nodes_up, count, per_node, node_slots):
    """:func:`place` without the reasons (building them costs more than placing)."""
    try:
        shares = _shares(np, nodes_up, count, per_node, node_slots)
    except NoFit:
        return None
    return _placement(np, free_items, shares, per_node)


def fits(job, free, node_slots, placement="pack"):
    """The job's placement on ``free`` (restricted to its candidate nodes), or None."""
    candidates = {n: free[n] for n in job["candidates"] if n in free}
    return _try_place(job["np"], _ordered(candidates.items(), _is_spread(placement)),
                      len(candidates), job.get("count"), job.get("per_node"), node_slots)


def _subtract(free, placement):
    return {n: s - placement.get(n, 0) for n, s in free.items()}


def _reserve(head, free, running, node_slots, spread, returning=None):
    """
    (time, placement) at which the head job can first start, or (inf, None): on the
    nodes in ``free`` and those ``returning`` (silent for a moment, with their free slots).

    Running jobs end in order of their end times and each end only adds free slots, so
    once the head fits it keeps fitting: a binary search over how many have ended finds
    the first end it fits after, placing the head a few times rather than once per job.
    """
    ending = sorted(running, key=lambda r: r["end"])
    returning = returning or {}
    nodes = [n for n in dict.fromkeys(head["candidates"]) if n in free or n in returning]

    def placement_after(ended):
        capacity = {n: free[n] if n in free else returning[n] for n in nodes}
        for job in ending[:ended]:
            for node, ranks in job["placement"].items():
                if node in capacity:
                    capacity[node] += ranks
        return _try_place(head["np"], _ordered(capacity.items(), spread), len(capacity),
                          head.get("count"), head.get("per_node"), node_slots)

    if not ending or placement_after(len(ending)) is None:
        return math.inf, None
    low, high = 1, len(ending)
    while low < high:
        middle = (low + high) // 2
        if placement_after(middle) is None:
            low = middle + 1
        else:
            high = middle
    return ending[low - 1]["end"], placement_after(low)


class _FreeSlots:
    """
    Free slots during one pass of :func:`plan`, for many jobs with few candidate lists.

    A pass only takes slots, never gives any back, so whatever does not fit stays unfit
    for the rest of the pass: a node that fills up leaves every candidate list for good,
    and a job shape that did not fit on a candidate list is not placed again. Placing a
    job then walks about as many nodes as it has ranks rather than every node, after
    reading its candidate list once if no job before it held that same list object.
    """

    def __init__(self, free, node_slots, spread=False):
        self.free = dict(free)
        self.total = sum(s for s in self.free.values() if s > 0)
        self._node_slots = node_slots
        self._spread = spread
        self._by_content = {}   # tuple(candidates) -> _Candidates
        # id(candidates) -> (candidates, _Candidates); holding the list keeps its id unique.
        self._by_object = {}
        self._lists_with = {}   # node -> the _Candidates where it has room
        self._last = None       # (candidates, _Candidates) looked up last

    def fit(self, job):
        """The job's placement now, as :func:`fits` would give it, or None."""
        np, count, per_node = job["np"], job.get("count"), job.get("per_node")
        if np > self.total:
            # More ranks than free slots anywhere: no need to read its candidate list.
            return None
        candidates = self._candidates(job["candidates"])
        shape = (np, count, per_node)
        if shape in candidates.unfit:
            return None
        placement = _try_place(np, candidates.items(self.free), candidates.nodes_up, count,
                               per_node, self._node_slots)
        if placement is None:
            candidates.unfit.add(shape)
        return placement

    def take(self, placement):
        """Hold the placement's slots for the rest of the pass."""
        for node, ranks in placement.items():
            before, after = self.free[node], self.free[node] - ranks
            self.free[node] = after
            self.total -= max(before, 0) - max(after, 0)
            if after <= 0:
                for candidates in self._lists_with.pop(node, ()):
                    candidates.drop(node, before)
            elif self._spread:  # (packing keeps the order: nothing to move)
                for candidates in self._lists_with.get(node, ()):
                    candidates.move(node, before, after)

    def _candidates(self, nodes):
        # Jobs mostly share one list object, or hold equal lists (one per job when read
        # from the store): look up by identity, then compare with the list looked up last
        # (cheaper than hashing a new list of new strings), then by content.
        known = self._by_object.get(id(nodes))
        if known is not None and known[0] is nodes:
            return known[1]
        if self._last is not None and nodes == self._last[0]:
            candidates = self._last[1]
        else:
            key = tuple(nodes)
            candidates = self._by_content.get(key)
            if candidates is None:
                kind = _SpreadCandidates if self._spread else _Candidates
                candidates = self._by_content[key] = kind(key, self.free)
                for node in candidates.open:
                    self._lists_with.setdefault(node, []).append(candidates)
        self._by_object[id(nodes)] = self._last = (nodes, candidates)
        return candidates


class _Candidates:
    """One candidate list in a pass (pack): how many of its nodes are up, and which have
    room, in the list's order."""

    def __init__(self, nodes, free):
        up = [n for n in dict.fromkeys(nodes) if n in free]
        self.nodes_up = len(up)
        # A dict as an ordered set: nodes with free slots, in the list's order.
        self.open = dict.fromkeys(n for n in up if free[n] > 0)
        self.unfit = set()   # (np, count, per_node) that did not fit
        self._dropped = 0

    def items(self, free):
        """``(node, free slots)`` of the nodes with room, in preference order."""
        return ((node, free[node]) for node in self.open)

    def drop(self, node, before):  # pylint: disable=unused-argument
        """The node is full for the rest of the pass."""
        del self.open[node]
        self._dropped += 1
        # Iterating a dict still steps over the holes deleted keys leave: rebuild it once
        # they outnumber the nodes left.
        if self._dropped > len(self.open):
            self.open = dict.fromkeys(self.open)
            self._dropped = 0


class _SpreadCandidates(_Candidates):
    """One candidate list in a pass (spread): its nodes with room grouped by free slots,
    each group in the list's order, so the walk starts at the emptiest nodes without
    sorting the list for every job. (``open`` keeps the nodes that had room at the
    start, in list order.)"""

    def __init__(self, nodes, free):
        super().__init__(nodes, free)
        self._position = {n: i for i, n in enumerate(self.open)}
        self._levels = {}    # free slots -> sorted [(position, node)]
        for node, position in self._position.items():
            self._levels.setdefault(free[node], []).append((position, node))

    def items(self, free):
        for level in sorted(self._levels, reverse=True):
            for _, node in self._levels[level]:
                yield node, free[node]

    def drop(self, node, before):
        self._remove(node, before)

    def move(self, node, before, after):
        """The node has ``after`` free slots instead of ``before``."""
        self._remove(node, before)
        bisect.insort(self._levels.setdefault(after, []), (self._position[node], node))

    def _remove(self, node, level):
        nodes = self._levels[level]
        del nodes[bisect.bisect_left(nodes, (self._position[node], node))]
        if not nodes:
            del self._levels[level]


def _within_limits(job, usage, limits):
    mine = usage.get(job["user"], {"jobs": 0, "slots": 0})
    max_jobs, max_slots = limits.get("max_running_jobs"), limits.get("max_slots")
    if max_jobs and mine["jobs"] + 1 > max_jobs:
        return False
    if max_slots and mine["slots"] + job["np"] > max_slots:
        return False
    return True


def plan(queued, free, running, now, node_slots, limits=None, usage=None, placement="pack",
         returning=None):
    """
    Decide which queued jobs start now.

    queued
        Jobs in submission order: dicts with ``id``, ``user``, ``np``, ``candidates``
        (node ids it may use), ``count``, ``per_node``, ``walltime`` (seconds).
    free
        ``{node: free slots}`` of the nodes that are up, in preference order.
    running
        Jobs holding slots: dicts with ``placement`` ``{node: ranks}`` and ``end`` (the
        time their walltime runs out).
    now
        Current time, in the same clock as ``end``.
    node_slots
        Slots per node.
    limits
        ``{"max_running_jobs": n, "max_slots": n}`` per user; 0 or None is no limit.
    usage
        ``{user: {"jobs": n, "slots": n}}`` held by running jobs.
    placement
        One of :data:`PLACEMENTS`: where a job's ranks go among the nodes that fit it.
    returning
        ``{node: free slots}`` of nodes left out of ``free`` for a moment (silent for a
        few seconds): no job starts there, but the head's reservation counts on them,
        so a late heartbeat does not let a long job take the slots the head waits for.

    Returns ``(starts, blocked)``: ``starts`` is a list of ``(job id, placement)`` in
    start order; ``blocked`` maps each job that waits to why (``"resources"``,
    ``"user limit"`` or ``"reserved for <head id>"``).
    """
    limits = limits or {}
    usage = {u: dict(v) for u, v in (usage or {}).items()}
    spread = _is_spread(placement)
    slots = _FreeSlots(free, node_slots, spread)
    # Jobs started by this plan hold their slots until their walltime, like running ones.
    running = list(running)
    starts, blocked = [], {}
    head, shadow_time, shadow_free = None, None, None
    for job in queued:
        if not _within_limits(job, usage, limits):
            blocked[job["id"]] = "user limit"
            continue
        where = slots.fit(job)
        if head is None:
            if where is None:
                head = job
                shadow_time, reserved = _reserve(job, slots.free, running, node_slots,
                                                   spread, returning)
                # Slots still free at the shadow time once the head has its share.
                shadow_free = None
                if reserved is not None:
                    capacity = dict(slots.free)
                    for run in running:
                        if run["end"] <= shadow_time:
                            for node, ranks in run["placement"].items():
                                if node in capacity:
                                    capacity[node] += ranks
                    shadow_free = _subtract(capacity, reserved)
                blocked[job["id"]] = "resources"
                continue
        elif where is not None:
            ends_in_time = now + job["walltime"] <= shadow_time
            if not ends_in_time:
                if shadow_free is None:
                    # The head cannot be placed at any known time (its nodes are down):
                    # nothing started now can delay it.
                    pass
                elif any(shadow_free.get(n, 0) < r for n, r in where.items()):
                    blocked[job["id"]] = f"reserved for {head['id']}"
                    continue
                else:
                    for node, ranks in where.items():
                        shadow_free[node] -= ranks
        if where is None:
            blocked[job["id"]] = "resources"
            continue
        starts.append((job["id"], where))
        slots.take(where)
        running.append({"placement": where, "end": now + job["walltime"]})
        mine = usage.setdefault(job["user"], {"jobs": 0, "slots": 0})
        mine["jobs"] += 1
        mine["slots"] += job["np"]
    return starts, blocked
