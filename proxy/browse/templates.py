# ruff: noqa: E501 - HTML, CSS and JS read better unwrapped
"""The page templates (Jinja2, autoescaped), kept as strings so the wheel needs no package data.

Nothing captured is ever marked safe: only the server's own SVG and the snippet highlighter (which
escapes first, then adds <mark>) produce markup.
"""

BASE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{% block title %}captures{% endblock %} · tapfix browse</title>
<link rel="stylesheet" href="/static/browse.css">
<script src="/static/browse.js" defer></script>
</head><body>
<header><a class="brand" href="/">tapfix</a>
<nav><a href="/">captures</a><a href="/sessions">sessions</a><a href="/stats">stats</a></nav>
<span class="db" title="capture database">{{ db }}</span></header>
<main>{% block main %}{% endblock %}</main>
</body></html>
"""

LIST = """{% extends "base" %}
{% block title %}captures{% endblock %}
{% block main %}
<form class="filters" method="get" action="/">
<input type="search" name="q" value="{{ f.q }}" placeholder="search prompts and answers" class="q">
<input name="model" value="{{ f.model }}" placeholder="model" list="models">
<input name="client" value="{{ f.client }}" placeholder="client (user-agent prefix)" list="clients">
<input name="path" value="{{ f.path }}" placeholder="path" list="paths">
<input name="status" value="{{ f.status }}" placeholder="status: 200, 4xx, error" size="10">
<select name="flag"><option value="">any flag</option>
{% for name, n in facets.flags %}<option value="{{ name }}"{% if name == f.flag %} selected{% endif %}>{{ name }} ({{ n }})</option>{% endfor %}
{% if f.flag and f.flag not in facets.flags|map('first') %}<option value="{{ f.flag }}" selected>{{ f.flag }}</option>{% endif %}
</select>
<input name="tag" value="{{ f.tag }}" placeholder="tag" size="8">
<input name="since" value="{{ f.since }}" placeholder="since: 2h, 7d, 2025-01-31" size="14">
<input name="until" value="{{ f.until }}" placeholder="until" size="10">
<label><input type="checkbox" name="changes" value="1"{% if f.changes %} checked{% endif %}> changed</label>
<label><input type="checkbox" name="repairs" value="1"{% if f.repairs %} checked{% endif %}> repaired</label>
{% if f.session %}<input type="hidden" name="session" value="{{ f.session }}">{% endif %}
<button type="submit">filter</button>{% if f.active() %} <a href="/">clear</a>{% endif %}
{% for name in ("models", "clients", "paths") %}<datalist id="{{ name }}">{% for v, n in facets[name] %}<option value="{{ v }}">{% endfor %}</datalist>{% endfor %}
</form>
{% if error %}<p class="error">{{ error }}</p>{% endif %}
{% if page.searched and page.index_behind %}<p class="muted">the search index is catching up: {{ page.index_behind }} recent captures are not searchable yet.</p>{% endif %}
{% if f.q and not page.searched %}<p class="muted">search is off (started with --no-search): showing all matches of the other filters.</p>{% endif %}
<table class="captures"><thead><tr><th>started (UTC)</th><th>id</th><th>client</th><th>model</th><th>path</th><th>status</th>
<th>TTFT</th><th>total</th><th>tokens</th><th>changes</th><th>flags</th><th>{% if page.searched %}match{% else %}answer{% endif %}</th></tr></thead><tbody>
{% for r in page.rows %}<tr class="{% if r.status is none or r.status >= 400 or r.error %}bad{% endif %}">
<td class="nowrap">{{ r.started_at|when }}</td><td><a class="id" href="/exchange/{{ r.id }}">{{ r.id }}</a>{% if r.source_id %} <span class="tag" title="replay of {{ r.source_id }}">replay</span>{% endif %}{% if r.attempt_of %} <a class="tag" href="/exchange/{{ r.attempt_of }}" title="regeneration attempt {{ r.attempt }} for {{ r.attempt_of }}">attempt {{ r.attempt }}</a>{% endif %}</td>
<td class="clip" title="{{ r.user_agent or '' }}">{{ r.user_agent|client }}</td><td>{{ r.model or '-' }}</td><td>{{ r.method }} {{ r.path }}</td>
<td>{{ r.status or '-' }}{% if r.stream %} <span class="muted">sse</span>{% endif %}</td>
<td class="num">{{ r.first_token_ms|ms }}</td><td class="num">{{ r.duration_ms|ms }}</td>
<td class="num">{{ r.prompt_tokens or '' }}{% if r.completion_tokens %}→{{ r.completion_tokens }}{% endif %}</td>
<td class="num">{{ r.changes_count or '' }}</td><td>{% for fl in r.flags %}<span class="flag">{{ fl }}</span> {% endfor %}</td>
<td class="clip answer">{% if page.searched %}{{ r.snippet|marked }}{% else %}{{ r.error or r.content_start or '' }}{% endif %}</td></tr>
{% else %}<tr><td colspan="12" class="muted">no captures{% if f.active() %} match these filters{% endif %}</td></tr>{% endfor %}
</tbody></table>
<p class="pager">{% if page.newer %}<a rel="prev" href="/?{{ f.query(after=page.newer) }}">← newer</a>{% endif %}
{% if page.older %}<a rel="next" href="/?{{ f.query(before=page.older) }}">older →</a>{% endif %}</p>
{% endblock %}
"""

EXCHANGE = """{% extends "base" %}
{% set c = d.capture %}
{% block title %}{{ c.id }}{% endblock %}
{% block main %}
<h1>exchange <span class="id">{{ c.id }}</span></h1>
<dl class="facts">
<dt>started</dt><dd>{{ c.started_at }}</dd>
<dt>request</dt><dd>{{ c.method }} {{ c.path }} → {{ d.destination }}</dd>
<dt>client</dt><dd>{{ c.user_agent or '-' }} <span class="muted">({{ c.client_addr or '-' }})</span></dd>
<dt>model</dt><dd>{{ c.model or '-' }}{% if c.served_model %} → served as {{ c.served_model }}{% endif %}</dd>
<dt>status</dt><dd>{{ c.status or '-' }} · {% if c.stream %}streamed{% else %}not streamed{% endif %} · finish_reason {{ c.finish_reason or '-' }}</dd>
<dt>timings</dt><dd>first byte {{ c.upstream_first_byte_ms|ms }}, first token {{ c.first_token_ms|ms }}, total {{ c.duration_ms|ms }}, {{ c.chunk_count or 0 }} chunks</dd>
<dt>tokens</dt><dd>{{ c.prompt_tokens if c.prompt_tokens is not none else '-' }} in, {{ c.completion_tokens if c.completion_tokens is not none else '-' }} out</dd>
{% if c.flags %}<dt>flags</dt><dd>{% for fl in c.flags %}<a class="flag" href="/?flag={{ fl|urlencode }}">{{ fl }}</a> {% endfor %}</dd>{% endif %}
{% if c.tags %}<dt>tags</dt><dd>{% for t in c.tags %}<span class="tag">{{ t }}</span> {% endfor %}</dd>{% endif %}
{% if c.error %}<dt>{{ d.error_label }}</dt><dd class="error">{{ c.error }}</dd>{% endif %}
{% if c.session_id %}<dt>session</dt><dd><a href="/session/{{ c.session_id|urlencode }}">{{ c.session_id }}</a>
{% if d.previous %} · <a href="/exchange/{{ d.previous }}">previous turn</a>{% endif %}{% if d.next %} · <a href="/exchange/{{ d.next }}">next turn</a>{% endif %}</dd>{% endif %}
{% if c.prefix_break %}{% set pb = c.prefix_break %}<dt>prefix break</dt><dd class="prefixbreak">at <code>{{ pb.path }}</code>, byte {{ pb.offset }}: {{ pb.reason or pb.cause }} <span class="muted">({{ pb.cause }}; compared with <a href="/exchange/{{ pb.previous }}">{{ pb.previous }}</a>; was <code>{{ pb.old }}</code>, now <code>{{ pb.new }}</code>)</span></dd>{% endif %}
{% if c.source_id %}<dt>replay of</dt><dd><a href="/exchange/{{ c.source_id }}">{{ c.source_id }}</a></dd>{% endif %}
{% if c.attempt_of %}<dt>attempt</dt><dd>{{ c.attempt }}, regenerated for <a href="/exchange/{{ c.attempt_of }}">{{ c.attempt_of }}</a> <span class="muted">(the client-facing capture: what the client sent and received)</span></dd>{% endif %}
{% if c.route_decision and 'route' in c.route_decision %}{% set r = c.route_decision %}<dt>route</dt><dd>{{ r.route or 'none' }}{% if r.upstream %} → {{ r.upstream }}/{{ r.served_model }}{% endif %} <span class="muted">matched {{ r.matched or '-' }}; prompt {{ r.inputs.prompt_tokens }} tokens ({{ r.inputs.prompt_source }}){% for x in r.rejected %}; rejected {{ x.route }} ({{ x.upstream }}): {{ x.reason }}{% endfor %}</span></dd>{% endif %}
{% if c.route_decision and c.route_decision.slot %}{% set sl = c.route_decision.slot %}<dt>llama.cpp slot</dt><dd>{% if sl.how == 'client' %}the client's id_slot {{ sl.client_slot }}{% else %}{{ sl.slot }}{% endif %} on {{ sl.upstream }} <span class="muted">{{ sl.how }}{% if sl.role %}, {{ sl.role }} thread{% endif %}{% if sl.cache_n is not none %}; {{ sl.cache_n }} prompt tokens from its cache{% endif %}</span></dd>{% endif %}
{% if c.trace_id %}<dt>trace</dt><dd><code class="trace">{{ c.trace_id }}</code> <span class="muted">span {{ c.span_id or '-' }} · parent span {{ c.parent_span_id or '-' }}</span></dd>{% endif %}
</dl>
{% if d.attempts %}<section><h2>regeneration attempts ({{ d.attempts|length }})</h2>
<p class="muted">tapfix asked the upstream again after an unrecoverable tool call; this capture holds what the client sent and received.</p>
<table class="attempts"><thead><tr><th>id</th><th>attempt</th><th>started</th><th>status</th><th>finish</th><th>TTFT</th><th>total</th><th>flags</th><th>why</th></tr></thead><tbody>
{% for a in d.attempts %}<tr class="{% if a.status is none or a.status >= 400 or a.error %}bad{% endif %}"><td><a class="id" href="/exchange/{{ a.id }}">{{ a.id }}</a></td><td>{{ a.attempt }}</td><td>{{ a.started_at|when }}</td><td>{{ a.status or '-' }}</td><td>{{ a.finish_reason or '-' }}</td><td class="num">{{ a.first_token_ms|ms }}</td><td class="num">{{ a.duration_ms|ms }}</td><td>{% for fl in a.flags %}<span class="flag">{{ fl }}</span> {% endfor %}</td><td>{% for why in a.reasons %}{{ why }}{% if not loop.last %}; {% endif %}{% endfor %}{% if a.error %} <span class="error">{{ a.error }}</span>{% endif %}</td></tr>{% endfor %}
</tbody></table></section>{% endif %}
<section class="actions"><h2>replay and download</h2>
<p><input id="replay-cmd" class="cmd" readonly value="{{ replay_cmd }}" size="{{ replay_cmd|length + 2 }}"> <button type="button" data-copy="replay-cmd">copy</button></p>
<ul class="downloads">{% for which, label, size in d.downloads %}<li><a href="/exchange/{{ c.id }}/body/{{ which }}" download>{{ label }}</a>{% if size >= 0 %} <span class="muted">{{ size }} bytes</span>{% endif %}</li>{% endfor %}
{% if d.bundle %}<li><a href="/exchange/{{ c.id }}/bundle" download>repro bundle</a></li>{% endif %}</ul>
{% if d.bodies_error %}<p class="error">{{ d.bodies_error }}</p>{% endif %}
</section>
<section><h2>changes ({{ d.changes|length }})</h2>
{% if d.changes %}<table class="changes"><thead><tr><th>stage</th><th>kind</th><th>path</th><th>what tapfix did</th><th>why</th></tr></thead><tbody>
{% for ch in d.changes %}<tr><td>{{ ch.stage }}</td><td>{{ ch.kind }}</td><td><code>{{ ch.path or '' }}</code></td><td>{{ ch.explanation }}</td><td>{{ ch.reason or '' }}</td></tr>{% endfor %}
</tbody></table>{% else %}<p class="muted">none: {% if d.tapfix_answered %}tapfix answered the request itself.{% else %}the request and the response passed unchanged.{% endif %}</p>{% endif %}
</section>
<section><h2>request</h2>
{% if d.forwarded is not none %}<h3>as sent → as forwarded</h3>
<pre class="diff">{% for mark, line in d.diff %}<span class="{{ {'+': 'add', '-': 'del', '@': 'hunk'}.get(mark, 'ctx') }}">{{ mark if mark != '@' else '' }}{{ line }}</span>{% endfor %}</pre>
<details><summary>as forwarded upstream</summary><pre>{{ d.forwarded }}</pre></details>
{% else %}<p class="muted">forwarded unchanged.</p>{% endif %}
<details{% if d.forwarded is none %} open{% endif %}><summary>as sent by the client{% if d.sent_truncated %} (truncated: download for all){% endif %}</summary><pre class="body">{{ d.sent }}</pre></details>
</section>
<section><h2>response</h2>
{% if c.reasoning %}<h3>reasoning</h3><pre class="text reasoning">{{ c.reasoning }}</pre>{% endif %}
<h3>content</h3>{% if c.content %}<pre class="text content">{{ c.content }}</pre>{% else %}<p class="muted">(none)</p>{% endif %}
{% if c.tool_calls %}<h3>tool calls ({{ c.tool_calls|length }})</h3>
{% for call in c.tool_calls %}<div class="call"><code>{{ call.name }}</code> <span class="muted">{{ call.id or '' }}</span><pre>{{ call.arguments|pretty_args }}</pre></div>{% endfor %}{% endif %}
{% if d.repairs %}<h3>repaired tool calls</h3>
{% for ch in d.repairs %}<div class="repair"><p><b>{{ ch.kind }}</b> at <code>{{ ch.path or '-' }}</code>{% if ch.reason %}: {{ ch.reason }}{% endif %}</p>
<div class="beforeafter"><div><h4>before (from the model)</h4><pre class="del">{{ ch.before_json }}</pre></div><div><h4>after (to the client)</h4><pre class="add">{{ ch.after_json }}</pre></div></div></div>{% endfor %}{% endif %}
{% if c.usage %}<h3>usage</h3><pre>{{ c.usage|tojson_pretty }}</pre>{% endif %}
{% if d.client_response_differs %}<p class="note">tapfix changed the response: the client got different bytes than the upstream sent (both are downloadable above).</p>{% endif %}
<details><summary>raw upstream response{% if d.response_truncated %} (truncated){% endif %}</summary><pre class="body">{{ d.response }}</pre></details>
</section>
{% if d.timing %}<section><h2>stream timeline</h2>
{{ d.timeline|safe }}
<p class="timing">{{ d.timing.chunks }} chunks, {{ d.timing.size }} bytes · TTFT {{ d.timing.ttft_ms|ms }}
{% if d.timing.tokens_per_s %} · decode {{ '%.1f'|format(d.timing.tokens_per_s) }} tokens/s{% endif %}
{% if d.timing.chunks_per_s %} · {{ '%.1f'|format(d.timing.chunks_per_s) }} chunks/s{% endif %}
{% if d.timing.median_gap_ms is not none %} · median gap {{ d.timing.median_gap_ms|ms }}{% endif %}
· {{ d.timing.stalls|length }} stall{{ '' if d.timing.stalls|length == 1 else 's' }}
{% for a, b in d.timing.stalls %}<span class="stall">{{ (b - a)|ms }} at {{ a|ms }}</span> {% endfor %}</p>
</section>{% endif %}
<section><h2>headers <span class="muted">(secrets are redacted when stored)</span></h2>
{% for title, hs in (("request", c.request_headers), ("forwarded", c.forwarded_headers), ("response", c.response_headers)) %}{% if hs %}
<details><summary>{{ title }} ({{ hs|length }})</summary><table class="headers">{% for name, value in hs %}<tr><th>{{ name }}</th><td>{{ value }}</td></tr>{% endfor %}</table></details>{% endif %}{% endfor %}
</section>
<section><h2>replays ({{ d.replays|length }})</h2>
{% if d.replays %}<table><thead><tr><th>id</th><th>started</th><th>status</th><th>TTFT</th><th>total</th><th>changes</th><th>flags</th></tr></thead><tbody>
{% for r in d.replays %}<tr><td><a class="id" href="/exchange/{{ r.id }}">{{ r.id }}</a></td><td>{{ r.started_at|when }}</td><td>{{ r.status or '-' }}</td><td class="num">{{ r.first_token_ms|ms }}</td><td class="num">{{ r.duration_ms|ms }}</td><td class="num">{{ r.changes_count or '' }}</td><td>{% for fl in r.flags %}<span class="flag">{{ fl }}</span> {% endfor %}</td></tr>{% endfor %}
</tbody></table>{% else %}<p class="muted">not replayed yet.</p>{% endif %}
</section>
{% endblock %}
"""

SESSIONS = """{% extends "base" %}
{% block title %}sessions{% endblock %}
{% block main %}
<h1>agent sessions</h1>
<table><thead><tr><th>last active (UTC)</th><th>session</th><th>client</th><th>model</th><th>turns</th><th>tokens in→out</th><th>time</th><th>changes</th><th>flagged</th><th>errors</th></tr></thead><tbody>
{% for s in page.rows %}<tr><td class="nowrap">{{ s.last_at|when }}</td><td><a href="/session/{{ s.id|urlencode }}">{{ s.id }}</a></td><td class="clip">{{ s.user_agent|client }}</td><td>{{ s.model or '-' }}</td>
<td class="num">{{ s.turns or s.exchanges }}</td><td class="num">{{ s.prompt_tokens or 0 }}→{{ s.completion_tokens or 0 }}</td><td class="num">{{ s.duration_ms|ms }}</td>
<td class="num">{{ s.changes or '' }}</td><td class="num">{{ s.flagged or '' }}</td><td class="num">{{ s.errors or '' }}</td></tr>
{% else %}<tr><td colspan="10" class="muted">no sessions yet</td></tr>{% endfor %}
</tbody></table>
<p class="pager">{% if page.older %}<a rel="next" href="/sessions?before={{ page.older|urlencode }}">older →</a>{% endif %}</p>
{% endblock %}
"""

SESSION = """{% extends "base" %}
{% block title %}session {{ v.session.id }}{% endblock %}
{% block main %}
<h1>session <span class="id">{{ v.session.id }}</span></h1>
<p>{{ v.session.user_agent or '' }} · {{ v.session.model or '' }} · {{ v.total }} turns · {{ v.session.first_at|when }} – {{ v.session.last_at|when }}
 · <a href="/?session={{ v.session.id|urlencode }}">as a list</a></p>
