"""
What the queue sees of the cluster when the job controller plans: free slots on usable
nodes, when running jobs end, each user's use, which nodes take no new job and why, and
which candidates of each queued job hold its image. The scheduler (``dmpi.jobs.sched``)
decides from this; the controller (:mod:`dmpi.master.controller`) records the starts.
No Salt, no I/O.
"""

from dmpi.jobs import rules


def capacity(active, closing, nodes, drains, alive, node_slots, now, cleanup_timeout):
    """
    ``(free, running, usage, problems)`` for a plan at ``now``:

    - ``free``: ``{node: free slots}`` of the ``alive`` nodes that may take new jobs;
    - ``running``: ``[{"placement", "end"}]`` of active jobs (their deadline) and of
      closing ones (``{job id: placement}``, whose slots are free once their clean-up
      ends, within ``cleanup_timeout``), as the scheduler's reservations count on them;
    - ``usage``: ``{user: {"jobs", "slots"}}`` of active jobs;
    - ``problems``: ``{node: why}`` of alive nodes drained or unhealthy (running jobs go
      on there, new ones do not start).

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
    return free, running, usage, problems


def waiting_jobs(queued, any_node, free, nodes):
    """``(waiting, images)``: the queued jobs as the scheduler takes them, each with the
    candidates that hold its image, and :func:`image_fit`'s answers by (candidate list,
    image). ``any_node`` is the one list every job that takes any node shares."""
    images, waiting = {}, []
    for job in queued:
        fit = image_fit(images, job["spec"]["candidates"] or any_node,
                        job["spec"]["image_ref"], free, nodes)
        waiting.append(
            {"id": job["job_id"], "user": job["user"], "np": job["np"],
             "walltime": job["walltime"], "candidates": fit["holders"],
             "count": job["spec"]["count"], "per_node": job["spec"]["per_node"]})
    return waiting, images


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


def explain(blocked, queued, images, problems, any_node):
    """The scheduler's reasons (``{job id: why}``), with the nodes a job waiting for
    resources cannot use named."""
    explained, texts = dict(blocked), {}
    for job in queued:
        base = blocked.get(job["job_id"])
        if base != "resources":
            continue
        candidates = job["spec"]["candidates"] or any_node
        key = (id(candidates), job["spec"]["image_ref"], job["image"])
        if key not in texts:
            fit = images[key[:2]]
            texts[key] = rules.waiting_reason(
                base, candidates, problems, set(fit["missing"]), job["image"])
        explained[job["job_id"]] = texts[key]
    return explained
