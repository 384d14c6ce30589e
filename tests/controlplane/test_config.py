"""Settings: defaults with no file, YAML overlaid by environment, errors that name the file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.config import DEFAULT_DATABASE_URL, ConfigError, load_config


def test_defaults_need_no_file() -> None:
    config = load_config(None, env={})
    assert (config.host, config.port, config.database_url) == ("127.0.0.1", 8000, DEFAULT_DATABASE_URL)
    assert config.agent_tokens == [] and config.stale_after_seconds == 30


def test_file_then_environment(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text("port: 9000\nstale_after_seconds: 12\nagent_tokens: [a, b]\n"
                    "database_url: postgresql+psycopg://pitstop@db/pitstop\n")
    config = load_config(path, env={"PITSTOP_SERVER_PORT": "9100", "PITSTOP_SERVER_VIEWER_TOKENS": "v1, v2",
                                    "UNRELATED": "x"})
    assert config.port == 9100 and config.stale_after_seconds == 12
    assert [t.get_secret_value() for t in config.agent_tokens] == ["a", "b"]
    assert [t.get_secret_value() for t in config.viewer_tokens] == ["v1", "v2"]
    assert config.database_url.startswith("postgresql+psycopg://")
    assert "a" not in repr(config.agent_tokens)  # secrets do not leak into logs


@pytest.mark.parametrize(("text", "needle"), [
    ("port: 70000\n", "'port'"),
    ("sample_retention: 3\n", "'sample_retention'"),
    ("database_url: mysql://x\n", "'database_url'"),
    ("- just\n- a list\n", "mapping"),
    ("port: [unclosed\n", "not valid YAML"),
])
def test_file_errors_name_file_and_field(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(path) in str(info.value) and needle in str(info.value)


def test_environment_errors_name_the_variable() -> None:
    with pytest.raises(ConfigError, match="PITSTOP_SERVER_STALE_AFTER_SECONDS"):
        load_config(None, env={"PITSTOP_SERVER_STALE_AFTER_SECONDS": "soon"})


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml", env={})


def test_a_bad_notifier_section_names_the_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text("external_url: https://pitstop.example.internal\nnotifier:\n  receivers:\n"
                    "    - {name: pager, pagerduty: {routing_key: abc}}\n  route:\n    receiver: pager\n"
                    "    routes:\n      - {receiver: chatt}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert f"{path}:8: field 'notifier.route.routes[0].receiver': unknown receiver 'chatt'" in str(info.value)
    assert "abc" not in str(info.value)  # an inline secret beside the mistake stays out of the message
