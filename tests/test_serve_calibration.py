"""On a first start under `--k auto`, the server is ready before auto's verify costs are measured:
what measuring takes beyond `BEFORE_READY_S` runs between requests, a fixed k standing in."""

from __future__ import annotations

import json
import threading
import time

import pytest
from serve_helpers import RunningServer

from specrun.config import SessionConfig
from specrun.core.auto import AutoK
from specrun.core.policy import FixedK
from specrun.session import Session
from specrun.session.policies import STAND_IN_K, Policies


def test_measured_in_steps_a_fixed_k_stands_in_until_the_table_is_kept(tiny, verify_cost_cache):
    with Session(SessionConfig(target=tiny["target"], lookup=True, n_ctx=256, threads=1)) as session:
        assert session.policies.calibrate_later()
        stand_in = session.policies.policy("auto")
        assert isinstance(stand_in, FixedK) and stand_in.k == STAND_IN_K
        steps = 1
        while session.policies.calibrate_step():
            steps += 1
        auto = session.policies.policy("auto")
        assert isinstance(auto, AutoK) and steps > 1  # a width at a time
        kept = json.loads(verify_cost_cache.read_text())[session.policies.costs_key]["costs"]
        assert kept == session.policies.verify_costs()


def test_a_kept_table_that_holds_leaves_nothing_to_measure(tiny, monkeypatch):
    config = SessionConfig(target=tiny["target"], lookup=True, n_ctx=256, threads=1)
    with Session(config) as session:
        session.policies.verify_costs()  # measured and kept
    monkeypatch.setattr("specrun.session.policies.verify_costs_hold", lambda context, costs: True)
    with Session(config) as session:
        assert not session.policies.calibrate_later()
        assert isinstance(session.policies.policy("auto"), AutoK)


@pytest.fixture
def held_calibration(monkeypatch):
    """Every step of the measuring waits (without holding up requests) until the event is set."""
    release = threading.Event()
    measure = Policies.calibrate_step

    def step(self: Policies) -> bool:
        if not release.is_set():
            time.sleep(0.01)
            return True
        return measure(self)

    monkeypatch.setattr(Policies, "calibrate_step", step)
    monkeypatch.setattr("specrun.serve.calibration.BEFORE_READY_S", 0.0)
    return release


def test_the_server_is_ready_and_serves_while_it_measures(tiny, held_calibration, verify_cost_cache, capfd):
    server = RunningServer(SessionConfig(target=tiny["target"], lookup=True, n_ctx=256, threads=1))
    try:
        worker = server.server.worker
        assert worker._calibration.running  # ready (wait_ready passed), nothing measured yet
        reply = server.client().completions.create(model="any", prompt="the cat sat on the mat", max_tokens=6)
        assert reply.choices[0].text and worker._calibration.running
        assert not verify_cost_cache.exists()
        held_calibration.set()
        deadline = time.monotonic() + 60
        while worker._calibration.running:
            assert time.monotonic() < deadline, "the measuring never finished"
            time.sleep(0.01)
        assert isinstance(worker.session.policies.policy("auto"), AutoK) and verify_cost_cache.exists()
        reply = server.client().completions.create(model="any", prompt="the cat sat on the mat", max_tokens=6)
        assert reply.choices[0].text
    finally:
        server.stop()
    err = capfd.readouterr().err
    assert f"between requests (k {STAND_IN_K} until then)" in err and "--k auto sizes drafts by them now" in err
