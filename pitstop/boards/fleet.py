"""The fleet board: is every model meeting its SLOs, and where is it not?"""

from __future__ import annotations

from typing import Any

from pitstop.boards import engines
from pitstop.boards.common import ACTIONS, GPU, REPLICA, ROW, board_links, firing_alerts, to_model, to_node, to_replica
from pitstop.boards.engines import RUNNING_CAPS
from pitstop.boards.grafana import Dashboard, Panel, Row, Step, Target, Variable, steps
from pitstop.boards.inputs import Inputs, Slo
from pitstop.boards.promql import Scope

S = Scope(("node", "engine", "model", "replica"))
# A model's series of each engine are apart (model_engine:* rules by model and engine): both name the series.
PER_MODEL = "{{model}} ({{engine}})"
REPLICA_KEY = "node, model, replica, engine"  # the labels of one replica's series
# Multiwindow burn-rate levels (Google SRE workbook): 14.4x burns 2 % of a 30-day budget in an hour (page),
# 6x burns 5 % in 6 hours.
FAST_BURN, SLOW_BURN = 14.4, 6.0
BURN_WINDOWS = ("5m", "30m", "1h", "6h")
KV_WARN, KV_FULL = 0.9, 0.95  # KVCacheSaturated fires above 95 % with requests waiting
JOBS = 'job=~"pitstop-agent|pitstop-engines|pitstop-controlplane"'
UP = f"up{{{JOBS}}}"
# Pitstop's own processes (the engines behind pitstop-engines export process_* too: left out).
PITSTOP_RSS = 'process_resident_memory_bytes{job=~"pitstop-agent|pitstop-controlplane"}'

VARIABLES = (
    Variable("node", "Node", "label_values(pitstop_replica_ready, node)"),
    Variable("engine", "Engine", 'label_values(pitstop_replica_ready{node=~"$node"}, engine)'),
    Variable("model", "Model", 'label_values(pitstop_replica_ready{node=~"$node", engine=~"$engine"}, model)'),
    Variable("replica", "Replica",
             'label_values(pitstop_replica_ready{node=~"$node", engine=~"$engine", model=~"$model"}, replica)'),
)


def _slo_steps(slo: Slo) -> tuple[Step, ...]:
    return steps("green", ("red", slo.threshold))


def _stat(**fields: Any) -> Panel:
    return Panel(kind="stat", width=6, height=5, **fields)


def _per_model(rule: str) -> str:
    return S.sel(rule)


def _rate(key: str, by: str) -> str:
    """The rate of the engines' figure ``key`` (their adapters' names), summed ``by``."""
    return f"sum by ({by}) ({engines.rate(S, key)})"


def _latency(name: str, family: str, slo: Slo | None, alerts: tuple[str, ...], what: str) -> Panel:
    targets = tuple(Target(_per_model(f"model_engine:{family}_seconds:{q}_1m"), f"{PER_MODEL} {q}")
                    for q in ("p50", "p95", "p99"))
    objective = (f" The line is the objective, {slo.percentile} <= {slo.threshold:g} s (policy {slo.policy}); "
                 "p99 above it for long means the SLO is being missed: open the model, then its worst replica."
                 if slo else " No objective is set on it; it grows with the output length and with the queue.")
    return Panel(
        title=name, unit="s", width=8, alerts=alerts, data_links=(to_model(),),
        thresholds=_slo_steps(slo) if slo else (), threshold_style="dashed",
        description=f"{what} per model and engine over the whole fleet, from the engines' histograms "
        f"aggregated by the model_engine:{family}_seconds recording rules (1-minute windows; node and replica "
        f"filters do not apply: the replica board has the per-replica histograms).{objective}",
        targets=targets,
    )


