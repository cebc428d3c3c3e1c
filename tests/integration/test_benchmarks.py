"""Every benchmark that drives the cluster keeps working: its short mode runs here, so a
change that breaks one fails CI. The figures are printed, never asserted on (speed is
measured by bench/, not by tests)."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cluster

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench(argv, timeout=900):
    done = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    print(done.stdout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_api_load_short_mode_runs_and_prints_its_figures(cluster):
    output = _bench(["bench/api_load.py", "--short"])
    assert "api_load_10_users_calls_per_s" in output and "launch idle s" in output, output
