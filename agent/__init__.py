"""The node agent: supervises a GPU host's vLLM engines and reports what they and the GPUs do.

``import httpx`` imports httpx's own command-line client, and with it rich and pygments wherever they are
installed (a GPU host's ML environment often has both): 3.8 MB of the agent's resident memory for a program it
never runs. Marking that one module absent before anything imports httpx keeps them out; httpx then defines a
``main`` that only says how to install its command line.
"""

import sys

sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
