"""Structured output: JSON schemas checked and turned into grammars, the grammar reader's forced
text, and generation held to a grammar: greedy output the masked argmax path, drafts of what the
grammar forces, sampling with drafts distributed as constrained plain sampling."""

from __future__ import annotations

import json
from collections import Counter

import jsonschema
import numpy as np
import pytest
from reference import TINY_ATOL, FreshContexts, assert_greedy_choice, chi_square_two_sample_p
from test_engine import PROMPT
from test_exactness import MIN_P, SETTINGS, first_tokens

from specrun.backend import Context, ContextOptions, Model
from specrun.backend.grammar import GrammarState
from specrun.config import SessionConfig
from specrun.core.drafting import Draft, DraftRequest, drafted, without_decodes
from specrun.core.engine import Engine
from specrun.core.policy import FixedK
from specrun.core.sampling import Sampler
from specrun.drafts.chain import Chain
from specrun.drafts.grammar import GrammarDraft, GrammarFirst
from specrun.drafts.lookup import PromptLookup
from specrun.drafts.model import DraftModel
from specrun.drafts.word_tokens import exact_tokens
from specrun.errors import SpecrunError
from specrun.grammar.constraint import Constraint
from specrun.grammar.gbnf import GbnfState, GrammarSyntaxError
from specrun.grammar.schemas import SchemaError, grammar_from_gbnf, grammar_from_json_schema, json_object_grammar
from specrun.session import Session

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
    },
    "required": ["name", "age"],
}


@pytest.mark.parametrize(
    "schema, feature",
    [
        ({"type": "integer", "minimum": 0}, "'minimum' at $"),
        ({"type": "object", "properties": {"a": {"not": {"type": "null"}}}}, "'not' at $.properties.a"),
        ({"type": "array", "items": {"type": "string", "format": "email"}}, "format 'email' at $.items"),
        ({"type": "array", "uniqueItems": True}, "'uniqueItems'"),
        ({"anyOf": [{"type": "string"}, {"type": "decimal"}]}, "type 'decimal' at $.anyOf[1]"),
        ([1, 2], "is not an object"),
        ({"type": "string", "maxLength": 524288}, "maxLength 524288 at $ is more than the 2000 repeats"),
    ],
)
def test_a_schema_feature_the_grammar_would_not_enforce_is_named(schema, feature):
    with pytest.raises(SchemaError, match=feature.replace("[", r"\[").replace("$", r"\$")):
        grammar_from_json_schema(schema)


def test_a_tools_arguments_keep_their_structure_where_the_grammar_cannot_narrow_them():
    """Claude Code's tools bound numbers, name keys, give formats and a 524288-long string: a
    refusal would block every request, so a tool's arguments are held to their types and structure
    only; a schema of annotations alone takes any value (its grammar once crashed the server)."""
    schema = {
        "type": "object",
        "properties": {
            "offset": {"type": "integer", "minimum": 0, "description": "line"},
            "url": {"type": "string", "format": "uri"},
            "meta": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}},
            "script": {"type": "string", "maxLength": 524288},
            "args": {"description": "any JSON value"},
        },
        "required": ["offset"],
        "additionalProperties": False,
    }
    gbnf = grammar_from_json_schema(schema, tool_arguments=True).gbnf
    assert len(gbnf) < 20000 and GbnfState.start(gbnf).forced(40).text == '{"offset": '
    with pytest.raises(SchemaError, match="'minimum'"):
        grammar_from_json_schema(schema)
    assert grammar_from_json_schema({"type": "object", "properties": {"a": {"description": "x"}}}).gbnf


def test_annotations_are_no_constraints_and_the_json_has_one_style():
    grammar = grammar_from_json_schema({"title": "P", "description": "d", **PERSON})
    walk = GbnfState.start(grammar.gbnf).forced(40)
    assert walk.text == '{"name": "' and not walk.ends  # a space after the colon, none elsewhere


def test_the_reader_walks_the_text_a_schema_forces():
    state = GbnfState.start(grammar_from_json_schema(PERSON).gbnf)
    state = state.feed('{"name": "Ada"')
    assert state.forced(40).text == ', "age": '
    state = state.feed(', "age": 36')
    assert state.forced(40).text == ""  # another digit, the tags or the end
    assert state.feed("}").forced(40).ends
    assert state.feed("}x") is None  # nothing may follow the object


