"""Draft sources, one module each, behind the contract in base.py (`DraftSource`).

- base: the contract (`DraftRequest`, `Draft`, `DraftDecode`, `DraftSource`) and `Chain`, which asks several in turn.
- lookup: n-grams copied from the generation's own context (prompt lookup).
- store: what earlier requests' prompts and outputs went on with (the cross-request store).
- model: a smaller model of the target's vocabulary; `FeedCost` and `Picker`, which every model draft uses.
- translated, with bridge and text: a model of another vocabulary, joined to the target through text.
- grammar: what a grammar forces.
- mtp: the target's own multi-token-prediction (NextN) layers.
- registry: sources by name, as a session builds them.

A session's chain asks, in order: prompt lookup, the store, the sources its settings name
(`SessionConfig.sources`), then a draft model; a grammar's forced text goes first of all.
"""

from specrun.drafts import lookup, mtp, store  # noqa: F401  (each registers itself)
