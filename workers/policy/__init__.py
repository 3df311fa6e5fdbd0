"""Policy backends behind one protocol (`protocol`): token-in/token-out (`token_policy` over the
`tokens` client) and the OpenAI client (`openai_pool`, `openai_convo`); the one replica rotation
(cooling, health, affinity) both use, the chat template and tool-call parsing, and the embedded
vLLM server (`serving`).

Knows nothing of tasks, loops or the queue.
"""
