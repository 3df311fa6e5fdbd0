"""Harbor task suites as a farm environment: a task directory per rollout, its tests as the verifier.

envs/harbor/task.py reads a task directory (task.toml schema 1.4, the instruction, the scripts);
envs/harbor/rows.py turns a suite into dataset rows (`farm data generate harbor --tasks DIR`);
envs/harbor/suite/ is the project's own suite, in three tiers.
"""