<ol class="turns" start="{{ v.first_number }}">
{% for t in v.turns %}{% set r = t.row %}<li class="turn{% if t.repairs %} repaired{% endif %}{% if r.flags %} flagged{% endif %}{% if r.prefix_break %} prefixbreak{% endif %}">
<p class="turnhead"><a class="id" href="/exchange/{{ r.id }}">{{ r.id }}</a> {{ r.started_at|when }} · {{ r.status or '-' }}
 · {{ r.prompt_tokens if r.prompt_tokens is not none else '?' }}→{{ r.completion_tokens if r.completion_tokens is not none else '?' }} tokens{% if t.cached_tokens is not none %} <span class="muted">({{ t.cached_tokens }} from cache)</span>{% endif %}
 · TTFT {{ r.first_token_ms|ms }} · total {{ r.duration_ms|ms }}{% if r.finish_reason %} · {{ r.finish_reason }}{% endif %}
{% for fl in r.flags %} <span class="flag">{{ fl }}</span>{% endfor %}
{% if t.repairs %} <span class="flag repair">{{ t.repairs|length }} repair{{ '' if t.repairs|length == 1 else 's' }}</span>{% endif %}
{% if r.changes_count %} <span class="muted">{{ r.changes_count }} change{{ '' if r.changes_count == 1 else 's' }}</span>{% endif %}</p>
{% if r.prefix_break %}{% set pb = r.prefix_break %}<p class="prefixbreak"><b>✂ prefix break</b> at <code>{{ pb.path }}</code>, byte {{ pb.offset }}: {{ pb.reason or pb.cause }} <span class="muted">({{ pb.cause }}; compared with <a href="/exchange/{{ pb.previous }}">{{ pb.previous }}</a>)</span></p>{% endif %}
{% if t.delta %}<p class="muted">{% if t.delta.kept %}{{ t.delta.kept }} messages resent unchanged, {% endif %}{{ t.delta.added|length }} new{% if t.delta.dropped %}; <b>{{ t.delta.dropped }} earlier messages dropped or rewritten</b>{% endif %}</p>{% endif %}
<ul class="newmsgs">{% for role, text in t.added %}<li><span class="role">{{ role }}</span> <pre class="text">{{ text }}</pre></li>{% endfor %}</ul>
{% for ch in t.changes %}<p class="change">[{{ ch.stage }}] {{ ch.kind }} <code>{{ ch.path or '' }}</code> {{ ch.reason or '' }}</p>{% endfor %}
<div class="answer"><span class="role">answer</span> {% if r.error %}<span class="error">{{ r.error }}</span>{% endif %}<pre class="text">{{ r.content_start or '' }}</pre>
{% for call in r.tool_calls %}<code>{{ call.name }}({{ call.arguments|truncate(300) }})</code> {% endfor %}</div>
</li>{% endfor %}</ol>
<p class="pager">{% if v.later %}<a rel="next" href="/session/{{ v.session.id|urlencode }}?after={{ v.later }}">later turns →</a>{% endif %}</p>
{% endblock %}
"""

STATS = """{% extends "base" %}
{% block title %}stats{% endblock %}
{% block main %}
<h1>stats</h1>
<form class="filters" method="get" action="/stats">
<input name="model" value="{{ f.model }}" placeholder="model"><input name="client" value="{{ f.client }}" placeholder="client">
<input name="since" value="{{ f.since }}" placeholder="since: 24h, 7d"><input name="until" value="{{ f.until }}" placeholder="until">
<input name="by" value="{{ by_text }}" placeholder="group by: {{ by|join(',') }}" title="any of model, route, upstream, client, session">
<button type="submit">filter</button></form>
{% if error %}<p class="error">{{ error }}</p>{% endif %}
<p>{{ s.total }} requests{% if s.first %}, {{ s.first|when }} – {{ s.last|when }}{% endif %}.{% if s.attempts %} tapfix made <a href="/?flag=regenerated">{{ s.attempts }} regeneration attempt{{ '' if s.attempts == 1 else 's' }}</a> for them (not counted as requests).{% endif %}</p>
<div class="charts">{{ ttft_svg|safe }}{{ rate_svg|safe }}</div>
<table class="summary"><thead><tr><th></th><th>n</th><th>p50</th><th>p90</th><th>p99</th></tr></thead><tbody>
{% for name, unit, sm in (("TTFT", "ms", s.ttft_summary), ("decode rate", "tokens/s", s.rate_summary)) %}
<tr><th>{{ name }}</th>{% if sm %}<td>{{ sm.n }}</td><td>{{ '%.0f'|format(sm.p50) }} {{ unit }}</td><td>{{ '%.0f'|format(sm.p90) }} {{ unit }}</td><td>{{ '%.0f'|format(sm.p99) }} {{ unit }}</td>{% else %}<td colspan="4" class="muted">no data</td>{% endif %}</tr>{% endfor %}
</tbody></table>
<h2>token volume by {{ by|join(', ') }}</h2>
{% if hours.total %}<p class="local-share">{{ '%.0f'|format(100 * hours.total_local / hours.total) }}% of tokens went to local upstreams ({{ hours.total_local|count }} of {{ hours.total|count }}); regeneration and fallback attempts included.</p>{% endif %}
<h3>tokens per route per {{ 'hour' if hours.hours_per_bar == 1 else hours.hours_per_bar ~ ' hours' }}</h3>
<div class="charts">{{ route_svg|safe }}</div>
<h3>share of tokens served locally</h3>
<div class="charts">{{ share_svg|safe }}</div>
<table class="volume"><thead><tr>{% for name in by %}<th>{{ name }}</th>{% endfor %}<th>requests</th><th>attempts</th><th>input</th><th>cached input</th><th>output</th><th>reasoning</th><th>errors</th><th>repairs</th><th>TTFT p50</th><th>TTFT p95</th><th>tokens/s p50</th></tr></thead><tbody>
{% for g in volume %}<tr>{% for name in by %}<td class="clip">{{ '-' if g[name] is none else g[name] }}</td>{% endfor %}<td class="num">{{ g.requests|count }}</td><td class="num">{{ g.attempts|count }}</td><td class="num">{{ g.input_tokens|count }}</td><td class="num">{{ g.cached_input_tokens|count }}</td><td class="num">{{ g.output_tokens|count }}</td><td class="num">{{ g.reasoning_tokens|count }}</td><td class="num">{{ g.errors|count }}</td><td class="num">{{ g.repairs|count }}</td><td class="num">{{ g.ttft_ms_p50|ms }}</td><td class="num">{{ g.ttft_ms_p95|ms }}</td><td class="num">{{ '-' if g.decode_tps_p50 is none else '%.1f'|format(g.decode_tps_p50) }}</td></tr>{% endfor %}
</tbody></table>
<h2>requests per client and model</h2>
<table><thead><tr><th>client</th><th>model</th><th>requests</th><th>errors</th><th>changed</th><th>mean TTFT</th><th>tokens in→out</th></tr></thead><tbody>
{% for r in s.by_client_model %}<tr><td class="clip"><a href="/?client={{ (r.client or '')|urlencode }}">{{ r.client or '-' }}</a></td><td><a href="/?model={{ (r.model or '')|urlencode }}">{{ r.model or '-' }}</a></td><td class="num">{{ r.requests }}</td><td class="num">{{ r.errors or '' }}</td><td class="num">{{ r.changed or '' }}</td><td class="num">{{ r.ttft_ms|ms }}</td><td class="num">{{ r.prompt_tokens or 0 }}→{{ r.completion_tokens or 0 }}</td></tr>{% endfor %}
</tbody></table>
<h2>requests without sampling parameters</h2>
<p><a href="/?flag=no_sampling_params">{{ s.no_sampling_flag }}</a> flagged <code>no_sampling_params</code> by the proxy.
{% if s.no_sampling_derived is not none %}From the request bodies (search index, {{ s.derived_over }} JSON requests indexed): <b>{{ s.no_sampling_derived }}</b> carried none of temperature, top_p, top_k, min_p.{% endif %}</p>
{% if s.no_sampling_by_client %}<table><thead><tr><th>client</th><th>JSON requests</th><th>without sampling parameters</th></tr></thead><tbody>
{% for r in s.no_sampling_by_client %}<tr><td class="clip">{{ r.client or '-' }}</td><td class="num">{{ r.requests }}</td><td class="num">{{ r.lacking or 0 }}</td></tr>{% endfor %}</tbody></table>{% endif %}
{% if s.sampling_changes %}<h3>sampling changes made by tapfix</h3><table><thead><tr><th>kind</th><th>path</th><th>count</th></tr></thead><tbody>
{% for r in s.sampling_changes %}<tr><td>{{ r.kind }}</td><td><code>{{ r.path }}</code></td><td class="num">{{ r.n }}</td></tr>{% endfor %}</tbody></table>{% endif %}
<h2>tool-call repairs by defect class</h2>
{% if s.repairs %}<table><thead><tr><th>defect class</th><th>changes</th><th>exchanges</th></tr></thead><tbody>
{% for r in s.repairs %}<tr><td>{{ r.defect }}</td><td class="num">{{ r.changes }}</td><td class="num"><a href="/?repairs=1">{{ r.exchanges }}</a></td></tr>{% endfor %}</tbody></table>{% else %}<p class="muted">no repairs.</p>{% endif %}
<h2>flags</h2>
{% if s.flags %}<table><tbody>{% for name, n in s.flags %}<tr><td><a class="flag" href="/?flag={{ name|urlencode }}">{{ name }}</a></td><td class="num">{{ n }}</td></tr>{% endfor %}</tbody></table>{% else %}<p class="muted">no flags.</p>{% endif %}
{% endblock %}
"""

ERROR = """{% extends "base" %}
{% block title %}{{ status }}{% endblock %}
{% block main %}<h1>{{ status }}</h1><p class="error">{{ message }}</p><p><a href="/">back to the captures</a></p>{% endblock %}
"""

ALL = {
    "base": BASE,
    "list": LIST,
    "exchange": EXCHANGE,
    "sessions": SESSIONS,
    "session": SESSION,
    "stats": STATS,
    "error": ERROR,
}
