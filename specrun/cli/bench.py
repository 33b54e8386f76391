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
from specrun.bench.methods import NEEDS_DRAFT_MODEL, NEEDS_STORE, PLAIN, parse_k_values, parse_methods, plan_variants
from specrun.bench.plot import check_plot_path, save_plot
from specrun.bench.results import SPEEDUP_DEFINITION, TOKENS_PER_S_DEFINITION, Results
from specrun.bench.runner import measure, tokenize_all
from specrun.chat.formats import choose_format
from specrun.cli import options as o
from specrun.cli.app import app, err_console
from specrun.config import SessionConfig
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


@app.command()
@o.model_options
def bench(
    prompts: Annotated[
        Optional[Path],
        typer.Argument(help="Prompts: .txt (one per line, or blocks split by ---) or .jsonl (default: the built-in sets)."),
    ] = None,
    prompt_set: Annotated[
        Optional[str],
        typer.Option(
            "--set",
            help=f"Built-in sets instead of PROMPTS: {', '.join(prompt_files.BUILTIN_SETS)} (structured: held to JSON schemas; default: {','.join(prompt_files.DEFAULT_SETS)}).",
        ),
    ] = None,
    methods: Annotated[
        Optional[str],
        typer.Option(
            "--methods",
            help="Comma list of plain, lookup, draft, hybrid, store (default plain,lookup,draft; draft and hybrid need --draft; store: lookup, then n-grams of the earlier prompts and outputs of the run).",
        ),
    ] = None,
    k: KList = None,
    max_tokens: Annotated[
        Optional[int], typer.Option("--max-tokens", "-n", help="Tokens per run (default 96 on built-in sets, 128 on a file).")
    ] = None,
    repeat: Annotated[
        Optional[int], typer.Option("--repeat", help="Timed runs per prompt and method; tok/s is their median (default 1).")
    ] = None,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed rounds of every method on the first prompt.")] = 1,
    store_tokens: o.StoreTokens = DEFAULT_LIMIT,
    json_out: Annotated[
        Optional[Path], typer.Option("--json", help="Write every number as JSON to FILE (default: none).")
    ] = None,
    csv_out: Annotated[
        Optional[Path], typer.Option("--csv", help="Write one row per prompt x method x k to FILE (default: none).")
    ] = None,
    plot_out: Annotated[
        Optional[Path],
        typer.Option(
            "--plot", help="Save acceptance and speed-up charts to FILE (.png, .svg, ...; needs the plot extra; default: none)."
        ),
    ] = None,
    parallel: Annotated[
        int,
        typer.Option(
            "--parallel",
            "-np",
            help="Run the prompts N at a time, as a server with N slots does, and report aggregate tok/s and latency percentiles (each with --ctx-size tokens; default 1: one at a time, per prompt).",
        ),
    ] = 1,
    *,
    model: o.ModelOptions,
) -> None:
    """Measure speculative decoding against plain decoding on your prompts (or built-in sets)."""
    defaults = FILE_DEFAULTS if prompts else BUILTIN_DEFAULTS
    max_tokens = defaults.max_tokens if max_tokens is None else max_tokens
    repeat = defaults.repeat if repeat is None else repeat
    check(max_tokens=max_tokens, repeat=repeat, warmup=warmup, store_tokens=store_tokens, parallel=parallel)
    SessionConfig.check_settings({"parallel": parallel, "n_ctx": model.ctx_size * parallel})  # before any note
    if parallel > 1 and (csv_out or plot_out or repeat > 1):
        raise SpecrunError("--parallel reports one pass of all prompts per method: leave out --csv, --plot and --repeat")
    ks = parse_k_values(k or defaults.k)
    loaded, source_name = _load_prompts(prompts, prompt_set)
    _check_outputs(json_out, csv_out, plot_out)
    method_names = _methods(methods, model.draft)
    if model.temp > 0 and model.seed is None:
        model = dataclasses.replace(model, seed=secrets.randbelow(2**31))  # one seed, shared by every method and recorded
    uses_store = bool(NEEDS_STORE & set(method_names))
    if uses_store and store_tokens < 1:
        raise SpecrunError(f"--methods includes store but --store-tokens is {store_tokens}: give it 1 or more")
    config = model.session_config(
        store_tokens=store_tokens if uses_store else 0, use_draft=bool(NEEDS_DRAFT_MODEL & set(method_names))
    )
    if parallel > 1:
        config = dataclasses.replace(config, parallel=parallel, n_ctx=model.ctx_size * parallel)
    variants = plan_variants(method_names, ks)
    err_console.print(
        f"[dim]bench: {len(loaded)} prompts ({source_name}) x {', '.join(v.label for v in variants)}; "
        f"max {max_tokens} tokens, repeat {repeat}, warmup {warmup}, "
        f"{'greedy' if model.temp == 0 else f'temperature {model.temp}, seed {model.seed}'}[/]"
    )
    with Session(config) as session:
        texts = _render_all(loaded, session)
        token_lists = tokenize_all(session, texts, [p.source for p in loaded])
        results = Results(variants, len(loaded))
        grammars = [grammar_from_json_schema(p.schema) if p.schema is not None else None for p in loaded]
        if parallel > 1:
            served = parallel_bench.serve_all(session, token_lists, variants, config.sampler, max_tokens, grammars)
            Console().print(parallel_bench.table(served, parallel))
            if json_out is not None:
                write_text_atomic(json_out, json.dumps({"parallel": parallel, "runs": parallel_bench.as_json(served)}, indent=1))
            return
        with closing(measure(session, token_lists, variants, config.sampler, max_tokens, repeat, warmup, grammars)) as runs:
            _run_with_progress(runs, results, len(loaded) * repeat * len(variants), loaded, warmup)
    meta = [{"source": p.source, "group": p.group, "prompt_tokens": len(t)} for p, t in zip(loaded, token_lists)]
    settings = _config_record(config, method_names, ks, max_tokens, repeat, warmup, source_name, len(loaded))
    document = export.build_document(results, settings, meta)
    view.show(document, Console())
    _write_outputs(document, json_out, csv_out, plot_out)


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


