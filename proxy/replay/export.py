"""Repro exports of one capture: a curl command, a Python script, or a bug-report bundle.

A repro is worth something only if it sends exactly the bytes that went wrong, so the body is
never re-serialized: curl reads it from a quoted heredoc cut to its exact length with `head -c`
(or base64-decoded, when the bytes are not plain UTF-8 text), and the Python script embeds it as
base64. The head too: the stored path and header values (text, `\\xNN` for bytes that aren't
UTF-8) become their original bytes again; curl gets them `$'…'`-quoted, an odd path as
`--request-target`, and the Python script writes the head itself (an HTTP client library would
refuse or re-encode such bytes). Secrets never leave: stored headers were redacted before storage, the export also drops
every credential-like header, and a key is only ever read from the environment when the repro runs
(`TAPFIX_API_KEY`), never written into it. `TAPFIX_UPSTREAM` points a repro at another server.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
import shlex
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from tapfix.proxy.http_headers import HOP_BY_HOP, SESSION_HEADERS, head_bytes
from tapfix.proxy.replay.bundle_readme import bundle_readme, safe_text
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.exchange_row import unpack_timing
from tapfix.proxy.store.redact import REDACTED, SECRET_HEADERS

if TYPE_CHECKING:
    from tapfix.proxy.store.reader import CaptureReader

_SKIP_HEADERS = HOP_BY_HOP | {"host", "content-length", "accept-encoding", "cookie", "set-cookie"}
_SECRET_NAME = re.compile(r"key|token|secret|auth|password|cookie|session-?secret", re.I)
_PLAIN = re.compile(rb"[\t\n\x20-\x7e\x80-\xff]*")
_ORIGIN = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^/?#]*)(.*)", re.S)
_URL_PATH = re.compile(rb"[A-Za-z0-9/._~!$&'()*+,;=:@%?-]*")  # a path curl takes in a URL as it is
REQUEST_BODIES = ("request", "forwarded")


def export_capture(
    reader: CaptureReader,
    capture: dict[str, Any],
    as_format: str,
    output: Path | None,
    which: str = "forwarded",
) -> None:
    """Write the repro for `capture` (`as_format`: curl | python | bundle) to `output` or stdout."""
    if as_format == "bundle":
        write_bundle(reader, capture, output or Path(f"tapfix-bundle-{capture['id']}"))
        return
    if as_format not in ("curl", "python"):
        raise StoreError(f"unknown export format {as_format!r}: curl, python or bundle")
    if which not in REQUEST_BODIES:
        raise StoreError(f"a {as_format} repro sends a request body: export it as forwarded (the default)")
    body = reader.capture_body(capture, which)
    text = curl_script(capture, body, which) if as_format == "curl" else python_script(capture, body, which)
    data = text.encode()
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    _write_atomically(output, data, mode=0o755)


def target(capture: dict[str, Any]) -> tuple[str, str]:
    """(origin, path with query, as stored text) the request went to upstream. Not `urlsplit`: it drops
    a `#…` and strips control bytes, and the path must come back byte for byte."""
    url = capture.get("upstream_url") or capture.get("url") or ""
    match = _ORIGIN.fullmatch(url)
    if match is None:
        return "http://127.0.0.1:8000", capture.get("path") or "/"
    return match.group(1), match.group(2) or capture.get("path") or "/"


def safe_headers(headers: Any) -> list[tuple[str, str]]:
    """The headers worth sending again: no framing, no credential of any kind, nothing redacted."""
    out: list[tuple[str, str]] = []
    for item in headers or []:
        name, value = str(item[0]), str(item[1])
        lower = name.lower()
        if lower in _SKIP_HEADERS or lower in SECRET_HEADERS or lower.startswith("x-tapfix-"):
            continue
        if REDACTED in value or (_SECRET_NAME.search(lower) and lower not in SESSION_HEADERS):
            continue
        out.append((name, value))
    return out


def _request_headers(capture: dict[str, Any], which: str) -> list[tuple[bytes, bytes]]:
    stored = capture.get("forwarded_headers") if which == "forwarded" else None
    return [(head_bytes(k), head_bytes(v)) for k, v in safe_headers(stored or capture.get("request_headers"))]


def _shell_bytes(data: bytes) -> str:
    """One shell word that is exactly `data` (no NUL): plain quoting when printable, else bash's `$'…'`."""
    if all(0x20 <= b < 0x7F for b in data):
        return shlex.quote(data.decode())
    out = "".join("\\" + chr(b) if b in (0x27, 0x5C) else chr(b) if 0x20 <= b < 0x7F else f"\\x{b:02x}" for b in data)
    return f"$'{out}'"


