"""Prompt lookup: its incremental index against a brute-force scan, and its match tracks."""

import numpy as np
import pytest

from specrun.core.drafting import DraftRequest, drafted
from specrun.core.policy import FixedK
from specrun.core.sampling import Sampler, SamplerSettings
from specrun.drafts.lookup import PromptLookup, blank_lines
from specrun.errors import SpecrunError

RNG = np.random.default_rng(0)
GREEDY = Sampler(SamplerSettings(), RNG)


def followers(history, ngram):
    n = len(ngram)
    return [history[end + 1] for end in range(n - 1, len(history) - 1) if history[end - n + 1 : end + 1] == ngram]


def longest_ngram(history, context, n_min, n_max):
    for n in range(min(n_max, len(context)), n_min - 1, -1):
        if followers(history, context[-n:]):
            return context[-n:]
    return None


def brute_force(history, k, n_min, n_max):
    """Scans the whole history: the copy after the latest longest match, cut where a context is ambiguous."""
    ngram = longest_ngram(history, history, n_min, n_max)
    if ngram is None:
        return []
    n = len(ngram)
    end = max(e for e in range(n - 1, len(history) - 1) if history[e - n + 1 : e + 1] == ngram)
    context = list(history)
    for token in history[end + 1 : end + 1 + k]:
        source = history[: end + 1 + len(context) - len(history)]
        in_step = next((m for m in range(len(source)) if source[-1 - m] != context[-1 - m]), len(source))
        ambiguous = len(set(followers(history, longest_ngram(history, context, n_min, n_max)))) > 1
        if ambiguous and in_step < PromptLookup.TRUSTED_MATCH:
            break
        context.append(token)
    return context[len(history) :]


@pytest.mark.parametrize("n_min, n_max", [(1, 3), (2, 4), (3, 5)])
def test_incremental_index_matches_a_full_rescan(n_min, n_max):
    lookup = PromptLookup(n_min, n_max)
    history = RNG.integers(0, 6, size=20).tolist()
    for _ in range(300):
        assert drafted(lookup, history, DraftRequest(5, FixedK(5), GREEDY)).tokens == brute_force(history, 5, n_min, n_max)
        history += RNG.integers(0, 6, size=int(RNG.integers(1, 4))).tolist()


def test_new_conversation_rebuilds_the_index():
    lookup = PromptLookup(1, 2)
    assert drafted(lookup, [1, 2, 3, 1, 2], DraftRequest(2, FixedK(2), GREEDY)).tokens == [3, 1]
    assert drafted(lookup, [7, 8, 9, 7], DraftRequest(2, FixedK(2), GREEDY)).tokens == [8, 9]


def test_copies_what_followed_the_longest_match():
    lookup = PromptLookup(1, 3)
    # "4 5" follows "1 2 3" at the start; "9" follows the more recent lone "3".
    assert drafted(lookup, [1, 2, 3, 4, 5, 3, 9, 1, 2, 3], DraftRequest(2, FixedK(2), GREEDY)).tokens == [4, 5]


def test_the_copy_stops_where_the_history_went_on_in_two_ways():
    lookup = PromptLookup(1, 2)
    # "5 6" went on "1 2 3", but "1 2" went on with 3 once and with 4 once.
    assert drafted(lookup, [5, 6, 1, 2, 3, 1, 2, 4, 5, 6], DraftRequest(4, FixedK(4), GREEDY)).tokens == [1, 2]
    assert drafted(lookup, [5, 6, 1, 2, 3, 1, 2, 4, 1, 2], DraftRequest(4, FixedK(4), GREEDY)).tokens == []


def test_a_copy_long_in_step_with_the_text_goes_on_past_ambiguous_contexts():
    lookup = PromptLookup(1, 2)
    copied = list(range(10, 10 + PromptLookup.TRUSTED_MATCH)) + [1, 2, 3]
    # "1 2" went on with 4 elsewhere, but the copy's source has been in step for 12 tokens.
    history = [1, 2, 4] + copied + [0] + copied[:-3]
    assert drafted(lookup, history, DraftRequest(3, FixedK(3), GREEDY)).tokens == [1, 2, 3]
    # A source in step for one token ("7") is cut where "1 2" went on in two ways.
    assert drafted(lookup, [1, 2, 4, 7, 1, 2, 3, 0, 7], DraftRequest(3, FixedK(3), GREEDY)).tokens == [1, 2]


