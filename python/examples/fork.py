"""Fork one warmed-up sandbox into N hygienic siblings and give each its own task.

python examples/fork.py [N]
"""

import sys

import drums


def main(n: int = 3) -> None:
    with drums.Sandbox.create() as parent:
        # Expensive set-up happens once...
        parent.commands.run("mkdir -p /work && echo 'shared set-up' > /work/state", check=True)
        # ...then every sibling starts from it, with its own hostname, address
        # and random state.
        siblings = parent.fork(n)
        try:
            for i, sb in enumerate(siblings):
                r = sb.commands.run(f"cat /work/state; echo 'task {i}' on $(hostname)")
                print(r.stdout, end="")
        finally:
            for sb in siblings:
                sb.kill()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
