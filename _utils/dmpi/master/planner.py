"""
What the queue sees of the cluster when the job controller plans: free slots on usable
nodes, when running jobs end, each user's use, which nodes take no new job and why, which
take the self-test's jobs only, and which candidates of each queued job hold its image.
The scheduler (``dmpi.jobs.sched``) decides from this; the controller
(:mod:`dmpi.master.controller`) records the starts.
No Salt, no I/O.
"""

from dmpi.jobs import rules


def capacity(active, closing, nodes, drains, alive, node_slots, now, cleanup_timeout):
    """
    ``(free, running, usage, problems, returning)`` for a plan at ``now``:

    - ``free``: ``{node: free slots}`` of the ``alive`` nodes that may take new jobs;
    - ``running``: ``[{"placement", "end"}]`` of active jobs (their deadline) and of
      closing ones (``{job id: placement}``, whose slots are free once their clean-up
      ends, within ``cleanup_timeout``), as the scheduler's reservations count on them;
    - ``usage``: ``{user: {"jobs", "slots"}}`` of active jobs;
    - ``problems``: ``{node: why}`` of alive nodes drained or unhealthy (running jobs go
      on there, new ones do not start);
    - ``returning``: ``{node: free slots}`` of nodes silent for at most
      ``rules.RESERVE_GRACE`` seconds whose last word found no problem (the scheduler's
      reservation for the head counts on them; nothing starts there).

    ``nodes`` is the controller's evidence by node, ``drains`` the admins' drains.
    """
    used, usage, running = {}, {}, []
    for placement in closing.values():
        for node, ranks in placement.items():
            used[node] = used.get(node, 0) + ranks
        running.append({"placement": placement, "end": now + cleanup_timeout})
    for job in active:
        for node, ranks in job["placement"].items():
            used[node] = used.get(node, 0) + ranks
        mine = usage.setdefault(job["user"], {"jobs": 0, "slots": 0})
        mine["jobs"] += 1
        mine["slots"] += job["np"]
        running.append({"placement": job["placement"],
                        "end": job.get("deadline") or now + job["walltime"]})
    problems = {}
    for node in alive:
        problem = rules.node_problem(nodes[node], drains.get(node))
        if problem:
            problems[node] = problem
    free = {n: node_slots - used.get(n, 0) for n in alive if n not in problems}
    alive = set(alive)
    returning = {n: node_slots - used.get(n, 0) for n, seen in nodes.items()
                 if n not in alive and now - seen["last_seen"] <= rules.RESERVE_GRACE
                 and not rules.node_problem(seen, drains.get(n))}
    return free, running, usage, problems, returning


def waiting_jobs(queued, any_node, free, nodes, withheld=None, exempt=None):
    """``(waiting, fits, images)``: the queued jobs as the scheduler takes them, each with
    the candidates that hold its image; by job id, the candidate list it asked for and
    :func:`image_fit`'s answer; and those answers by (candidate list, image).
    ``any_node`` is the one list every job that takes any node shares; ``withheld``
    nodes (``{node: why}``) are left out of every job's list but those of the user
    ``exempt`` (the self-test's)."""
    images, kept, waiting, fits = {}, {}, [], {}
    for job in queued:
        listed = job["spec"]["candidates"] or any_node
        allowed = listed
        if withheld and job["user"] != exempt:
            allowed = kept.get(id(listed))
            if allowed is None:  # once per list, so jobs that shared one still do
                left = [n for n in listed if n not in withheld]
                allowed = kept[id(listed)] = listed if len(left) == len(listed) else left
        fit = image_fit(images, allowed, job["spec"]["image_ref"], free, nodes)
        fits[job["job_id"]] = (listed, fit)
        waiting.append(
            {"id": job["job_id"], "user": job["user"], "np": job["np"],
             "walltime": job["walltime"], "candidates": fit["holders"],
             "count": job["spec"]["count"], "per_node": job["spec"]["per_node"]})
    return waiting, fits, images


def image_fit(images, candidates, image_ref, free, nodes):
    """For a job's candidate list and image, once per plan and list (kept in
    ``images``): the candidates that hold the image (the very list when all do, so jobs
    keep sharing one) and the usable nodes among them that lack it."""
    key = (id(candidates), image_ref)
    fit = images.get(key)
    if fit is None:
        holders = [n for n in candidates if rules.has_image(nodes.get(n) or {}, image_ref)]
        if len(holders) == len(candidates):
            holders = candidates
        held = set(holders)
        fit = images[key] = {"candidates": candidates, "image_ref": image_ref,
                             "holders": holders,
                             "missing": [n for n in candidates if n in free and n not in held]}
    return fit


def explain(blocked, queued, fits, problems, withheld=None, exempt=None):
    """The scheduler's reasons (``{job id: why}``), with the nodes a job waiting for
    resources cannot use named (``fits`` as :func:`waiting_jobs` gave them)."""
    explained, texts = dict(blocked), {}
    barred = {**withheld, **problems} if withheld else problems
    for job in queued:
        base = blocked.get(job["job_id"])
        if base != "resources":
            continue
        listed, fit = fits[job["job_id"]]
        shut = problems if job["user"] == exempt else barred
        key = (id(listed), id(fit), job["image"], shut is problems)
        if key not in texts:
            texts[key] = rules.waiting_reason(
                base, listed, shut, set(fit["missing"]), job["image"])
        explained[job["job_id"]] = texts[key]
    return explained
