"""Stand-in modules for what OSWorld's desktop-env imports at module level but
the drums tests never use (playwright, pydrive): imported by drive.py and
drive_desktop_env.py before any desktop_env module."""
import sys
import types


def stand_in(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def unavailable(*_a, **_k):
    raise RuntimeError("not installed in the drums test environment")


stand_in("playwright")
stand_in("playwright.sync_api", sync_playwright=unavailable, TimeoutError=TimeoutError)
stand_in("pydrive")
stand_in("pydrive.auth", GoogleAuth=unavailable)
stand_in("pydrive.drive", GoogleDrive=unavailable, GoogleDriveFile=object, GoogleDriveFileList=object)
