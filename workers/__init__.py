"""Worker processes by job: delivery (fetch, run, settle), loops (what runs for a task), policy
(model clients and the embedded server) and supervise (process pools, `farm up`).

The layers point down: supervise -> delivery -> loops -> policy (checked by `.importlinter`).
"""
