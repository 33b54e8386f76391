"""`specrun pair`: draft/target compatibility, draft suggestions and self-derived drafts."""
