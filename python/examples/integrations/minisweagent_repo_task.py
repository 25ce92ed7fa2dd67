"""mini-swe-agent fixes a failing test in a drums sandbox, offline.

    python examples/integrations/minisweagent_repo_task.py

The agent is mini-swe-agent's own `DefaultAgent`, with its bundled
`default.yaml` templates; the model is its `DeterministicModel`, which plays
back the answers a model that knew the fix would give, so this runs without
any LLM. Swap in `model_class: litellm` and a `model_name` for a real one.
Needs mini-swe-agent 2.x and a drumsd (DRUMS_SOCKET, or the SDK starts one).
"""

from __future__ import annotations

import sys
from typing import Any

from minisweagent.agents.default import DefaultAgent
from minisweagent.config import get_config_from_spec
from minisweagent.models.test_models import DeterministicModel
from task_repo import SETUP, TEST  # beside this file (the script's directory is on sys.path)

from drums.integrations.minisweagent import DrumsEnvironment

# What a model that knew the fix would answer, one command a step.
ANSWERS = [
    TEST,
    "cd /repo && sed -i 's/return a - b/return a + b/' calc.py && git diff",
    TEST,
    "cd /repo && echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff",
]


def answer(i: int, command: str) -> dict[str, Any]:
    """One model message in the format of default.yaml (text actions)."""
    return {
        "role": "assistant",
        "content": f"THOUGHT: step {i}.\n\n```mswea_bash_command\n{command}\n```",
        "extra": {"actions": [{"command": command}], "cost": 0.0},
    }


def main() -> int:
    config = get_config_from_spec("default.yaml")
    with DrumsEnvironment(cwd="/repo", **config["environment"]) as env:
        # The task's set-up (a real runner would start from its warm
        # checkpoint instead: DrumsEnvironment(from_checkpoint=...)).
        env.sandbox.commands.run(SETUP, check=True)
        outputs = [answer(i, c) for i, c in enumerate(ANSWERS)]
        model = DeterministicModel(outputs=outputs)  # type: ignore[no-untyped-call]  # theirs
        agent = DefaultAgent(model, env, **{**config["agent"], "step_limit": 10})
        result = agent.run("The tests in /repo fail: make `add` add.")
        print(f"exit status: {result['exit_status']}, in session {env.sandbox.name}")
        print(result["submission"], end="")
        passed = env.execute({"command": TEST})["returncode"] == 0
        print("tests pass" if passed else "tests FAIL")
        return 0 if result["exit_status"] == "Submitted" and passed else 1


if __name__ == "__main__":
    sys.exit(main())
