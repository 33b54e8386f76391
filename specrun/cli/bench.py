"""`specrun bench`: plain decoding against speculative methods on a set of prompts."""

from __future__ import annotations

import dataclasses
import json
import secrets
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specrun import __version__
from specrun.backend import system_info
from specrun.bench import export, view
from specrun.bench import parallel as parallel_bench
from specrun.bench import prompts as prompt_files
from specrun.bench.methods import (
    NEEDS_DRAFT_MODEL,
    NEEDS_STORE,
    PLAIN,
    Variant,
    method_names,
    parse_k_values,
    parse_methods,
    plan_variants,
    sources_of,
)
from specrun.bench.plot import check_plot_path, save_plot
from specrun.bench.results import SPEEDUP_DEFINITION, TOKENS_PER_S_DEFINITION, Results
from specrun.bench.runner import measure, tokenize_all
from specrun.chat.formats import choose_format
from specrun.cli import options as o
from specrun.cli.app import app, err_console
from specrun.config import SessionConfig
from specrun.core.sampling import Penalties
from specrun.drafts.store import DEFAULT_LIMIT
from specrun.errors import SpecrunError
from specrun.files import check_writable, write_text_atomic
from specrun.grammar.schemas import grammar_from_json_schema
from specrun.session import Session
from specrun.settings import check


@dataclass(frozen=True)
class Defaults:
    """What an option left out means: the built-in sets must finish in a few minutes on 2 cores."""

    k: str
    max_tokens: int
    repeat: int


BUILTIN_DEFAULTS = Defaults(k="4,8,auto", max_tokens=96, repeat=1)
FILE_DEFAULTS = Defaults(k="2,4,8,16,auto", max_tokens=128, repeat=1)
DEFAULT_METHODS = "plain,lookup,draft"

KList = Annotated[
    Optional[str],
    typer.Option(
        "--k",
        help="Comma list of draft lengths, 'auto' and 'llama.cpp' (default 4,8,auto on built-in sets, 2,4,8,16,auto on a file).",
    ),
]
Prompts = Annotated[
    Optional[Path],
    typer.Argument(help="Prompts: .txt (one per line, or blocks split by ---) or .jsonl (default: the built-in sets)."),
]
PromptSet = Annotated[
    Optional[str],
    typer.Option(
        "--set",
        help=f"Built-in sets instead of PROMPTS: {', '.join(prompt_files.BUILTIN_SETS)} (structured: held to JSON schemas; default: {','.join(prompt_files.DEFAULT_SETS)}).",
    ),
]
Methods = Annotated[
    Optional[str],
    typer.Option(
        "--methods",
        help=f"Comma list of {', '.join(method_names())} (default plain,lookup,draft; draft: the --draft model; hybrid: lookup, then the draft; store: lookup, then n-grams of the earlier prompts and outputs of the run; any other: that registered source alone).",
    ),
]
MaxTokens = Annotated[
    Optional[int], typer.Option("--max-tokens", "-n", help="Tokens per run (default 96 on built-in sets, 128 on a file).")
]
Repeat = Annotated[
    Optional[int], typer.Option("--repeat", help="Timed runs per prompt and method; tok/s is their median (default 1).")
]
Warmup = Annotated[int, typer.Option("--warmup", help="Untimed rounds of every method on the first prompt.")]
JsonOut = Annotated[Optional[Path], typer.Option("--json", help="Write every number as JSON to FILE (default: none).")]
CsvOut = Annotated[Optional[Path], typer.Option("--csv", help="Write one row per prompt x method x k to FILE (default: none).")]
PlotOut = Annotated[
    Optional[Path],
    typer.Option(
        "--plot", help="Save acceptance and speed-up charts to FILE (.png, .svg, ...; needs the plot extra; default: none)."
    ),
]
Parallel = Annotated[
    int,
    typer.Option(
        "--parallel",
        "-np",
        help="Run the prompts N at a time, as a server with N slots does, and report aggregate tok/s and latency percentiles (each with --ctx-size tokens; default 1: one at a time, per prompt).",
    ),
]


@dataclass(frozen=True)
class Outputs:
    """The files a bench writes besides its table."""

    json: Path | None
    csv: Path | None
    plot: Path | None

    def check(self) -> None:
        for path, option in ((self.json, "--json"), (self.csv, "--csv"), (self.plot, "--plot")):
            if path is not None:
                check_writable(path, option)
        if self.plot is not None:
            check_plot_path(self.plot)


@dataclass(frozen=True)
class Plan:
    """What a bench runs: the prompts, each method at each k, and how often."""

    prompts: list[prompt_files.Prompt]
    source_name: str  # where the prompts came from
    methods: list[str]
    ks: list[int | str]
    max_tokens: int
    repeat: int
    warmup: int

    @property
    def variants(self) -> list[Variant]:
        return plan_variants(self.methods, self.ks)


