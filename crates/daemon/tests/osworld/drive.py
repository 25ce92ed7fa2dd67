"""Drives a drums desktop with OSWorld's own, unmodified client classes.

Usage: drive.py VM_IP TASK_JSON   (prints one JSON object with the results)

desktop-env==1.0.2 is installed with --no-deps. Its controllers import only
`requests` (installed) plus three things its `execute` steps never touch:
playwright and pydrive (for Chrome and Google Drive set-up steps) and
desktop_env.evaluators.metrics.utils (whose package __init__ imports every
metric's heavy dependencies). Those three get empty stand-in modules so that
the controller modules import; the classes themselves run as published.
"""
import importlib.util
import json
import pathlib
import sys


from standins import stand_in, unavailable  # noqa: E402  (playwright, pydrive)
stand_in("desktop_env.evaluators.metrics.utils", compare_urls=unavailable)

from desktop_env.controllers.python import PythonController  # noqa: E402
from desktop_env.controllers.setup import SetupController  # noqa: E402

# OSWorld's real getter, loaded from its file: the getters package __init__
# imports every getter's dependencies too.
import desktop_env  # noqa: E402

getters = pathlib.Path(desktop_env.__file__).parent / "evaluators" / "getters" / "general.py"
spec = importlib.util.spec_from_file_location("osworld_getters_general", getters)
general = importlib.util.module_from_spec(spec)
spec.loader.exec_module(general)


class Env:
    """What OSWorld's getters read from a DesktopEnv."""

    def __init__(self, ip):
        self.vm_ip = ip
        self.server_port = 5000


def exact_match(result, rules):
    # OSWorld's metrics.general.exact_match, whose module imports pdfplumber,
    # docx and rapidfuzz: the same rule, one line.
    return 1.0 if result == rules["expected"] else 0.0


def evaluate(env, task):
    ev = task["evaluator"]
    assert ev["func"] == "exact_match" and ev["result"]["type"] == "vm_command_line"
    result = general.get_vm_command_line(env, ev["result"])
    return exact_match(result, ev["expected"]["rules"])


def main():
    ip, task_path = sys.argv[1], sys.argv[2]
    task = json.loads(pathlib.Path(task_path).read_text())
    env = Env(ip)
    pc = PythonController(vm_ip=ip, server_port=5000)
    out = {}

    shot = pc.get_screenshot()
    out["screenshot_png"] = bool(shot) and shot[:8] == b"\x89PNG\r\n\x1a\n"
    out["screenshot_bytes"] = len(shot or b"")

    r = pc.execute_python_command("print('pyautogui', *pyautogui.size())")
    out["python"] = (r or {}).get("output", "").strip()

    r = pc.run_bash_script("echo shell $(id -un)")
    out["bash"] = (r or {}).get("output", "").strip()

    setup = SetupController(vm_ip=ip, server_port=5000)
    out["setup_ok"] = setup.setup(task["config"])
    out["score_before"] = evaluate(env, task)
    # The agent's action, as OSWorld agents act: a pyautogui-prefixed command.
    pc.execute_python_command(
        "open('/home/user/Desktop/notes.txt', 'w').write('done\\n')"
    )
    out["score_after"] = evaluate(env, task)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
