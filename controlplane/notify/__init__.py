"""The notifier: alerts to on-call through the tools on-call already uses (Alertmanager's webhook, PagerDuty,
Slack, a signed webhook), grouped, retried through the outbox, and never lost."""