@app.command()
@o.model_options
def bench(
    prompts: Prompts = None,
    prompt_set: PromptSet = None,
    methods: Methods = None,
    k: KList = None,
    max_tokens: MaxTokens = None,
    repeat: Repeat = None,
    warmup: Warmup = 1,
    store_tokens: o.StoreTokens = DEFAULT_LIMIT,
    json_out: JsonOut = None,
    csv_out: CsvOut = None,
    plot_out: PlotOut = None,
    parallel: Parallel = 1,
    *,
    model: o.ModelOptions,
) -> None:
    """Measure speculative decoding against plain decoding on your prompts (or built-in sets)."""
    defaults = FILE_DEFAULTS if prompts else BUILTIN_DEFAULTS
    max_tokens = defaults.max_tokens if max_tokens is None else max_tokens
    repeat = defaults.repeat if repeat is None else repeat
    check(max_tokens=max_tokens, repeat=repeat, warmup=warmup, store_tokens=store_tokens, parallel=parallel)
    SessionConfig.check_settings({"parallel": parallel, "n_ctx": model.ctx_size * parallel})  # before any note
    if model.source:
        raise SpecrunError(f"bench measures a source as a method: give --methods plain,{model.source[0]} instead of --source")
    if parallel > 1 and (csv_out or plot_out or repeat > 1):
        raise SpecrunError("--parallel reports one pass of all prompts per method: leave out --csv, --plot and --repeat")
    ks = parse_k_values(k or defaults.k)
    loaded, source_name = _load_prompts(prompts, prompt_set)
    outputs = Outputs(json_out, csv_out, plot_out)
    outputs.check()
    plan = Plan(loaded, source_name, _methods(methods, model.draft), ks, max_tokens, repeat, warmup)
    if model.temp > 0 and model.seed is None:
        model = dataclasses.replace(model, seed=secrets.randbelow(2**31))  # one seed, shared by every method and recorded
    _run(plan, _session_config(model, plan.methods, store_tokens, parallel), outputs)


def _session_config(model: o.ModelOptions, methods: list[str], store_tokens: int, parallel: int) -> SessionConfig:
    """The session every method runs on: the draft, the store and the sources the methods ask for."""
    uses_store = bool(NEEDS_STORE & set(methods))
    if uses_store and store_tokens < 1:
        raise SpecrunError(f"--methods includes store but --store-tokens is {store_tokens}: give it 1 or more")
    config = model.session_config(
        store_tokens=store_tokens if uses_store else 0,
        use_draft=bool(NEEDS_DRAFT_MODEL & set(methods)),
        sources=sources_of(methods),
    )
    return dataclasses.replace(config, parallel=parallel, n_ctx=model.ctx_size * parallel) if parallel > 1 else config


def _run(plan: Plan, config: SessionConfig, outputs: Outputs) -> None:
    s = config.sampler
    penalties = (
        f", penalties: repeat {s.repeat_penalty:g}, frequency {s.frequency_penalty:g}, presence {s.presence_penalty:g} "
        f"over the last {s.repeat_last_n} tokens"
        if Penalties.of(s)
        else ""
    )
    bias = f", logit bias on {len(s.logit_bias)} tokens" if s.logit_bias else ""
    bias += ", end of generation banned" if s.ignore_eos else ""
    bias += f", XTC {s.xtc_probability:g} at {s.xtc_threshold:g}" if s.xtc else ""
    err_console.print(
        f"[dim]bench: {len(plan.prompts)} prompts ({plan.source_name}) x {', '.join(v.label for v in plan.variants)}; "
        f"max {plan.max_tokens} tokens, repeat {plan.repeat}, warmup {plan.warmup}, "
        f"{'greedy' if s.deterministic else f'temperature {s.temperature}, seed {s.seed}'}{penalties}{bias}[/]"
    )
    with Session(config) as session:
        texts = _render_all(plan.prompts, session)
        token_lists = tokenize_all(session, texts, [p.source for p in plan.prompts])
        grammars = [grammar_from_json_schema(p.schema) if p.schema is not None else None for p in plan.prompts]
        if config.parallel > 1:
            return _run_parallel(session, plan, token_lists, grammars, outputs.json)
        results = Results(plan.variants, len(plan.prompts))
        runs = measure(session, token_lists, plan.variants, s, plan.max_tokens, plan.repeat, plan.warmup, grammars)
        with closing(runs):
            _run_with_progress(runs, results, len(plan.prompts) * plan.repeat * len(plan.variants), plan.prompts, plan.warmup)
    meta = [{"source": p.source, "group": p.group, "prompt_tokens": len(t)} for p, t in zip(plan.prompts, token_lists)]
    document = export.build_document(results, _config_record(config, plan), meta)
    view.show(document, Console())
    _write_outputs(document, outputs)


