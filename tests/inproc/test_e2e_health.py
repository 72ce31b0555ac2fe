"""`/tapfix/health`: liveness, the capture writer's state, and deep probes that prove the model."""

from __future__ import annotations

import httpx
import pytest

from tests.support.inproc import start_mock, start_proxy


@pytest.mark.parametrize(("scenario", "ok"), [(None, True), ("probe_failures/cjk_drift", False)])
def test_deep_health_reflects_the_model_not_just_the_port(tmp_path, scenario, ok):
    mock = start_mock(tmp_path, *(["--scenario", scenario] if scenario else []))
    proxy = start_proxy(tmp_path, mock.url)
    try:
        shallow = httpx.get(f"{proxy.url}/tapfix/health").json()
        assert shallow["status"] == "ok" and shallow["capture_writer"]["failures"] == 0
        assert "x-tapfix-capture-id" not in httpx.get(f"{proxy.url}/tapfix/health").headers
        deep = httpx.get(f"{proxy.url}/tapfix/health?deep=1", timeout=60).json()
        probe = deep["probes"]["default"]
        assert probe["ok"] is ok
        assert deep["status"] == ("ok" if ok else "degraded")
        checks = {r["check"]: r for r in probe["results"]}
        assert set(checks) == {"models", "completion", "streaming"}
        if not ok:
            assert checks["completion"]["status"] == "fail" and "CJK" in checks["completion"]["detail"]
    finally:
        proxy.stop()
        mock.stop()
