"""Sandbox backends for agentic environments (the protocol: envs.sdk.sandbox).

- `base`: the Debian base tree every sandbox starts from, built offline with debootstrap and
  imported into Docker when a daemon answers (`farm sandbox base`);
- `local`: no daemon, namespaces + a cgroup + an overlay over the base tree (`LocalBackend`);
- `dockerfile`: the Dockerfile subset the `local` backend builds;
- `docker`: a Docker daemon.

Modules are imported where used (the backends pull in asyncio and subprocess machinery a plain
`import envs.boxes` should not pay for).
"""
