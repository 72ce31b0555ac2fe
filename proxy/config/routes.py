"""`[[models.X.routes]]`: the ordered routes a model may take before its default upstream, as value types
built from the (schema-checked) file, and the checks a schema can't express: each route's upstreams exist,
its names are unique, its thresholds can be met.

The decision itself (which route a request takes, and why the others were not) is `request/routes.py`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

CAPABILITIES = ("tools", "images", "reasoning")
DEFAULT_ROUTE = "default"  # the model's own upstream, tried after its routes
GLOB_CHARS = frozenset("*?[")


def is_glob(name: str) -> bool:
    return any(c in GLOB_CHARS for c in name)


def glob_match(pattern: str, value: str) -> bool:
    """Case-sensitive shell-style match (`fnmatchcase`): what a config's glob means everywhere."""
    return fnmatch.fnmatchcase(value, pattern)


@dataclass(frozen=True, slots=True)
class When:
    """What a request must show for a route to match; every condition given must hold."""

    prompt_tokens_over: int | None = None
    prompt_tokens_under: int | None = None
    header: Mapping[str, str] = field(default_factory=dict)  # lowercased name → glob of the value
    user_agent: str | None = None
    model: str | None = None
    needs: tuple[str, ...] = ()

    @property
    def always(self) -> bool:
        return self == When()

    def describe(self) -> str:
        parts = []
        if self.prompt_tokens_over is not None:
            parts.append(f"prompt_tokens_over {self.prompt_tokens_over:,}")
        if self.prompt_tokens_under is not None:
            parts.append(f"prompt_tokens_under {self.prompt_tokens_under:,}")
        parts += [f"header {k} ~ {v!r}" for k, v in self.header.items()]
        if self.user_agent is not None:
            parts.append(f"user_agent ~ {self.user_agent!r}")
        if self.model is not None:
            parts.append(f"model ~ {self.model!r}")
        if self.needs:
            parts.append("needs " + ", ".join(self.needs))
        return " and ".join(parts) or "always"


@dataclass(frozen=True, slots=True)
class RouteRule:
    name: str
    when: When
    upstreams: tuple[str, ...]  # one, or replicas in order
    upstream_model: str | None = None  # None: the model's own
    context_window: int | None = None
    supports: tuple[str, ...] | None = None  # None: its upstream's, else everything


def parse_routes(
    source: str, where: str, raw: Any, upstream_names: list[str], problems: list[str]
) -> tuple[RouteRule, ...]:
    """The model's `routes` list, its problems appended to `problems` (the schema already checked the shape)."""
    rules: list[RouteRule] = []
    seen: set[str] = set()
    for i, r in enumerate(raw or []):
        at = f"{source}: {where}.routes[{i}]"
        name = r["name"]
        if name == DEFAULT_ROUTE or name in seen:
            why = "the model's own upstream is" if name == DEFAULT_ROUTE else "another route of this model is"
            problems.append(f"{at}.name: found {name!r}, which {why} called; expected a name of its own")
        seen.add(name)
        upstream = r["upstream"]
        ups = (upstream,) if isinstance(upstream, str) else tuple(upstream)
        for u in ups:
            if u not in upstream_names:
                problems.append(f"{at}.upstream: found {u!r}, expected one of {', '.join(upstream_names)}")
        w = r.get("when", {})
        when = When(
            prompt_tokens_over=w.get("prompt_tokens_over"),
            prompt_tokens_under=w.get("prompt_tokens_under"),
            header={k.lower(): v for k, v in w.get("header", {}).items()},
            user_agent=w.get("user_agent"),
            model=w.get("model"),
            needs=tuple(w.get("needs", ())),
        )
        low, high = when.prompt_tokens_over, when.prompt_tokens_under
        if low is not None and high is not None and high <= low + 1:
            problems.append(
                f"{at}.when: found prompt_tokens_over {low} and prompt_tokens_under {high}, "
                "expected a range some prompt can be in"
            )
        supports = r.get("supports")
        rules.append(
            RouteRule(
                name=name,
                when=when,
                upstreams=ups,
                upstream_model=r.get("upstream_model"),
                context_window=r.get("context_window"),
                supports=tuple(supports) if supports is not None else None,
            )
        )
    return tuple(rules)
