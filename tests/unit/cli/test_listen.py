"""`--listen` and the loopback rule: the forms accepted, the ones refused, and how URLs are printed."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner
from tapfix.proxy.cli import main
from tapfix.proxy.net import is_loopback, parse_listen, url


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:9", ("127.0.0.1", 9)),
        (":81", ("127.0.0.1", 81)),
        ("8082", ("127.0.0.1", 8082)),
        ("[::1]:7", ("::1", 7)),
        ("0.0.0.0:8080", ("0.0.0.0", 8080)),
        ("localhost:65535", ("localhost", 65535)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
    ],
)
def test_accepted_forms(value: str, expected: tuple[str, int]) -> None:
    assert parse_listen(value, 1) == expected


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("garbage", "expected HOST:PORT"),
        ("", "expected HOST:PORT"),
        ("::1:8080", "second colon"),
        ("127.0.0.1:80:81", "second colon"),
        ("127.0.0.1:http", "0 to 65535"),
        ("127.0.0.1:65536", "0 to 65535"),
        ("127.0.0.1:-1", "0 to 65535"),
        (":", "0 to 65535"),
        ("[::1]", "[IPv6]:PORT"),
        ("[::1]8080", "[IPv6]:PORT"),
        ("[127.0.0.1]:80", "not an IPv6 address"),
        ("no-such-host.invalid:8080", "does not resolve"),
    ],
)
def test_refused_forms_name_the_value(value: str, why: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_listen(value, 8080)
    assert repr(value) in str(raised.value) and why in str(raised.value)


def _fake_dns(monkeypatch: pytest.MonkeyPatch, table: dict[str, list[str]]) -> None:
    """A resolver that knows only `table`: the rule is about what a name resolves to, not about our DNS."""

    def getaddrinfo(host: str, *args: object, **kw: object) -> list[tuple[object, ...]]:
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, 1, 6, "", (a, 0)) for a in table[host]]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_is_loopback_literals_and_localhost() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LOCALHOST"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "192.168.1.2", "fe80::1", ""))


def test_is_loopback_names_by_every_address(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_dns(
        monkeypatch,
        {
            "box": ["127.0.1.1"],
            "dual": ["127.0.0.1", "::1"],
            "mixed": ["127.0.0.1", "10.1.2.3"],
            "127.evil.example": ["203.0.113.7"],
        },
    )
    assert is_loopback("box") and is_loopback("dual")
    assert not is_loopback("mixed"), "one routable address is enough to reach it from outside"
    assert not is_loopback("127.evil.example"), "a name that starts with 127. is just a name"
    assert not is_loopback("unknown-name"), "unresolvable: not loopback"
    assert not is_loopback("box", resolve=False), "a Host header is judged without resolving"


def test_a_listen_host_must_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_dns(monkeypatch, {"gpu-box": ["10.0.0.5"]})
    assert parse_listen("gpu-box:9000", 1) == ("gpu-box", 9000)
    with pytest.raises(ValueError, match="does not resolve"):
        parse_listen("other-box:9000", 1)


def test_urls_bracket_ipv6() -> None:
    assert url("::1", 8080) == "http://[::1]:8080"
    assert url("127.0.0.1", 8080) == "http://127.0.0.1:8080"
    assert url("localhost", 1, "https") == "https://localhost:1"


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--upstream", "http://127.0.0.1:9", "--listen", "garbage"],
        ["run", "--upstream", "http://127.0.0.1:9", "--listen", "::1:8080"],
        ["mock", "--listen", "127.0.0.1:99999"],
        ["demo", "--listen", "127.0.0.1:x"],
        ["demo", "--mock-listen", "garbage"],
        ["browse", "--listen", "garbage"],
    ],
)
def test_commands_refuse_a_bad_listen_before_starting(args: list[str]) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert f"'{args[-1]}'" in result.stderr and "Invalid value for '--" in result.stderr
    assert "Traceback" not in result.output
