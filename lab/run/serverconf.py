"""How `lab run` hands the reference server its settings: structured data in a private
file, never strings joined into its command line.

A scenario's token subjects and Origins are data, and data joined with commas into
`--tokens a=b,c=d` can smuggle in a token (`"alice,evil=mallory"`) or an option
(an origin `"--rollback"`). `server_config_file` writes a JSON object whose keys are
`lab.server.config.ServerConfig` field names (tokens as a mapping token -> subject,
origins as a list) into a 0600 file of the run's secrets folder; `lab serve --config FILE`
reads it. The admin token travels in the same file, so no secret is in any argv.

Until `lab serve` has `--config`, `serve_options` falls back to flags, and refuses (with
`UnsafeSetting`, before anything starts) any value that flags cannot carry intact.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lab.runfolder import write_secret
from lab.scenario import TargetSpec

CONFIG_FILE = "server-config.json"


class UnsafeSetting(ValueError):
    """A setting that cannot be passed to `lab serve` as a flag without changing its meaning."""


def server_settings(target: TargetSpec, *, admin_token: str | None) -> dict[str, Any]:
    """The scenario's reference-target settings as ServerConfig fields."""
    settings: dict[str, Any] = {
        "session_ttl": target.session_ttl,
        "refuse_delete": target.delete == "refuse",
        "allowed_origins": list(target.allowed_origins),
        "max_streams": target.max_streams,
        "retry_after": target.retry_after,
        "max_rps": target.max_rps,
        "tokens": dict(sorted(target.tokens.items())),
        "keepalive_s": target.keepalive,
    }
    if admin_token is not None:
        settings["admin_token"] = admin_token
    return settings


def server_config_file(folder: Path, settings: dict[str, Any]) -> Path:
    """Write `settings` (ServerConfig field names) as JSON into a 0600 file of the run's
    secrets folder; the path to give `lab serve --config`."""
    return write_secret(folder, CONFIG_FILE, json.dumps(settings, indent=2, sort_keys=True))


def serve_accepts_config() -> bool:
    """Whether this lab's `lab serve` reads `--config FILE`."""
    from lab.server.cli import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return "--config" in sub.choices["serve"]._option_string_actions


def serve_options(settings: dict[str, Any], config: Path | None) -> list[str]:
    """The options that give `lab serve` these settings: `--config FILE` when it has it,
    else flags (UnsafeSetting for a value flags would change)."""
    if config is not None:
        return ["--config", str(config)]
    return settings_as_flags(settings)


def settings_as_flags(settings: dict[str, Any]) -> list[str]:
    """The flag form of `settings` for a `lab serve` without `--config`."""
    for token, subject in settings.get("tokens", {}).items():
        _plain("a bearer token", token, forbidden=",=")
        _plain(f"the subject of a token ({subject!r})", subject, forbidden=",")
    for origin in settings.get("allowed_origins", []):
        _plain("an allowed origin", origin, forbidden=",")
    args = ["--session-ttl", f"{settings['session_ttl']:g}"]
    args += ["--delete", "refuse" if settings.get("refuse_delete") else "allow"]
    args += [f"--allowed-origins={','.join(settings['allowed_origins'])}"]
    args += ["--max-streams", str(settings["max_streams"]), "--retry-after", str(settings["retry_after"])]
    if "keepalive_s" in settings:
        args += ["--keepalive", f"{settings['keepalive_s']:g}"]
    if settings.get("max_rps"):
        args += ["--max-rps", f"{settings['max_rps']:g}"]
    if settings.get("tokens"):
        args += [f"--tokens={','.join(f'{k}={v}' for k, v in settings['tokens'].items())}"]
    if settings.get("admin_token"):
        # `=`: a random token may start with "-", which argparse would take for an option.
        args += [f"--admin-token={settings['admin_token']}"]
    return args


def _plain(what: str, value: str, *, forbidden: str) -> None:
    """Values go as `--flag=a,b` (so a leading "-" is safe); the list parser splits on
    commas and strips blanks, so those would change the value."""
    bad = [c for c in forbidden if c in value]
    if bad or value != value.strip() or not value:
        reason = f"holds {bad[0]!r}" if bad else "is blank or has surrounding blanks"
        raise UnsafeSetting(
            f"{what} {value!r} cannot be passed to this `lab serve` intact as a command-line flag "
            f"(it {reason}); that needs `lab serve --config`"
        )
