"""The GPU board: are my GPUs healthy, or slowing down, failing or full?"""

from __future__ import annotations

from pitstop.boards.common import ACTIONS, FLEET, REPLICA, board_links, firing_alerts, to_node, to_replica
from pitstop.boards.grafana import Dashboard, Panel, Row, Target, Variable, steps
from pitstop.boards.inputs import Inputs
from pitstop.boards.promql import Scope

S = Scope(("node", "gpu"))
GPU_LEGEND = "{{node}} gpu{{gpu}}"
MEMORY_HIGH = 0.95  # GPUMemoryHigh; engines preallocate less by default (vLLM 0.9)
HEADROOM_WARN = 5  # GPUHot: within 5 °C of the GPU's own slowdown threshold

VARIABLES = (
    Variable("node", "Node", "label_values(pitstop_gpu_temperature_celsius, node)"),
    Variable("gpu", "GPU", 'label_values(pitstop_gpu_temperature_celsius{node=~"$node"}, gpu)'),
)

# One lane per GPU in the throttle timeline: 2 while a fault reason is active, 1 while only a cap that is no fault
# is, 0 at full clocks.
THROTTLE_MAPPINGS = ({"type": "value", "options": {
    "0": {"text": "full clocks", "color": "green", "index": 0},
    "1": {"text": "capped, no fault (sw_power_cap, idle, clock settings)", "color": "blue", "index": 1},
    "2": {"text": "slowdown: fault (thermal, power brake, hardware)", "color": "red", "index": 2},
}},)
ACTIVE_MAPPINGS = ({"type": "value", "options": {
    "0": {"text": "inactive", "color": "transparent", "index": 0},
    "1": {"text": "active", "color": "orange", "index": 1},
}},)
FAULT_MAPPINGS = ({"type": "value", "options": {
    "true": {"text": "fault", "color": "red", "index": 0},
    "false": {"text": "no fault", "color": "blue", "index": 1},
}},)


