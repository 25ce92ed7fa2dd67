"""A desktop sandbox (X, Chromium, OSWorld's port 5000) and a screenshot of it.

python examples/desktop_screenshot.py [out.png]
"""

import sys

import drums


def main(out: str = "screenshot.png") -> None:
    with drums.Sandbox.create(profile="desktop", memory="1G", pids=512, screen="1024x768") as sb:
        print(f"OSWorld endpoint: {sb.osworld_url}")
        png = sb.screenshot()
        with open(out, "wb") as f:
            f.write(png)
        print(f"wrote {out} ({len(png)} bytes)")


if __name__ == "__main__":
    main(*sys.argv[1:2])
