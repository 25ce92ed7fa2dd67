"""The small repository task the integration examples share: a module whose
test fails until `add` adds."""

SETUP = r"""
set -e
mkdir -p /repo && cd /repo
cat > calc.py <<'EOF'
def add(a, b):
    return a - b
EOF
cat > test_calc.py <<'EOF'
import unittest

from calc import add


class TestAdd(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)
        self.assertEqual(add(-1, 1), 0)
        self.assertEqual(add(0, 7), 7)


if __name__ == "__main__":
    unittest.main()
EOF
git init -q && git add -A && git -c user.email=task@drums -c user.name=task commit -qm task
"""
"""Shell commands that make /repo in a fresh sandbox (a constant script)."""

TEST = "cd /repo && python3 -B -m unittest -q test_calc"
"""The task's test: exit 0 once the fix is in (-B: no stale bytecode)."""
