"""What is stored and where secrets can leak, where only processes show it: tapfix processes starting at
once share one whole CA (the lock), and a config with a literal key is refused at start (exit code, message).

tests/inproc/test_e2e_capture.py already proves header/URL secrets never reach the db/-wal/-shm files and
tests/unit/test_upstream_and_redact.py the redaction rules; this adds the other ways out.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.procs import cli
from tests.support.secrets import SECRET


def test_tapfix_processes_starting_together_share_one_whole_ca(tmp_path):
    """The first start makes the CA; six starting at once on a fresh config dir (mitmproxy writes the
    key file in pieces) all load one whole CA. Unlocked, rounds like these failed most runs."""
    load = (
        "from mitmproxy.certs import CertStore; from tapfix.addons.runner.master import confdir;"
        "print(CertStore.from_store(confdir(), 'mitmproxy', 2048).default_ca.fingerprint().hex())"
    )
    for round_ in range(2):
        env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / f"xdg{round_}")}
        procs = [
            subprocess.Popen([sys.executable, "-c", load], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for _ in range(6)
        ]
        outputs = [proc.communicate(timeout=60)[0].decode().strip() for proc in procs]
        assert all(proc.returncode == 0 for proc in procs), outputs
        assert len(set(outputs)) == 1, outputs


def test_config_refuses_literal_keys_through_the_cli(tmp_path):
    config = tmp_path / "tapfix.toml"
    config.write_text(
        f'[upstreams.gpu]\nbase_url = "http://127.0.0.1:9/v1"\nengine = "vllm"\napi_key = "{SECRET}"\n'
        '[models.m]\nupstream = "gpu"\n'
    )
    for args in (("run", "--config", str(config), "--db", str(tmp_path / "c.db")), ("check", "--config", str(config))):
        result = cli(*args)
        text = result.stdout.decode() + result.stderr.decode()
        assert result.returncode != 0 and "api_key_env" in text, text
        assert SECRET not in text
    assert not (tmp_path / "c.db").exists()