def _dashed(name_regex: str, color: str) -> dict[str, object]:
    """An override drawing the series matching ``name_regex`` as a dashed line of one colour."""
    return {"matcher": {"id": "byRegexp", "options": name_regex}, "properties": [
        {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
        {"id": "color", "value": {"mode": "fixed", "fixedColor": color}},
    ]}


def _thermal_row() -> Row:
    temp, slowdown = S.sel("pitstop_gpu_temperature_celsius"), S.sel("pitstop_gpu_slowdown_temperature_celsius")
    fault = S.sel("pitstop_gpu_throttle_reason", 'fault="true"')
    benign = S.sel("pitstop_gpu_throttle_reason", 'fault="false"')
    return Row("Thermal and throttling", (
        Panel(title="Temperature vs own slowdown threshold", unit="celsius", alerts=("GPUHot", "GPUThrottled"),
              data_links=(to_node(),), overrides=(_dashed("^slowdown .*", "red"),), custom={"lineWidth": 2},
              description="Each GPU's temperature against the slowdown threshold it reports through NVML (89 °C "
              "on an H200; dashed). Within 5 °C GPUHot fires; at the threshold the GPU cuts its clocks and every "
              "replica on it slows down: check cooling and airflow; Pitstop cordons the node after 15 minutes hot "
              "(thermal-sustained).",
              targets=(Target(temp, GPU_LEGEND), Target(slowdown, f"slowdown {GPU_LEGEND}"))),
        Panel(title="Thermal headroom", unit="celsius", alerts=("GPUHot", "GPUThrottled"),
              thresholds=steps("red", ("orange", 0), ("green", HEADROOM_WARN)), threshold_style="area",
              description=f"Degrees left before thermal slowdown (the GPU's own threshold minus its "
              f"temperature). Under {HEADROOM_WARN} °C raises GPUHot, under 0 the GPU slows down: look at the "
              "fans, the inlet temperature and the neighbours in the chassis.",
              targets=(Target(f"{slowdown} - {temp}", GPU_LEGEND),)),
        Panel(title="Throttle reasons", kind="state-timeline", unit="short", width=16, alerts=("GPUThrottled",),
              mappings=THROTTLE_MAPPINGS, thresholds=steps("green", ("blue", 1), ("red", 2)),
              description="Per GPU, whether NVML reports a clocks-event (throttle) reason as active "
              "(pitstop_gpu_throttle_reason): red while a fault reason is (thermal or power-brake slowdown, a "
              "hardware slowdown: the GPU runs slower than it should, GPUThrottled), blue while only a cap that "
              "is no fault is (sw_power_cap under full load, idle, clock settings). Red for minutes: treat it "
              "as a thermal or power problem; the table says which reason.",
              targets=(Target(f"max by (node, gpu) (({fault} * 2) or {benign})", GPU_LEGEND),)),
        Panel(title="Throttle reasons now", kind="table", unit="short", width=8, alerts=("GPUThrottled",),
              description="Every known throttle reason of the selected GPUs at the end of the range, active ones "
              "first; fault marks the slowdowns that are faults (thermal, power brake, hardware). An active "
              "fault row: see the runbook.",
              targets=(Target(f"sort_desc(max by (node, gpu, reason, fault) "
                              f"({S.sel('pitstop_gpu_throttle_reason')}))", instant=True, table=True),),
              overrides=(
                  {"matcher": {"id": "byName", "options": "fault"}, "properties": [
                      {"id": "mappings", "value": list(FAULT_MAPPINGS)},
                      {"id": "custom.cellOptions", "value": {"type": "color-text"}}]},
                  {"matcher": {"id": "byName", "options": "active"}, "properties": [
                      {"id": "mappings", "value": list(ACTIVE_MAPPINGS)},
                      {"id": "custom.cellOptions", "value": {"type": "color-background"}}]},
              ),
              transformations=({"id": "organize", "options": {
                  "excludeByName": {"Time": True},
                  "indexByName": {"node": 0, "gpu": 1, "reason": 2, "fault": 3, "Value": 4},
                  "renameByName": {"Value": "active"}}},)),
    ))


def _memory_row() -> Row:
    return Row("Memory and load", (
        Panel(title="GPU memory used", unit="percentunit", width=8, min=0, max=1, alerts=("GPUMemoryHigh",),
              thresholds=steps("green", ("red", MEMORY_HIGH)), threshold_style="dashed",
              description=f"Share of each GPU's memory in use. Engines preallocate most of it at start (vLLM "
              f"--gpu-memory-utilization, 0.9 by default; SGLang --mem-fraction-static): high and flat is normal. "
              f"Above {MEMORY_HIGH:.0%} something outside the "
              "engines' budget holds memory (see the orphan processes).",
              targets=(Target(f"{S.sel('pitstop_gpu_memory_used_bytes')} / "
                              f"{S.sel('pitstop_gpu_memory_total_bytes')}", GPU_LEGEND),)),
        Panel(title="GPU memory per replica", unit="bytes", width=8, alerts=("ReplicaGPUMemoryGrowing",),
              data_links=(to_replica(),),
              description="GPU memory held by each replica's processes on the selected nodes (replicas carry no "
              "GPU label: the GPU filter does not apply). Growth after start-up is a leak (vLLM #17243): click "
              "the replica for its trend.",
              targets=(Target(S.sel("pitstop_replica_gpu_memory_bytes"), "{{node}}/{{replica}}"),)),
        Panel(title="Processes no replica started", unit="short", width=8, alerts=("GPUOrphanProcesses",),
              thresholds=steps("green", ("red", 1)),
              description="Processes holding memory on the GPU that no Pitstop replica started (a leftover "
              "engine, a hand-started vllm serve). Above 0 for long: the next engine on that GPU may run out "
              "of memory; find and stop the process.",
              targets=(Target(S.sel("pitstop_gpu_orphan_processes"), GPU_LEGEND),)),
        Panel(title="Utilisation", unit="percentunit", width=8, min=0, max=1,
              description="Share of time each GPU was busy. Low while its replica has a queue: the engine is "
              "stalled or starved by the host; zero on a serving GPU: check the replica's state.",
              targets=(Target(S.sel("pitstop_gpu_utilization_ratio"), GPU_LEGEND),)),
        Panel(title="Power vs limit", unit="watt", width=8, overrides=(_dashed("^limit .*", "red"),),
              description="Board power draw against the enforced power limit (dashed). At the limit the GPU "
              "caps its clocks (sw_power_cap in the throttle reasons, no fault); a limit far below the "
              "board's rating has been lowered by someone.",
              targets=(Target(S.sel("pitstop_gpu_power_watts"), GPU_LEGEND),
                       Target(S.sel("pitstop_gpu_power_limit_watts"), f"limit {GPU_LEGEND}"))),
        Panel(title="Cordoned GPUs and nodes", kind="stat", unit="short", width=8,
              alerts=("GPUCordoned", "NodeCordoned"), thresholds=steps("green", ("orange", 1)),
              description="GPUs cordoned on their own and nodes cordoned whole by the control plane "
              "(xid-hardware, thermal-sustained, an operator). Above 0: their replicas are kept stopped until "
              "an operator uncordons them, once the cause is fixed.",
              targets=(Target(f"sum({S.sel('pitstop_gpu_cordoned')}) or vector(0)", "GPUs"),
                       Target(f"sum({S.sel('pitstop_node_cordoned')}) or vector(0)", "nodes"))),
    ))


def _xid(window: str) -> str:
    """XID errors per GPU, code and blast radius over ``window``; a GPU without any shows its total (0) as
    xid="none". A code's series appears with its first error, which increase() cannot see: a series that did
    not exist ``window`` ago counts whole."""
    per_code, total = S.sel("pitstop_gpu_xid_errors_total"), S.sel("pitstop_gpu_xid_events_total")
    by = "node, gpu, xid, blast_radius"
    codes = f"sum by ({by}) (increase({per_code}[{window}]) or ({per_code} unless {per_code} offset {window}))"
    none = (f'label_replace(label_replace(sum by (node, gpu) (increase({total}[{window}])), "xid", "none", "", ""), '
            f'"blast_radius", "none", "", "")')
    return f"{codes} or on (node, gpu) {none}"


def _errors_row(inputs: Inputs) -> Row:
    return Row("Errors", (
        Panel(title="XID errors by code and blast radius", unit="short", width=12, alerts=("GPUXidErrors",),
              custom={"drawStyle": "bars", "fillOpacity": 80}, data_links=(to_node(),),
              description="New XID critical errors per GPU, by XID code and blast radius (hardware: the GPU "
              "itself, application: the process on it, unknown). The xid policies cordon the node on hardware "
              "codes and restart the GPU's replicas on application ones; a GPU without any XID shows a zero "
              "line (xid none). See the runbook for codes Pitstop does not know.",
              targets=(Target(_xid("$__rate_interval"), f"{GPU_LEGEND} XID {{{{xid}}}} ({{{{blast_radius}}}})"),)),
        Panel(title="XID errors in range by code", kind="table", unit="short", width=6, alerts=("GPUXidErrors",),
              thresholds=steps("green", ("red", 1)),
              overrides=({"matcher": {"id": "byName", "options": "errors"}, "properties": [
                  {"id": "custom.cellOptions", "value": {"type": "color-background"}}]},),
              description="XID errors over the whole time range, one row per GPU, code and blast radius (xid "
              "none: the GPU had none). Any other row: check the code in the runbook; repeated hardware codes "
              "mean the GPU needs service.",
              targets=(Target(_xid("$__range"), instant=True, table=True),),
              transformations=({"id": "organize", "options": {
                  "excludeByName": {"Time": True},
                  "indexByName": {"node": 0, "gpu": 1, "xid": 2, "blast_radius": 3, "Value": 4},
                  "renameByName": {"Value": "errors"}}},)),
        Panel(title="Uncorrected ECC errors in range", kind="stat", unit="short", width=6,
              alerts=("GPUEccErrors",), thresholds=steps("green", ("red", 1)),
              description="Uncorrected ECC errors over the time range per GPU. Any: results computed on the GPU "
              "may be wrong; it pages, and the GPU should be drained and reset or replaced.",
              targets=(Target(f"sum by (node, gpu) (increase({S.sel('pitstop_gpu_ecc_uncorrected_total')}"
                              f"[$__range]))", GPU_LEGEND),)),
        firing_alerts(S, inputs.alerts, title="Firing Pitstop alerts on these nodes", width=24, height=7,
                      labels=("node",), required=("node",),
                      description="Pitstop's alerts firing now on the selected nodes, whatever their GPU."),
    ))


def board(inputs: Inputs) -> Dashboard:
    return Dashboard(
        uid="pitstop-gpu", title="Pitstop GPU",
        description="Are my GPUs healthy? Temperature against each GPU's own slowdown threshold, throttle "
        "reasons, memory, utilisation, power, XID and ECC errors, cordons.",
        tags=("pitstop", "gpu"), variables=VARIABLES,
        rows=(_thermal_row(), _memory_row(), _errors_row(inputs)),
        links=board_links((FLEET, "Fleet"), (REPLICA, "Replica detail")),
        annotations=(ACTIONS,),
    )
