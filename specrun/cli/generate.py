"""`specrun generate`: one prompt, streamed, with speculative statistics."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from specrun.bench.prompts import Prompt, load_prompt_file, render
from specrun.chat.formats import choose_format
from specrun.cli import options as o
from specrun.cli.app import app, err_console
from specrun.core.events import TokenEvent
from specrun.errors import SpecrunError
from specrun.files import read_text
from specrun.grammar.schemas import Grammar, grammar_from_gbnf, grammar_from_json_schema
from specrun.session import Session
from specrun.settings import check

PromptArg = Annotated[Optional[str], typer.Argument(help="Text to continue (default: --prompt-file, else standard input).")]
PromptFile = Annotated[
    Optional[Path],
    typer.Option("--prompt-file", "-f", help="Read the prompt from a file (default: PROMPT, else standard input)."),
]
ComparePlain = Annotated[bool, typer.Option("--compare-plain", help="Also decode plainly; report speed-up and match.")]
JsonSchema = Annotated[
    Optional[Path], typer.Option("--json-schema", help="Hold the output to the JSON schema in FILE (default: free text).")
]
GrammarFile = Annotated[
    Optional[Path],
    typer.Option("--grammar", help="Hold the output to the GBNF grammar in FILE, llama.cpp's format (default: free text)."),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of streaming text.")]
Batch = Annotated[
    Optional[Path],
    typer.Option(
        "--batch",
        help="Continue every prompt of FILE (.txt: one a line; .jsonl: prompt or messages, and a schema) and print one JSON line each, in order (default: one prompt, PROMPT).",
    ),
]
Parallel = Annotated[
    int, typer.Option("--parallel", "-np", help="With --batch: prompts run at once, each with --ctx-size tokens of context.")
]


@app.command()
@o.model_options
def generate(
    prompt: PromptArg = None,
    prompt_file: PromptFile = None,
    lookup: o.Lookup = False,
    k: o.K = "auto",
    max_tokens: o.MaxTokens = 256,
    compare_plain: ComparePlain = False,
    json_schema: JsonSchema = None,
    grammar_file: GrammarFile = None,
    as_json: AsJson = False,
    batch: Batch = None,
    parallel: Parallel = 4,
    *,
    model: o.ModelOptions,
) -> None:
    """Continue PROMPT with the target, drafting by --draft model and/or --lookup."""
    check(max_tokens=max_tokens, parallel=parallel)
    grammar = read_grammar(json_schema, grammar_file)  # before minutes of model loading
    if batch is not None:
        if prompt is not None or prompt_file is not None or compare_plain:
            raise SpecrunError("--batch reads its prompts from FILE: leave out PROMPT, --prompt-file and --compare-plain")
        return generate_batch(load_prompt_file(batch), model, lookup, k, max_tokens, grammar, parallel)
    text = o.read_prompt(prompt, prompt_file)
    with Session(model.session_config(lookup, k)) as session:
        if session.drafter is None:  # --draft mtp drafts without a draft model
            err_console.print("[dim]no --draft or --lookup: plain decoding[/]")
        result = _continue(
            session, session.prompt_tokens(text), max_tokens, grammar, stream=not as_json, compare_plain=compare_plain
        )
    if as_json:
        print(json.dumps(result))
    else:
        _report(result)


def _continue(
    session: Session, tokens: list[int], max_tokens: int, grammar: Grammar | None, *, stream: bool, compare_plain: bool
) -> dict[str, Any]:
    """Generate once (streaming the text to stdout when `stream`), and plainly too if asked: the JSON result."""
    spec = session.engine(grammar=grammar).run(tokens, max_tokens, _echo if stream else None)
    if stream:
        sys.stdout.write("\n")
    result: dict[str, Any] = spec.to_dict()
    if compare_plain:
        plain = session.engine(plain=True, grammar=grammar).run(tokens, max_tokens)
        result["plain"] = {**plain.to_dict(), "tokens_per_s": plain.stats.tokens_per_s}
        result["speedup"] = spec.stats.tokens_per_s / plain.stats.tokens_per_s if plain.stats.tokens_per_s else 0.0
        result["matches_plain"] = plain.tokens == spec.tokens
    return result


def generate_batch(
    prompts: list[Prompt], model: o.ModelOptions, lookup: bool, k: str, max_tokens: int, grammar: Grammar | None, parallel: int
) -> None:
    """Every prompt, `parallel` at a time in one batch; one JSON line per prompt on stdout."""
    config = replace(model.session_config(lookup, k), parallel=parallel, n_ctx=model.ctx_size * parallel)
    grammars = [grammar_from_json_schema(p.schema) if p.schema is not None else grammar for p in prompts]
    with Session(config) as session:
        fmt = choose_format(session.target_model, None)
        results = session.generate_many([render(p, fmt) for p in prompts], max_tokens, grammar=grammars)
    for index, (source, result) in enumerate(zip(prompts, results)):
        print(json.dumps({"index": index, "source": source.source, **result.to_dict()}))


def read_grammar(json_schema: Path | None, grammar_file: Path | None) -> Grammar | None:
    """The grammar --json-schema or --grammar names, read and checked."""
    if json_schema is not None and grammar_file is not None:
        raise SpecrunError("give either --json-schema or --grammar, not both")
    if grammar_file is not None:
        return grammar_from_gbnf(read_text(grammar_file, "--grammar"))
    if json_schema is None:
        return None
    try:
        schema = json.loads(read_text(json_schema, "--json-schema"))
    except json.JSONDecodeError as exc:
        raise SpecrunError(
            f"--json-schema {json_schema}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
        ) from None
    try:
        return grammar_from_json_schema(schema)
    except SpecrunError as exc:
        raise SpecrunError(f"--json-schema {json_schema}: {exc}") from None


def _echo(event: TokenEvent) -> None:
    sys.stdout.write(event.text)
    sys.stdout.flush()


def _report(result: dict) -> None:
    s = result["stats"]
    err_console.print(
        f"[dim]{s['tokens']} tokens in {s['steps']} steps, {s['tokens_per_s']:.1f} tok/s; "
        f"accepted {s['accepted']}/{s['drafted']} drafts ({100 * s['acceptance_rate']:.0f}%), "
        f"{s['tokens_per_step']:.2f} tokens/step; prompt {s['prompt_tokens']} tokens in "
        f"{s['prefill_s']:.2f}s; stop: {s['stop_reason']}[/]"
    )
    if "plain" in result:
        match = "identical" if result["matches_plain"] else "different"
        err_console.print(
            f"[dim]plain: {result['plain']['tokens_per_s']:.1f} tok/s; speed-up {result['speedup']:.2f}x; output {match}[/]"
        )
