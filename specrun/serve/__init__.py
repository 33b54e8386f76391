"""An OpenAI-compatible server over one speculative session.

`api` turns request bodies into `GenerationRequest`s (or OpenAI error objects) and
results into response bodies; `worker` runs requests one at a time on the model, in
arrival order, from a bounded queue; `metrics` counts for /metrics; `app` is the thin
FastAPI layer over them, and `server` runs it with uvicorn.
"""
