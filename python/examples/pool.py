"""A warm pool: sandboxes restored from a checkpoint and kept ready, so that
taking one costs milliseconds instead of a boot.

    python examples/pool.py
"""

import time

import drums


def main() -> None:
    # The image every pooled sandbox starts from: a checkpoint of a set-up session.
    with drums.Sandbox.create() as seed:
        seed.commands.run("echo 'ready to serve' > /root/motd", check=True)
        checkpoint = seed.checkpoint(name="example-pool-seed")
    try:
        with drums.Pool(checkpoint, size=2) as pool:
            for _ in range(3):
                t = time.monotonic()
                with pool.take(timeout=60) as sb:
                    took = (time.monotonic() - t) * 1000
                    motd = sb.files.read("/root/motd").strip()
                    print(f"took {sb.name} in {took:.0f} ms: {motd}")
            print(pool.info())
        # Leaving the block removed the pool and the members no one took.
    finally:
        checkpoint.remove()


if __name__ == "__main__":
    main()
