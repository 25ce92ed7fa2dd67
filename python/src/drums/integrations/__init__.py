"""Adapters that let agent harnesses run their commands in drums sandboxes.

Each module adapts one harness's interface to the SDK and does nothing else;
none is imported by `import drums`, and each imports its harness only where
it must, so the SDK never depends on a harness.

- `drums.integrations.minisweagent`: `DrumsEnvironment`, an environment for
  mini-swe-agent (2.x, and the 1.x `execute(command)` call).
- `drums.integrations.swerex`: `DrumsDeployment`, a SWE-ReX deployment whose
  runtime drives the session through the SDK (no server in the sandbox).
- `drums.integrations.harbor`: `DrumsEnvironment`, a Harbor (>= 0.26)
  environment: each trial in a drums session, its Dockerfile built by
  `drums build` (`harbor run -e drums.integrations.harbor:DrumsEnvironment`).
  It subclasses Harbor's `BaseEnvironment`, so importing it imports Harbor.
"""
