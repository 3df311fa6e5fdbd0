"""Task delivery: one worker process fetching from an agent's stream, running agent loops under a
slot bound, and settling each task exactly once (reply, retry or dead letter); its chores and probes.

Imports the agent loops (`workers.loops`) only through their protocol; nothing here talks to a model.
"""
