"""Loads a target and its draft sources once and hands out engines over them.

Commands (generate, chat, bench, serve) and the Python API share this; contexts are
reused across prompts, not recreated, so hundreds of prompts cost no reloads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Sequence

from specrun.config import SessionConfig
from specrun.core.batch import Batch
from specrun.core.drafting import DraftSource
from specrun.core.engine import Engine, EventStream
from specrun.core.events import Generation
from specrun.core.policy import DraftPolicy, rollback_tokens
from specrun.core.sampling import Sampler, SamplerSettings
from specrun.drafts import registry
from specrun.drafts.grammar import GrammarDraft, GrammarFirst
from specrun.drafts.store import NgramStore
from specrun.errors import SpecrunError
from specrun.grammar.constraint import Constraint
from specrun.grammar.schemas import Grammar
from specrun.session.drafters import Drafters, source_names, target_options
from specrun.session.policies import Policies
from specrun.session.resources import Resources
from specrun.session.slots import Slots
from specrun.settings import check, check_bias_tokens, parse_k


@dataclass(frozen=True)
class CallSettings:
    """A library call's own settings (`stream`, `generate`, `generate_many`), checked once as the
    call comes in; what the call leaves out is the session's."""

    max_tokens: int
    plain: bool
    k: int | str | None  # checked (`parse_k`); None: the session's
    sampler: SamplerSettings  # the call's, with its seed


