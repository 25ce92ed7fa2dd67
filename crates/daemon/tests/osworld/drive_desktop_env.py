"""OSWorld's DesktopEnv with its vmware provider, on a drums desktop through
drums-vmrun (found as `vmrun` on PATH).

Usage: drive_desktop_env.py VMX   (prints one JSON object with the results)

desktop-env==1.0.2 is installed with --no-deps, plus what desktop_env.py and
the vmware provider import at module level (gymnasium, psutil, filelock,
tqdm, requests). The evaluators package (every metric's dependencies: office
formats, images, PDFs) gets stand-in modules, as do playwright and pydrive;
no evaluator is run here. DesktopEnv itself runs as published.
"""
import json
import sys


from standins import stand_in, unavailable  # noqa: E402  (playwright, pydrive)
evaluators = stand_in("desktop_env.evaluators")
evaluators.__path__ = []
evaluators.metrics = stand_in("desktop_env.evaluators.metrics", exact_match=unavailable)
evaluators.getters = stand_in("desktop_env.evaluators.getters")
stand_in("desktop_env.evaluators.metrics.utils", compare_urls=unavailable)

from desktop_env.desktop_env import DesktopEnv  # noqa: E402

TASK = {
    "id": "drums-revert",
    "instruction": "unused",
    "config": [
        {
            "type": "execute",
            "parameters": {"command": ["sh", "-c", "echo draft > /home/user/Desktop/n.txt"]},
        }
    ],
    "evaluator": {"func": "exact_match"},
}


def sh(env, script):
    return (env.controller.run_bash_script(script) or {}).get("output", "").strip()


def main():
    env = DesktopEnv(
        provider_name="vmware",
        path_to_vm=sys.argv[1],
        snapshot_name="init_state",
        require_a11y_tree=False,
        headless=True,
    )
    out = {"ip": env.vm_ip}
    obs = env.reset(task_config=TASK)
    out["screenshot_png"] = obs["screenshot"][:8] == b"\x89PNG\r\n\x1a\n"
    out["machine_id_1"] = sh(env, "cat /etc/machine-id")
    out["file_after_setup"] = sh(env, "cat /home/user/Desktop/n.txt")
    env.step("pyautogui.moveTo(100, 100)")
    # Used, so this reset reverts to the snapshot: a drums restore.
    env.reset(task_config={**TASK, "config": []})
    out["machine_id_2"] = sh(env, "cat /etc/machine-id")
    out["file_after_revert"] = sh(env, "test -e /home/user/Desktop/n.txt && echo present || echo absent")
    out["hostname"] = sh(env, "hostname")
    env.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
