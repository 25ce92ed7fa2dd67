"""Create a sandbox, run commands in it, read a file back; it is removed on exit.

python examples/create_and_run.py
"""

import drums


def main() -> None:
    with drums.Sandbox.create(memory="512M", cpus=1) as sb:
        print(f"sandbox {sb.name} at {sb.info.ip}")
        r = sb.commands.run("uname -sr; python3 -c 'print(6 * 7)'")
        print(r.stdout, end="")
        # Output can be handled as it arrives.
        sb.commands.run("for i in 1 2 3; do echo tick $i; sleep 0.1; done", on_stdout=print)
        sb.files.write("/root/notes.txt", "written from Python\n")
        print(sb.files.read("/root/notes.txt"), end="")
        # A failing command is a result, not an exception (unless check=True).
        r = sb.commands.run("ls /nonexistent")
        print(f"exit code {r.exit_code}: {r.stderr.strip()}")


if __name__ == "__main__":
    main()