class Session:
    """A loaded target (and draft) that generates, speculatively or plainly, prompt after prompt.

    What `k="auto"` learns (verify costs, acceptance per draft source) carries over from
    one generation to the next. Close it (or use `with`) to free the models; the verify
    costs auto refined are then kept for the next session with this set-up. One thread
    at a time: llama.cpp's contexts are not thread-safe.
    """

    def __init__(self, config: SessionConfig):
        self.config = config
        self.resources = Resources(config, registry.model_checks())
        self.store = NgramStore(config.store_tokens) if config.store_tokens else None
        try:
            self.target_model = self.resources.load_model(config.target, "target", target_options(config))
            check_bias_tokens(config.sampler.logit_bias, self.target_model.n_vocab)  # before a front end's first line
            speculative = bool(source_names(config))
            # A recurrent target keeps a snapshot for each token the longest draft its k grants may lose.
            self.target = self.resources.open_context(self.target_model, rollback=rollback_tokens(config.k) if speculative else 0)
            if speculative:
                self._check_rollback()
            self.policies = Policies(self.target, config)
            self.drafters = Drafters(self.target, config, self.store, self.resources)
            self.drafter = self.drafters.chain(0)
        except BaseException:
            self.resources.close()  # nothing ran yet whose costs close() would keep
            raise

    def _check_rollback(self) -> None:
        """A target whose recurrent state llama.cpp cannot roll back verifies no draft."""
        target, name = self.target, self.config.target.name
        if not target.rollback_limit:
            raise SpecrunError(
                f"the target model {name} ({target.model.architecture}) keeps a recurrent state that llama.cpp cannot roll "
                "back, so no draft can be verified on it: run it plainly (without --draft, --lookup or --store-tokens), "
                "or pick a target whose architecture llama.cpp rolls back (Qwen3.5, Nemotron-H, LFM2, ...)"
            )
        k = self.config.k
        if isinstance(k, int) and k > target.rollback_limit:
            raise SpecrunError(
                f"k = {k}, but the {target.model.architecture} target {name} can roll back only "
                f"{target.rollback_limit} tokens with --ubatch-size {self.config.n_ubatch}: lower --k or "
                "raise --ubatch-size (it has to exceed k + 1)"
            )

    def close(self) -> None:
        """Free the models and contexts, keeping the verify costs auto refined for the next session."""
        if not self.resources.closed:
            self.policies.save()
        self.resources.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def remember(self, tokens: list[int]) -> None:
        """Let later generations draft from a finished one's prompt and output (with a store)."""
        if self.store is not None:
            self.store.add(tokens)

    def tokenize(self, text: str) -> list[int]:
        """The target's token ids for `text`, with the start token the model adds (BOS) and
        special tokens written as text (`<start_of_turn>`) parsed as such."""
        return self.target_model.tokenize(text)

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of the target's `tokens` (control tokens such as end-of-turn render empty)."""
        return self.target_model.detokenize(tokens)

    def prompt_tokens(self, prompt: str | Sequence[int]) -> list[int]:
        """`prompt` (text, or token ids) as the target's tokens, checked once for every generation
        the library or the CLI starts: some text, and fewer tokens than a stream's context holds."""
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        if not tokens or (isinstance(prompt, str) and not prompt.strip()):  # not "continue the start token"
            raise SpecrunError("the prompt is empty: give some text to continue")
        if len(tokens) >= self.target.n_ctx:
            raise SpecrunError(
                f"the prompt has {len(tokens)} tokens but the context holds {self.target.n_ctx}: "
                "shorten the prompt or raise --ctx-size"
            )
        return tokens

    def engine(
        self,
        *,
        plain: bool = False,
        policy: DraftPolicy | int | str | None = None,
        sampler: SamplerSettings | None = None,
        drafter: DraftSource | None = None,
        grammar: Grammar | None = None,
        grammar_drafts: bool = True,
        slot: int = 0,
        logprobs: int | None = None,
    ) -> Engine:
        """A fresh engine over the session's target, with this call's settings.

        `plain` decodes without drafting; `policy` is a checked draft length, "auto" or
        "llama.cpp" (the session's kept policy for that k) or a `DraftPolicy` of the caller's
        (default: the session's k); `sampler` replaces the session's sampler settings (its seed
        seeds the random stream, so the same seed gives the same stream for plain and
        speculative); `drafter` replaces the session's draft source (bench measures one method
        at a time); `grammar` holds the output to a grammar, and unless `grammar_drafts` is
        False (or `plain`), what it forces is drafted ahead of the other sources; `slot` is the
        stream (0 .. parallel - 1) whose sequence and sources it uses; `logprobs`: each
        TokenEvent carries the token's log-probability and that many of the likeliest (None: none).
        """
        settings = sampler or self.config.sampler
        if settings is not self.config.sampler:  # the session's own were checked when it loaded
            check_bias_tokens(settings.logit_bias, self.target_model.n_vocab)
        check(logprobs=logprobs)
        constraint = Constraint(self.target_model, grammar) if grammar is not None else None
        target = self.target.sequence(slot)
        drafter = None if plain else drafter or self.drafters.chain(slot)
        if constraint is not None and grammar_drafts and not plain:
            forced = GrammarDraft(constraint, self.target_model)
            drafter = forced if drafter is None else GrammarFirst(forced, drafter)
        self.drafters.follow(drafter, slot)
        if drafter is None:  # plain decoding needs no policy, nor auto's start-up measurement of verify costs
            return Engine(target, None, Sampler.seeded(settings), constraint=constraint, logprobs=logprobs)
        if policy is None or isinstance(policy, (int, str)):
            policy = self.policies.policy(self.config.k if policy is None else policy)
        catch_up = self.policies.catch_up(policy)
        return Engine(
            target, drafter, Sampler.seeded(settings), policy, constraint=constraint, catch_up=catch_up, logprobs=logprobs
        )

    def stream(
        self,
        prompt: str | Sequence[int],
        max_tokens: int = 256,
        plain: bool = False,
        k: int | str | None = None,
        seed: int | None = None,
        sampler: SamplerSettings | None = None,
        grammar: Grammar | None = None,
        logprobs: int | None = None,
    ) -> EventStream:
        """Generate a continuation of `prompt` (text, or token ids), event by event.

        Yields a `StepEvent` per draft-and-verify round, a `TokenEvent` per emitted token
        (its `source`: "draft" for an accepted guess, "target" for the target's own token,
        "bonus" for the one that follows a fully accepted draft), and last a `Done` with
        the `Generation`. For this generation only: `plain` decodes without drafting, through
        the same loop; `k` overrides the session's draft length ("auto", "llama.cpp" or a
        number); `sampler` replaces the session's sampler settings and `seed` their seed;
        `grammar` (a `specrun.Grammar`: `grammar_from_json_schema`, `grammar_from_gbnf`)
        holds the output to it; with `logprobs` (0 to 20) each TokenEvent carries its token's
        log-probability in the target's row and that many of the row's likeliest tokens with
        theirs. Stopping early is safe: the engine rolls the caches back when the stream is
        closed (`contextlib.closing`, or garbage collection).
        """
        call = self._call(max_tokens, plain, k, seed, sampler)
        return self._engine(call, grammar, logprobs=logprobs).stream(self.prompt_tokens(prompt), call.max_tokens)

    def generate(
        self,
        prompt: str | Sequence[int],
        max_tokens: int = 256,
        plain: bool = False,
        k: int | str | None = None,
        seed: int | None = None,
        sampler: SamplerSettings | None = None,
        grammar: Grammar | None = None,
    ) -> Generation:
        """Generate a continuation of `prompt` in one call: its `Generation` (text, token ids,
        stats). The arguments are `stream`'s."""
        call = self._call(max_tokens, plain, k, seed, sampler)
        return self._engine(call, grammar).run(self.prompt_tokens(prompt), call.max_tokens)

    def generate_many(
        self,
        prompts: Sequence[str | Sequence[int]],
        max_tokens: int = 256,
        plain: bool = False,
        k: int | str | None = None,
        seed: int | None = None,
        sampler: SamplerSettings | None = None,
        grammar: Grammar | Sequence[Grammar | None] | None = None,
    ) -> list[Generation]:
        """Each prompt's continuation, as `generate` gives it, `parallel` at a time: the running
        streams' rows go through one target decode per step, and a prompt takes the next free
        stream (`Slots.slot_for`). `grammar`: one for all, or one per prompt.
        Returned in the prompts' order."""
        grammars = [grammar] * len(prompts) if grammar is None or isinstance(grammar, Grammar) else list(grammar)
        if len(grammars) != len(prompts):
            raise SpecrunError(f"{len(grammars)} grammars for {len(prompts)} prompts: give one for all, or one per prompt")
        call = self._call(max_tokens, plain, k, seed, sampler)
        prepared = [self.prompt_tokens(prompt) for prompt in prompts]
        slots: Slots[int] = self.slots()
        done: dict[int, Generation] = {}
        waiting = list(range(len(prepared)))
        while waiting or slots.busy:
            while waiting and slots.free:
                index = waiting.pop(0)
                slot = slots.slot_for(prepared[index])
                engine = self._engine(call, grammars[index], slot)
                slots.start(slot, index, engine, prepared[index], call.max_tokens, on_done=partial(done.__setitem__, index))
            slots.step()
        return [done[i] for i in range(len(prepared))]

    def slots(self) -> Slots:
        """The session's streams, scheduled together (`generate_many`, serve's requests)."""
        return Slots(self.target, self.batch)

    def batch(self) -> Batch:
        """Streams on this session's slots, verified together; a draft under auto has its rows
        priced by the verify costs auto keeps refining."""
        return Batch(self.target, self.policies.auto_costs)

    def _call(
        self, max_tokens: int, plain: bool, k: int | str | None, seed: int | None, sampler: SamplerSettings | None
    ) -> CallSettings:
        check(max_tokens=max_tokens)
        settings = sampler or self.config.sampler
        return CallSettings(
            max_tokens, plain, None if k is None else parse_k(k), replace(settings, seed=seed) if seed is not None else settings
        )

    def _engine(self, call: CallSettings, grammar: Grammar | None, slot: int = 0, logprobs: int | None = None) -> Engine:
        return self.engine(plain=call.plain, policy=call.k, sampler=call.sampler, grammar=grammar, slot=slot, logprobs=logprobs)