def _burn(name: str, rule: str, slo: Slo, alert: str, what: str) -> Panel:
    targets = tuple(Target(f"{_per_model(f'{rule}{w}')} / {slo.budget:g}", f"{PER_MODEL} {w}")
                    for w in BURN_WINDOWS)
    return Panel(
        title=name, unit="short", width=8, alerts=(alert,), data_links=(to_model(),),
        thresholds=steps("green", ("orange", SLOW_BURN), ("red", FAST_BURN)), threshold_style="dashed",
        description=f"How fast each model spends its error budget, per engine: the share of {what} over 5 min, "
        f"30 min, 1 h and 6 h, divided by the budget ({slo.budget:g}, policy {slo.policy}). 1 spends the budget "
        f"exactly over the SLO period; {SLOW_BURN:g} (6 h and 30 min both above) and {FAST_BURN:g} (1 h and 5 min) are "
        f"the slow and fast burn levels {alert} pages on. A short window alone above is a spike; long windows "
        "above mean the budget is going: add capacity or find the replica dragging the model.",
        targets=targets,
    )


def _slo_row(inputs: Inputs) -> Row:
    t = inputs.targets
    return Row("Service level objectives", (
        _stat(title=f"TTFT {t.ttft.percentile} per model (5m)", unit="s", thresholds=_slo_steps(t.ttft),
              alerts=("TTFTSLOBreach", "TTFTSLOBurnRate"), data_links=(to_model(),),
              description=f"Time to first token {t.ttft.percentile} of each model and engine over the last 5 "
              f"minutes (model_engine:ttft_seconds:{t.ttft.percentile}_5m), red above the objective "
              f"{t.ttft.threshold:g} s (policy {t.ttft.policy}). Red: check the queue and the KV cache below, "
              "then add replicas; click a model to narrow the board to it.",
              targets=(Target(_per_model(f"model_engine:ttft_seconds:{t.ttft.percentile}_5m"), PER_MODEL),)),
        _stat(title=f"Inter-token latency {t.itl.percentile} per model (5m)", unit="s",
              thresholds=_slo_steps(t.itl), alerts=("ITLSLOBreach", "ITLSLOBurnRate"), data_links=(to_model(),),
              description=f"Inter-token latency {t.itl.percentile} of each model and engine over the last 5 "
              f"minutes (model_engine:itl_seconds:{t.itl.percentile}_5m), red above the objective "
              f"{t.itl.threshold:g} s (policy {t.itl.policy}, which lowers the running-request cap: "
              f"{RUNNING_CAPS}). Red: look for preemptions and a full KV cache, and for actions of the itl-slo "
              "governor in the annotations.",
              targets=(Target(_per_model(f"model_engine:itl_seconds:{t.itl.percentile}_5m"), PER_MODEL),)),
        _stat(title="Error ratio per model (5m)", unit="percentunit", thresholds=_slo_steps(t.errors),
              alerts=("HighErrorRate", "ErrorBudgetBurnRate"), data_links=(to_model(),),
              description=f"Requests finished with an error or an abort over all finished requests, per model "
              f"and engine, over 5 minutes (model_engine:request_error_ratio:5m); red above {t.errors.threshold:g} "
              "(policy "
              f"{t.errors.policy}). Red: open the model's replicas and their engine logs; one replica alone "
              "points at that engine, all of them at the requests or the model.",
              targets=(Target(_per_model("model_engine:request_error_ratio:5m"), PER_MODEL),)),
        _stat(title="Firing Pitstop alerts", unit="short", thresholds=steps("green", ("red", 1)),
              description="Pitstop alerts firing now on the selected nodes, models and replicas (alerts without "
              "such a label, like the control plane's, always count). Above 0: the table at the bottom lists "
              "them with their runbooks.",
              targets=(Target(f"count({S.alerts(inputs.alerts)}) or vector(0)", "firing"),)),
    ))


