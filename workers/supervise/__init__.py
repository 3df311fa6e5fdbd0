"""Process supervision: `farm worker --processes P` and `farm up` (a whole farm from one file).

The top of workers/: it starts worker processes and policy servers, and nothing below imports it.
"""
