"""Verify costs are measured once per model and set-up, refined while running, kept, and spot-checked."""

import json
from types import SimpleNamespace

import pytest
from test_engine import PROMPT

from specrun.config import SessionConfig
from specrun.core.costs import verify_costs_hold
from specrun.core.events import TokenEvent
from specrun.session import Session

WIDEST = 64  # the widest width the fake measurement times


@pytest.fixture
def measured(monkeypatch):
    """Count the measurements; each returns a recognisable table, and kept tables pass the spot check."""
    calls = []

    def measure(context):
        calls.append(context)
        return [0.0] + [0.001 * w for w in range(1, WIDEST + 1)]

    monkeypatch.setattr("specrun.session.policies.measure_verify_costs", measure)
    monkeypatch.setattr("specrun.session.policies.verify_costs_hold", lambda context, costs: True)
    return calls


def config(tiny, **changes):
    return SessionConfig(target=tiny["target"], lookup=True, k="auto", n_ctx=256, **changes)


class ClockedContext:
    """Stands in for a target whose decode of w rows takes 10 ms per row, on a clock of its own
    that the policy's timing reads: no real sleep, so a busy machine cannot move the result."""

    def __init__(self):
        self.tokens, self.free_slots, self.n_batch, self.model = [], 100, 512, SimpleNamespace(bos=1)
        self.now = 0.0

    def eval(self, tokens, logits_rows):
        self.now += 0.010 * len(tokens)

    def truncate(self, n):
        pass


def test_the_spot_check_passes_a_table_that_holds_and_fails_one_that_does_not(monkeypatch):
    context = ClockedContext()
    monkeypatch.setattr("specrun.core.costs.time", SimpleNamespace(perf_counter=lambda: context.now))
    right = [0.0] + [0.010 * w for w in range(1, 21)]  # spot-checked at 1 and 20 rows
    assert verify_costs_hold(context, right)
    assert not verify_costs_hold(context, [c * 2 for c in right])  # a faster GPU, say
    assert not verify_costs_hold(context, [c / 2 for c in right])  # measured on a busy machine
    assert not verify_costs_hold(context, [c * 0.7 for c in right])  # decodes 43% slower: beyond the 35% tolerance
    assert verify_costs_hold(context, [c * 0.8 for c in right])  # 25% slower: within it


def test_a_kept_table_the_spot_check_rejects_is_measured_again(tiny, measured, monkeypatch):
    with Session(config(tiny, threads=1)) as session:
        session.policies.verify_costs()
    monkeypatch.setattr("specrun.session.policies.verify_costs_hold", lambda context, costs: False)
    with Session(config(tiny, threads=1)) as session:
        session.policies.verify_costs()
    assert len(measured) == 2


def test_a_second_run_with_the_same_setup_measures_nothing(tiny, measured):
    with Session(config(tiny, threads=1)) as session:
        first = list(session.policies.verify_costs())
    with Session(config(tiny, threads=1)) as session:
        assert session.policies.verify_costs() == first
    assert len(measured) == 1


def test_another_setup_is_measured_apart(tiny, measured):
    for threads in (1, 2, 1):
        with Session(config(tiny, threads=threads)) as session:
            session.policies.verify_costs()
    assert len(measured) == 2


def test_what_auto_refines_while_running_is_kept(tiny, measured, verify_cost_cache):
    with Session(config(tiny, threads=1)) as session:
        list(session.stream(PROMPT, 20))
        refined = list(session.policies.policy("auto").costs)
    assert refined != [0.0] + [0.001 * w for w in range(1, WIDEST + 1)]
    kept = json.loads(verify_cost_cache.read_text())
    assert [entry["costs"] for entry in kept.values()] == [refined]


def test_a_changed_model_file_is_measured_again_and_a_deleted_one_forgotten(tiny, measured, tmp_path, verify_cost_cache):
    model = tmp_path / "model.gguf"
    model.write_bytes(tiny["target"].read_bytes())
    with Session(SessionConfig(target=model, lookup=True, n_ctx=256)) as session:
        session.policies.verify_costs()
    model.write_bytes(model.read_bytes() + b"\0")  # same path, other file
    with Session(SessionConfig(target=model, lookup=True, n_ctx=256)) as session:
        session.policies.verify_costs()
    assert len(measured) == 2
    with Session(SessionConfig(target=model, lookup=True, n_ctx=256)) as session:
        session.policies.policy("auto")  # closing writes back what auto refined
        model.unlink()  # gone while running: closing still works
    with Session(config(tiny)) as session:
        session.policies.verify_costs()
    kept = json.loads(verify_cost_cache.read_text())
    assert [entry["model"] for entry in kept.values()] == [str(tiny["target"].resolve())]


DAMAGED = [
    "{not json",
    "[1, 2]",
    '{"KEY": [0, 0.1]}',
    '{"KEY": {"costs": [0]}}',
    '{"KEY": {"costs": [0, 0.1, "x"]}}',
    '{"KEY": {"costs": [0' + ", -1" * WIDEST + "]}}",
]


@pytest.mark.parametrize("content", DAMAGED)
def test_a_damaged_file_means_measuring_again_and_a_whole_new_file(tiny, measured, verify_cost_cache, content):
    with Session(config(tiny, threads=1)) as session:
        verify_cost_cache.write_text(content.replace("KEY", session.policies.costs_key))
        costs = session.policies.verify_costs()
    assert len(measured) == 1
    assert len(costs) == WIDEST + 1 and list(json.loads(verify_cost_cache.read_text()).values())
    assert list(verify_cost_cache.parent.glob("*.partial")) == []


def test_an_unwritable_cache_still_runs(tiny, measured, verify_cost_cache):
    verify_cost_cache.mkdir()  # a folder where the file should be: writing it fails
    with Session(config(tiny, threads=1)) as session:
        tokens = [e.token for e in session.stream(PROMPT, 5) if isinstance(e, TokenEvent)]
    assert len(tokens) == 5 and len(measured) == 1
    assert verify_cost_cache.is_dir() and list(verify_cost_cache.parent.glob("*.partial")) == []