def _latency_row(inputs: Inputs) -> Row:
    t = inputs.targets
    return Row("Latency", (
        _latency("TTFT p50 / p95 / p99 per model", "ttft", t.ttft, ("TTFTSLOBreach",), "Time to first token"),
        _latency("Inter-token latency p50 / p95 / p99 per model", "itl", t.itl, ("ITLSLOBreach",),
                 "Inter-token latency"),
        _latency("End-to-end latency p50 / p95 / p99 per model", "e2e", None, (), "Request latency, end to end,"),
    ))


def _traffic_row(inputs: Inputs) -> Row:
    t = inputs.targets
    return Row("Traffic, errors and error budgets", (
        Panel(title="Finished requests/s per model", unit="reqps", width=8, data_links=(to_model(),),
              description=f"Requests finished per second per model and engine, whatever their end "
              f"({engines.names('requests')}). A drop with steady clients means replicas are missing or "
              "refusing: check READY below.",
              targets=(Target(_rate("requests", "model, engine"), PER_MODEL),)),
        Panel(title="Generation tokens/s per model", unit="short", width=8, data_links=(to_model(),),
              description=f"Output tokens generated per second per model and engine "
              f"({engines.names('generation_tokens')}). Falling while requests keep coming in means engines slow "
              "down or stall (see Stalled engines).",
              targets=(Target(_rate("generation_tokens", "model, engine"), PER_MODEL),)),
        Panel(title="Error ratio per model", unit="percentunit", width=8, thresholds=_slo_steps(t.errors),
              alerts=("HighErrorRate",), data_links=(to_model(),), threshold_style="dashed",
              description=f"Errors and aborts over finished requests per model and engine, 5-minute windows "
              f"(model_engine:request_error_ratio:5m); the line is the objective {t.errors.threshold:g} (policy "
              f"{t.errors.policy}). Above it for 5 minutes pages (HighErrorRate): open the model's replicas.",
              targets=(Target(_per_model("model_engine:request_error_ratio:5m"), PER_MODEL),)),
        _burn("TTFT SLO burn rate (x budget)", "model_engine:ttft_slo_miss:ratio_rate", t.ttft, "TTFTSLOBurnRate",
              f"requests whose first token took longer than {t.ttft.threshold:g} s"),
        _burn("Inter-token latency SLO burn rate (x budget)", "model_engine:itl_slo_miss:ratio_rate", t.itl,
              "ITLSLOBurnRate", f"tokens that came later than {t.itl.threshold:g} s after the previous one"),
        _burn("Error budget burn rate (x budget)", "model_engine:request_error_ratio:", t.errors,
              "ErrorBudgetBurnRate", "requests that finished with an error or an abort"),
    ))


