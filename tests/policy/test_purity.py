"""The policy engine is pure: importing all of it pulls in no network, database, web or hardware library."""

import subprocess
import sys

IO_MODULES = ("httpx", "sqlalchemy", "fastapi", "uvicorn", "starlette", "psutil", "pynvml", "psycopg", "streamlit",
              "apscheduler")


def test_policy_package_imports_no_io_library():
    code = ("import sys, importlib, pkgutil, controlplane.policy; "
            "[importlib.import_module(m.name) for m in pkgutil.walk_packages(controlplane.policy.__path__, "
            "'controlplane.policy.')]; "
            # A None entry marks a module absent (agent/__init__.py so marks httpx's command line): nothing loaded.
            f"print(','.join(sorted(m for m, v in sys.modules.items() if v is not None "
            f"and m.split('.')[0] in {IO_MODULES!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == ""