def test_the_reader_follows_gbnf_repetitions_classes_and_alternatives():
    state = GbnfState.start('root ::= "a" [0-9]{2,3} ("x" | "y") "!" # a comment\n')
    assert state.forced(10).text == "a"
    assert state.feed("a1").forced(10).text == ""  # the second digit is free
    assert state.feed("a12x").forced(10) == type(state.forced(1))("!", True)
    assert state.feed("a1x") is None
    with pytest.raises(GrammarSyntaxError):
        GbnfState.start('root ::= "a" ::= "b"')


def masked_argmax_path(model_path, prompt_tokens, tokens, grammar):
    """Each token against a fresh context's logits masked by the grammar state before it."""
    with FreshContexts(model_path, 512) as fresh:
        state = GrammarState(fresh.model, grammar.gbnf)
        for i, token in enumerate(tokens):
            masked = state.mask(fresh.logits(prompt_tokens + tokens[:i]))
            assert_greedy_choice(masked, token, TINY_ATOL)
            if token not in fresh.model.eog_ids:
                state.accept(token)


@pytest.mark.parametrize("drafting", ["grammar", "lookup", "draft"])
def test_greedy_constrained_output_is_the_masked_argmax_path(tiny, drafting):
    grammar = grammar_from_json_schema(PERSON)
    config = SessionConfig(
        target=tiny["target"], draft=tiny["draft"] if drafting == "draft" else None, lookup=drafting == "lookup", k=4, n_ctx=512
    )
    with Session(config) as session:
        prompt = session.tokenize(PROMPT)
        run = session.engine(grammar=grammar).run(prompt, 48)
        plain = session.engine(plain=True, grammar=grammar).run(prompt, 48)
    masked_argmax_path(tiny["target"], prompt, run.tokens, grammar)
    assert run.stats.accepted_by_source["grammar"] > 0 and run.stats.steps < len(
        run.tokens
    )  # what the grammar forced came drafted
    assert plain.stats.drafted == 0
    if run.stop_reason == "eog":
        jsonschema.validate(json.loads(session_text(tiny, run.tokens)), PERSON)


def session_text(tiny, tokens) -> str:
    model = Model(tiny["target"], role="reader")
    try:
        return model.detokenize(tokens)
    finally:
        model.close()


class Proposing:
    """A draft source that always proposes the same tokens."""

    names, counters, parts, runs_model = ("lookup",), (), (), False

    def __init__(self, tokens):
        self.tokens = tokens

    @without_decodes
    def propose(self, history, request):
        return Draft.under(request.policy.offer(self.names[0], min(len(self.tokens), request.limit)), self.tokens)

    def rollback(self, history):
        pass


@pytest.mark.parametrize(
    "after, drafts",
    [
        (b'Ann", "age": 3', "other"),  # writes the forced text and goes on: the copy drafts
        (b"", "forced"),  # no more than the forced text
        (None, "forced"),  # another text
    ],
)
def test_other_sources_draft_past_the_forced_text(tiny, after, drafts):
    model = Model(tiny["target"])
    try:
        forced = GrammarDraft(Constraint(model, grammar_from_json_schema(PERSON)), model)
        forced_tokens = drafted(forced, [model.bos], DraftRequest(64, FixedK(64), Sampler.seeded(SETTINGS))).tokens
        forced_text = b"".join(model.piece(t) for t in forced_tokens)
        other = Proposing(exact_tokens(model, model.pieces(), b'{"age": 3' if after is None else forced_text + after))
        draft = drafted(GrammarFirst(forced, other), [model.bos], DraftRequest(64, FixedK(64), Sampler.seeded(SETTINGS)))
    finally:
        model.close()
    assert forced_text.startswith(b'{"')  # the object's opening and its first key are forced
    assert draft.tokens == (other.tokens if drafts == "other" else forced_tokens)