def _comment(text: str) -> str:
    """Safe inside a shell comment and a Python docstring."""
    return "".join(c if c.isascii() and c.isprintable() and c not in '\\"' else "?" for c in text)


def curl_script(capture: dict[str, Any], body: bytes, which: str = "forwarded") -> str:
    origin, path = target(capture)
    method = capture.get("method") or "POST"
    lines = [
        "#!/usr/bin/env bash",
        f"# tapfix repro of capture {capture['id']}: {_comment(f'{method} {origin}{path}')}",
        f"# {len(body)} body bytes ({_which_text(which)}), sent byte for byte.",
        "# TAPFIX_UPSTREAM=http://host:port sends it elsewhere;",
        "# TAPFIX_API_KEY, if set, is sent as a Bearer key.",
    ]
    raw_path = head_bytes(path)
    if _URL_PATH.fullmatch(raw_path):
        url = f'"${{TAPFIX_UPSTREAM:-{origin}}}"{shlex.quote(path)}'
    else:  # bytes curl's URL parser would refuse, glob or re-encode: the request line gets them as they are
        url = f'"${{TAPFIX_UPSTREAM:-{origin}}}" --request-target {_shell_bytes(raw_path)}'
    args = [f"curl -sS -N -X {shlex.quote(method)} {url}"]
    # `-H "name:"` would remove the header: an empty value is curl's `name;`.
    args += [f"-H {_shell_bytes(k + (b': ' + v if v else b';'))}" for k, v in _request_headers(capture, which)]
    args.append('${TAPFIX_API_KEY:+-H "Authorization: Bearer $TAPFIX_API_KEY"}')
    if not body:
        return "\n".join(lines + [" \\\n  ".join(args), ""])
    args.append("--data-binary @-")
    tag = "TAPFIX_BODY_" + secrets.token_hex(6)
    plain = _PLAIN.fullmatch(body) is not None and _utf8(body) and tag.encode() not in body
    if plain:
        feed = f"head -c {len(body)} <<'{tag}' |"
        payload = body.decode() + ("" if body.endswith(b"\n") else "\n")
    else:  # NUL, CR, other control bytes or invalid UTF-8: a shell heredoc can't carry them verbatim
        feed = f"base64 -d <<'{tag}' |"
        payload = _wrapped_b64(body) + "\n"
    return "\n".join(lines + [feed + " " + " \\\n  ".join(args), payload + tag, ""])


def _which_text(which: str) -> str:
    return "as forwarded upstream" if which == "forwarded" else "as the client sent them"


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _wrapped_b64(data: bytes, width: int = 76) -> str:
    text = base64.b64encode(data).decode()
    return "\n".join(text[i : i + width] for i in range(0, len(text), width))


def python_script(capture: dict[str, Any], body: bytes, which: str = "forwarded") -> str:
    origin, path = target(capture)
    method = capture.get("method") or "POST"
    headers = _request_headers(capture, which)
    return f'''#!/usr/bin/env python3
"""tapfix repro of capture {capture["id"]}: {_comment(f"{method} {origin}{path}")}

Sends the {len(body)} body bytes ({_which_text(which)}), byte for byte, with the
request line and headers as they were, and writes the response body to stdout (the status to
stderr). Standard library only: it writes the head itself, so no byte is refused or re-encoded.
TAPFIX_UPSTREAM=http://host:port sends it elsewhere; TAPFIX_API_KEY, if set, is sent as a Bearer key.
"""

import base64
import http.client
import os
import socket
import ssl
import sys
from urllib.parse import urlsplit

METHOD = {method.encode()!r}
TARGET = {head_bytes(path)!r}
HEADERS = {headers!r}
BODY = base64.b64decode("""
{_wrapped_b64(body)}
""")


def main() -> int:
    upstream = urlsplit(os.environ.get("TAPFIX_UPSTREAM", {origin!r}))
    tls = upstream.scheme == "https"
    host = upstream.hostname or "127.0.0.1"
    headers = [(b"Host", upstream.netloc.encode()), *HEADERS]
    key = os.environ.get("TAPFIX_API_KEY")
    if key:
        headers.append((b"authorization", b"Bearer " + key.encode()))
    if BODY or METHOD in (b"POST", b"PUT", b"PATCH"):
        headers.append((b"content-length", str(len(BODY)).encode()))
    headers.append((b"connection", b"close"))
    line = METHOD + b" " + upstream.path.rstrip("/").encode() + TARGET + b" HTTP/1.1\\r\\n"
    head = line + b"".join(k + b": " + v + b"\\r\\n" for k, v in headers) + b"\\r\\n"
    sock = socket.create_connection((host, upstream.port or (443 if tls else 80)), timeout=600)
    if tls:
        sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
    with sock:
        sock.sendall(head + BODY)
        response = http.client.HTTPResponse(sock, method=METHOD.decode())
        response.begin()
        print(f"HTTP {{response.status}}", file=sys.stderr)
        while chunk := response.read1(65536):
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
    return 0 if response.status < 400 else 1


if __name__ == "__main__":
    sys.exit(main())
'''


