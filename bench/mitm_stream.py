"""The plain-mitmproxy baseline: stream SSE responses through untouched (six lines, nothing else)."""


def responseheaders(flow):
    if "text/event-stream" in flow.response.headers.get("content-type", ""):
        flow.response.stream = True
