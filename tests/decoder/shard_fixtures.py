"""The two fixtures every test of the row shards (decoder/training/shards.py) runs under.

Imported by test_shards.py and test_shard_workers.py, where they are autouse.
"""

from __future__ import annotations

import multiprocessing

import pytest

import decoder.training.shards as shards_module
import decoder.training.step as step_module
from minigrad import cpu_tuning


@pytest.fixture(autouse=True)
def sharding(monkeypatch):
    """Sharding on wherever this runs: a BLAS whose count we cannot set, or one core, would
    otherwise turn it off (or run the shards one after another), and the tests would compare
    the unsharded step with itself. (Here the BLAS count is only not changed, not wrong.)"""
    if not cpu_tuning.blas_threads_settable():
        monkeypatch.setattr(step_module, "blas_threads_settable", lambda: True)
    if cpu_tuning.cpu_count() < 2:
        monkeypatch.setattr(step_module, "cpu_count", lambda: 2)


@pytest.fixture(autouse=True)
def no_workers_left():
    """Each test ends with the shard workers it started stopped, so none outlives its model."""
    yield
    if shards_module._current is not None:
        shards_module._current.close()
    assert not multiprocessing.active_children(), "a shard worker outlived the test"
