"""Plain-text rendering of pair results (the CLI prints these lines on stdout)."""

from __future__ import annotations

from specrun.core.policy import AUTO_ROLLBACK
from specrun.headers.arch import HEADS, Traits, state_bytes
from specrun.headers.read import ModelFacts
from specrun.hub.memory import format_bytes
from specrun.hub.stores.base import SOURCE_LABELS
from specrun.pair.check import DEFAULT_CTX, PairCheck, snapshot_copies, traits_of
from specrun.pair.cost import MODEL_ASSUMPTIONS, DecodeCost, decode_cost, mtp_cost
from specrun.pair.derive import DerivedDraft, describe_layers
from specrun.pair.make import MEASURED
from specrun.pair.mtp import MTP_SPEC, UNMEASURED, MtpCheck, OwnHeads
from specrun.pair.sources import Known
from specrun.pair.suggest import Suggestion, known_traits


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def human_count(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(int(n))


def model_line(role: str, model: ModelFacts) -> str:
    v = model.vocab
    vocab = f"{v.vocab_type} vocabulary of {v.n_tokens} tokens"
    if not model.tensors:
        return f"{role:<7} {model.source}\n        {model.arch}, vocab only (no weights), {vocab}"
    return (
        f"{role:<7} {model.source}\n        {model.arch}, {human_count(model.n_params)} params, "
        f"{human_bytes(model.file_size)}, {model.n_layers} layers, {vocab}"
    )


def cost_line(role: str, cost: DecodeCost) -> str:
    tied = ", tied to token_embd" if cost.head_tied else ""
    return (
        f"  {role:<7} {human_bytes(cost.per_token_bytes)} read per token: layers "
        f"{human_bytes(cost.layer_bytes)} + output head {human_bytes(cost.head_bytes)}{tied}"
    )


def trait_lines(traits: Traits) -> list[str]:
    """What a model is for drafting (its MTP heads, its recurrent state), under its model line."""
    return [f"        {note}" for note in traits.notes()]


def check_lines(result: PairCheck) -> list[str]:
    lines = [
        model_line("target", result.target),
        *trait_lines(result.target_traits),
        model_line("draft", result.draft),
        *trait_lines(result.draft_traits),
        "",
    ]
    if result.compat.ok:
        lines.append("compatible: yes (llama.cpp's rule: vocab type, bos/eos, sizes within 128, token text from id 5)")
    else:
        lines.append("compatible: no, by llama.cpp's rule; specrun drafts translated, through text")
        lines += [f"  - {problem}" for problem in result.compat.problems]
    lines += [f"  note: {note}" for note in result.compat.notes]
    lines += translation_lines(result)
    lines.append("")
    lines += ratio_lines(result) if result.has_weights else []
    lines += [
        f"acceptance {result.prior.alpha:.0%} assumed: {result.prior.why}",
        f"verdict    {result.verdict}",
    ]
    lines += [f"warning    {w}" for w in result.warnings()]
    lines.append(f"cost model {MODEL_ASSUMPTIONS}")
    return lines


def translation_lines(result: PairCheck) -> list[str]:
    if not result.translated:
        return []
    t = result.translation
    if t is None:
        return ["translated: how the vocabularies line up is read when both files are on disk (`specrun pull` them)"]
    o = t.overlap
    return [
        f"translated: {o.draft_share:.0%} of the draft's {o.draft_tokens} text tokens have a target token with the "
        f"same bytes; {o.target_share:.0%} of the target's {o.target_tokens} have a draft token",
        f"  sample text: {t.target_tokens} target tokens, {t.draft_tokens} draft tokens "
        f"({t.draft_per_target:.2f} per target token), {t.shared_boundaries} token ends in common",
    ]


def ratio_lines(result: PairCheck) -> list[str]:
    t, d = result.target, result.draft
    return [
        f"params     draft/target {result.param_ratio:.2f} ({human_count(d.n_params)} / {human_count(t.n_params)})",
        f"file size  draft/target {result.size_ratio:.2f} ({human_bytes(d.file_size)} / {human_bytes(t.file_size)})",
        f"cost       draft/target {result.cost_ratio:.2f} (bytes of weights read per target token drafted)",
        cost_line("target", result.target_cost),
        cost_line("draft", result.draft_cost),
        memory_line(result),
        *fit_lines(result),
    ]


def memory_line(result: PairCheck | MtpCheck) -> str:
    total = result.memory_bytes
    if total is None and result.state_memory_bytes is None:
        return f"memory     unknown: {unknown_state(result)}"
    if total is None:
        return "memory     unknown (the headers lack the attention shape for the KV cache)"
    weights = result.target.file_size + (result.draft.file_size if isinstance(result, PairCheck) else 0)
    states = result.state_memory_bytes or 0
    state = f" + recurrent state {human_bytes(states)} ({state_copies(result)})" if states else ""
    return (
        f"memory     {human_bytes(total)} together: weights {human_bytes(weights)} + f16 KV "
        f"caches at {result.n_ctx} tokens {human_bytes(total - weights - states)}{state} "
        "(plus compute buffers)"
    )


def unknown_state(result: PairCheck | MtpCheck) -> str:
    models = [result.target] + ([result.draft] if isinstance(result, PairCheck) else [])
    unknown = ", ".join(sorted({m.arch for m in models if state_bytes(m.meta) is None}))
    return f"specrun does not know the size of the recurrent state of {unknown} models"


def state_copies(result: PairCheck | MtpCheck) -> str:
    """Which copies of the recurrent states the memory counts, and their size."""
    parts = []
    target = state_bytes(result.target.meta)
    if target:
        copies = snapshot_copies(traits_of(result.target), result.rollback)
        snapshots = f": one, and a snapshot for each of {result.rollback} drafted tokens" if copies > 1 else ""
        parts.append(f"target {copies} x {human_bytes(target)}{snapshots}")
    draft = state_bytes(result.draft.meta) if isinstance(result, PairCheck) else 0
    if draft:
        parts.append(f"draft 2 x {human_bytes(draft)}: one, and specrun's checkpoint")
    return "; ".join(parts)


def mtp_check_lines(result: MtpCheck) -> list[str]:
    """`pair check TARGET mtp`: the target, what its MTP layers cost, the memory, the verdict."""
    cost = result.cost_ratio
    lines = [
        model_line("target", result.target),
        *trait_lines(traits_of(result.target)),
        "draft   mtp: the target's own MTP layers (--draft mtp), no second model",
        "",
    ]
    if cost is not None:
        lines += [
            f"cost       MTP/target {cost:.2f} (bytes of weights read per token drafted)",
            cost_line("target", decode_cost(result.target)),
            cost_line("MTP", mtp_cost(result.target)),
            memory_line(result),
            *fit_lines(result),
        ]
    if result.acceptance is not None:
        lines.append(f"acceptance {result.acceptance:.0%} given")
    lines += [f"verdict    {result.verdict}", f"cost model {MODEL_ASSUMPTIONS}"]
    return lines


def fit_lines(result: PairCheck | MtpCheck) -> list[str]:
    if result.fits is None or result.budget is None:
        return []
    free = f"{format_bytes(result.budget.bytes)} free in {result.budget.where}"
    if result.fits:
        return [f"fits       yes: {free}"]
    return [f"fits       no: {free}; pick smaller quants, a shorter --ctx, or add RPC servers (--rpc)"]


def derive_lines(derived: DerivedDraft, result: PairCheck) -> list[str]:
    kept = describe_layers(list(derived.layers))
    lines = [
        f"wrote {derived.path} ({human_bytes(result.draft.file_size)}): layers {kept} "
        f"of the target's 0-{derived.n_target_layers - 1}, loaded by llama.cpp",
        f"use it with: specrun generate --target {result.target.source} --draft {derived.path}",
        "",
        f"cost       draft/target {result.cost_ratio:.2f} (bytes of weights read per token)",
        cost_line("target", result.target_cost),
        cost_line("draft", result.draft_cost),
        f"verdict    {result.verdict}",
    ]
    lines += [f"warning    {w}" for w in result.warnings()]
    if result.prior.why != MEASURED:
        lines.append(
            "acceptance of a layer subset is not predictable from its size: measure "
            "it with --auto or specrun generate --compare-plain"
        )
    return lines


def target_lines(target: Known) -> list[str]:
    """The target as far as it is known, and from where, and what it is for drafting."""
    where = f", on disk in {SOURCE_LABELS[target.store]}" if target.store else ""
    traits = trait_lines(known_traits(target))
    if target.facts is not None:
        unconverted = (
            ["        its profile lists MTP heads, but this GGUF has none: it was converted without them"]
            if target.profile and target.profile.mtp == HEADS and known_traits(target).mtp != HEADS
            else []
        )
        return [model_line("target", target.facts), f"        known from its {target.evidence}{where}", *traits, *unconverted]
    profile = target.profile
    assert profile is not None  # locate answers with a header or a profile
    return [
        f"target  {target.spec}",
        f"        known from its profile: {profile.family} family, {human_count(profile.params)} params, "
        f"tokenizer {profile.tokenizer}; no file on disk and no header read",
        *traits,
    ]


def suggest_lines(target: Known, own: OwnHeads | None, found: list[Suggestion]) -> list[str]:
    lines = [*target_lines(target), ""]
    if not known_traits(target).speculates:
        lines.append("no draft can work for it: llama.cpp cannot roll its recurrent state back")
        return lines
    if not found and own is None:
        lines.append(
            "no draft cheaper than the target was found (try without --offline, or `specrun pair derive` for a layer subset)"
        )
        return lines
    lines.append(
        f"{'#':>2}  {'speed-up':>8}  {'k':>2}  {'cost':>5}  {'accept':>6}  "
        f"{'memory':>10}  {'evidence':<13}  {'on disk':<9}  draft (origin)"
    )
    if own is not None:
        lines.append(own_heads_row(own))
    for rank, s in enumerate(found, 1 + (own is not None)):
        k, speedup = s.best or (0, 0.0)
        memory = s.memory_bytes
        on_disk = s.draft.store or ("file" if s.draft.path else "-")
        lines.append(
            f"{rank:>2}  {speedup:>7.2f}x  {k:>2}  {s.cost_ratio:>5.2f}  "
            f"{s.prior.alpha:>6.0%}  {human_bytes(memory) if memory else '?':>10}  "
            f"{s.evidence:<13}  {on_disk:<9}  {s.spec} ({s.origin}{', translated' if s.translated else ''})"
        )
        lines += [f"      {w}" for w in (s.check.warnings() if s.check else [])]
    lines += [
        "",
        "speed-up is predicted, not measured: cost = draft/target bytes read per token (from "
        "the headers) or parameters read per token (evidence: profile, no file read), accept = assumed "
        f"acceptance by family, memory = both models + f16 KV caches at {DEFAULT_CTX} tokens + recurrent "
        f"states, a hybrid target's with a snapshot per token of the longest draft --k auto grants ({AUTO_ROLLBACK})",
        f"cost model {MODEL_ASSUMPTIONS}",
    ]
    if own is not None:
        lines.append(f"mtp: the target's own MTP layers draft (--draft mtp); {UNMEASURED}")
    return lines


def own_heads_row(own: OwnHeads) -> str:
    check = own.check
    cost = f"{check.cost_ratio:>5.2f}" if check and check.cost_ratio is not None else f"{'?':>5}"
    memory = check.memory_bytes if check else None
    on_disk = own.target.store or ("file" if own.target.path else "-")
    return (
        f"{1:>2}  {'-':>8}  {'-':>2}  {cost}  {'-':>6}  {human_bytes(memory) if memory else '?':>10}  "
        f"{own.target.evidence:<13}  {on_disk:<9}  {MTP_SPEC} (the target's own MTP layers)"
    )


def auto_lines(measured: list) -> list[str]:
    """The --auto measurements, best first, and what they mean."""
    if not measured:
        return []
    ranked = sorted(measured, key=lambda m: -m.speedup)
    names = [describe_layers(list(m.layers)) for m in ranked]
    width = max(6, *(len(n) for n in names))
    lines = [f"{'layers':<{width}} {'accept':>6} {'cost':>5} {'bytes':>5} {'k':>2} {'predicted':>9}"]
    lines += [
        f"{name:<{width}} {m.acceptance:>6.0%} {m.cost_ratio:>5.2f} {m.bytes_ratio:>5.2f} {m.k:>2} {m.speedup:>8.2f}x"
        for name, m in zip(names, ranked)
    ]
    best = ranked[0]
    if best.speedup < 1:
        lines.append(
            f"no layer subset beats the target alone on the sample prompts; wrote the "
            f"best one ({best.speedup:.2f}x predicted) so you can measure it yourself"
        )
    lines += [
        "accept = greedy agreement with the target along its own output (teacher-forced); "
        "cost = measured one-token step time, draft/target (noisy on a busy machine); "
        "bytes = weights read per token, draft/target",
        "",
    ]
    return lines
