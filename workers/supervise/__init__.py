"""Process supervision: `farm worker --processes P` (`pool.py`), a farm on this machine (`stack.py`:
Redis, then the policy server, then worker pools, stopped in reverse order) and `farm up` (`up.py`).

The top of workers/: it starts worker processes and policy servers, and nothing below imports it.
"""
