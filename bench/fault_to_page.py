"""Fault to page: a stall, a TTFT SLO breach and a hot GPU until on-call's PagerDuty is told; Pitstop vs Prometheus.

The faults are fault_to_action's (``bench/fault_to_action.py``), on the same fleet: one real agent supervises
eight simulated engines, each fault injected at the same moment in a ``p-`` replica the policies cover and in a
``b-`` twin they leave alone. Fault times are exact (the simulator's timed faults count from the moment it
listens, watched to 50 ms; the surge's is when its load starts).

Pitstop: the control plane with the shipped policies, the ``for:`` of ``stall``, ``ttft-slo`` and ``thermal``
cut to ``--policy-for`` seconds (``policy_for_seconds`` in the output), and its notifier with one ``pagerduty``
receiver whose ``url`` is a local Events v2 endpoint (``bench/harness/pager.py``, answering 202); the route is
the product's default (group by model and node, ``group_wait`` 0, the leader's notify job every
``notify_interval_seconds``, default 1 s). Measured: fault -> the trigger event carrying the fault's alert
(``pitstop-stall``, ``pitstop-ttft-slo``, ``pitstop-thermal``) arrives at the endpoint (its wall clock).

Side by side, in the same run and on the same ``b-`` twins, two Prometheus pipelines, each to its own webhook:
stock (scrape and rule evaluation every 15 s, ``alerts/pitstop-rules.yml`` unchanged, Alertmanager
``group_wait: 30s``) and tuned (scrape and evaluation every 5 s, every rule's ``for:`` cut to 15 s at most in a
generated copy of the rules, ``group_wait: 5s``). Measured: fault -> arrival of the first matching alert.

Storm (``--storm`` alone, or after the fault runs): a fresh control plane, same notifier; 1,000 firing alert rows
for the replicas of one model on a few nodes are written straight into its database within one second (in ten
transactions, 100 ms apart); counted: the notifications that reach the endpoint (one per (model, node) group
expected) and the time until the outbox is empty (every alert carried by a sent delivery, none pending).

``--quick`` (CI): one run, a smaller storm, and the stock pipeline SHORTENED (scrape 5 s, ``for: 10s``,
``group_wait 5s``), labelled so; the tuned pipeline is the same as in a full run.

    python bench/fault_to_page.py [--quick] [--runs 3] [--policy-for 5] [--storm] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fault_to_action import (  # the same faults on the same fleet
    ALERTS,
    FAULTS,
    HANG_AFTER,
    HOT_AFTER,
    LABELS,
    POLICY,
    fault_fleet,
    policy_dir,
    start_faults,
)
from bench.harness.figures import fmt, host_note, median, ratio, table, write_json
from bench.harness.fleet import Fleet, ListenWatch, server_config, wall
from bench.harness.http import probe
from bench.harness.pager import PagerDutyReceiver
from bench.harness.policy_loop import server_runs_policies
from bench.harness.procs import Processes, free_port, http_ok, wait_until
from bench.harness.stock_alerting import (
    WebhookReceiver,
    rule_for,
    rules_copy,
    start_alertmanager,
    start_prometheus,
)
from controlplane.config import ServerConfig
from controlplane.notify.lifecycle import fingerprint
from controlplane.notify.matchers import DEFAULT_GROUP_BY, DEFAULT_GROUP_WAIT
from controlplane.store.db import make_engine, make_sessionmaker, session_scope
from controlplane.store.models import AlertRow

EXTERNAL_URL = "https://pitstop.bench.invalid"
ROUTING_KEY = "benchROUTINGkey0123456789abcdef0"
TUNED_FOR_SECONDS = 15
TUNED = "tuned (scrape 5 s, rules' for: cut to 15 s at most, evaluation 5 s, group_wait 5 s)"
STOCK = "stock (scrape 15 s, repo rules unchanged, group_wait 30 s)"
STOCK_QUICK = "SHORTENED stock (scrape 5 s, rule for: 10 s, group_wait 5 s)"
# The targets.
TARGET_PAGE_S = 10.0
TARGET_VS_STOCK = 10.0
TARGET_VS_TUNED = 2.0
TARGET_STORM_EMPTY_S = 30.0
# Which Pitstop alert is the page for each fault (the alert entry's labels in the event's custom details).
PAGED: dict[str, Callable[[dict[str, str]], bool]] = {
    "stall": lambda lb: lb.get("alertname") == f"pitstop-{POLICY['stall']}" and lb.get("replica") == "p-stalled",
    # On the model (``model:p-ttft``) or on one of its two replicas, as the policy targets it.
    "ttft": lambda lb: lb.get("alertname") == f"pitstop-{POLICY['ttft']}" and (
        lb.get("model") == "p-ttft" or lb.get("target", "").endswith("p-ttft") or "/p-slow" in lb.get("target", "")),
    "hot": lambda lb: lb.get("alertname") == f"pitstop-{POLICY['hot']}" and "bench-node/3" in lb.get("target", ""),
}
STORM_MODEL = "storm-model"
STORM_BATCHES = 10  # the alerts are written in this many transactions over one second (--storm-batches)


def notifier_settings(url: str) -> dict[str, Any]:
    """The server config's notifier part: one PagerDuty receiver at ``url``, the product's default route."""
    return {"external_url": EXTERNAL_URL,
            "notifier": {"receivers": [{"name": "pager", "pagerduty": {"url": url, "routing_key": ROUTING_KEY}}],
                         "route": {"receiver": "pager"}}}


def route_note() -> str:
    return (f"route: the product's defaults (group_by {list(DEFAULT_GROUP_BY)}, group_wait {DEFAULT_GROUP_WAIT:g}s), "
            f"notify job every {ServerConfig.model_fields['notify_interval_seconds'].default:g} s")


def stock_first(hook: WebhookReceiver, fault: str) -> dict[str, Any] | None:
    hits = [d for name in ALERTS[fault] if (d := hook.first(name, **LABELS[fault])) is not None]
    if not hits:
        return None
    first = min(hits, key=lambda d: d.at)
    return {"alert": first.labels["alertname"], "at": first.at}


def one_run(tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One run of the three faults: Pitstop's page, the stock and the tuned pipelines' webhooks."""
    replicas, by_name = fault_fleet()
    policies = policy_dir(tmp / "policies", args.policy_for)
    quick = args.quick
    with Processes(tmp / "logs") as procs, WebhookReceiver() as stock_hook, WebhookReceiver() as tuned_hook, \
            PagerDutyReceiver() as pager:
        server = {"policy_dir": str(policies), "policy_interval_seconds": 1.0, **notifier_settings(pager.url)}
        watch = ListenWatch({r.name: r.port for r in replicas})
        fleet = Fleet.start(tmp, procs, replicas, server=server, agent={"scrape_interval": 1.0})
        # The stock pipeline (shortened in --quick, labelled) and the tuned one, each its own pair and webhook.
        am = start_alertmanager(tmp / "stock", procs, stock_hook.url, group_wait="5s" if quick else "30s",
                                name="alertmanager-stock")
        rules = rules_copy(tmp / "stock-rules.yml", for_seconds=10 if quick else None,
                           interval="5s" if quick else None)
        start_prometheus(tmp / "stock", procs, targets=[fleet.agent], alertmanager=am, rules=rules,
                         control_plane=fleet.cp, scrape_interval="5s" if quick else "15s",
                         evaluation_interval="5s" if quick else "15s",
                         name="prometheus-stock")
        am_tuned = start_alertmanager(tmp / "tuned", procs, tuned_hook.url, group_wait="5s", name="alertmanager-tuned")
        tuned_rules = rules_copy(tmp / "tuned-rules.yml", interval="5s", max_for_seconds=TUNED_FOR_SECONDS)
        start_prometheus(tmp / "tuned", procs, targets=[fleet.agent], alertmanager=am_tuned, rules=tuned_rules,
                         control_plane=fleet.cp,
                         scrape_interval="5s", evaluation_interval="5s", name="prometheus-tuned")
        faults = start_faults(fleet, replicas, watch, by_name, policies)
        fault_at, poller, loop, loads = faults.at, faults.poller, faults.loop, faults.loads
        got: dict[tuple[str, str], dict[str, Any]] = {}
        deadline = time.time() + args.timeout

        def done() -> bool:
            for fault in FAULTS:
                if (fault, "pitstop") not in got:
                    wanted = PAGED[fault]
                    event = pager.first_trigger(lambda a, w=wanted: w(a.get("labels") or {}))  # type: ignore[misc]
                    if event is not None:
                        got[(fault, "pitstop")] = {"at": event.at, "dedup_key": event.dedup_key,
                                                   "summary": (event.body.get("payload") or {}).get("summary")}
                for name, hook in (("stock", stock_hook), ("tuned", tuned_hook)):
                    if (fault, name) not in got and (hit := stock_first(hook, fault)) is not None:
                        got[(fault, name)] = hit
            return len(got) == 3 * len(FAULTS) or time.time() > deadline

        wait_until(done, args.timeout + 30, what="the pages and the alerts", interval=0.5)
        ended = time.time()
        poller.stop()
        if loop is not None:
            loop.__exit__()
        for load in loads:
            load.stop()
    t0 = min(fault_at.values())
    out: dict[str, Any] = {
        "pages": pager.alertnames(),
        # Every event the endpoint got: when (from the first fault), its group and action, and its alerts.
        "page_log": [{"t_s": round(e.at - t0, 2), "action": e.action, "group": e.group_labels,
                      "alerts": [f"{(a.get('labels') or {}).get('alertname')} {(a.get('labels') or {}).get('target')}"
                                 f" {a.get('status')} since {a.get('starts_at')}" for a in e.alerts()]}
                     for e in list(pager.events)],
        "stock_deliveries": sorted({d.labels.get("alertname", "") for d in stock_hook.deliveries}),
        "tuned_deliveries": sorted({d.labels.get("alertname", "") for d in tuned_hook.deliveries}),
    }
    for fault in FAULTS:
        target = "bench-node/3" if fault == "hot" else "" if fault == "ttft" else "p-stalled"
        action = poller.first_record(POLICY[fault], target)
        page = got.get((fault, "pitstop"))
        row: dict[str, Any] = {
            "pitstop_page_s": page["at"] - fault_at[(fault, "p")] if page else None,
            "pitstop_page_waited_s": None if page else ended - fault_at[(fault, "p")],
            "pitstop_page_summary": page["summary"] if page else None,
            # The record the page follows (the stall's restart, the alerts' alert action): the notifier's share
            # of the time is page - action.
            "pitstop_action_s": wall(action["created_at"]) - fault_at[(fault, "p")] if action else None,
            "pitstop_action": {k: action[k] for k in ("kind", "policy", "target", "state")} if action else None,
        }
        for name in ("stock", "tuned"):
            hit = got.get((fault, name))
            row[f"{name}_s"] = hit["at"] - fault_at[(fault, "b")] if hit else None
            # Not delivered by the end of the run: the pipeline took at least this long.
            row[f"{name}_waited_s"] = None if hit else ended - fault_at[(fault, "b")]
            row[f"{name}_alert"] = hit["alert"] if hit else None
        out[fault] = row
    return out


