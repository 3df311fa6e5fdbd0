"""The model gateway: an OpenAI-compatible server in each worker process, so that a harness the farm
never saw (the openai SDK, the OpenAI Agents SDK, verifiers, a command) trains through it.

  bridge.py    a harness's chat history back to the token ids the policy sampled (chains, segments)
  shapes.py    OpenAI's request shapes (Chat Completions and Responses) read into one form; errors
  answers.py   the answers written back in either API's shape, streamed or not
  calls.py     one rollout's state at the gateway, and one model call through the token path
  server.py    the aiohttp server: one per process, a secret per rollout, calls through the token path
"""
