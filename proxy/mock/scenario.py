"""Scenario files: one small JSON format for every way the mock can misbehave.

A flag per behaviour would not scale (each issue adds one), so a scenario is data:

    {"models": ["id", ...], "strict_models": false,
     "rules": [{"when": {...conditions, all must hold...}, "do": "<behaviour>", ...params}]}

Rules are tried in order for each generation request; the first whose conditions all hold decides;
no match means the healthy default answer. Counters (`nth`, `attempt`) live in the process, so a
restarted mock starts again at request 1. The file is validated when loaded, with a message naming
the rule and key, so a typo fails at start-up and not in the middle of a benchmark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tapfix.proxy.mock.cases import Case, load_case
from tapfix.proxy.mock.degenerate import STYLES

# behaviour -> its own parameters (besides the common ones)
BEHAVIOURS: dict[str, set[str]] = {
    "answer": set(),
    "degenerate": {"style", "tokens"},
    "ignore_images": set(),
    "forget_needle": set(),
    "ignore_effort": set(),
    "serve_case": {"case"},
    "break_tool_call": {"mode"},
    "http_error": {"status", "body", "headers", "stall_s"},
    "reset_mid_stream": {"after_chunks"},
    "stall": {"seconds", "after_chunks"},
    "garbage": {"status", "body", "content_type", "stall_s"},
    "malformed_sse": {"kind", "size", "after_chunks"},
    "crlf": {"ping"},
    "delay_ms": {"ms"},
}
COMMON_PARAMS = {"delay_ms", "chunk_delay_ms", "note", "compress", "compress_lie"}
ENCODINGS = ("gzip", "deflate", "br", "zstd")  # `compress`: what the reply is sent in, whatever was asked
CONDITIONS = {
    "nth",
    "every",
    "first",
    "after",
    "attempt",
    "path",
    "model",
    "has_tools",
    "has_images",
    "stream",
    "last_role",
}
ROLES = ("system", "developer", "user", "assistant", "tool")
MALFORMED_KINDS = ("no_blank_lines", "huge_line", "invalid_utf8", "error_object_midstream")
BREAK_MODES = ("truncate", "unclosed", "resend_whole", "drop_opening")
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"


class ScenarioError(ValueError):
    pass


@dataclass(frozen=True)
class RequestFacts:
    """What rules can test about one request."""

    nth: int  # 1-based count of generation requests in this process
    attempt: int  # 1-based count of requests in this conversation (continuation.conversation_key)
    path: str
    model: str | None
    has_tools: bool
    has_images: bool
    stream: bool
    # Role of the last message/input item; `tool` for a tool result (see surface_script.last_role).
    last_role: str | None = None


@dataclass
class Rule:
    index: int
    when: dict[str, Any]
    do: str
    params: dict[str, Any]
    case: Case | None = None

    def matches(self, facts: RequestFacts) -> bool:
        when = self.when
        wanted_path = when.get("path")
        if wanted_path is None:
            if facts.path not in GENERATION_PATHS:
                return False
        elif facts.path not in _as_list(wanted_path):
            return False
        if "nth" in when and facts.nth not in _as_list(when["nth"]):
            return False
        if "every" in when and facts.nth % when["every"] != 0:
            return False
        if "first" in when and facts.nth > when["first"]:
            return False
        if "after" in when and facts.nth <= when["after"]:
            return False
        if "attempt" in when and facts.attempt not in _as_list(when["attempt"]):
            return False
        if "model" in when and facts.model not in _as_list(when["model"]):
            return False
        for key in ("has_tools", "has_images", "stream"):
            if key in when and bool(when[key]) != getattr(facts, key):
                return False
        if "last_role" in when and facts.last_role not in _as_list(when["last_role"]):
            return False
        return True


@dataclass
class Scenario:
    rules: list[Rule]
    models: list[str] | None = None
    strict_models: bool = False
    source: Path | None = None
    description: str = ""

    def match(self, facts: RequestFacts) -> Rule | None:
        return next((rule for rule in self.rules if rule.matches(facts)), None)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def shipped_scenarios() -> list[str]:
    """Names of the example scenarios shipped with the package (`probe_failures/forget_needle`, ...)."""
    return sorted(str(p.relative_to(SCENARIO_DIR).with_suffix("")) for p in SCENARIO_DIR.rglob("*.json"))


def resolve_scenario(path: Path | str) -> Path:
    """A scenario file path; a name that is no file is looked up among the shipped examples."""
    candidate = Path(path)
    if candidate.exists():
        return candidate
    shipped = SCENARIO_DIR / (candidate if candidate.suffix == ".json" else candidate.with_suffix(".json"))
    if not candidate.is_absolute() and shipped.is_file():
        return shipped
    raise ScenarioError(f"{path}: no such scenario file; shipped examples: {', '.join(shipped_scenarios())}")


def load_scenario(path: Path | str) -> Scenario:
    path = resolve_scenario(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ScenarioError(f"{path}: {e}") from e
    return parse_scenario(data, base_dir=Path(path).resolve().parent, source=Path(path))


def parse_scenario(data: Any, base_dir: Path | None = None, source: Path | None = None) -> Scenario:
    where = str(source or "scenario")
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: a scenario is a JSON object")
    unknown = set(data) - {"models", "strict_models", "rules", "description"}
    if unknown:
        raise ScenarioError(f"{where}: unknown top-level keys {sorted(unknown)}")
    models = data.get("models")
    if models is not None and (not isinstance(models, list) or not all(isinstance(m, str) for m in models)):
        raise ScenarioError(f"{where}: `models` must be a list of strings")
    rules_data = data.get("rules", [])
    if not isinstance(rules_data, list):
        raise ScenarioError(f"{where}: `rules` must be a list")
    rules = [_parse_rule(i, r, base_dir, where) for i, r in enumerate(rules_data)]
    return Scenario(
        rules=rules,
        models=models or None,
        strict_models=bool(data.get("strict_models", False)),
        source=source,
        description=str(data.get("description", "")),
    )


def _parse_rule(index: int, data: Any, base_dir: Path | None, where: str) -> Rule:
    label = f"{where}: rule {index}"
    if not isinstance(data, dict):
        raise ScenarioError(f"{label}: a rule is an object")
    do = data.get("do")
    if do not in BEHAVIOURS:
        raise ScenarioError(f"{label}: `do` must be one of {sorted(BEHAVIOURS)}, not {do!r}")
    when = data.get("when", {})
    if not isinstance(when, dict):
        raise ScenarioError(f"{label}: `when` must be an object")
    bad = set(when) - CONDITIONS
    if bad:
        raise ScenarioError(f"{label}: unknown conditions {sorted(bad)}; known: {sorted(CONDITIONS)}")
    for key in ("every", "first", "after"):
        if key in when and (not isinstance(when[key], int) or when[key] < 1):
            raise ScenarioError(f"{label}: `{key}` must be a positive integer")
    if "last_role" in when:
        roles = _as_list(when["last_role"])
        if not roles or any(r not in ROLES for r in roles):
            raise ScenarioError(f"{label}: `last_role` must be one of {list(ROLES)} or a list of them")
    params = {k: v for k, v in data.items() if k not in ("do", "when")}
    bad = set(params) - BEHAVIOURS[do] - COMMON_PARAMS
    if bad:
        raise ScenarioError(f"{label}: `{do}` takes {sorted(BEHAVIOURS[do] | COMMON_PARAMS)}, not {sorted(bad)}")
    _check_params(label, do, params)
    case = None
    if do == "serve_case":
        ref = params.get("case")
        if isinstance(ref, dict):
            case = load_case(ref, name=f"rule{index}-inline")
        elif isinstance(ref, str):
            path = Path(ref)
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
            try:
                case = load_case(path)
            except (OSError, ValueError) as e:
                raise ScenarioError(f"{label}: cannot load case {ref!r}: {e}") from e
        else:
            raise ScenarioError(f"{label}: `case` must be a file path or an inline case object")
    return Rule(index=index, when=when, do=do, params=params, case=case)


def _check_params(label: str, do: str, params: dict[str, Any]) -> None:
    def number(key: str, minimum: float = 0) -> None:
        value = params.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool) or value < minimum):
            raise ScenarioError(f"{label}: `{key}` must be a number >= {minimum}")

    for key in ("delay_ms", "chunk_delay_ms", "ms", "seconds", "after_chunks", "size", "tokens", "stall_s"):
        number(key)
    if do == "degenerate" and params.get("style", "cjk_drift") not in STYLES:
        raise ScenarioError(f"{label}: `style` must be one of {list(STYLES)}")
    if do == "malformed_sse" and params.get("kind") not in MALFORMED_KINDS:
        raise ScenarioError(f"{label}: `kind` must be one of {list(MALFORMED_KINDS)}")
    if params.get("compress", "gzip") not in ENCODINGS or ("compress_lie" in params and "compress" not in params):
        raise ScenarioError(f"{label}: `compress` must be one of {list(ENCODINGS)} (`compress_lie` needs it)")
    if do == "break_tool_call" and params.get("mode", "truncate") not in BREAK_MODES:
        raise ScenarioError(f"{label}: `mode` must be one of {list(BREAK_MODES)}")
    if do == "http_error":
        status = params.get("status", 500)
        if not isinstance(status, int) or not 400 <= status <= 599:
            raise ScenarioError(f"{label}: `status` must be an HTTP error status (400-599)")
        headers = params.get("headers", {})
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise ScenarioError(f"{label}: `headers` must map names to strings")
