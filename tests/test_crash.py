"""A few of bench/crash.py's trials, through the same code: writers (and maintenance) SIGKILLed
at random moments lose, duplicate and resurrect nothing acknowledged. The full run is
``make crash`` (1000 trials, docs/bench-log/crash-trials.md)."""

from __future__ import annotations

import os
import random
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import crash  # noqa: E402


@pytest.mark.slow
def test_crash_trials(tmp_path):
    seed = random.randrange(1 << 30)
    totals = crash.run(8, seed, tmp_path / "crash", maintain_every=4, maintenance_share=0.5, progress=False)
    assert totals.trials == 8
    assert totals.acked_batches > 0, "the writers never got to acknowledge a batch"
    assert (totals.lost, totals.duplicated, totals.resurrected) == (0, 0, 0), (seed, totals.failures[:5])
    assert totals.failures == [], (seed, totals.failures[:5])
