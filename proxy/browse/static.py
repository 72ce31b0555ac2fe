# ruff: noqa: E501 - HTML, CSS and JS read better unwrapped
"""The stylesheet and the one small script, served from /static so the CSP can forbid anything inline."""

CSS = """
:root { --fg: #1d2230; --muted: #6b7285; --line: #dde1ea; --bad: #b3261e; --add: #e3f6e8; --del: #fbe3e3; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); }
header { display: flex; gap: 1.5em; align-items: baseline; padding: .6em 1.2em; background: #1d2230; color: #fff; }
header a { color: #fff; text-decoration: none; margin-right: 1em; }
header .brand { font-weight: 700; }
header .db { margin-left: auto; color: #aab; font-family: ui-monospace, monospace; font-size: 12px; }
main { padding: 1em 1.2em 3em; }
h1 { font-size: 1.3em; margin: .2em 0 .6em; } h2 { font-size: 1.1em; margin-top: 1.6em; border-bottom: 1px solid var(--line); }
h3 { font-size: 1em; margin: 1em 0 .3em; } h4 { margin: .2em 0; font-size: .9em; }
table { border-collapse: collapse; width: 100%; margin: .4em 0; }
th, td { text-align: left; padding: .25em .5em; border-bottom: 1px solid var(--line); vertical-align: top; }
thead th { background: #f3f5f9; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.clip { max-width: 22em; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
td.answer { max-width: 36em; }
.nowrap { white-space: nowrap; }
tr.bad td { background: #fff4f3; }
.id { font-family: ui-monospace, monospace; }
.muted { color: var(--muted); } .error { color: var(--bad); } .note { background: #fff8e1; padding: .4em .6em; }
.flag, .tag { display: inline-block; padding: 0 .4em; border-radius: 3px; background: #fde7c8; font-size: 12px;
  color: #6a3d00; text-decoration: none; }
.tag { background: #e2e8f8; color: #23366b; } .flag.repair { background: #f7d4f0; color: #6b1458; }
mark { background: #ffe36e; }
form.filters { display: flex; flex-wrap: wrap; gap: .4em; align-items: center; margin-bottom: .8em; }
form.filters input, form.filters select { padding: .25em .4em; }
form.filters .q { min-width: 20em; }
pre { background: #f6f7fa; padding: .6em; overflow: auto; max-height: 36em; white-space: pre-wrap;
  word-break: break-word; font: 12.5px/1.4 ui-monospace, monospace; margin: .3em 0; }
pre.diff span { display: block; } pre.diff .add { background: var(--add); } pre.diff .del { background: var(--del); }
pre.diff .hunk { color: var(--muted); border-top: 1px dashed var(--line); }
pre.add { background: var(--add); } pre.del { background: var(--del); }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .15em 1em; margin: 0; }
dl.facts dt { color: var(--muted); } dl.facts dd { margin: 0; }
.beforeafter { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; }
input.cmd { font-family: ui-monospace, monospace; padding: .3em; max-width: 100%; }
ul.downloads { display: flex; flex-wrap: wrap; gap: .3em 1.5em; padding-left: 1.2em; }
.timeline, .histogram { max-width: 100%; height: auto; } .charts { display: flex; flex-wrap: wrap; gap: 2em; }
.stall { color: var(--bad); }
ol.turns > li { border-left: 3px solid var(--line); padding: .2em .8em; margin-bottom: 1em; }
ol.turns > li.repaired { border-left-color: #c04fb0; } ol.turns > li.flagged { border-left-color: #e0a030; }
ol.turns > li.prefixbreak { border-left-color: #d0453a; } .prefixbreak b { color: #d0453a; }
.turnhead { margin: 0; } .newmsgs { list-style: none; padding: 0; margin: .3em 0; }
.role { font-size: 12px; font-weight: 600; color: var(--muted); text-transform: uppercase; }
.turns pre.text { max-height: 12em; }
.pager a { margin-right: 2em; }
"""

JS = """// tapfix browse: the copy buttons. Served from /static; the CSP allows scripts from 'self' only.
document.documentElement.setAttribute("data-js", "ready");  // lets tests see that allowed scripts run
document.addEventListener("click", function (event) {
  var button = event.target.closest ? event.target.closest("button[data-copy]") : null;
  if (!button) return;
  var source = document.getElementById(button.getAttribute("data-copy"));
  if (!source) return;
  var text = source.value !== undefined ? source.value : source.textContent;
  function done() { button.textContent = "copied"; setTimeout(function () { button.textContent = "copy"; }, 1500); }
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(done, function () { source.select(); document.execCommand("copy"); done(); });
  } else {
    source.select(); document.execCommand("copy"); done();
  }
});
"""
