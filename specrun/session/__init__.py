"""Loads a target and a draft source once and hands out generators over them.

Commands (generate, chat, bench, serve) and the Python API share this; contexts are
reused across prompts, not recreated, so hundreds of prompts cost no reloads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from specrun.backend import ModelOptions
from specrun.config import SessionConfig
from specrun.core.auto import AutoK
from specrun.core.batch import Batch
from specrun.core.costs import measure_verify_costs, verify_costs_hold
from specrun.core.engine import EventStream, Generator
from specrun.core.events import RunResult, Stats
from specrun.core.policy import DraftPolicy, FixedK, PMinPolicy, parse_k, rollback_tokens
from specrun.core.sampling import Sampler, SamplerSettings
from specrun.core.sequences import common_prefix
from specrun.drafts import registry
from specrun.drafts.base import CatchUp, DraftSource, chained, leaves
from specrun.drafts.grammar import GrammarDraft, GrammarFirst
from specrun.drafts.registry import Resources, SourceSite
from specrun.drafts.store import NgramStore
from specrun.errors import SpecrunError
from specrun.grammar.constraint import Constraint
from specrun.grammar.schemas import Grammar
from specrun.session import cost_cache
from specrun.settings import check, check_bias_tokens


@dataclass(frozen=True)
class Generation:
    """What `Session.generate` returns: the continuation and how it was made."""

    text: str  # the generated text (the prompt not included)
    tokens: list[int]  # the generated token ids, end-of-generation token included when one ended it
    stats: Stats  # counters and timings; stats.stop_reason says why it stopped

    @property
    def stop_reason(self) -> str:
        """'eog' (the model ended), 'max_tokens' or 'context_full'."""
        return self.stats.stop_reason


class Session:
    """A loaded target (and draft) that generates, speculatively or plainly, prompt after prompt.

    What `k="auto"` learns (verify costs, acceptance per draft source) carries over from
    one generation to the next. Close it (or use `with`) to free the models; the verify
    costs auto refined are then kept for the next session with this set-up. One thread
    at a time: llama.cpp's contexts are not thread-safe.
    """

    def __init__(self, config: SessionConfig):
        self.config = config
        self.resources = Resources(config)
        self._verify_costs: list[float] | None = None
        self._policies: dict[int | str, FixedK | PMinPolicy | AutoK] = {}
        self._sources: dict[tuple[str, int], DraftSource] = {}
        self._drafters: dict[int, DraftSource | None] = {}
        self.store = NgramStore(config.store_tokens) if config.store_tokens else None
        try:
            self.target_model = self.resources.load_model(config.target, "target", self._target_options())
            check_bias_tokens(config.sampler.logit_bias, self.target_model.n_vocab)  # before a front end's first line
            speculative = bool(self.source_names)
            # A recurrent target keeps a snapshot for each token the longest draft its k grants may lose.
            self.target = self.resources.open_context(self.target_model, rollback=rollback_tokens(config.k) if speculative else 0)
            if speculative:
                self._check_rollback()
            self.costs_key = self._costs_key()  # taken now: the file may change or go while we run
            self.drafter = self.drafter_for(0)
        except BaseException:
            self.close()
            raise

    def _target_options(self) -> ModelOptions:
        """The target's placement, and what the sources asked for ask of its load (MTP layers)."""
        c = self.config
        options = ModelOptions(n_gpu_layers=c.n_gpu_layers, rpc_servers=c.rpc, tensor_split=c.tensor_split)
        for name in self.source_names:
            asks = registry.kind(name).target_options
            options = asks(options) if asks is not None else options
        return options

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

    def drafter_for(self, slot: int) -> DraftSource | None:
        """Stream `slot`'s chain of the sources the settings ask for, in `source_names`' order.
        Each stream has its own; the store is shared."""
        if slot not in self._drafters:
            self._drafters[slot] = chained([self.source(name, slot) for name in self.source_names])
        return self._drafters[slot]

    @property
    def source_names(self) -> list[str]:
        """The sources the settings ask for, in the order the chain asks them: copies first (this
        request's context, then what earlier ones wrote), then the sources named, a draft model last."""
        c = self.config
        named = [*(["lookup"] if c.lookup else []), *(["store"] if c.store_tokens else []), *c.sources]
        return list(dict.fromkeys([*named, *([registry.draft_file_kind(c.draft)] if c.draft is not None else [])]))

    def source(self, name: str, slot: int = 0) -> DraftSource:
        """Stream `slot`'s source of the registered kind `name` (`specrun.drafts.registry`), built
        on first use and kept: the one in the stream's chain, when the chain asks it."""
        if (name, slot) not in self._sources:
            site = SourceSite(slot, self.target.sequence(slot), self.config, self.store, self.resources)
            self._sources[name, slot] = registry.kind(name).build(site)
        return self._sources[name, slot]

    def close(self) -> None:
        """Free the models and contexts, keeping the verify costs auto refined for the next session."""
        auto = self._policies.get("auto")
        if isinstance(auto, AutoK) and not self.resources.closed:
            cost_cache.save(self.costs_key, self.config.target, auto.costs)  # what auto refined while running
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

    def generator(
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
    ) -> Generator:
        """A fresh generator over the session's target, with this call's settings.

        `plain` decodes without drafting; `policy` is a draft length, "auto" or "llama.cpp"
        (the session's kept policy for that k) or a `DraftPolicy` of the caller's (default:
        the session's k); `sampler` replaces the session's sampler settings (its seed seeds
        the random stream, so the same seed gives the same stream for plain and speculative);
        `drafter` replaces the session's draft source (bench measures one method at a time);
        `grammar` holds the output to a grammar, and unless `grammar_drafts` is False (or
        `plain`), what it forces is drafted ahead of the other sources; `slot` is the stream
        (0 .. parallel - 1) whose sequence and sources it uses; `logprobs`: each TokenEvent
        carries the token's log-probability and that many of the likeliest (None: none).
        """
        settings = sampler or self.config.sampler
        constraint = Constraint(self.target_model, grammar) if grammar is not None else None
        target = self.target.sequence(slot)
        drafter = None if plain else drafter or self.drafter_for(slot)
        if constraint is not None and grammar_drafts and not plain:
            forced = GrammarDraft(constraint, self.target_model)
            drafter = forced if drafter is None else GrammarFirst(forced, drafter)
        self._follow(drafter, slot)
        if drafter is None:  # plain decoding needs no policy, nor auto's start-up measurement of verify costs
            return Generator(target, None, Sampler.seeded(settings), constraint=constraint, logprobs=logprobs)
        if policy is None or isinstance(policy, (int, str)):
            policy = self.policy(self.config.k if policy is None else policy)
        return Generator(
            target,
            drafter,
            Sampler.seeded(settings),
            policy,
            constraint=constraint,
            catch_up=self.catch_up(policy),
            logprobs=logprobs,
        )

    def _follow(self, drafter: DraftSource | None, slot: int) -> None:
        """The stream's sources that follow the target's decodes (an MTP head) follow them while a
        generation drafts with them, and rest during others (plain decoding is then timed without them)."""
        asked = leaves(drafter) if drafter is not None else []
        for (name, at), source in self._sources.items():
            follow = registry.kind(name).follow
            if at == slot and follow is not None:
                follow(source, source in asked)

    @staticmethod
    def catch_up(policy: DraftPolicy) -> CatchUp:
        """Under auto, a draft's cache that fell far behind catches up on a window of the text, sized
        by what feeding costs; under a fixed k or llama.cpp's rule, on all of it, as llama.cpp does."""
        return "window" if isinstance(policy, AutoK) else "all"

    def policy(self, k: int | str) -> FixedK | PMinPolicy | AutoK:
        """One policy per k for the session's life: what auto has learned (costs, acceptance,
        that a draft is too slow) carries over to the next generation, chat turn or bench prompt."""
        k = parse_k(k)
        if k not in self._policies:
            if k == "auto":
                self._policies[k] = AutoK(self.verify_costs())
            elif k == "llama.cpp":
                self._policies[k] = PMinPolicy()
            else:
                self._policies[k] = FixedK(int(k))
        return self._policies[k]

    def verify_costs(self) -> list[float]:
        """The target's decode time per batch width: as an earlier run with this set-up left it
        (if a spot check agrees), or measured now."""
        if self._verify_costs is None:
            kept = cost_cache.load(self.costs_key)
            if kept and verify_costs_hold(self.target, kept):
                self._verify_costs = kept
            else:
                self._verify_costs = measure_verify_costs(self.target)
                cost_cache.save(self.costs_key, self.config.target, self._verify_costs)
        return self._verify_costs

    def _costs_key(self) -> str:
        c = self.config
        # Layers on other machines or split another way decode at other costs; a local set-up keeps its old key.
        placement: dict[str, str | int] = {"rpc": ",".join(c.rpc)} if c.rpc else {}
        placement |= {"tensor_split": ",".join(map(str, c.tensor_split))} if c.tensor_split else {}
        placement |= {"n_ubatch": c.n_ubatch} if c.n_ubatch else {}  # smaller micro-batches verify at other costs
        return cost_cache.setup_key(
            c.target,
            threads=self.target.n_threads,
            n_gpu_layers=c.n_gpu_layers,
            flash_attn=c.flash_attn,
            repack=c.repack,
            n_batch=self.target.n_batch,
            n_ctx=self.target.n_ctx,
            **placement,
        )  # a small context caps the widths measured

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
        the `Stats`. For this generation only: `plain` decodes without drafting, through
        the same loop; `k` overrides the session's draft length ("auto", "llama.cpp" or a
        number); `sampler` replaces the session's sampler settings and `seed` their seed;
        `grammar` (a `specrun.Grammar`: `grammar_from_json_schema`, `grammar_from_gbnf`)
        holds the output to it; with `logprobs` (0 to 20) each TokenEvent carries its token's
        log-probability in the target's row and that many of the row's likeliest tokens with
        theirs. Stopping early is safe: the generator rolls the caches back when it is closed
        (`contextlib.closing`, or garbage collection).
        """
        generator, tokens = self._prepared(prompt, max_tokens, plain, k, seed, sampler, grammar, logprobs=logprobs)
        return generator.generate(tokens, max_tokens)

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
        """Generate a continuation of `prompt` in one call: its text, token ids and stats.

        The arguments are `stream`'s. The text is decoded from all the tokens at once, so a
        character split across tokens comes out whole.
        """
        generator, tokens = self._prepared(prompt, max_tokens, plain, k, seed, sampler, grammar)
        run = generator.run(tokens, max_tokens)
        return Generation(self.detokenize(run.tokens), run.tokens, run.stats)

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
        stream (`best_slot`). `grammar`: one for all, or one per prompt.
        Returned in the prompts' order."""
        grammars = [grammar] * len(prompts) if grammar is None or isinstance(grammar, Grammar) else list(grammar)
        if len(grammars) != len(prompts):
            raise SpecrunError(f"{len(grammars)} grammars for {len(prompts)} prompts: give one for all, or one per prompt")
        prepared = [self._prepared(prompt, max_tokens, plain, k, seed, sampler, None)[1] for prompt in prompts]
        batch, free, done = self.batch(), list(range(self.config.parallel)), {}
        waiting = list(range(len(prepared)))
        while waiting or batch.streams:
            while waiting and free:
                index = waiting.pop(0)
                slot = self.best_slot(prepared[index], free)
                free.remove(slot)
                generator = self._prepared(prepared[index], max_tokens, plain, k, seed, sampler, grammars[index], slot)[0]

                def finished(run: RunResult, index: int = index, slot: int = slot) -> None:
                    done[index] = run
                    free.append(slot)

                batch.add(generator, prepared[index], max_tokens, on_done=finished)
            batch.step()
        return [Generation(self.detokenize(done[i].tokens), done[i].tokens, done[i].stats) for i in range(len(prepared))]

    def batch(self) -> Batch:
        """Streams on this session's slots, verified together; a draft under auto has its rows
        priced by the verify costs auto keeps refining."""
        return Batch(self.target, self._auto_costs)

    def _auto_costs(self) -> list[float]:
        auto = self.policy("auto")
        assert isinstance(auto, AutoK)
        return auto.costs

    def best_slot(self, tokens: Sequence[int], free: Sequence[int]) -> int:
        """Of the free streams, the one to run `tokens` on. Where streams lend one another the cells
        of a prefix they share (a system prompt), that prefix costs nothing on any of them: the one
        that throws away least of what it holds (another conversation's turns) is taken, the longest
        shared prefix breaking ties. Otherwise the one sharing the longest prefix, as llama-server
        picks a slot."""
        held = {slot: self.target.sequence(slot).tokens for slot in free}
        shared = {slot: common_prefix(held[slot], tokens) for slot in free}
        if self.target.shares_prefixes:
            return min(free, key=lambda slot: (len(held[slot]) - shared[slot], -shared[slot]))
        return max(free, key=lambda slot: (shared[slot], shared[slot] - len(held[slot])))

    def _prepared(
        self,
        prompt: str | Sequence[int],
        max_tokens: int,
        plain: bool,
        k: int | str | None,
        seed: int | None,
        sampler: SamplerSettings | None,
        grammar: Grammar | None,
        slot: int = 0,
        logprobs: int | None = None,
    ) -> tuple[Generator, list[int]]:
        check(max_tokens=max_tokens)
        if isinstance(prompt, str) and not prompt.strip():
            raise SpecrunError("the prompt is empty: give some text to continue")  # not "continue the start token"
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        settings = sampler or self.config.sampler
        if seed is not None:
            settings = replace(settings, seed=seed)
        return self.generator(plain=plain, policy=k, sampler=settings, grammar=grammar, slot=slot, logprobs=logprobs), tokens
