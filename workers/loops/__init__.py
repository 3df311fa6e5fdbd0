"""Agent loops: what a worker runs for one task (the Agent protocol, the registry, the policy loop,
the built-in noop), and the tool and verifier calls every loop shares.

Loops call a policy through `workers.policy`; they never touch the queue (`workers.delivery`).
"""
