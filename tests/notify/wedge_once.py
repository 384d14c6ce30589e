"""An engine command for an agent replica whose simulated engine wedges on its first start only.

``--fault-hang-after`` wedges every start of an engine, and a restart runs the same arguments again, so a
restarted simulator would wedge again. Used as the replica's ``command``::

    [python, wedge_once.py, MARKER, SECONDS, "{model}", "--host", "{host}", "--port", "{port}"]

the first start (no MARKER file yet) creates MARKER and runs ``pitstop sim serve`` with
``--fault-hang-after SECONDS``; every later start runs it without, so the engine comes back healthy, as a real
vLLM does after a restart clears a wedged EngineCore. The process replaces itself (exec): the agent supervises,
signals and stack-dumps the simulator itself.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> None:
    marker, seconds, *serve = argv
    try:
        with open(marker, "x"):
            pass
        serve += ["--fault-hang-after", seconds]
    except FileExistsError:
        pass
    os.execv(sys.executable, [sys.executable, "-m", "pitstop.cli", "sim", "serve", *serve])


if __name__ == "__main__":
    main(sys.argv[1:])