def _run_parallel(session: Session, plan: Plan, token_lists: list, grammars: list, json_out: Path | None) -> None:
    served = parallel_bench.serve_all(session, token_lists, plan.variants, session.config.sampler, plan.max_tokens, grammars)
    Console().print(parallel_bench.table(served, session.config.parallel))
    if json_out is not None:
        runs = parallel_bench.as_json(served)
        write_text_atomic(json_out, json.dumps({"parallel": session.config.parallel, "runs": runs}, indent=1))


def _methods(text: str | None, draft: str | None) -> list[str]:
    """Parsed --methods; `draft` without --draft is an error if asked for, skipped if defaulted."""
    names = parse_methods(text or DEFAULT_METHODS)
    if draft is None and NEEDS_DRAFT_MODEL & set(names):
        if text is not None:
            asked = ", ".join(sorted(NEEDS_DRAFT_MODEL & set(names)))
            raise SpecrunError(f"--methods includes {asked} but no --draft was given: pass a draft model or drop {asked}")
        err_console.print("[dim]no --draft: skipping the draft method[/]")
        names = [name for name in names if name not in NEEDS_DRAFT_MODEL]
    return names


def _load_prompts(path: Path | None, prompt_set: str | None) -> tuple[list[prompt_files.Prompt], str]:
    if path is not None and prompt_set is not None:
        raise SpecrunError("give either PROMPTS or --set NAME, not both")
    if path is not None:
        return prompt_files.load_prompt_file(path), str(path)
    names = [n.strip() for n in (prompt_set or ",".join(prompt_files.DEFAULT_SETS)).split(",") if n.strip()]
    return prompt_files.load_builtin(names), "built-in sets: " + ", ".join(names)


def _render_all(loaded: list[prompt_files.Prompt], session: Session) -> list[str]:
    chat_format = choose_format(session.target_model, None)
    if any(p.text is None for p in loaded):
        err_console.print(f"[dim]chat prompts rendered with the {chat_format.name} format ({chat_format.source})[/]")
    return [prompt_files.render(p, chat_format) for p in loaded]


def _run_with_progress(runs, results: Results, total: int, loaded: list, warmup: int) -> None:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err_console) as progress:
        task = progress.add_task("warming up" if warmup else "measuring", total=total)
        for run in runs:
            results.add(run)
            progress.update(task, advance=1, description=f"{loaded[run.prompt_index].source} {run.variant.label}")


def _config_record(config: SessionConfig, plan: Plan) -> dict:
    s = config.sampler
    return {
        "target": str(config.target),
        "draft": str(config.draft) if config.draft else None,
        "methods": [PLAIN, *[m for m in plan.methods if m != PLAIN]],
        "k": plan.ks,
        "temperature": s.temperature,
        "top_n_sigma": s.top_n_sigma,
        "top_k": s.top_k,
        "typical_p": s.typical_p,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "repeat_penalty": s.repeat_penalty,
        "frequency_penalty": s.frequency_penalty,
        "presence_penalty": s.presence_penalty,
        "repeat_last_n": s.repeat_last_n,
        "logit_bias": [f"{token}{bias:+g}" for token, bias in s.logit_bias.items()],  # as --logit-bias takes them
        "ignore_eos": s.ignore_eos,
        "xtc_probability": s.xtc_probability,
        "xtc_threshold": s.xtc_threshold,
        "dynatemp_range": s.dynatemp_range,
        "dynatemp_exponent": s.dynatemp_exponent,
        "seed": s.seed,
        "max_tokens": plan.max_tokens,
        "repeat": plan.repeat,
        "warmup": plan.warmup,
        "n_ctx": config.n_ctx,
        "n_ubatch": config.n_ubatch,
        "threads": config.threads,
        "store_tokens": config.store_tokens,
        "rpc": list(config.rpc),
        "draft_rpc": list(config.draft_rpc),
        "tensor_split": list(config.tensor_split),
        "prompts": plan.source_name,
        "n_prompts": len(plan.prompts),
        "order": "for each prompt and repeat: plain, then every method x k in turn (interleaved)",
        "speedup": SPEEDUP_DEFINITION,
        "tokens_per_s": TOKENS_PER_S_DEFINITION,
        "caches": "target and draft KV caches emptied before every run; the draft model's prompt processing counts as draft time",
        "peak_memory": "peak_rss_mb is the whole process's peak resident memory (ru_maxrss), models included",
        "specrun": __version__,
        "llama_cpp_python": system_info()["llama_cpp_python"],
    }


def _write_outputs(document: dict, outputs: Outputs) -> None:
    if outputs.json is not None:
        write_text_atomic(outputs.json, export.json_text(document), "--json")
    if outputs.csv is not None:
        write_text_atomic(outputs.csv, export.csv_text(document), "--csv")
    if outputs.plot is not None:
        save_plot(document, outputs.plot)
    for path in (outputs.json, outputs.csv, outputs.plot):
        if path is not None:
            err_console.print(f"[dim]wrote {path}[/]")