def _check_outputs(json_out: Path | None, csv_out: Path | None, plot_out: Path | None) -> None:
    for path, option in ((json_out, "--json"), (csv_out, "--csv"), (plot_out, "--plot")):
        if path is not None:
            check_writable(path, option)
    if plot_out is not None:
        check_plot_path(plot_out)


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


def _config_record(config, methods, ks, max_tokens, repeat, warmup, source_name, n_prompts) -> dict:
    s = config.sampler
    return {
        "target": str(config.target),
        "draft": str(config.draft) if config.draft else None,
        "methods": [PLAIN, *[m for m in methods if m != PLAIN]],
        "k": ks,
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "seed": s.seed,
        "max_tokens": max_tokens,
        "repeat": repeat,
        "warmup": warmup,
        "n_ctx": config.n_ctx,
        "n_ubatch": config.n_ubatch,
        "threads": config.threads,
        "store_tokens": config.store_tokens,
        "rpc": list(config.rpc),
        "draft_rpc": list(config.draft_rpc),
        "tensor_split": list(config.tensor_split),
        "prompts": source_name,
        "n_prompts": n_prompts,
        "order": "for each prompt and repeat: plain, then every method x k in turn (interleaved)",
        "speedup": SPEEDUP_DEFINITION,
        "tokens_per_s": TOKENS_PER_S_DEFINITION,
        "caches": "target and draft KV caches emptied before every run; the draft model's prompt processing counts as draft time",
        "peak_memory": "peak_rss_mb is the whole process's peak resident memory (ru_maxrss), models included",
        "specrun": __version__,
        "llama_cpp_python": system_info()["llama_cpp_python"],
    }


def _write_outputs(document: dict, json_out: Path | None, csv_out: Path | None, plot_out: Path | None) -> None:
    if json_out is not None:
        write_text_atomic(json_out, export.json_text(document), "--json")
    if csv_out is not None:
        write_text_atomic(csv_out, export.csv_text(document), "--csv")
    if plot_out is not None:
        save_plot(document, plot_out)
    for path in (json_out, csv_out, plot_out):
        if path is not None:
            err_console.print(f"[dim]wrote {path}[/]")
