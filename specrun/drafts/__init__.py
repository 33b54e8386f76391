"""Draft sources, one module each, behind the contract in base.py (`DraftSource`).

- base: the contract (`DraftRequest`, `Draft`, `DraftDecode`, `DraftSource`) and `Chain`, which asks several in turn.
- registry: sources by name (`register`), and what a builder gets (`SourceSite`).
- lookup: n-grams copied from the generation's own context (prompt lookup).
- store_lookup: what earlier requests' prompts and outputs went on with (the session's `store.NgramStore`).
- model: a second, smaller GGUF (`--draft PATH`); translated, with bridge and text, when its vocabulary is another.
- feeding: what every source with a model shares: the cost of feeding its cache, picking a token, the drafting loop.
- mtp: the target's own multi-token-prediction (NextN) layers (`--draft mtp`).
- eagle3: an EAGLE-3 drafter, trained to read the target's features (`--draft FILE`).
- dflash: a DFlash or DSpark drafter, which reads them too and drafts a whole block in one decode (`--draft FILE`).
- suffix: copies from the longest earlier match of the text's end.
- grammar: what a grammar forces.

A session's chain asks, in order: prompt lookup, the store, the sources its settings name
(`SessionConfig.sources`), then a draft model; a grammar's forced text goes first of all.
"""

from specrun.drafts import dflash, eagle3, lookup, model, mtp, store_lookup, suffix  # noqa: F401  (each registers itself)
