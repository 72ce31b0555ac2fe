"""Replies of a broken model, the failures a deep probe and the proxy's flags must recognise.

Each style copies a failure seen with quantized or mis-templated open-weight models: an English
answer that drifts into CJK (wrong chat template or bad quant), a line repeated until the token
budget runs out, an answer that never ends (finish_reason length), and an immediate end of sequence.
"""

from __future__ import annotations

from tapfix.proxy.mock.chat import Reply

STYLES = ("cjk_drift", "repeat_loop", "runaway", "empty")

_CJK = (
    "配置文件需要更新以便系统能够正确加载模型参数然后我们再检查输出结果是否符合预期"
    "因此我们应该先确认环境变量已经设置好并且所有依赖都已安装完毕接下来继续处理请求"
)
_LOOP_LINE = "I will now check the file again to make sure the change is correct.\n"
_RUNAWAY = (
    "Let me also consider step {n}: the configuration may need another pass, and each pass reveals one more "
    "detail worth examining before the final answer can be given. "
)


def degenerate_reply(style: str, english: str, tokens: int = 400) -> Reply:
    """A reply in the given broken style; `english` is what a healthy model would have started with."""
    if style == "empty":
        return Reply(content="")
    if style == "cjk_drift":
        first = english.split(". ")[0].rstrip(".") + ". "
        runs = max(2, tokens // 60)
        drift = "".join(_CJK[(i * 7) % len(_CJK) :] + _CJK[: (i * 7) % len(_CJK)] for i in range(runs))
        return Reply(content=first + "The answer is 因为 " + drift + "。")
    if style == "repeat_loop":
        repeats = max(3, tokens // 14)
        return Reply(content=_LOOP_LINE * repeats, finish_reason="length")
    if style == "runaway":
        text = ""
        n = 1
        while len(text) < tokens * 5:
            text += _RUNAWAY.format(n=n)
            n += 1
        return Reply(content=english.rstrip() + "\n\n" + text, finish_reason="length")
    raise ValueError(f"unknown degenerate style {style!r}; expected one of {', '.join(STYLES)}")