# --- bundle -----------------------------------------------------------------------------------


def bundle_files(reader: CaptureReader, capture: dict[str, Any]) -> dict[str, bytes]:
    """name -> bytes of everything a bug report needs about one exchange."""
    request = reader.capture_body(capture, "request")
    forwarded = reader.capture_body(capture, "forwarded")
    response = reader.capture_body(capture, "response")
    client = reader.capture_body(capture, "client_response")
    sse = "event-stream" in _header(capture.get("response_headers"), "content-type")
    files: dict[str, bytes] = {"request.json": request}
    if forwarded != request:
        files["forwarded.json"] = forwarded
    response_name = "response.sse" if sse else "response.json"
    files[response_name] = response
    if client != response:
        files["client_response" + (".sse" if sse else ".json")] = client
    meta = {
        k: v
        for k, v in capture.items()
        if not k.endswith("_body_id")
        and k not in ("chunk_timing", "request_headers", "forwarded_headers", "response_headers", "change_rows")
    }
    files["exchange.json"] = _pretty(meta)
    files["headers.json"] = _pretty(
        {
            "request": safe_headers(capture.get("request_headers")),
            "forwarded": safe_headers(capture.get("forwarded_headers")) if capture.get("forwarded_headers") else None,
            "response": safe_headers(capture.get("response_headers")),
        }
    )
    files["changes.json"] = _pretty(capture.get("change_rows") or [])
    files["timing.json"] = _pretty(
        {
            "upstream_first_byte_ms": capture.get("upstream_first_byte_ms"),
            "first_token_ms": capture.get("first_token_ms"),
            "duration_ms": capture.get("duration_ms"),
            "chunks": [
                {"ms": round(float(ms), 3), "size": size} for ms, size in unpack_timing(capture.get("chunk_timing"))
            ],
        }
    )
    files["flags.json"] = _pretty(capture.get("flags") or [])
    files["repro.sh"] = curl_script(capture, forwarded).encode()
    files["repro.py"] = python_script(capture, forwarded).encode()
    files["README.md"] = bundle_readme(capture, forwarded, response, sorted(files) + ["README.md"]).encode()
    for name in ("exchange.json", "headers.json", "changes.json", "timing.json", "README.md"):
        files[name] = safe_text(files[name].decode()).encode()
    return files


def write_bundle(reader: CaptureReader, capture: dict[str, Any], output: Path) -> Path:
    """A directory, or a zip when `output` ends in .zip; written aside, then moved into place."""
    files = bundle_files(reader, capture)
    if output.exists() and (output.is_file() or any(output.iterdir())):
        raise StoreError(f"{output} already exists: choose another -o PATH")
    output.parent.mkdir(parents=True, exist_ok=True)
    if output.suffix == ".zip":
        fd, tmp = tempfile.mkstemp(dir=output.parent, prefix=".tapfix-bundle-", suffix=".zip")
        os.close(fd)
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in files.items():
                archive.writestr(f"{output.stem}/{name}", data)
        os.replace(tmp, output)
        return output
    tmp_dir = Path(tempfile.mkdtemp(dir=output.parent, prefix=".tapfix-bundle-"))
    try:
        for name, data in files.items():
            (tmp_dir / name).write_bytes(data)
            if name.startswith("repro."):
                (tmp_dir / name).chmod(0o755)
        if output.exists():
            output.rmdir()
        os.replace(tmp_dir, output)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return output


def _header(headers: Any, name: str) -> str:
    return next((str(v) for k, v in headers or [] if str(k).lower() == name), "")


def _pretty(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n"


def _write_atomically(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    os.replace(tmp, path)
