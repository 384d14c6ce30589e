"""The live-cap scheduler plug-in's directory: the agent puts it on a vLLM engine's ``PYTHONPATH``.

``pitstop_live_cap`` is imported by the engine, never by the agent (docs/design.md, "Live cap").
"""

from pathlib import Path

PLUGIN_DIR = Path(__file__).parent
SCHEDULER_FLAG = "--scheduler-cls"
SCHEDULER_CLS = "pitstop_live_cap.LiveCapScheduler"
