"""The benchmarks' figures: printed as ``<name> <value>[ <unit>]`` lines, and kept.

Each script calls :func:`record` for every figure it measures and :func:`save` at its
end. A full run (not ``--short``) writes what it measured to
``bench/results/<script>.json``, each figure with the commit, the date and the arguments
it was measured with; a later run replaces only the figures it measured. The table of
docs/benchmarks.md is made from those files:

    .venv/bin/python bench/figures.py            # print the table
    .venv/bin/python bench/figures.py --write    # put it in docs/benchmarks.md

tests/unit/test_bench_figures.py fails when the document's table is not the files' table.
"""

import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parent
RESULTS = BENCH / "results"
DOCUMENT = BENCH.parent / "docs" / "benchmarks.md"
BEGIN = "<!-- figures: made by `bench/figures.py --write` from bench/results/; do not edit -->"
END = "<!-- end of figures -->"

_recorded = {}


def record(name, value, digits=2, unit="", aim=""):
    """Print ``name value[ unit]`` and keep the figure for :func:`save`; ``aim`` is what
    the figure should reach, shown beside it in the table."""
    _recorded[name] = {"value": round(float(value), digits), "digits": digits,
                       "unit": unit, "aim": aim}
    print(f"{name} {value:.{digits}f}{' ' + unit if unit else ''}", flush=True)


def _commit():
    """HEAD's short hash, ``+`` when the working tree differs from it."""
    def git(*args):
        return subprocess.run(["git", "-C", str(BENCH.parent), *args], capture_output=True,
                              text=True, check=False).stdout.strip()
    commit = git("rev-parse", "--short=10", "HEAD") or "unknown"
    return commit + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")


def save(script, argv, short, results=RESULTS):
    """After a full run, merge what :func:`record` kept into ``results/<script>.json``;
    a ``--short`` run (CI's) keeps nothing. Returns the file written, or None."""
    if short or not _recorded:
        return None
    name = pathlib.Path(script).stem
    path = pathlib.Path(results) / f"{name}.json"
    kept = json.loads(path.read_text()) if path.exists() else {"script": f"bench/{name}.py",
                                                               "figures": {}}
    measured = {"commit": _commit(),
                "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
                "argv": " ".join(argv)}
    for figure, found in _recorded.items():
        kept["figures"][figure] = dict(found, **measured)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
    os.replace(temporary, path)
    _recorded.clear()
    return path


def table(results=RESULTS):
    """The Markdown table of every kept figure, by script then figure name."""
    lines = ["| figure | value | aim | script and arguments | commit | date |",
             "| --- | --- | --- | --- | --- | --- |"]
    for path in sorted(pathlib.Path(results).glob("*.json")):
        kept = json.loads(path.read_text())
        for figure, found in sorted(kept["figures"].items()):
            value = f"{found['value']:.{found['digits']}f}" + \
                (f" {found['unit']}" if found["unit"] else "")
            run = f"`{kept['script']}{' ' + found['argv'] if found['argv'] else ''}`"
            lines.append(f"| `{figure}` | {value} | {found['aim'] or '-'} | {run} | "
                         f"{found['commit']} | {found['date']} |")
    return "\n".join(lines)


def with_table(text, made):
    """``text`` with what lies between :data:`BEGIN` and :data:`END` replaced by
    ``made``."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + made + "\n" + text[end:]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true",
                        help=f"put the table in {DOCUMENT.relative_to(BENCH.parent)}")
    args = parser.parse_args(argv)
    made = table()
    if args.write:
        DOCUMENT.write_text(with_table(DOCUMENT.read_text(), made))
    else:
        print(made)
    return 0


if __name__ == "__main__":
    sys.exit(main())