def test_matches_reaching_far_back_are_their_own_source():
    """Text being copied is far likelier to be accepted: the policy tracks it apart."""
    lookup = PromptLookup(2, 4)
    copied = [10, 11, 12, 13, 14, 15, 16, 17]
    assert drafted(lookup, copied + [1] + copied[:6], DraftRequest(2, FixedK(2), GREEDY)).source == "lookup-long"
    assert drafted(lookup, copied + [1] + copied[:6], DraftRequest(2, FixedK(2), GREEDY)).tokens == [16, 17]
    assert drafted(lookup, copied + [1, 9, 9] + copied[3:5], DraftRequest(2, FixedK(2), GREEDY)).source == "lookup"
    assert drafted(lookup, [1, 2, 3], DraftRequest(2, FixedK(2), GREEDY)).source is None  # no match at all: no draft


def test_a_copy_in_step_for_copy_match_tokens_is_offered_whole_as_its_own_source():
    lookup = PromptLookup(2, 4)
    source = list(range(100, 300))  # 200 distinct tokens, copied after a separator
    in_step = source[: PromptLookup.COPY_MATCH]
    draft = drafted(lookup, source + [1] + in_step, DraftRequest(150, FixedK(150), GREEDY))
    assert draft.source == "lookup-copy"
    assert draft.tokens == source[PromptLookup.COPY_MATCH :][:150]  # as much as the policy asks for
    assert drafted(lookup, source + [1] + in_step[:-1], DraftRequest(4, FixedK(4), GREEDY)).source == "lookup-long"


BLANK = 0  # the blank-line token in these tests


def test_a_copy_stops_after_a_blank_line_of_its_source_until_copies_go_on_past_one():
    lookup = PromptLookup(2, 4, breaks=frozenset({BLANK}))
    block = [10, 11, 12, BLANK, 13, 14, 15, BLANK, 16, 17]
    history = [9, *block, 1, 9, 10, 11]
    assert drafted(lookup, history, DraftRequest(8, FixedK(8), GREEDY)).tokens == [12, BLANK]  # the end of a block, maybe
    history += [12, BLANK, 13]  # the text went on as the source did past the blank line
    assert drafted(lookup, history, DraftRequest(5, FixedK(5), GREEDY)).tokens == [
        14,
        15,
        BLANK,
        16,
        17,
    ]  # now it goes on past one


def test_a_copy_that_ended_at_a_blank_line_keeps_stopping_there():
    lookup = PromptLookup(2, 4, breaks=frozenset({BLANK}))
    history = [9, 10, 11, 12, BLANK, 13, 14, 1, 9, 10, 11]
    assert drafted(lookup, history, DraftRequest(8, FixedK(8), GREEDY)).tokens == [12, BLANK]
    history += [12, BLANK, 20]  # the text went its own way after the block
    history += [5, 9, 10, 11]
    assert drafted(lookup, history, DraftRequest(8, FixedK(8), GREEDY)).tokens == [12, BLANK]


def test_a_copy_rejected_before_its_blank_line_says_nothing_of_what_follows_one():
    lookup = PromptLookup(2, 4, breaks=frozenset({BLANK}))
    history = [9, 10, 11, 12, BLANK, 13, 14, 1, 9, 10, 11]
    assert drafted(lookup, history, DraftRequest(8, FixedK(8), GREEDY)).tokens == [12, BLANK]
    history += [12, BLANK, 13]  # went on as the source did: one of one copies went on past a blank line
    assert BLANK in drafted(lookup, history, DraftRequest(8, FixedK(8), GREEDY)).tokens[:-1]
    history += [7]  # that copy was rejected at its first token, before its blank line
    drafted(lookup, history, DraftRequest(8, FixedK(8), GREEDY))
    history += [9, 10, 11]
    # Still one of one: counted as a miss, it would make one of two, and the copy would stop at the blank line.
    assert drafted(lookup, history, DraftRequest(8, FixedK(8), GREEDY)).tokens == [12, BLANK, 13]


def test_blank_line_tokens_come_from_the_vocabulary():
    class Vocabulary:
        def tokenize(self, text, add_special, parse_special):
            return [100 + len(text)] if len(text) <= 3 else [103] * (len(text) // 3)  # "\n\n", "\n\n\n" single

    assert blank_lines(Vocabulary()) == {102, 103}


def test_bad_ngram_range():
    with pytest.raises(SpecrunError, match="but is 3..2"):
        PromptLookup(3, 2)
