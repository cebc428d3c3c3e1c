"""bench/figures.py: what a benchmark run keeps, and docs/benchmarks.md's table made from
bench/results/ alone."""

import json
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import figures  # noqa: E402


@pytest.fixture(autouse=True)
def nothing_recorded():
    figures._recorded.clear()
    yield
    figures._recorded.clear()


def test_a_short_run_keeps_nothing_and_a_full_run_keeps_each_figure_with_its_run(
        tmp_path, capsys):
    figures.record("demo_pass_ms", 12.345, 1, aim="under 200")
    assert capsys.readouterr().out == "demo_pass_ms 12.3\n"
    assert figures.save("bench/demo.py", ["--short"], True, tmp_path) is None
    assert list(tmp_path.iterdir()) == []
    figures.record("demo_cpu", 1.5, 2, "%")
    path = figures.save("bench/demo.py", ["--repeat", "3"], False, tmp_path)
    kept = json.loads(path.read_text())
    assert kept["script"] == "bench/demo.py"
    first = kept["figures"]["demo_pass_ms"]
    assert (first["value"], first["unit"], first["aim"], first["argv"]) == (
        12.3, "", "under 200", "--repeat 3")
    assert first["commit"].rstrip("+").isalnum() and len(first["date"]) == 10
    # a later run replaces only what it measured
    figures.record("demo_cpu", 2.25, 2, "%")
    figures.save("bench/demo.py", ["--variant", "b"], False, tmp_path)
    kept = json.loads(path.read_text())
    assert kept["figures"]["demo_cpu"]["value"] == 2.25
    assert kept["figures"]["demo_cpu"]["argv"] == "--variant b"
    assert kept["figures"]["demo_pass_ms"]["value"] == 12.3
    assert figures.table(tmp_path).splitlines()[2:] == [
        "| `demo_cpu` | 2.25 % | - | `bench/demo.py --variant b` | "
        f"{kept['figures']['demo_cpu']['commit']} | {kept['figures']['demo_cpu']['date']} |",
        "| `demo_pass_ms` | 12.3 | under 200 | `bench/demo.py --repeat 3` | "
        f"{first['commit']} | {first['date']} |"]


def test_the_documents_table_is_the_one_made_from_bench_results():
    text = figures.DOCUMENT.read_text()
    assert text.count(figures.BEGIN) == 1 and text.count(figures.END) == 1
    assert figures.with_table(text, figures.table()) == text, \
        "docs/benchmarks.md's table is not bench/results/'s: run bench/figures.py --write"


def test_every_figure_kept_names_its_commit_and_date():
    for path in figures.RESULTS.glob("*.json"):
        for name, found in json.loads(path.read_text())["figures"].items():
            assert len(found["commit"].rstrip("+")) >= 7, (path.name, name)
            assert len(found["date"]) == 10, (path.name, name)