# -- storm --------------------------------------------------------------------------------------------------------


def _sqlite(db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    return conn


def _reasons(db: Path) -> list[dict[str, Any]]:
    """Every delivery the notifier queued: its group, why (new, resolved, repeat), how many alerts, its status."""
    with _sqlite(db) as conn:
        rows = conn.execute("SELECT group_key, reason, alert_ids, status FROM notification_deliveries "
                            "ORDER BY id").fetchall()
    return [{"group_key": g, "reason": r, "alerts": len(json.loads(i) if isinstance(i, str) else i or []),
             "status": st} for g, r, i, st in rows]


def _outbox(db: Path) -> tuple[int, int, set[int]]:
    """(deliveries, pending, the alert ids carried by sent deliveries) as the server's database has them."""
    with _sqlite(db) as conn:
        rows = conn.execute("SELECT status, alert_ids FROM notification_deliveries").fetchall()
    carried: set[int] = set()
    for status, ids in rows:
        if status == "sent" and ids:
            carried.update(int(i) for i in (json.loads(ids) if isinstance(ids, str) else ids))
    return len(rows), sum(1 for s, _ in rows if s == "pending"), carried


def storm_run(tmp: Path, count: int, nodes: int, settle: float, batches: int = STORM_BATCHES) -> dict[str, Any]:
    """``count`` alerts of one model on ``nodes`` nodes, written within one second; what reaches the pager."""
    db = tmp / "cp.db"
    with Processes(tmp / "logs") as procs, PagerDutyReceiver() as pager:
        port = free_port()
        (tmp / "server.yaml").write_text(yaml.safe_dump(server_config({
            "port": port, "database_url": f"sqlite:///{db}", **notifier_settings(pager.url)})))
        procs.start("server", "server", "--config", str(tmp / "server.yaml"), "--log-level", "warning")
        cp = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_ok(f"{cp}/healthz"), 60, what="the control plane")
        wait_until(lambda: "pitstop_cp_leader 1.0" in _get(f"{cp}/metrics"), 30, what="the control plane leads")
        engine = make_engine(f"sqlite:///{db}")
        sessions = make_sessionmaker(engine)
        ids: list[int] = []
        t0 = time.time()
        per_batch = -(-count // batches)
        for b in range(batches):
            time.sleep(max(0.0, t0 + b / batches - time.time()))
            now = datetime.now(UTC)
            rows = []
            with session_scope(sessions) as session:
                for i in range(b * per_batch, min(count, (b + 1) * per_batch)):
                    node, replica = f"storm-node-{i % nodes}", f"storm-{i:04d}"
                    labels = {"alertname": "pitstop-storm", "target": f"replica:{node}/{replica}",
                              "severity": "warning", "model": STORM_MODEL, "node": node, "replica": replica}
                    # policy None: an operator's alert, which the policy rounds' alert sync leaves firing (it
                    # would resolve a policy's alert on a replica this control plane has never heard of).
                    row = AlertRow(fingerprint=fingerprint(labels), labels=labels,
                                   annotations={"summary": f"{replica} on {node}: fleet-wide event (benchmark)"},
                                   severity="warning", state="firing", starts_at=now, ends_at=None,
                                   action_id=None, updated_at=now, policy=None, last_seen_at=now,
                                   resolved_reason="")
                    session.add(row)
                    rows.append(row)
                session.flush()
                ids += [r.id for r in rows]
        inserted = time.time()
        engine.dispose()
        want = set(ids)
        empty_at: float | None = None

        def outbox_empty() -> bool:
            nonlocal empty_at
            _, pending, carried = _outbox(db)
            if pending == 0 and want <= carried:
                empty_at = time.time()
                return True
            return False

        with contextlib.suppress(TimeoutError):  # reported as never empty (None)
            wait_until(outbox_empty, 120, what="the outbox empty", interval=0.1)
        time.sleep(settle)  # a later notification for the same groups would come within a tick or two
        deliveries, pending, carried = _outbox(db)
        queued = _reasons(db)
        events = pager.triggers()
    per_group = Counter(json.dumps(e.group_labels, sort_keys=True) for e in events)
    arrivals = sorted(e.at for e in events)
    return {
        "alerts": count, "nodes": nodes, "batches": batches, "groups_expected": nodes,
        "inserted_within_s": inserted - t0,
        "notifications": len(events),
        "per_group": dict(sorted(per_group.items())),
        "groups_paged": len(per_group),
        "one_per_group": len(per_group) == nodes and all(n == 1 for n in per_group.values()),
        "dedup_keys": len({e.dedup_key for e in events}),
        "alerts_per_notification": [len(e.alerts()) for e in events],
        "alerts_in_bodies": sum(len(e.alerts()) for e in events),
        "queued": queued,
        "alerts_carried": len(carried & want),
        "largest_body_bytes": max((e.size for e in events), default=0),
        "deliveries": deliveries, "pending_at_end": pending,
        "first_page_s": arrivals[0] - t0 if arrivals else None,
        "last_page_s": arrivals[-1] - t0 if arrivals else None,
        "outbox_empty_s": empty_at - t0 if empty_at else None,
    }


def _get(url: str) -> str:
    try:
        return probe.get(url, timeout=5).text
    except httpx.HTTPError:
        return ""


# -- figures ------------------------------------------------------------------------------------------------------


def _waited(runs: list[dict[str, Any]], fault: str, key: str) -> tuple[float | None, bool]:
    """The median with undelivered runs counted as the time waited, and whether that makes it a lower bound."""
    values = [r[fault][f"{key}_s"] if r[fault][f"{key}_s"] is not None else r[fault][f"{key}_waited_s"]
              for r in runs]
    return median(values), any(r[fault][f"{key}_s"] is None for r in runs)


def summarize(runs: list[dict[str, Any]]) -> tuple[dict[str, Any], list[list[str]]]:
    medians, rows = {}, []
    for fault in FAULTS:
        m: dict[str, Any] = {"pitstop_page_s": median([r[fault]["pitstop_page_s"] for r in runs]),
                             "pitstop_action_s": median([r[fault]["pitstop_action_s"] for r in runs]),
                             "pitstop_paged_every_run": all(r[fault]["pitstop_page_s"] is not None for r in runs)}
        for name in ("stock", "tuned"):
            m[f"{name}_s"], m[f"{name}_lower_bound"] = _waited(runs, fault, name)
            m[f"{name}_ratio"] = ratio(m[f"{name}_s"], m["pitstop_page_s"])
        m["targets_met"] = {
            "page_under_10_s": m["pitstop_page_s"] is not None and m["pitstop_page_s"] < TARGET_PAGE_S,
            "10x_stock": (m["stock_ratio"] or 0) >= TARGET_VS_STOCK,
            "2x_tuned": (m["tuned_ratio"] or 0) >= TARGET_VS_TUNED}
        medians[fault] = m

        def each(key: str, fault: str = fault) -> str:
            return ", ".join(fmt(r[fault][f"{key}_s"] if r[fault][f"{key}_s"] is not None
                                 else r[fault].get(f"{key}_waited_s")) for r in runs)

        sb, tb = (">=" if m["stock_lower_bound"] else ""), (">=" if m["tuned_lower_bound"] else "")
        ok = m["targets_met"]
        page = f"{fmt(m['pitstop_page_s'], ' s')} ({each('pitstop_page')})"
        rows.append([fault, f"{fmt(m['pitstop_action_s'], ' s')}",
                     f"{page} {'met' if ok['page_under_10_s'] else 'MISSED'}",
                     f"{sb}{fmt(m['stock_s'], ' s')} ({each('stock')})",
                     f"{tb}{fmt(m['tuned_s'], ' s')} ({each('tuned')})",
                     f"{sb}{fmt(m['stock_ratio'], 'x')} {'met' if ok['10x_stock'] else 'MISSED'}",
                     f"{tb}{fmt(m['tuned_ratio'], 'x')} {'met' if ok['2x_tuned'] else 'MISSED'}",
                     "/".join(f"{a} for {rule_for(a)}" for a in ALERTS[fault])])
    return medians, rows


def summarize_storm(storms: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("notifications", "groups_paged", "dedup_keys", "alerts_carried", "largest_body_bytes", "first_page_s",
            "last_page_s", "outbox_empty_s", "inserted_within_s")
    m: dict[str, Any] = {k: median([s[k] for s in storms]) for k in keys}
    m["alerts"], m["groups_expected"] = storms[0]["alerts"], storms[0]["groups_expected"]
    m["one_per_group_every_run"] = all(s["one_per_group"] for s in storms)
    m["targets_met"] = {"one_per_group": m["one_per_group_every_run"],
                        "outbox_empty_within_30_s": all(s["outbox_empty_s"] is not None and
                                                        s["outbox_empty_s"] <= TARGET_STORM_EMPTY_S for s in storms)}
    return m


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="one run, a 200-alert storm, stock pipeline shortened (scrape 5 s, for: 10 s, group_wait 5 s)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--policy-for", type=float, default=5.0, help="seconds each measured policy's condition must hold")
    p.add_argument("--timeout", type=float, default=300.0, help="longest wait for the stock alerts")
    p.add_argument("--storm", action="store_true", help="the fleet-wide event alone (no fault runs)")
    p.add_argument("--no-storm", action="store_true", help="the fault runs alone")
    p.add_argument("--storm-alerts", type=int, default=None, help="alerts in the storm (1000; 200 with --quick)")
    p.add_argument("--storm-nodes", type=int, default=4, help="nodes the storm's replicas are spread over")
    p.add_argument("--storm-batches", type=int, default=STORM_BATCHES,
                   help="transactions the storm's alerts are written in, evenly over one second (1: all at once)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fault_to_page.json")
    args = p.parse_args()
    if args.quick:
        args.runs, args.timeout = 1, 90.0
    storm_alerts = args.storm_alerts or (200 if args.quick else 1000)
    runs: list[dict[str, Any]] = []
    storms: list[dict[str, Any]] = []
    for i in range(args.runs):
        if not args.storm:
            with tempfile.TemporaryDirectory(prefix="bench-f2p-") as tmp:
                r = one_run(Path(tmp), args)
            runs.append(r)
            print(f"run {i + 1}: paged {sorted(set(r['pages']))}")
            print(f"run {i + 1}: " + "; ".join(
                f"{f}: pitstop page {fmt(r[f]['pitstop_page_s'], ' s')} (action {fmt(r[f]['pitstop_action_s'], ' s')}),"
                f" stock {fmt(r[f]['stock_s'], ' s')} {r[f]['stock_alert'] or ''},"
                f" tuned {fmt(r[f]['tuned_s'], ' s')} {r[f]['tuned_alert'] or ''}" for f in FAULTS), flush=True)
        if not args.no_storm:
            with tempfile.TemporaryDirectory(prefix="bench-f2p-storm-") as tmp:
                s = storm_run(Path(tmp), storm_alerts, args.storm_nodes, settle=3.0, batches=args.storm_batches)
            storms.append(s)
            print(f"storm {i + 1}: {s['alerts']} alerts in {s['inserted_within_s']:.2f} s on {s['nodes']} nodes -> "
                  f"{s['notifications']} notifications ({s['per_group']}), outbox empty after "
                  f"{fmt(s['outbox_empty_s'], ' s')}, last page {fmt(s['last_page_s'], ' s')}", flush=True)
    label = "QUICK (one run, shortened stock pipeline, small storm)" if args.quick else f"medians of {args.runs} run(s)"
    stock_note = STOCK_QUICK if args.quick else STOCK
    medians: dict[str, Any] = {}
    if runs:
        medians, rows = summarize(runs)
        print(f"\nfault to page, {label}; policies with for: {args.policy_for:g} s; {route_note()}; "
              f"{stock_note}; {TUNED}; {host_note()}")
        print(table(["fault", "pitstop action", "pitstop page (target < 10 s)", "stock webhook", "tuned webhook",
                     "stock/pitstop (>= 10x)", "tuned/pitstop (>= 2x)", "stock rule"], rows))
    if storms:
        medians["storm"] = sm = summarize_storm(storms)
        ok = sm["targets_met"]
        print(f"\nstorm, {label}: {sm['alerts']} alerts of one model on {sm['groups_expected']} nodes within "
              f"{fmt(sm['inserted_within_s'], ' s', 2)}: {fmt(sm['notifications'], '', 0)} notifications for "
              f"{sm['groups_expected']} groups (target one per group: {'met' if ok['one_per_group'] else 'MISSED'}); "
              f"outbox empty after {fmt(sm['outbox_empty_s'], ' s')} (target <= 30 s: "
              f"{'met' if ok['outbox_empty_within_30_s'] else 'MISSED'}); last page {fmt(sm['last_page_s'], ' s')}")
    write_json(args.out, "fault_to_page", {
        "settings": {"quick": args.quick, "runs": args.runs, "policy_for_seconds": args.policy_for,
                     "pitstop": f"shipped policies; pagerduty receiver at a local Events v2 endpoint; {route_note()}",
                     "stock": stock_note, "tuned": TUNED,
                     "policy_loop": "control plane's job" if server_runs_policies() else "stand-in (bench.harness)",
                     "hang_after_s": HANG_AFTER, "hot_after_s": HOT_AFTER,
                     "storm": None if not storms else {
                         "alerts": storm_alerts, "nodes": args.storm_nodes, "batches": args.storm_batches,
                         "path": "alert rows written into the control plane's SQLite database (policy NULL), "
                                 f"in {args.storm_batches} transaction(s) evenly over one second"}},
        "targets": {"page_s": f"< {TARGET_PAGE_S:g}", "vs_stock": f">= {TARGET_VS_STOCK:g}x",
                    "vs_tuned": f">= {TARGET_VS_TUNED:g}x", "storm": "one notification per group, outbox empty "
                                                               f"within {TARGET_STORM_EMPTY_S:g} s"},
        "medians": medians, "runs": runs, "storms": storms})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
