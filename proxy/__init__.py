"""tapfix core: pure logic (no mitmproxy imports outside the runner) and the CLI."""
