"""Agent loops: what a worker runs for one task (the Agent protocol, the registry, the one agent
loop over every policy backend, the built-in noop), and the tool and verifier calls it makes.

Loops call a policy through `workers.policy`; they never touch the queue (`workers.delivery`).
"""
