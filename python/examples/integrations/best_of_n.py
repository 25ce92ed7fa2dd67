"""Best-of-N: fork one warm task environment into 8 siblings, try a
different candidate fix in each, keep the one whose tests pass.

    python examples/integrations/best_of_n.py

The task is set up once (the repository, its first test run); `fork(8)`
restores 8 hygienic siblings of that moment, each with its own hostname,
address and random state, in the time one cold start takes. Each candidate
runs through mini-swe-agent's environment interface (`execute`), as an
agent's rollout would. Needs mini-swe-agent 2.x importable only for the
`Submitted` exception (not raised here) and a drumsd.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

from task_repo import SETUP, TEST  # beside this file (the script's directory is on sys.path)

from drums.integrations.minisweagent import DrumsEnvironment

# Eight rollouts' candidate bodies for `add`: one of them is right.
CANDIDATES = [
    "return a - b",
    "return b - a",
    "return a * b",
    "return abs(a - b)",
    "return a + b",
    "return max(a, b)",
    "return a + b + 1",
    "return (a - b) * -1",
]


def attempt(env: DrumsEnvironment, body: str) -> bool:
    """Apply one candidate and run the tests. The candidate is a file's
    contents, never part of a shell string."""
    env.sandbox.files.write("/repo/calc.py", f"def add(a, b):\n    {body}\n")
    return bool(env.execute({"command": TEST})["returncode"] == 0)


def main() -> int:
    with DrumsEnvironment(cwd="/repo") as task:
        task.sandbox.commands.run(SETUP, check=True)
        print("baseline:", "passes" if attempt(task, "return a - b") else "fails")
        # 8 siblings of the warm environment, as it is now.
        siblings = [
            DrumsEnvironment(sandbox=sb, cwd="/repo") for sb in task.sandbox.fork(len(CANDIDATES))
        ]
        try:
            with ThreadPoolExecutor(len(siblings)) as pool:
                passed = list(pool.map(attempt, siblings, CANDIDATES))
            for env, body, ok in zip(siblings, CANDIDATES, passed, strict=True):
                print(f"{env.sandbox.name}: {body:<22} {'PASS' if ok else 'fail'}")
            if True not in passed:
                print("no candidate passed")
                return 1
            best = siblings[passed.index(True)]
            # Keep the winner, drop the rest now.
            for env in siblings:
                if env is not best:
                    env.cleanup()
            diff = best.execute({"command": "git diff --stat && git diff"})["output"]
            print(f"kept {best.sandbox.name}:\n{diff}", end="")
        finally:
            for env in siblings:
                env.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
