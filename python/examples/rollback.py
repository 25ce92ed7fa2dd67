"""Roll a sandbox back after an agent's bad turn.

Each turn is bracketed by turn.begin() and turn.end(checkpoint=True): drumsd's
inspector sees what the turn changed and takes a version of the session. When
a turn goes wrong, rollback() continues the same sandbox (same id, name and
address) from the version before it.

    python examples/rollback.py
"""

import drums


def turn(sb: drums.Sandbox, command: str) -> drums.models.SessionVersion:
    sb.turn.begin()
    sb.commands.run(command, check=True)
    effects = sb.turn.end(checkpoint=True, policy="full", wait=True)
    print(f"turn {effects.turn} ({effects.class_}): {[f.path for f in effects.files]}")
    if effects.checkpoint is None or effects.checkpoint.version is None:
        raise RuntimeError(f"turn {effects.turn} took no version")
    return effects.checkpoint.version


def main() -> None:
    with drums.Sandbox.create() as sb:
        good = turn(sb, "mkdir -p /work && echo 'important data' > /work/data.txt")
        turn(sb, "rm -f /work/data.txt; echo oops > /work/mistake")  # a bad turn
        print("after the bad turn:", sb.commands.run("ls /work").stdout.split())
        sb.rollback(to=good.number)
        print("after rollback:", sb.commands.run("ls /work").stdout.split())
        print(sb.files.read("/work/data.txt"), end="")


if __name__ == "__main__":
    main()
