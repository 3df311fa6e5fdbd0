"""Policy clients: the token-in/token-out client, the OpenAI-client boundary, the one replica
rotation (cooling, health, affinity), the chat template and tool-call parsing, and the embedded
vLLM server (`serving`).

Knows nothing of tasks, loops or the queue.
"""