def _capacity_row() -> Row:
    ready = S.sel("pitstop_replica_ready")
    return Row("Capacity and pressure", (
        _stat(title="READY replicas per model", unit="short", data_links=(to_model(),),
              description="Replicas taking traffic (readiness answered 200) per model. Fewer than planned: see "
              "Replicas by state and the replicas table for which ones and why.",
              targets=(Target(f"sum by (model) ({ready})", "{{model}}"),)),
        _stat(title="READY ratio per model", unit="percentunit", min=0, max=1, alerts=("ReplicaDown",),
              thresholds=steps("red", ("orange", 0.5), ("green", 1)), data_links=(to_model(),),
              description="READY replicas over all replicas of each model. Under 100 %: some replica is starting,"
              " draining, backing off or down; under 50 % the model has lost half its capacity.",
              targets=(Target(f"sum by (model) ({ready}) / count by (model) ({ready})", "{{model}}"),)),
        _stat(title="Stalled engines", unit="short", thresholds=steps("green", ("red", 1)),
              alerts=("EngineStalled",), data_links=(to_model(),),
              description="Engines with work queued and no token moving, per model (a wedged EngineCore still "
              "answers /health 200). Above 0: Pitstop's stall policy restarts them; if not, follow the runbook.",
              targets=(Target(f"sum by (model) ({S.sel('pitstop_engine_stalled')})", "{{model}}"),)),
        _stat(title="Cordoned nodes", unit="short", thresholds=steps("green", ("orange", 1)),
              alerts=("NodeCordoned",),
              description="Nodes the control plane cordoned (thermal-sustained, xid-hardware, an operator): "
              "their replicas are moved away. Above 0: the GPU board shows why; uncordon once fixed.",
              targets=(Target(f"sum({S.sel('pitstop_node_cordoned')})", "cordoned"),)),
        Panel(title="Replicas by state", unit="short", width=12, alerts=("ReplicaDown", "ReplicaCrashLoop"),
              custom={"stacking": {"mode": "normal"}, "fillOpacity": 30},
              description="Replicas in each supervisor state, stacked. Anything but READY and STOPPED for long "
              "is a replica not serving: FATAL is a crash loop the agent gave up on, BACKOFF one it retries.",
              targets=(Target(f"sum by (state) ({S.sel('pitstop_replica_state')} == 1)", "{{state}}"),)),
        Panel(title="Replicas and their state (click a row for its detail)", kind="table", unit="short",
              width=12, data_links=(to_replica(ROW), to_node(ROW)),
              description="Every selected replica with its current state. Click a row to open that replica's "
              "board, or its node's GPUs.",
              targets=(Target(f"max by (node, model, replica, state) ({S.sel('pitstop_replica_state')} == 1)",
                              instant=True, table=True),),
              transformations=({"id": "organize", "options": {
                  "excludeByName": {"Time": True, "Value": True},
                  "indexByName": {"node": 0, "model": 1, "replica": 2, "state": 3}}},)),
        Panel(title="Queue: running and waiting per model", unit="short", width=8, data_links=(to_model(),),
              description="Requests in the running batch and waiting for it, per model and engine, as the "
              "agents read them from each engine (pitstop_engine_requests_running, pitstop_engine_requests_"
              "waiting). A waiting queue that grows is TTFT to come: add replicas.",
              targets=(Target(f"sum by (model, engine) ({S.sel('pitstop_engine_requests_running')})",
                              f"running {PER_MODEL}"),
                       Target(f"sum by (model, engine) ({S.sel('pitstop_engine_requests_waiting')})",
                              f"waiting {PER_MODEL}"))),
        Panel(title="KV cache usage per replica", unit="percentunit", width=8, min=0, max=1,
              alerts=("KVCacheSaturated",), data_links=(to_replica(), to_node()), threshold_style="dashed",
              thresholds=steps("green", ("orange", KV_WARN), ("red", KV_FULL)),
              description=f"Share of each replica's KV cache in use, as the agent reads it from the engine "
              f"(pitstop_engine_kv_cache_usage_ratio). Above {KV_WARN:.0%} sequences start to be preempted; above "
              f"{KV_FULL:.0%} with a queue, KVCacheSaturated fires: lower the running-request cap "
              f"({RUNNING_CAPS}) or add replicas.",
              targets=(Target(f"max by (node, model, replica, engine) "
                              f"({S.sel('pitstop_engine_kv_cache_usage_ratio')})", "{{node}}/{{replica}}"),)),
        Panel(title="Preemptions/s per replica", unit="short", width=8, data_links=(to_replica(), to_node()),
              description=f"Sequences evicted from the KV cache per second ({engines.names('preemptions')}): "
              "their work is recomputed later. Sustained preemptions make the itl-slo policy lower the "
              "running-request cap.",
              # SGLang's counter appears with its first retraction: until then the replica reads 0.
              targets=(Target(f"{_rate('preemptions', REPLICA_KEY)} or 0 * sum by ({REPLICA_KEY}) "
                              f"({S.sel('pitstop_engine_requests_running')})", "{{node}}/{{replica}}"),)),
    ))


