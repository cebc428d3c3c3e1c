"""Job records and job lists as people read them (the ``mpi`` command's output)."""

import re
import time

FINAL_STATES = ("succeeded", "failed", "cancelled", "timed_out")


def clock(epoch):
    """An epoch time as local ``YYYY-MM-DDTHH:MM:SS`` (like Slurm), ``-`` for none."""
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def duration(seconds):
    """Seconds as Slurm shows a time: ``M:SS``, ``H:MM:SS`` or ``D-HH:MM:SS``."""
    if seconds is None:
        return "-"
    seconds = max(0, int(round(seconds)))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def placement_text(placement):
    """``{"node1": 2, "node2": 2}`` as ``node1:2,node2:2``."""
    return ",".join(f"{node}:{ranks}" for node, ranks in (placement or {}).items()) or "-"


def table(headers, rows):
    """Rows of cells as left-aligned columns; the last column is never padded."""
    cells = [headers] + [["-" if cell is None else str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [cell.ljust(width) for cell, width in zip(row[:-1], widths)] + [row[-1]]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def outcome_line(record):
    """One line on how a job ended (or where it is): state, exit code, explanation."""
    parts = [f"job {record.get('job_id')} {record.get('state')}"]
    if record.get("exit_code") is not None:
        parts.append(f"exit code {record['exit_code']}")
    if record.get("placement"):
        parts.append(f"on {placement_text(record['placement'])}")
    line = "mpi: " + ", ".join(parts)
    why = record.get("explanation") or record.get("reason")
    return f"{line}: {why}" if why else line


def state_detail(record):
    """What follows a state in a progress line: `` (why it waits; place N in the
    queue)`` for a queued job, `` (reason)`` for one with a reason, else nothing."""
    parts = [record.get("waiting_for") or record.get("reason")]
    if record.get("state") == "queued" and isinstance(record.get("queue_place"), int):
        parts.append(f"place {record['queue_place']} in the queue")
    shown = "; ".join(part for part in parts if part)
    return f" ({shown})" if shown else ""


def failure_text(failure):
    """Which rank failed first and how (a record's ``failure``), or None."""
    if not isinstance(failure, dict) or not isinstance(failure.get("rank"), int):
        return None
    if failure.get("signal_name"):
        return f"rank {failure['rank']} failed first, of {failure['signal_name']}"
    if isinstance(failure.get("exit_code"), int):
        return f"rank {failure['rank']} failed first, exit code {failure['exit_code']}"
    return f"rank {failure['rank']} failed first"


def progress_line(record, now):
    """Where a job is, for a notebook cell's job view: why and how long it has waited,
    where and how long it has run against its walltime, or how it ended and which rank
    failed first. ``now`` (epoch seconds) None leaves the times out."""
    state = record.get("state")
    if state in FINAL_STATES:
        line = outcome_line(record)
        failed = failure_text(record.get("failure")) if state != "succeeded" else None
        named = failed and re.search(rf"\brank {record['failure']['rank']}\b", line)
        return f"{line}; {failed}" if failed and not named else line
    line = f"mpi: job {record.get('job_id')} {state}"
    if state == "queued":
        line += state_detail(record)
        if now is not None and record.get("submitted"):
            line += f", waiting {duration(now - record['submitted'])}"
        return line
    line += f" on {placement_text(record['placement'])}" if record.get("placement") \
        else state_detail(record)
    if state == "running" and now is not None and record.get("started"):
        line += f", {duration(now - record['started'])}"
        if record.get("walltime"):
            line += f" of {duration(record['walltime'])}"
    return line


def origin_text(origin):
    """Where a job came from (``{"notebook": path, "cell": n}``), or None."""
    if not origin:
        return None
    cell = f"cell [{origin['cell']}]" if origin.get("cell") is not None else None
    return " ".join(part for part in (origin.get("notebook"), cell) if part) or None


def record_text(record):
    """A job record as a short report."""
    elapsed = None
    if record.get("started") is not None:
        elapsed = (record.get("ended") or time.time()) - record["started"]
    state = record.get("state")
    if state and record.get("closed"):
        state += " (cleaned up)"
    lines = [f"job {record.get('job_id')}" + (f" ({record['name']})" if record.get("name") else "")]
    fields = [
        ("user", record.get("user")),
        ("state", state),
        ("exit code", record.get("exit_code")),
        ("explanation", record.get("explanation")),
        ("reason", record.get("reason") if not record.get("explanation") else None),
        ("failure", record.get("failure")),
        ("waiting for", record.get("waiting_for")),
        ("queue place", record.get("queue_place")),
        ("priority", priority_text(record.get("priority"))),
        ("ranks", record.get("np")),
        ("placement", placement_text(record["placement"]) if record.get("placement") else None),
        ("submitted", clock(record["submitted"]) if record.get("submitted") else None),
        ("started", clock(record["started"]) if record.get("started") else None),
        ("ended", clock(record["ended"]) if record.get("ended") else None),
        ("elapsed", duration(elapsed) if elapsed is not None else None),
        ("output", (record.get("output") or {}).get("dir_in_job")),
        ("from", origin_text(record.get("origin"))),
    ]
    width = max(len(label) for label, _ in fields)
    lines += [f"  {label.ljust(width)}  {value}" for label, value in fields if value is not None]
    history = record.get("history") or []
    if history:
        lines.append("  history")
        for step in history:
            reason = f"  {step['reason']}" if step.get("reason") else ""
            lines.append(f"    {clock(step.get('at'))}  {step.get('state')}{reason}")
    return "\n".join(lines)


def priority_text(priority):
    """A queued job's fair-share priority and its parts, or None."""
    if not isinstance(priority, dict):
        return None
    return (f"{priority.get('priority')} (fairshare {priority.get('fairshare')}, "
            f"age {priority.get('age')})")


def queue_text(rows, now=None):
    """Queued and running jobs like ``squeue``: PRIORITY is a queued job's fair-share
    priority (higher starts first), TIME how long a job has run; the last column says
    where it runs or, in parentheses, why it waits."""
    now = time.time() if now is None else now
    lines = []
    for row in rows:
        started = row.get("started")
        if row.get("state") == "queued":
            where = f"({row.get('waiting_for') or 'waiting'})"
        else:
            where = placement_text(row.get("placement"))
        ran = (row.get("ended") or now) - started if started else 0
        priority = row.get("priority") if isinstance(row.get("priority"), dict) else {}
        lines.append([row.get("job_id"), row.get("name"), row.get("user"), row.get("state"),
                      row.get("np"), priority.get("priority"), duration(ran), where])
    return table(["JOBID", "NAME", "USER", "STATE", "NP", "PRIORITY", "TIME",
                  "NODELIST(REASON)"], lines)


def history_text(rows):
    """Ended jobs like ``sacct``."""
    lines = []
    for row in rows:
        core_hours = row.get("core_hours")
        lines.append([row.get("job_id"), row.get("name"), row.get("state"),
                      row.get("exit_code"), row.get("np"), duration(row.get("elapsed")),
                      f"{core_hours:.2f}" if isinstance(core_hours, (int, float)) else None,
                      clock(row.get("ended")), row.get("explanation")])
    return table(["JOBID", "NAME", "STATE", "EXIT", "NP", "ELAPSED", "CORE-H", "ENDED",
                  "EXPLANATION"], lines)


def size_text(count):
    """Bytes as ``df -h`` shows them (1024-based): ``512B``, ``1.5K``, ``48M``, ``2.0G``."""
    if count is None:
        return "-"
    size = float(count)
    for unit in ("B", "K", "M", "G", "T"):
        if size < 1024 or unit == "T":
            break
        size /= 1024
    if unit == "B":
        return f"{int(size)}B"
    return f"{size:.1f}{unit}" if size < 10 else f"{size:.0f}{unit}"


def usage_text(usage):
    """Your usage like ``sreport`` and ``sshare`` (jobs, core-hours, fair-share
    standing), and your directory against its quota like ``quota -s``."""
    lines = []
    for user, entry in sorted((usage.get("users") or {}).items()):
        jobs = entry.get("jobs") or {}
        standing = (usage.get("fair_share") or {}).get(user) or {}
        lines.append([user, jobs.get("total", 0), jobs.get("running", 0),
                      jobs.get("queued", 0), f"{entry.get('core_hours', 0):.2f}",
                      standing.get("decayed_core_hours"), standing.get("fairshare")])
    text = table(["USER", "JOBS", "RUNNING", "QUEUED", "CORE-H", "RECENT CORE-H",
                  "FAIRSHARE"], lines)
    storage = usage.get("storage")
    if storage is None:
        return text
    if "error" in storage:
        return f"{text}\nstorage: {storage['error']}"
    rows = []
    for user, figures in sorted(storage.items()):
        rows.append([user, size_text(figures.get("bytes_used")),
                     size_text(figures.get("bytes_limit")) if figures.get("bytes_limit")
                     else "none", figures.get("files_used"),
                     figures.get("files_limit") or "none"])
    return text + "\n\n" + table(["USER", "USED", "LIMIT", "FILES", "FILE LIMIT"], rows)


def whoami_text(identity):
    """Who the master takes you for, and where your files are."""
    return (f"user {identity.get('user')} (account {identity.get('account')}, "
            f"uid {identity.get('uid')}, gid {identity.get('gid')})\n"
            f"your directory: {identity.get('dir')} (in jobs: {identity.get('dir_in_job')})")


def images_text(rows):
    """The approved images: whether jobs run on each (and why not, or why on one node
    only), the MPI it holds, python3 and mpi4py, the OS."""
    lines = []
    for row in rows:
        runs = {True: "yes", False: "no", None: "not probed yet"}.get(row.get("runs_jobs"))
        python = row.get("python_version")
        if python and row.get("mpi4py"):
            python += f", mpi4py {row['mpi4py']}"
        mpi = row.get("why_no_jobs") or row.get("mpi")
        if row.get("runs_jobs") and row.get("why_one_node_only"):
            runs, mpi = "one node", f"{mpi}; {row['why_one_node_only']}"
        lines.append([row.get("name"), runs, mpi, python, row.get("os")])
    return table(["IMAGE", "JOBS", "MPI (OR WHY NOT)", "PYTHON", "OS"], lines)