class ModelDrafting(Proposing):
    """A stand-in for a draft model: it counts the times it was asked (each costs decodes)."""

    names, runs_model = ("draft",), True

    def __init__(self, tokens):
        super().__init__(tokens)
        self.asked = 0

    def propose(self, history, request):
        self.asked += 1
        return super().propose(history, request)


def test_a_draft_model_is_asked_only_where_nothing_is_forced(tiny):
    model = Model(tiny["target"])
    try:
        constraint = Constraint(model, grammar_from_json_schema(PERSON))
        forced = GrammarDraft(constraint, model)
        start = [model.bos]
        forced_tokens = drafted(forced, start, DraftRequest(64, FixedK(64), Sampler.seeded(SETTINGS))).tokens
        forced_text = b"".join(model.piece(t) for t in forced_tokens)
        going_on = exact_tokens(model, model.pieces(), forced_text + b'Ann", "age": 3')
        drafting = ModelDrafting(going_on)
        copy = Proposing(going_on)
        alone, behind_copy = GrammarFirst(forced, drafting), GrammarFirst(forced, Chain(Proposing([]), drafting))
        assert drafted(alone, start, DraftRequest(64, FixedK(64), Sampler.seeded(SETTINGS))).tokens == forced_tokens
        assert drafted(behind_copy, start, DraftRequest(64, FixedK(64), Sampler.seeded(SETTINGS))).tokens == forced_tokens
        assert drafting.asked == 0  # the forced text is free: the model's decodes would redo it
        with_copy = GrammarFirst(forced, Chain(copy, drafting))
        assert (
            drafted(with_copy, start, DraftRequest(64, FixedK(64), Sampler.seeded(SETTINGS))).tokens == going_on
        )  # a copy still goes past
        constraint.commit(constraint.admissible(forced_tokens), forced_tokens)  # the forced text is accepted
        assert drafted(forced, start + forced_tokens, DraftRequest(64, FixedK(64), Sampler.seeded(SETTINGS))).tokens == []
        assert (
            drafted(alone, start + forced_tokens, DraftRequest(64, FixedK(64), Sampler.seeded(SETTINGS))).tokens == going_on[:64]
        )
        assert drafting.asked == 1  # nothing is forced at the value: the model drafts
    finally:
        model.close()


def test_a_grammar_the_reader_cannot_follow_still_holds_the_output(tiny):
    # A right-recursive rule llama.cpp takes; the reader is given up on, drafting stops, masking goes on.
    grammar = grammar_from_gbnf('root ::= "[" item "]"\nitem ::= [a-z] | [a-z] item\n')
    with Session(SessionConfig(target=tiny["target"], lookup=True, k=4, n_ctx=512)) as session:
        run = session.engine(grammar=grammar).run(session.tokenize(PROMPT), 24)
        text = session.detokenize(run.tokens)
    assert text.startswith("[") and set(text[1:].rstrip("]")) <= set("abcdefghijklmnopqrstuvwxyz")


class ConstrainedRig:
    """The tiny target with the exactness rig's one-row micro-batches, and its first layer as a draft."""

    def __init__(self, target, draft):
        self.models = [Model(target), Model(draft, role="draft")]
        options = ContextOptions(n_ctx=128, n_batch=8, n_ubatch=1, n_threads=1)
        self.target, self.draft = (Context(model, options) for model in self.models)

    def engine(self, drafting: str, grammar, seed: int) -> Engine:
        constraint = Constraint(self.models[0], grammar)
        forced = GrammarDraft(constraint, self.models[0])
        drafter = {
            "plain": None,
            "grammar": GrammarFirst(forced, PromptLookup()),
            "model": GrammarFirst(forced, DraftModel(self.draft, sample=True)),
        }[drafting]
        sampler = Sampler.seeded(SETTINGS.__class__(**{**SETTINGS.__dict__, "seed": seed}))
        return Engine(self.target, drafter, sampler, FixedK(2), constraint=constraint)

    def close(self):
        for model in self.models:
            model.close()