def _pitstop_row(inputs: Inputs) -> Row:
    return Row("Restarts, Pitstop actions and alerts", (
        Panel(title="Failure restarts (per hour)", unit="short", width=8, alerts=("ReplicaRestarting",),
              thresholds=steps("green", ("red", 3)), data_links=(to_replica(), to_node()),
              description="Restarts after failures per replica over the last hour. Several an hour: the "
              "replica is crash looping (its state turns FATAL when the agent gives up); open it.",
              targets=(Target(f"sum by (node, model, replica) (increase("
                              f"{S.sel('pitstop_replica_restarts_total')}[1h]))", "{{node}}/{{replica}}"),)),
        Panel(title="Pitstop actions by kind and state", unit="short", width=8,
              alerts=("RemediationActionsFailing", "RemediationAwaitingApproval"),
              description="Actions in the control plane's store (automatic and operator) by kind and state. "
              "Rising failed or rolled_back: the runbook says when the circuit breaker opens; proposed ones "
              "wait for an operator's approval.",
              targets=(Target("sum by (kind, state) (pitstop_cp_actions)", "{{kind}} {{state}}"),)),
        Panel(title="Actions finished per hour by outcome", unit="short", width=8,
              alerts=("RemediationActionsFailing",), custom={"drawStyle": "bars", "fillOpacity": 60},
              description="Actions that reached a final state in the last hour, by kind and outcome "
              "(pitstop_cp_actions_total); each also marks the graphs as an annotation. Many of one kind "
              "means a problem Pitstop keeps fixing: find its cause.",
              targets=(Target("sum by (kind, outcome) (increase(pitstop_cp_actions_total[1h]))",
                              "{{kind}} {{outcome}}"),)),
        firing_alerts(S, inputs.alerts, title="Firing Pitstop alerts (click a row for its runbook)", width=16,
                      description="Pitstop's alerts firing now on the selected nodes, models and replicas (with "
                      "those that carry none of these labels)."),
        Panel(title="Pitstop versions", kind="table", unit="short", width=8,
              description="Agents and control planes by the Pitstop and Python version they run "
              "(pitstop_build_info). More than one version outside a rollout: finish or roll back the upgrade.",
              targets=(Target("count by (job, version, python) (pitstop_build_info)", instant=True, table=True),),
              transformations=({"id": "organize", "options": {"excludeByName": {"Time": True},
                                                              "renameByName": {"Value": "instances"}}},)),
        Panel(title="Scrape targets down per job", kind="stat", unit="short", width=8, height=6,
              alerts=("AgentDown", "EngineMetricsDown", "ControlPlaneDown", "ScrapeJobMissing"),
              thresholds=steps("green", ("red", 1)),
              description="Targets Prometheus fails to scrape, per Pitstop job: pitstop-agent (the agents), "
              "pitstop-engines (each replica's engine /metrics through its agent), pitstop-controlplane. Above 0 "
              "the panels above miss those series; a job missing here is not scraped at all (ScrapeJobMissing).",
              targets=(Target(f"count by (job) ({UP} == 0) or sum by (job) ({UP}) * 0", "{{job}}"),)),
        Panel(title="Memory of Pitstop's own processes", unit="bytes", width=8, height=6,
              description="Resident memory of each agent and control-plane process (process_resident_memory_"
              "bytes). Steady growth over days is a leak in Pitstop itself: restart it and report it.",
              targets=(Target(PITSTOP_RSS, "{{job}} {{instance}}"),)),
    ))


def board(inputs: Inputs) -> Dashboard:
    return Dashboard(
        uid="pitstop-fleet", title="Pitstop fleet",
        description="Is my fleet meeting its SLOs? Latency and errors per model against the policies' "
        "objectives, error budgets, capacity, pressure, restarts, Pitstop's actions and alerts.",
        tags=("pitstop", "fleet"), variables=VARIABLES,
        rows=(_slo_row(inputs), _latency_row(inputs), _traffic_row(inputs), _capacity_row(), _pitstop_row(inputs)),
        links=board_links((GPU, "GPUs"), (REPLICA, "Replica detail")),
        annotations=(ACTIONS,),
    )
