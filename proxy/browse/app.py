"""`tapfix browse`: a Starlette app over the capture store, read-only, HTML rendered on the server.

Endpoints are plain functions (Starlette runs them in its thread pool) over the store's
`BrowseQueries` (store/backend.py): the pages ask the store, whichever database it is; the SQL is
the store's own. Reads never block the proxy writing beside them.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import tempfile
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route
from tapfix.proxy.browse import static
from tapfix.proxy.browse.charts import Hourly, histogram_svg, hourly, local_share_svg, route_tokens_svg
from tapfix.proxy.browse.detail import BODIES, export_available, load_detail
from tapfix.proxy.browse.security import HostGuard, SecurityHeaders, TokenGate
from tapfix.proxy.browse.session_turns import session_view
from tapfix.proxy.browse.views import render
from tapfix.proxy.store.errors import CaptureNotFound, StoreError
from tapfix.proxy.store.filters import FilterError, Filters
from tapfix.proxy.store.locator import StoreLocator
from tapfix.proxy.store.pages import Page, Stats
from tapfix.proxy.store.volume import GroupError, is_local, parse_by

DEFAULT_BY = ("route", "upstream")  # the stats page's token-volume table, unless `by=` says otherwise


def create_app(
    db: StoreLocator | Path | str,
    *,
    token: str | None = None,
    loopback_only: bool = True,
    search: bool = True,
    index_path: Path | None = None,
    background_index: bool = True,
) -> Starlette:
    """`db`: a locator, or a SQLite file's path. `search`, `index_path`, `background_index`: a search index
    the store keeps for the browser, if it needs one (`StoreBackend.browse`)."""
    backend = StoreLocator.of(db).backend()
    store = backend.browse(search=search, index_path=index_path, background=background_index)
    shown_db = backend.location  # a PostgreSQL URL shows its password masked
    replay_db = shlex.quote(backend.as_argument())

    def page(name: str, status_code: int = 200, **context: object) -> Response:
        return render(name, status_code, db=shown_db, **context)

    def error(status_code: int, message: str) -> Response:
        return page("error", status_code, status=status_code, message=message)

    def captures(request: Request) -> Response:
        f = Filters.from_params(request.query_params)
        try:
            result = store.list_exchanges(
                f,
                before=request.query_params.get("before", ""),
                after=request.query_params.get("after", ""),
            )
            problem = None
        except FilterError as e:
            result, problem = Page([]), str(e)
        return page("list", 200 if problem is None else 400, f=f, page=result, facets=store.facets(), error=problem)

    def exchange(request: Request) -> Response:
        capture_id = request.path_params["capture_id"]
        try:
            d = load_detail(store, capture_id)
        except CaptureNotFound as e:
            return error(404, str(e))
        if d.capture["id"] != capture_id:
            return RedirectResponse(f"/exchange/{d.capture['id']}", status_code=302)
        return page("exchange", d=d, replay_cmd=f"tapfix replay {d.capture['id']} --db {replay_db}")

    def body(request: Request) -> Response:
        which = request.path_params["which"]
        if which not in BODIES:
            return error(404, f"no body {which!r}: one of {', '.join(BODIES)}")
        try:
            with store.reading() as reader:
                capture = reader.load_capture(request.path_params["capture_id"])
                data = reader.capture_body(capture, which)
        except CaptureNotFound as e:
            return error(404, str(e))
        except StoreError as e:
            return error(410, str(e))
        suffix = (
            ".json" if data[:1] in (b"{", b"[") else ".sse" if capture.get("stream") and "response" in which else ".bin"
        )
        return _download(data, f"tapfix-{capture['id']}-{which}{suffix}")

    def bundle(request: Request) -> Response:
        if not export_available():
            return error(404, "repro bundles need tapfix.proxy.replay.export, which this installation lacks")
        from tapfix.proxy.replay.export import export_capture

        try:
            with store.reading() as reader, tempfile.TemporaryDirectory(prefix="tapfix-browse-") as tmp:
                capture = reader.load_capture(request.path_params["capture_id"])
                out = Path(tmp) / f"tapfix-bundle-{capture['id']}.zip"
                export_capture(reader, capture, "bundle", out, "forwarded")
                data, name = _packed(out)
        except CaptureNotFound as e:
            return error(404, str(e))
        except (StoreError, OSError, ValueError) as e:
            return error(500, f"could not build the bundle: {e}")
        return _download(data, name)

    def sessions(request: Request) -> Response:
        return page("sessions", page=store.list_sessions(before=request.query_params.get("before", "")))

    def session(request: Request) -> Response:
        turns = store.load_session(request.path_params["session_id"], after=request.query_params.get("after", ""))
        if turns is None:
            return error(404, f"no session {request.path_params['session_id']!r}")
        return page("session", v=session_view(turns))

    def stats_of(f: Filters, by: tuple[str, ...] = DEFAULT_BY) -> dict[str, object]:
        """Aggregates over the whole store take a while (~0.2-1 s at 100k): cached, refreshed behind."""

        def compute() -> dict[str, object]:
            s = store.compute_stats(f)
            with store.reading() as reader:
                volume = reader.token_volume(f, by)
                hours = hourly(reader.volume_by_hour(f), is_local)
            return {
                "s": s,
                "ttft_svg": histogram_svg(s.ttft_ms, unit="ms", label="time to first token"),
                "rate_svg": histogram_svg(s.decode_rate, unit="tok/s", label="decode rate"),
                "volume": volume,
                "hours": hours,
                "route_svg": route_tokens_svg(hours),
                "share_svg": local_share_svg(hours),
            }

        return store.cached(f"stats?{f.query(by=','.join(by))}", 10.0, compute)

    def stats(request: Request) -> Response:
        f = Filters.from_params(request.query_params)
        by_text = request.query_params.get("by", "").strip()[:200]
        try:
            by = parse_by(by_text) if by_text else DEFAULT_BY
            shown, problem = stats_of(f, by), None
        except (FilterError, GroupError) as e:
            shown, problem = {"s": Stats(), "volume": [], "hours": Hourly()}, str(e)
            by = DEFAULT_BY
        return page("stats", 200 if problem is None else 400, f=f, by=by, by_text=by_text, error=problem, **shown)

    def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name == "browse.css":
            return Response(static.CSS, media_type="text/css")
        if name == "browse.js":
            return Response(static.JS, media_type="text/javascript")
        return Response("not found", status_code=404, media_type="text/plain")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        def warm() -> None:  # ready before the first visit; stats only once they'd be complete
            store.facets()
            if store.stats_complete():
                stats_of(Filters())

        store.in_thread(warm)
        store.start()
        try:
            yield
        finally:
            store.close()

    routes = [
        Route("/", captures),
        Route("/exchange/{capture_id}", exchange),
        Route("/exchange/{capture_id}/body/{which}", body),
        Route("/exchange/{capture_id}/bundle", bundle),
        Route("/sessions", sessions),
        Route("/session/{session_id:path}", session),
        Route("/stats", stats),
        Route("/static/{name}", asset),
    ]
    middleware = [Middleware(SecurityHeaders)]
    if token:
        middleware.append(Middleware(TokenGate, token=token))
    elif loopback_only:
        middleware.append(Middleware(HostGuard))
    else:
        raise ValueError("a browser reachable beyond loopback needs a token")

    def unavailable(request: Request, exc: Exception) -> Response:
        return error(503, str(exc))  # the database went away (a PostgreSQL restart): one line, never a traceback

    app = Starlette(
        routes=routes, middleware=middleware, lifespan=lifespan, exception_handlers={StoreError: unavailable}
    )
    app.state.store = store
    return app


def _download(data: bytes, filename: str) -> Response:
    """Exact bytes as an attachment: never rendered, whatever they contain (nosniff is set too)."""
    return Response(
        data,
        media_type="application/octet-stream",
        headers={"content-disposition": f'attachment; filename="{filename}"'},
    )


def _packed(out: Path) -> tuple[bytes, str]:
    """The exporter may write a file (any name starting with `out`) or a folder: zip a folder."""
    if out.is_dir():
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
            for path in sorted(out.rglob("*")):
                if path.is_file():
                    z.write(path, str(path.relative_to(out.parent)))
        return buffer.getvalue(), out.name + ".zip"
    if out.is_file():
        return out.read_bytes(), out.name
    made = sorted(p for p in out.parent.iterdir() if p.name.startswith(out.name))
    if not made:
        raise ValueError("the exporter wrote nothing")
    if made[0].is_dir():
        return _packed(made[0])
    return made[0].read_bytes(), made[0].name