@pytest.mark.parametrize("drafting", ["grammar", "model"])
def test_constrained_sampling_with_drafts_is_distributed_as_constrained_plain_sampling(tiny, drafting):
    """Temperature 1: the grammar leaves a word free, forces " sat on the", then leaves a word
    free again; drafts (the forced text, prompt lookup, a sampling draft model with p/q) must not
    move the distribution of either free word, the second sampled after a verified draft."""
    grammar = grammar_from_gbnf('root ::= " the" word " sat on the" word\nword ::= " cat" | " dog" | " mat" | " log" | " hat"\n')
    rig = ConstrainedRig(tiny["target"], write_first_layer(tiny))
    try:
        prompt = rig.models[0].tokenize(PROMPT)
        plain, _, _ = first_tokens(lambda seed: rig.engine("plain", grammar, seed), prompt, range(1200), n=7)
        drafted, n_drafted, accepted = first_tokens(lambda seed: rig.engine(drafting, grammar, seed), prompt, range(1200), n=7)
    finally:
        rig.close()
    assert n_drafted > 0 and accepted > 0
    assert all(rig.models[0].detokenize(tokens).startswith(" the") for tokens in drafted.values())
    second, last = (lambda outcomes, i=i: Counter(t[i] for t in outcomes.values() if len(t) > i) for i in (1, -1))
    assert chi_square_two_sample_p(second(plain), second(drafted)) > MIN_P
    assert chi_square_two_sample_p(last(plain), last(drafted)) > MIN_P


def write_first_layer(tiny):
    from tinymodels import write_tiny_llama

    return write_tiny_llama(tiny["target"].parent / "first-layer.gguf", seed=0, n_layer=1)


def test_json_mode_gives_an_object(tiny):
    with Session(SessionConfig(target=tiny["target"], lookup=True, k=4, n_ctx=512)) as session:
        result = session.generate(PROMPT, max_tokens=24, grammar=json_object_grammar())
    assert result.text.startswith("{")


def test_a_grammar_llama_cpp_cannot_parse_is_one_clear_error(tiny):
    with Session(SessionConfig(target=tiny["target"], n_ctx=128)) as session:
        with pytest.raises(Exception, match="cannot parse the grammar's GBNF"):
            session.generate(PROMPT, max_tokens=4, grammar=grammar_from_gbnf("root ::= [unclosed"))


def test_the_allowed_check_agrees_with_the_full_mask(tiny):
    model = Model(tiny["target"])
    try:
        state = GrammarState(model, grammar_from_json_schema(PERSON).gbnf)
        with pytest.raises(SpecrunError, match="not allowed by the grammar"):
            state.accept(model.tokenize(" x", add_special=False)[0])  # llama.cpp would end the process
        for token in exact_tokens(model, model.pieces(), b'{"name": "Al'):
            state.accept(token)
        masked = state.mask(np.zeros(model.n_vocab, dtype=np.float32))
        ids = np.arange(model.n_vocab)
        assert np.array_equal(state.allows(ids), np.isfinite(masked))
        assert 0 < np.isfinite(masked).sum() < model.n_vocab
    finally:
        model.close()


def test_generate_holds_its_output_to_a_json_schema_file(tiny, tmp_path, capsys):
    from specrun.cli import run_app

    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    assert (
        # A fixed k: auto judges drafts by timed decodes, and on a busy machine may decline every one
        run_app(
            [
                "generate",
                PROMPT,
                "-m",
                str(tiny["target"]),
                "--lookup",
                "--k",
                "4",
                "-n",
                "64",
                "--json-schema",
                str(schema),
                "--json",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result["text"].startswith('{"name": "') and result["stats"]["accepted_by_source"]["grammar"] > 0
    if result["stats"]["stop_reason"] == "eog":
        jsonschema.validate(json.loads(result["text"]), PERSON)


def test_bench_holds_a_prompt_file_s_records_to_their_schemas(tiny, tmp_path, capsys):
    from specrun.cli import run_app

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": PROMPT, "schema": PERSON}) + "\n" for _ in range(2)))
    out = tmp_path / "b.json"
    assert (
        run_app(
            [
                "bench",
                str(prompts),
                "-m",
                str(tiny["target"]),
                "--methods",
                "plain,lookup",
                "--k",
                "auto",
                "-n",
                "24",
                "--warmup",
                "0",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    document = json.loads(out.read_text())
    assert document["summary"]["lookup_kauto"]["tokens"] > 0
