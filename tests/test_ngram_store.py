"""The cross-request n-gram store: bounded, oldest first, and drafts only what earlier requests agree on."""

import numpy as np
import pytest

from specrun.config import SessionConfig
from specrun.core.drafting import DraftRequest, drafted
from specrun.core.policy import FixedK
from specrun.core.sampling import Sampler, SamplerSettings
from specrun.drafts.store import NgramStore
from specrun.drafts.store_lookup import StoreLookup
from specrun.errors import SpecrunError
from specrun.session import Session
from specrun.settings import SettingError

GREEDY = Sampler(SamplerSettings(), np.random.default_rng(0))


def propose(store: NgramStore, history: list[int], limit: int = 32):
    return drafted(StoreLookup(store), history, DraftRequest(limit, FixedK(limit), GREEDY))


def test_a_repeated_output_is_drafted_from_the_store():
    store = NgramStore(1000)
    output = list(range(100, 160))
    store.add([5, 6, 7, *output])
    draft = propose(store, [9, 9, 5, 6, 7, *output[:3]], limit=30)
    assert draft.tokens == output[3:33]
    assert draft.source == "store-long"  # the context matched 6 tokens back


def test_the_draft_stops_where_earlier_requests_disagree():
    store = NgramStore(1000)
    for value in (40, 41, 42):  # the same field with three different values
        store.add([10, 11, 12, value, 13, 14])
    assert propose(store, [1, 10, 11, 12]).tokens == []
    # After the value, the requests agree again (the one-token match was seen three times).
    assert propose(store, [1, 10, 11, 12, 99, 13]).tokens == [14]


def test_a_majority_is_followed_and_a_single_one_token_match_is_no_evidence():
    store = NgramStore(1000)
    for value in (40, 40, 40, 41):
        store.add([10, 11, value, 50])
    assert propose(store, [7, 10, 11]).tokens == [40, 50]  # 3 of 4 went on with 40
    lonely = NgramStore(1000)
    lonely.add([3, 4, 5])
    assert propose(lonely, [8, 3]).tokens == []  # token 3 seen once: no evidence
    assert propose(lonely, [2, 3, 4]).tokens == [5]  # two tokens of agreement are


def test_the_store_never_exceeds_its_limit_and_drops_the_oldest_first():
    store = NgramStore(100)
    for i in range(50):
        store.add([1000 + i] * 3 + list(range(i, i + 30)))
        assert len(store) <= 100
    assert len(store) > 60
    assert propose(store, [1049, 1049, 1049]).tokens[:3] == [49, 50, 51]  # the newest is kept
    assert propose(store, [1000, 1000, 1000]).tokens == []  # the oldest is gone
    long = NgramStore(10)
    long.add(list(range(200, 250)))
    assert len(long) == 10 and propose(long, [245, 246]).tokens == [247, 248, 249]


def test_a_conversation_that_extends_the_last_request_adds_only_its_new_tokens():
    store = NgramStore(10_000)
    first = list(range(300, 600))
    store.add(first)
    store.add(first + [7, 8, 9])
    assert len(store) < len(first) + NgramStore.MAX_MATCH + 3 + 1
    assert propose(store, [598, 599, 7]).tokens == [8, 9]  # the new tokens are found after the old


def test_a_store_needs_a_positive_limit():
    with pytest.raises(SpecrunError, match="limit >= 1"):
        NgramStore(0)
    with pytest.raises(SettingError, match="store_tokens has to be an integer from 0"):
        SessionConfig(target="x.gguf", store_tokens=-1)


def generate(session, prompt, max_tokens):
    sources = []

    def on_step(event, stats):
        if event.accepted:
            sources.append(event.draft_source)

    run = session.engine(policy=4).run(prompt, max_tokens, on_step=on_step)
    return run.tokens, sources, run.stats


def test_a_second_request_repeating_the_first_drafts_from_the_store_with_the_same_output(tiny):
    config = SessionConfig(target=tiny["target"], store_tokens=200, k=4, n_ctx=512, threads=1)
    with Session(config) as session:
        prompt = session.tokenize("the cat sat on the mat and the dog")
        first, sources, stats = generate(session, prompt, 40)
        assert stats.accepted == 0  # nothing stored yet
        session.remember(prompt + first)
        session.target.truncate(0)
        second, sources, stats = generate(session, prompt, 40)
        assert second == first  # every token is still the target's
        assert stats.accepted > 0 and set(sources) <= {"store", "store-long"}
        for i in range(20):
            session.remember(session.tokenize(f"request {i} of many words") + first)
            assert len(session.store) <= 200


def test_bench_reports_the_store_as_its_own_method_learning_only_from_earlier_prompts(tiny):
    from specrun.bench.methods import plan_variants
    from specrun.bench.runner import measure

    config = SessionConfig(target=tiny["target"], store_tokens=1000, n_ctx=256, threads=1)
    with Session(config) as session:
        prompt = session.tokenize("hello world , what was it")
        runs = list(measure(session, [prompt, prompt], plan_variants(["lookup", "store"], [4]), config.sampler, 32))
    accepted = {(run.prompt_index, run.variant.method): run.stats.accepted for run in runs}
    assert all(run.matches_plain for run in runs if run.variant.method != "plain")
    assert accepted[0, "store"] == accepted[0, "lookup"]  # nothing stored before the first prompt
    assert accepted[1, "store"] > accepted[1, "lookup"]  # the second drafts from the first's output


def test_bench_store_method_from_the_command_line(tiny, tmp_path):
    import json

    from specrun.cli import run_app

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello world , what was it\nhello world , what was it\n")
    out = tmp_path / "bench.json"
    code = run_app(
        [
            "bench",
            str(prompts),
            "--target",
            str(tiny["target"]),
            "--methods",
            "plain,store",
            "--k",
            "4",
            "-n",
            "24",
            "--warmup",
            "0",
            "--store-tokens",
            "500",
            "--ctx-size",
            "256",
            "--threads",
            "1",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    document = json.loads(out.read_text())
    assert list(document["summary"]) == ["store_k4"] and document["config"]["store_tokens"] == 500


class Quiet:
    def show(self, pieces) -> None:
        pass

    def step(self, event, stats) -> None:
        pass


def test_chat_after_a_reset_drafts_from_the_earlier_conversation(tiny):
    from specrun.chat.formats import choose_format
    from specrun.chat.runner import ChatRunner

    config = SessionConfig(target=tiny["target"], store_tokens=1000, k=4, n_ctx=512, threads=1)
    with Session(config) as session:
        runner = ChatRunner(session, choose_format(session.target_model, None), max_tokens=24)
        first = runner.reply(runner.prepare("hello world"), Quiet())
        runner.reset()
        session.target.truncate(0)
        second = runner.reply(runner.prepare("hello world"), Quiet())
    assert first.stats.accepted == 0  # the store was empty
    assert second.text == first.text and second.stats.accepted > 0
