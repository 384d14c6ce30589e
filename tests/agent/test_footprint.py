"""What the agent's process loads: its resident memory is a promise (under 80 MB on a GPU host)."""

import importlib.util
import subprocess
import sys


def test_the_agent_leaves_httpx_command_line_libraries_unloaded_where_they_are_installed():
    # The test environment has rich and pygments (the console's dependencies), as a GPU host's ML stack often does.
    assert importlib.util.find_spec("rich") is not None and importlib.util.find_spec("pygments") is not None
    code = ("import sys, agent.cli, agent.node, agent.api, httpx; "
            "print(sorted(m for m in ('rich', 'pygments', 'httpx._main') if m in sys.modules and sys.modules[m]), "
            "callable(httpx.main))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["[]", "True"]
